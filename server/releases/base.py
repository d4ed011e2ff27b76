"""What every client-level release does on the server: its mechanism's server half, and the round's hooks.

A release says what a round asks of its clients (:meth:`Release.noise_std`, :attr:`codec`,
:meth:`records_for`), what a usable reply looks like (:meth:`expected`, :meth:`reply_shapes`,
:meth:`check`) and how the usable replies become the increment the server applies (:meth:`round_sum`),
each asked of its mechanism (common/privacy/mechanisms/mechanism.py, which holds both halves; ``none``'s is
FedAvg's, server/releases/none.py). The round loop (server/round.py, server/federation.py) calls
these and never asks which release it runs.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from flwr.serverapp import Grid

from common.config import RunConfig
from common.models import AdapterState
from common.privacy.accounting.accountants import Event
from common.privacy.accounting.ledger import Ledger
from common.privacy.mechanisms.mechanism import RoundSum, ServerHalf, mechanism_for
from common.privacy.planning.plan import NoisePlan


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
    """Server side of a client-level release: a thin view of its mechanism (``mechanism``, by default
    the registry's for the run's release kind), which plans, clips, checks, sums and keeps its state,
    plus what a round of the ServerApp needs around it: start-up work and notes (:meth:`prepare`),
    the codec and records an instruction names, and reply bookkeeping (the DR-Encoder release's)."""

    def __init__(self, cfg: RunConfig, plan: NoisePlan | None, mechanism: ServerHalf | None = None) -> None:
        self.cfg, self.plan = cfg, plan
        self.name = cfg.release_kind if plan else "none"
        self.mechanism = mechanism or mechanism_for(plan, cfg)

    @property
    def clip(self) -> float:
        """The round's C (the mechanism's: it moves under adaptive clipping)."""
        return self.mechanism.clip

    def instruction_clip(self) -> float:
        """The clip a train instruction names (0: the run config's)."""
        return self.mechanism.instruction_clip()

    def state(self) -> dict[str, float]:
        """What the checkpoint keeps of the release between rounds (JSON numbers)."""
        return self.mechanism.state()

    def restore(self, state: dict[str, float]) -> None:
        """Continue from :meth:`state` of a checkpoint (absent keys: as at the start)."""
        self.mechanism.restore(state)

    def prepare(self, grid: Grid, nodes: Sequence[int], state: AdapterState, run: RunHandles) -> dict:
        """Work before round 1: the mechanism's state bound to the run (reloaded on resume) and the
        start-up notes; a release with more (the DR-Encoder statistics round and autoencoder) returns
        what the run summary records of it (empty: nothing)."""
        self.mechanism.open_state(run.run_dir, run.first, {k: tuple(t.shape) for k, t in state.items()})
        plan, cfg = self.plan, self.cfg
        if plan and (note := plan.threat.noise_note(cfg.min_replies, plan.sigma)):
            run.echo(note)
        if plan and cfg.adaptive_clip:
            run.echo(
                f"adaptive clipping: C starts at {cfg.clip:g}, target quantile {cfg.target_quantile:g}, "
                f"clip lr {cfg.clip_lr:g}; count noise std {plan.count_std:.4g}, update noise multiplier "
                f"{plan.update_sigma:.4g} (the pair is one Gaussian mechanism of sigma {plan.sigma:.4g})"
            )
        return {}

    def before_round(self, rnd: int, state: AdapterState) -> None:
        """Work before round ``rnd`` is sent: the mechanism's state brought to the round (a subclass
        adds its own, the ``pca`` codec's refit)."""
        self.mechanism.before_round(rnd)

    def noise_std(self, sampled: int) -> float:
        """Noise std each of ``sampled`` clients adds to its clipped release."""
        return self.mechanism.noise_std(sampled)

    @property
    def codec(self) -> dict[str, object]:
        """The codec a train instruction names (``dr-encoder``); empty for the others."""
        return {}

    def records_for(self, node: int) -> dict:
        """Extra records for ``node``'s instruction (the encoder broadcast)."""
        return {}

    def expected(self, sampled: int) -> dict[str, object]:
        """Meta values a reply must carry, as the client applied them."""
        base = {"mechanism": self.cfg.mechanism, "release": self.name, "noise-std": self.noise_std(sampled)}
        return {**base, **self.mechanism.expected(sampled)}

    def reply_shapes(self, shapes: Mapping[str, tuple[int, ...]]) -> dict[str, tuple[int, ...]]:
        """Names and shapes of a reply's tensors for an adapter of ``shapes``."""
        return self.mechanism.reply_shapes(shapes)

    def check(self, increment: AdapterState) -> None:
        """Raise :class:`common.wire.InvalidReply` for a parsed reply this release must not use."""
        self.mechanism.check(increment)

    def answered(self, node: int, usable: bool) -> None:
        """Bookkeeping after each reply (whether ``node``'s reply was usable)."""

    def events(self, rnd: int) -> tuple[Event, ...]:
        """What round ``rnd`` charges the client-level ledger."""
        return self.mechanism.events(rnd)

    def finish(self) -> None:
        """After the run's last round: the mechanism removes what it kept."""
        self.mechanism.close_state()

    def round_sum(self, sampled: int) -> RoundSum:
        """The round's aggregate: each usable reply is added to it, then it releases the increment to
        apply and the noise multiplier it carried (None: no client-level noise). Nothing else in the
        round sees the replies one by one (common/privacy/mechanisms/mechanism.py ``RoundSum``)."""
        return self.mechanism.round_sum(sampled)


__all__ = ["Release", "RunHandles"]
