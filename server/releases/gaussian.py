"""``gaussian``: each client's increment clipped to C and noised as the threat model says
(DP-FedAvg, McMahan et al. 2018); common/privacy/plan.py sizes the noise. With adaptive clipping
(Andrew et al. 2021) each reply also carries ``clip-bit``, [‖Δ‖ ≤ C] (plus a noise share under
distributed noise); the server noises their sum and moves C toward the target quantile."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
from flwr.serverapp import Grid

from common.models import AdapterState
from common.privacy.adaptive_clip import next_clip
from common.privacy.release import add_noise, global_norm
from common.wire import CLIP_BIT, InvalidReply
from server.aggregate import private_mean
from server.releases.base import Release, RunHandles

#: central noise: a reply's norm may exceed C by float round-off only (the server clips it again)
CLIP_SLACK = 1e-4


def split_clip_bit(increment: AdapterState) -> tuple[AdapterState, torch.Tensor | None]:
    """A reply's update without its adaptive-clipping bit, and the bit (None when absent)."""
    return {k: v for k, v in increment.items() if k != CLIP_BIT}, increment.get(CLIP_BIT)


class GaussianRelease(Release):
    name = "gaussian"

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
        return self.plan.client_std(sampled, self.clip)

    def expected(self, sampled: int) -> dict[str, object]:
        extra = {"clip": self.clip} if self.cfg.adaptive_clip else {}
        return {**super().expected(sampled), **extra}

    def reply_shapes(self, shapes: Mapping[str, tuple[int, ...]]) -> dict[str, tuple[int, ...]]:
        return {**shapes, CLIP_BIT: (1,)} if self.cfg.adaptive_clip else dict(shapes)

    def check(self, increment: AdapterState) -> None:
        update, _ = split_clip_bit(increment)
        if self.plan.threat.clear_replies and global_norm(update) > self.clip * (1 + CLIP_SLACK):
            raise InvalidReply(f"increment norm {global_norm(update):.4g} exceeds the clip {self.clip:g}")
        if self.cfg.adaptive_clip and self.plan.threat.clear_replies:
            bit = float(increment[CLIP_BIT][0])
            if bit not in (0.0, 1.0):
                raise InvalidReply(f"clip-bit must be 0 or 1 under central noise, got {bit:.4g}")

    def aggregate(
        self, increments: Sequence[AdapterState], weights: Sequence[int | None], sampled: int
    ) -> tuple[AdapterState, float | None]:
        updates, bits = zip(*map(split_clip_bit, increments), strict=True)
        mean = self.mean(updates)
        if self.cfg.adaptive_clip:
            self._move_clip(bits, sampled)
        return mean, self.plan.released_sigma(sampled, len(increments))

    def mean(self, increments: Sequence[AdapterState]) -> AdapterState:
        """The DP-FedAvg mean of the clipped, noised releases (the server's noise: central only)."""
        plan = self.plan
        return private_mean(increments, plan.threat, plan.server_sigma, self.clip, self.expected_count)

    def _move_clip(self, bits: Sequence[torch.Tensor | None], sampled: int) -> None:
        """C ← C·exp(−η(b̄ − γ)) from the noised count of unclipped replies (Andrew et al. 2021)."""
        _, server_std = self.plan.count_stds(sampled)
        # Σ(b − ½) + N(0, σ_b²) + K/2: the centred bit moves the sum by ½ whether a client is added
        # or removed (the sensitivity the composition assumes); K = p·N, never the replies' count
        centred = sum(float(b[0]) - 0.5 for b in bits if b is not None)
        noised = float(add_noise({"count": torch.tensor(centred, dtype=torch.float64)}, server_std)["count"])
        count = noised + self.expected_count / 2
        cfg = self.cfg
        self.clip = next_clip(self.clip, count, self.expected_count, cfg.target_quantile, cfg.clip_lr)

    @property
    def expected_count(self) -> float:
        """p·N, the constant the noised sum is divided by (one client moves the mean by ≤ C/(p·N))."""
        return self.cfg.expected_cohort


__all__ = ["GaussianRelease"]
