"""A private release through its mechanism (common/privacy/mechanism.py), which does the work: for
``gaussian`` each client's increment clipped to C and noised as the threat model says (DP-FedAvg,
McMahan et al. 2018), with adaptive clipping (Andrew et al. 2021) as a wrapper; a release kind added
with ``register_release`` (common/privacy/registry.py) runs through this class as it is. The release adds what a round of the
ServerApp needs around the mechanism (the start-up notes)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from flwr.serverapp import Grid

from common.config import CORRELATED, RunConfig
from common.models import AdapterState
from common.privacy.accountants import Event
from common.privacy.factorization import WORKLOADS
from common.privacy.mechanism import RoundSum, mechanism_for
from common.privacy.plan import NoisePlan
from server.releases.base import Release, RunHandles


class MechanismRelease(Release):
    name = "gaussian"

    def __init__(self, cfg: RunConfig, plan: NoisePlan | None) -> None:
        super().__init__(cfg, plan)
        self.name = cfg.release_kind
        self.mechanism = mechanism_for(plan, cfg)

    @property
    def clip(self) -> float:
        return self.mechanism.clip

    def instruction_clip(self) -> float:
        return self.mechanism.instruction_clip()

    def state(self) -> dict[str, float]:
        return self.mechanism.state()

    def restore(self, state: dict[str, float]) -> None:
        self.mechanism.restore(state)

    def prepare(self, grid: Grid, nodes: Sequence[int], state: AdapterState, run: RunHandles) -> dict:
        plan = self.plan
        self.mechanism.open_state(run.run_dir, run.first, {k: tuple(t.shape) for k, t in state.items()})
        if note := plan.threat.noise_note(self.cfg.min_replies, plan.sigma):
            run.echo(note)
        if self.cfg.adaptive_clip:
            run.echo(
                f"adaptive clipping: C starts at {self.cfg.clip:g}, target quantile {self.cfg.target_quantile:g}, "
                f"clip lr {self.cfg.clip_lr:g}; count noise std {plan.count_std:.4g}, update noise multiplier "
                f"{plan.update_sigma:.4g} (the pair is one Gaussian mechanism of sigma {plan.sigma:.4g})"
            )
        return {}

    def noise_std(self, sampled: int) -> float:
        return self.mechanism.noise_std(sampled)

    def expected(self, sampled: int) -> dict[str, object]:
        return {**super().expected(sampled), **self.mechanism.expected(sampled)}

    def reply_shapes(self, shapes: Mapping[str, tuple[int, ...]]) -> dict[str, tuple[int, ...]]:
        return self.mechanism.reply_shapes(shapes)

    def check(self, increment: AdapterState) -> None:
        self.mechanism.check(increment)

    def round_sum(self, sampled: int) -> RoundSum:
        return self.mechanism.round_sum(sampled)

    def events(self, rnd: int) -> tuple[Event, ...]:
        return self.mechanism.events(rnd)

    def before_round(self, rnd: int, state: AdapterState) -> None:
        self.mechanism.before_round(rnd)

    def finish(self) -> None:
        self.mechanism.close_state()


class CorrelatedRelease(MechanismRelease):
    """``dp-ftrl``: the mechanism release of banded correlated noise (common/privacy/ftrl_mechanism.py),
    which says at start-up which strategy and participation rule its ε assumes."""

    name = CORRELATED

    def prepare(self, grid: Grid, nodes: Sequence[int], state: AdapterState, run: RunHandles) -> dict:
        f, optimizer = self.plan.family, self.cfg.server_optimizer
        run.echo(
            f"dp-ftrl: {f.bands}-band correlated noise (sigma {self.plan.sigma:.4g}, the strategy for server "
            f"{f.workload} over {f.rounds} rounds), assuming {f.guarantee}"
        )
        if optimizer not in WORKLOADS:
            run.echo(
                f"dp-ftrl: server {optimizer} is not linear: the noise before it is post-processing (the "
                "epsilon holds), but the strategy's cancellation is designed for server sgd or momentum"
            )
        return super().prepare(grid, nodes, state, run)


__all__ = ["CorrelatedRelease", "MechanismRelease"]
