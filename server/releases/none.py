"""``none``: no client-level release; increments are averaged as FedAvg does."""

from __future__ import annotations

from collections.abc import Mapping

from common.config import RunConfig
from common.models import AdapterState
from common.privacy.accounting.accountants import Event
from common.privacy.mechanisms.mechanism import ServerHalf
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


class FedAvg(ServerHalf):
    """The server half (common/privacy/mechanisms/mechanism.py ``ServerHalf``) of no client-level release: no
    noise, no clip, no check, no charge, no state (the protocol's no-op defaults); the replies'
    (weighted) mean."""

    def __init__(self, cfg: RunConfig) -> None:
        self.cfg, self.clip = cfg, cfg.clip

    def noise_std(self, sampled: int) -> float:
        return 0.0

    def instruction_clip(self) -> float:
        return 0.0

    def expected(self, sampled: int) -> dict[str, object]:
        return {}

    def reply_shapes(self, shapes: Mapping[str, tuple[int, ...]]) -> dict[str, tuple[int, ...]]:
        return dict(shapes)

    def round_sum(self, sampled: int) -> FedAvgRound:
        return FedAvgRound(uniform=self.cfg.private)

    def events(self, rnd: int) -> tuple[Event, ...]:
        return ()

    def state(self) -> dict[str, float]:
        return {"clip": self.clip}


def no_release(cfg: RunConfig, plan: None) -> Release:
    """The release of a run without client-level noise: :class:`FedAvg` on the server."""
    return Release(cfg, plan, FedAvg(cfg))


__all__ = ["FedAvg", "FedAvgRound", "no_release"]
