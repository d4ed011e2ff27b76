"""``fedlora bench``: the command (``cli.py``) and the benches that run a federation (``codec.py``).

The DP-engine benches (gauge, prism-step) need no server and live in ``client/bench``."""
