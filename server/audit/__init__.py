"""Empirical privacy audits: real attacks on the real training code (``fedlora audit``). The
statistics (bounds, AUC, estimates) are in common/privacy/audit.py."""
