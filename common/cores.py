"""The CPU cores this process may use, and their share among processes run side by side.

Imports nothing heavy: the bench runner and the deployment launcher split threads before any
model framework loads."""

from __future__ import annotations

import os


def available_cores() -> int:
    """The cores this process may run on (its CPU affinity, not the machine's core count)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def threads_each(processes: int) -> int:
    """Intra-op threads for each of ``processes`` CPU-bound processes run at once (at least one),
    so that together they do not oversubscribe the available cores."""
    return max(1, available_cores() // max(1, processes))
