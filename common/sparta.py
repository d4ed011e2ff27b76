"""SPARTA's plan (Makni et al., KDD 2025): how many rows stay trainable and how many steps select them.
Shared by the config check (before any model loads) and the optimizer (client/dp/optimizers/sparta.py)."""

from __future__ import annotations

from common.errors import FedloraError


def kept_rows(keep: float, rows: int) -> int:
    """Rows kept of ``rows``: ``keep`` < 1 is a fraction (the official code keeps
    ``rows - int(rows·(1 - keep))``), ``keep`` ≥ 1 a count."""
    if keep <= 0:
        raise FedloraError(f"sparta keep must be > 0, got {keep:g}")
    if keep < 1:
        return rows - int(rows * (1 - keep))
    if keep != int(keep):
        raise FedloraError(f"sparta keep >= 1 is a number of rows and must be whole, got {keep:g}")
    if keep > rows:
        raise FedloraError(f"sparta keeps {int(keep)} rows per factor but a factor has only {rows} rows")
    return int(keep)


def selection_steps(fraction: float, steps: int) -> int:
    """Steps spent selecting rows: ``round(fraction·steps)``, at least 1 and leaving at least 1 to train."""
    if not 0 < fraction < 1:
        raise FedloraError(f"sparta selection must be a fraction of the steps in (0, 1), got {fraction:g}")
    chosen = max(1, round(fraction * steps))
    if chosen >= steps:
        raise FedloraError(f"sparta needs at least 2 local steps (1 to select rows, 1 to train), got {steps}")
    return chosen
