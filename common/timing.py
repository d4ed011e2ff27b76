"""Wall time per phase of a federation, summed in this process.

In ``fedlora simulate`` the ClientApps run in the server's process or in its worker processes, which
send their phases back with each reply (:func:`add`), so the totals split a run's time into local
training, the client's release (clip, noise, encode), the server's decode and aggregate, and
evaluation; with several workers the clients' phases are summed over them (more than wall time).
Under a real deployment each process sums only its own phases."""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager

_TOTALS: defaultdict[str, float] = defaultdict(float)

#: the phases instrumented, in a round's order
PHASES = ("local-training", "encode", "decode-aggregate", "evaluation")


@contextmanager
def phase(name: str) -> Iterator[None]:
    """Add the wall time of the ``with`` body to phase ``name`` (seconds)."""
    start = time.perf_counter()
    try:
        yield
    finally:
        _TOTALS[name] += time.perf_counter() - start


def totals() -> dict[str, float]:
    """Seconds per phase since the last :func:`reset` (phases never entered are 0)."""
    return {name: round(_TOTALS.get(name, 0.0), 3) for name in (*PHASES, *sorted(set(_TOTALS) - set(PHASES)))}


def add(seconds: dict[str, float]) -> None:
    """Add phase seconds measured elsewhere (a worker process's, for one message)."""
    for name, value in seconds.items():
        _TOTALS[name] += float(value)


def reset() -> None:
    _TOTALS.clear()
