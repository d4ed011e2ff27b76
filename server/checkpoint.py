"""The server's checkpoint of the last committed round: global adapter state plus loop state.

One safetensors file, replaced atomically (write, fsync, rename): after a crash it holds either the
previous committed round or this one, never a mix. Loop state (round, counters, the round's metrics
record, the release's clip, the server optimizer's step count) is JSON in the file's metadata and
the server optimizer's moments are tensors under ``server-optimizer/``; nothing is unpickled. The
client sampler's state is not kept (it is drawn from OS entropy; a resumed run draws afresh).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from safetensors import SafetensorError
from safetensors.torch import load_file, safe_open, save_file
from torch import Tensor

from common.atomic import replacing
from common.errors import FedloraError
from common.models import AdapterState

FORMAT = "fedlora-checkpoint/1"
CHECKPOINT_FILE = "checkpoint.safetensors"  # in a run directory
OPTIMIZER_PREFIX = "server-optimizer/"


@dataclass
class LoopState:
    """Where the round loop stands after ``round`` committed rounds."""

    round: int = 0
    completed: int = 0
    skipped: int = 0
    bytes_down: int = 0
    bytes_up: int = 0
    before: dict = field(default_factory=dict)  # held-out metrics of the initial adapter
    after: dict = field(default_factory=dict)  # held-out metrics after the last applied round
    record: dict = field(default_factory=dict)  # the metrics line of the last committed round
    withheld: int = 0  # rounds whose aggregate was not applied (fewer than min-replies usable replies)
    dropouts: list = field(default_factory=list)  # [{"round": r, "nodes": [ids]}]: sampled, never answered
    release: dict = field(default_factory=dict)  # the release's state (server.releases.Release.state)
    optimizer_steps: int = 0  # steps the server optimizer has taken
    stale: bool = False  # the adapter changed after the last evaluation (--eval-every)
    elapsed_s: float = 0.0  # wall seconds from the run's start to this commit, summed over resumed sessions
    cached_evaluation_s: float = (
        0.0  # round 0's evaluation seconds when read from --eval-cache (not in elapsed_s)
    )

    def count(self, result) -> None:
        """Add one round's :class:`server.round.RoundRecord` to the counters."""
        if result.phase == "skipped":
            self.skipped += 1
        elif result.applied:
            self.completed += 1
        elif result.replied:
            self.withheld += 1
        if result.dropouts:
            self.dropouts.append({"round": result.round, "nodes": result.dropouts})
        self.bytes_down += result.bytes_down
        self.bytes_up += result.bytes_up


def save(
    path: Path, state: AdapterState, loop: LoopState, optimizer: Mapping[str, Tensor] | None = None
) -> None:
    """Write the checkpoint atomically; ``optimizer``: the server optimizer's state tensors."""
    extra = {OPTIMIZER_PREFIX + k: v for k, v in (optimizer or {}).items()}
    tensors = {k: v.detach().float().contiguous() for k, v in {**state, **extra}.items()}
    with replacing(path) as tmp:
        save_file(tensors, tmp, metadata={"format": FORMAT, "loop": json.dumps(loop.__dict__)})


def load(
    path: Path, shapes: Mapping[str, tuple[int, ...]]
) -> tuple[AdapterState, LoopState, dict[str, Tensor]]:
    """The checkpoint at ``path``: adapter state (the model's names and ``shapes``), loop state and
    the server optimizer's state tensors (empty for sgd)."""
    try:
        with safe_open(path, framework="pt") as fh:
            meta = fh.metadata() or {}
        if meta.get("format") != FORMAT:
            raise FedloraError(f"{path} is not a fedlora checkpoint (format {meta.get('format')!r})")
        state = load_file(path)
        fields = json.loads(meta["loop"])
        fields.pop("rng", None)  # written before 2026-11-24: the sampler state, now never reused
        loop = LoopState(**fields)
    except (SafetensorError, OSError, KeyError, TypeError, ValueError) as exc:
        raise FedloraError(f"checkpoint {path} is unreadable ({exc})") from None
    optimizer = {
        k[len(OPTIMIZER_PREFIX) :]: state.pop(k) for k in list(state) if k.startswith(OPTIMIZER_PREFIX)
    }
    if {k: tuple(v.shape) for k, v in state.items()} != {k: tuple(v) for k, v in shapes.items()}:
        raise FedloraError(f"checkpoint {path} was written for another model or LoRA configuration")
    return state, loop, optimizer
