"""``fedlora bench``: measurements behind the README's mechanism figures."""
