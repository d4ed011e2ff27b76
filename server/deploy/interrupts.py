"""Ctrl-C and SIGTERM during a deployment: they still shut the processes down, and never land
between starting a child and learning its PID."""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from common.signals import handlers_while

_held = {"depth": 0, "pending": False}  # see holding_interrupts()


def _interrupt(signum: int, frame: object) -> None:
    if _held["depth"]:
        _held["pending"] = True
    else:
        raise KeyboardInterrupt


@contextmanager
def interrupts_shut_down() -> Iterator[None]:
    """SIGINT and SIGTERM to ``fedlora`` raise KeyboardInterrupt (so the processes are still shut
    down), except inside :func:`holding_interrupts`."""
    with handlers_while({signal.SIGINT: _interrupt, signal.SIGTERM: _interrupt}):
        yield


@contextmanager
def holding_interrupts() -> Iterator[None]:
    """Hold an interrupt while a child process is created: raised inside ``Popen()`` it would
    orphan a child whose PID we never learn. It is raised on leaving the block instead."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    _held["depth"] += 1
    try:
        yield
    finally:
        _held["depth"] -= 1
        if not _held["depth"] and _held["pending"]:
            _held["pending"] = False
            raise KeyboardInterrupt
