"""``gaussian``: each client's increment clipped to C and noised as the threat model says
(DP-FedAvg, McMahan et al. 2018); common/privacy/plan.py sizes the noise."""

from __future__ import annotations

from collections.abc import Sequence

from flwr.serverapp import Grid

from common.models import AdapterState
from common.privacy.release import global_norm
from common.wire import InvalidReply
from server.aggregate import private_mean
from server.releases.base import Release, RunHandles

#: central noise: a reply's norm may exceed C by float round-off only (the server clips it again)
CLIP_SLACK = 1e-4


class GaussianRelease(Release):
    name = "gaussian"

    def prepare(self, grid: Grid, nodes: Sequence[int], state: AdapterState, run: RunHandles) -> dict:
        if self.plan.threat_model == "distributed":
            run.echo(
                f"distributed noise: each of the K sampled clients adds std sigma*C/sqrt(m), m = min(min-replies "
                f"{self.cfg.min_replies}, K), so any applied round carries sigma >= {self.plan.sigma:.4g}; "
                "the server sees each reply with that std (no secure aggregation)"
            )
        return {}

    def check(self, increment: AdapterState) -> None:
        if self.plan.threat_model == "central" and global_norm(increment) > self.plan.clip * (1 + CLIP_SLACK):
            raise InvalidReply(
                f"increment norm {global_norm(increment):.4g} exceeds the clip {self.plan.clip:g}"
            )

    def aggregate(
        self, increments: Sequence[AdapterState], weights: Sequence[int | None], sampled: int
    ) -> tuple[AdapterState, float | None]:
        return self.mean(increments), self.plan.released_sigma(sampled, len(increments))

    def mean(self, increments: Sequence[AdapterState]) -> AdapterState:
        """The DP-FedAvg mean of the clipped, noised releases."""
        plan = self.plan
        return private_mean(increments, plan.threat_model, plan.sigma, plan.clip, self.expected_count)

    @property
    def expected_count(self) -> float:
        """p·N, the constant the noised sum is divided by (one client moves the mean by ≤ C/(p·N))."""
        return self.cfg.sample_rate * self.cfg.num_clients


__all__ = ["GaussianRelease"]
