"""``fedlora bench suite``: the comparisons that regenerate docs/RESULTS.md."""
