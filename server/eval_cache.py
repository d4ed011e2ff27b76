"""Held-out evaluations kept by content (``--eval-cache DIR``): an evaluation is a pure function of
the adapter state, the held-out examples, the base model and the task's settings, so one already
computed is read instead of recomputed. What it saves: round 0, the untrained adapter, is the same
evaluation for every arm of a seed (non-private, each ε, each mechanism), minutes a run on a CPU for
the multiple-choice benchmark (docs/instruction-tuning.md). lm-evaluation-harness's ``--use_cache``
keeps model answers the same way.

An entry is ``DIR/<key>.json``: the metrics and the seconds the evaluation took when computed (the
run's time-left estimate uses them). The key is the SHA-256 of :data:`SCHEMA`, the package version,
the settings that shape the evaluation (the task's code among them, :func:`code_digest`: an edit to
the scorer makes what it computed before absent) and every held-out example and adapter tensor, byte for byte;
an unreadable entry counts as absent. Evaluations are deterministic on a given machine; on another
thread count or device an entry is the same evaluation up to floating-point summation order."""

from __future__ import annotations

import hashlib
import inspect
import json
from collections.abc import Iterable, Mapping
from importlib import metadata
from pathlib import Path

import torch
from torch import Tensor

from common.atomic import write_text

SCHEMA = "fedlora eval-cache v1"


def _version() -> str:
    try:
        return metadata.version("fedlora-dp")
    except metadata.PackageNotFoundError:
        return "unknown"


#: the packages whose source a task's code digest covers
PACKAGES = ("common", "server", "client", "autoencoder")


def code_digest(cls: type) -> str:
    """Hex SHA-256 of the source files of ``cls`` and of its bases in this package: the code that
    scores an evaluation (a task's ``evaluate`` and the scorer its module holds)."""
    files = sorted(
        {inspect.getsourcefile(c) or "" for c in cls.__mro__ if c.__module__.split(".")[0] in PACKAGES}
    )
    digest = hashlib.sha256()
    for file in files:
        digest.update(Path(file).read_bytes())
    return digest.hexdigest()


def cache_key(
    settings: Mapping[str, object], examples: Iterable[tuple[str, object]], state: Mapping[str, Tensor]
) -> str:
    """Hex SHA-256 of an evaluation's inputs: ``settings`` (JSON-able: model, precision, task, lengths),
    the held-out ``(text, label)`` pairs in order, and each adapter tensor (name, dtype, shape, bytes)
    in name order."""
    digest = hashlib.sha256()

    def put(part: bytes) -> None:  # length-prefixed: no two sequences of parts hash alike
        digest.update(len(part).to_bytes(8, "big"))
        digest.update(part)

    put(f"{SCHEMA}\0{_version()}".encode())
    put(json.dumps(dict(settings), sort_keys=True, default=str).encode())
    for text, label in examples:
        put(text.encode())
        put(json.dumps(label, default=str).encode())
    for name in sorted(state):
        tensor = state[name].detach().cpu().contiguous()
        put(f"{name}\0{tensor.dtype}\0{tuple(tensor.shape)}".encode())
        put(tensor.reshape(-1).view(torch.uint8).numpy().tobytes())  # (bf16 has no numpy dtype)
    return digest.hexdigest()


def read(root: Path, key: str) -> tuple[dict[str, float], float] | None:
    """``(metrics, seconds)`` stored under ``key``, or None (absent or unreadable)."""
    try:
        entry = json.loads((root / f"{key}.json").read_text(encoding="utf-8"))
        metrics = {str(k): float(v) for k, v in entry["metrics"].items()}
        return metrics, float(entry["seconds"])
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def write(root: Path, key: str, metrics: Mapping[str, float], seconds: float) -> Path:
    """Store an evaluation under ``key`` (atomically; the directory is created)."""
    root.mkdir(parents=True, exist_ok=True)
    path = root / f"{key}.json"
    write_text(path, json.dumps({"metrics": dict(metrics), "seconds": seconds}, sort_keys=True))
    return path


__all__ = ["SCHEMA", "cache_key", "read", "write"]
