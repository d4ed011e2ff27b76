"""``none``: no client-level release; increments are averaged as FedAvg does."""

from __future__ import annotations

from collections.abc import Sequence

from common.models import AdapterState
from server.aggregate import weighted_mean
from server.releases.base import Release


class NoRelease(Release):
    """FedAvg: weighted by example counts, which only a non-private run sends; a run with a
    sample-level local optimizer sends none and is averaged with equal weights."""

    name = "none"

    def aggregate(
        self, increments: Sequence[AdapterState], weights: Sequence[int | None], sampled: int
    ) -> tuple[AdapterState, float | None]:
        uniform = self.cfg.private or any(w is None for w in weights)
        return weighted_mean(increments, [1.0] * len(increments) if uniform else weights), None


__all__ = ["NoRelease"]
