"""Atomic file replacement: write beside the target, fsync, rename over it. A reader, or a crash at
any point, sees the old file or the new one, never half of either; a failed write leaves the
target untouched and no temporary file behind."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def replacing(path: str | os.PathLike, mode: int | None = None, exclusive: bool = False) -> Iterator[Path]:
    """Yields a temporary path beside ``path`` (``.<name>.<pid>.tmp``) for the caller to write; on
    leaving the block it is fsynced and renamed over ``path``. ``mode`` (e.g. ``0o600`` for a secret):
    the temporary file is created with it before anything is written, so the content is never
    readable by others. ``exclusive``: ``path`` must not exist yet (FileExistsError, atomically:
    of two writers racing for it, exactly one wins). On an error the temporary file is removed and
    ``path`` is not touched."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    if mode is not None:
        os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode))
    try:
        yield tmp
        if mode is not None:
            os.chmod(tmp, mode)
        with open(tmp, "rb") as fh:
            os.fsync(fh.fileno())
        if exclusive:
            os.link(tmp, path)  # the whole file appears at once, or FileExistsError
        else:
            os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def write_text(path: str | os.PathLike, text: str, exclusive: bool = False) -> None:
    """``text`` (UTF-8) as the new content of ``path``, atomically (``exclusive``: :func:`replacing`'s)."""
    with replacing(path, exclusive=exclusive) as tmp:
        tmp.write_text(text, encoding="utf-8")


__all__ = ["replacing", "write_text"]
