"""The git-ignored cache for converted models: ``$FEDLORA_CACHE`` or ``~/.cache/fedlora-dp``."""

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path


def cache_dir() -> Path:
    root = os.environ.get("FEDLORA_CACHE") or Path.home() / ".cache" / "fedlora-dp"
    path = Path(root)
    path.mkdir(parents=True, exist_ok=True)
    return path


@contextlib.contextmanager
def cache_lock(name: str) -> Iterator[None]:
    """Inter-process lock so concurrent clients convert a model once, not N times."""
    with open(cache_dir() / f".{name}.lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)
