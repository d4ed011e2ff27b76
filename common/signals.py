"""Signal handlers installed for the length of a block and restored after it."""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager

Handler = Callable[[int, object], object] | int | signal.Handlers


@contextmanager
def handlers_while(handlers: Mapping[int, Handler]) -> Iterator[bool]:
    """Install ``handlers`` (signal number -> handler, ``SIG_IGN`` or ``SIG_DFL``) for the block, and
    put the previous ones back after it, so that a caller running inside another program (a test
    session, a notebook) keeps its own. Off the main thread Python cannot change a handler: nothing
    is installed and the block is told so (it yields ``False``; ``True`` where they were installed)."""
    if threading.current_thread() is not threading.main_thread():
        yield False
        return
    previous = {signum: signal.signal(signum, handler) for signum, handler in handlers.items()}
    try:
        yield True
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
