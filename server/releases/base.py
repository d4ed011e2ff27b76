"""What every client-level release does on the server, and the defaults (``none``'s).

A release says what a round asks of its clients (:meth:`Release.noise_std`, :attr:`codec`,
:meth:`records_for`), what a usable reply looks like (:meth:`expected`, :meth:`reply_shapes`,
:meth:`check`) and how the usable replies become the increment the server applies (:meth:`round_sum`). A private
release delegates these to its mechanism (common/privacy/mechanism.py), which holds both halves. The round loop
(server/round.py, server/federation.py) calls these and never asks which release it runs.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from flwr.serverapp import Grid

from common.config import RunConfig
from common.models import AdapterState
from common.privacy.accountants import Event
from common.privacy.ledger import Ledger
from common.privacy.mechanism import RoundSum
from common.privacy.plan import NoisePlan


@dataclass(frozen=True)
class RunHandles:
    """What a release may use before round 1: the run directory, its ledger and run id, the
    metrics log, the console and the server's evaluator."""

    run_dir: Path
    ledger: Ledger | None
    run_id: str
    log: Callable[[dict], None]
    echo: Callable[[str], None]
    evaluator: object | None = None  # the server's model and public split (a public prior needs them)
    first: int = 1  # the first round this process runs (after the last finished one, on resume)


class Release:
    """Server side of a client-level release; ``plan`` is None for ``none``."""

    name = "none"

    def __init__(self, cfg: RunConfig, plan: NoisePlan | None) -> None:
        self.cfg, self.plan = cfg, plan

    @property
    def clip(self) -> float:
        """The round's C (the mechanism's: it moves under adaptive clipping)."""
        return self.cfg.clip

    def instruction_clip(self) -> float:
        """The clip a train instruction names (0: the run config's)."""
        return 0.0

    def state(self) -> dict[str, float]:
        """What the checkpoint keeps of the release between rounds (JSON numbers)."""
        return {"clip": self.clip}

    def restore(self, state: dict[str, float]) -> None:
        """Continue from :meth:`state` of a checkpoint (absent keys: as at the start)."""

    def prepare(self, grid: Grid, nodes: Sequence[int], state: AdapterState, run: RunHandles) -> dict:
        """Work before round 1 (the DR-Encoder statistics round and autoencoder); returns what the
        run summary records of it (empty: nothing)."""
        return {}

    def before_round(self, rnd: int, state: AdapterState) -> None:
        """Work before round ``rnd`` is sent (the ``pca`` codec's refit); nothing by default."""

    def noise_std(self, sampled: int) -> float:
        """Noise std each of ``sampled`` clients adds to its clipped release (none without a mechanism)."""
        return 0.0

    @property
    def codec(self) -> dict[str, object]:
        """The codec a train instruction names (``dr-encoder``); empty for the others."""
        return {}

    def records_for(self, node: int) -> dict:
        """Extra records for ``node``'s instruction (the encoder broadcast)."""
        return {}

    def expected(self, sampled: int) -> dict[str, object]:
        """Meta values a reply must carry, as the client applied them."""
        return {"mechanism": self.cfg.mechanism, "release": self.name, "noise-std": self.noise_std(sampled)}

    def reply_shapes(self, shapes: Mapping[str, tuple[int, ...]]) -> dict[str, tuple[int, ...]]:
        """Names and shapes of a reply's tensors for an adapter of ``shapes``."""
        return dict(shapes)

    def check(self, increment: AdapterState) -> None:
        """Raise :class:`common.wire.InvalidReply` for a parsed reply this release must not use."""

    def answered(self, node: int, usable: bool) -> None:
        """Bookkeeping after each reply (whether ``node``'s reply was usable)."""

    def events(self, rnd: int) -> tuple[Event, ...]:
        """What round ``rnd`` charges the client-level ledger (none without a client-level release)."""
        return ()

    def finish(self) -> None:
        """After the run's last round (a stateful release removes what it kept)."""

    def round_sum(self, sampled: int) -> RoundSum:
        """The round's aggregate: each usable reply is added to it, then it releases the increment to
        apply and the noise multiplier it carried (None: no client-level noise). Nothing else in the
        round sees the replies one by one (common/privacy/mechanism.py ``RoundSum``)."""
        raise NotImplementedError


__all__ = ["Release", "RunHandles"]
