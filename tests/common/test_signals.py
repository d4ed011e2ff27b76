"""common/signals.py: handlers installed for a block are the ones in force inside it, and the
previous ones come back after it, also when the block raises; off the main thread nothing changes."""

from __future__ import annotations

import os
import signal
import threading

import pytest

from common.signals import handlers_while


def _mark(signum: int, frame: object) -> None:
    raise LookupError(f"signal {signum}")


def test_a_handler_is_in_force_inside_the_block_and_the_previous_one_after_it():
    before = signal.getsignal(signal.SIGUSR1)
    handlers = {signal.SIGUSR1: _mark, signal.SIGUSR2: signal.SIG_IGN}
    with (
        pytest.raises(LookupError, match=f"signal {int(signal.SIGUSR1)}"),
        handlers_while(handlers) as installed,
    ):
        assert installed
        assert signal.getsignal(signal.SIGUSR2) == signal.SIG_IGN
        os.kill(os.getpid(), signal.SIGUSR1)
    assert signal.getsignal(signal.SIGUSR1) == before
    assert signal.getsignal(signal.SIGUSR2) != signal.SIG_IGN


def test_off_the_main_thread_nothing_is_installed_and_the_block_is_told():
    seen: list[object] = []

    def body() -> None:
        with handlers_while({signal.SIGUSR1: _mark}) as installed:
            seen.extend([installed, signal.getsignal(signal.SIGUSR1)])

    thread = threading.Thread(target=body)
    thread.start()
    thread.join()
    assert seen == [False, signal.getsignal(signal.SIGUSR1)]
