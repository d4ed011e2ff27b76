"""A private release through its mechanism (common/privacy/mechanism.py), which does the work: for
``gaussian`` each client's increment clipped to C and noised as the threat model says (DP-FedAvg,
McMahan et al. 2018), with adaptive clipping (Andrew et al. 2021) as a wrapper; a release kind added
with ``register_release`` runs through this class as it is. The release adds what a round of the
ServerApp needs around the mechanism (the start-up notes)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from flwr.serverapp import Grid

from common.config import RunConfig
from common.models import AdapterState
from common.privacy.accountants import Event
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

    def events(self) -> tuple[Event, ...]:
        return self.mechanism.events()


__all__ = ["MechanismRelease"]
