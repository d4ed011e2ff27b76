"""``none``: no client-level release; increments are averaged as FedAvg does."""

from __future__ import annotations

from common.models import AdapterState
from server.aggregate import weighted_mean
from server.releases.base import Release


class FedAvgRound:
    """FedAvg's round sum: weighted by example counts, which only a non-private run sends; a run with
    a sample-level local optimizer sends none (or a reply lacks one) and is averaged with equal weights."""

    def __init__(self, uniform: bool) -> None:
        self.uniform = uniform
        self.replies: list[AdapterState] = []
        self.weights: list[float] = []

    def add(self, reply: AdapterState, weight: int | None = None) -> None:
        self.uniform = self.uniform or weight is None
        self.replies.append(reply)
        self.weights.append(float(weight or 0))

    def release(self) -> tuple[AdapterState, float | None]:
        weights = [1.0] * len(self.replies) if self.uniform else self.weights
        return weighted_mean(self.replies, weights), None


class NoRelease(Release):
    name = "none"

    def round_sum(self, sampled: int) -> FedAvgRound:
        return FedAvgRound(uniform=self.cfg.private)


__all__ = ["FedAvgRound", "NoRelease"]
