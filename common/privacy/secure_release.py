"""An adapter increment through secure aggregation: the client encodes it to integers mod 2^b
(common/privacy/discrete.py) with the numbers of its run's :class:`~common.privacy.secure_plan.SecurePlan`;
the server decodes the unmasked sum (common/secagg/) back to an increment.

The flat vector is every tensor of the adapter flattened in sorted-name order (the same order on
every node and the server). The rotation signs come from the round's public seed, which the server
draws fresh for every round and sends with the protocol's parameters: public randomness, the same
for everyone, so it need not be secret.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import torch

from common.models import AdapterState
from common.privacy import discrete
from common.privacy.secure_plan import SecurePlan

_SIGNS = b"fedlora-dp/secure-release/rotation/"


@dataclass(frozen=True)
class SecureRelease:
    """``plan``: the run's release numbers; ``shapes``: name -> shape of the adapter's tensors,
    whose sizes add up to ``plan.dim``."""

    plan: SecurePlan
    shapes: Mapping[str, tuple[int, ...]]

    def __post_init__(self) -> None:
        size = sum(math.prod(s) for s in self.shapes.values())
        if size != self.plan.dim:
            raise ValueError(f"the adapter has {size} coordinates, the plan is for {self.plan.dim}")

    def signs(self, public_seed: bytes) -> torch.Tensor:
        """The round's rotation signs (D,), from its public seed."""
        return discrete.rotation_signs(_SIGNS + public_seed, self.plan.dim)

    def encode(self, update: AdapterState, public_seed: bytes) -> np.ndarray:
        """Client: ``update`` clipped to C, scaled, rotated, rounded to ‖z‖ ≤ Δ2, plus this client's
        Skellam share μ/m, mod 2^b: int64 (D,) in [0, 2^b)."""
        if set(update) != set(self.shapes):
            raise ValueError("the update's tensors are not the plan's adapter")
        flat = torch.cat([update[name].reshape(-1).to(torch.float64) for name in sorted(self.shapes)])
        p = self.plan
        return discrete.encode(
            flat, p.clip, p.scale, self.signs(public_seed), p.l2, p.share_variance, p.bits
        ).astype(np.int64)

    def decode(self, total: np.ndarray, public_seed: bytes, divide_by: float) -> AdapterState:
        """Server: the unmasked sum Σ encode(...) mod 2^b (D,) -> the sum of the clipped updates plus
        the summed noise, divided by ``divide_by`` (the expected cohort, a constant), as an adapter
        state. Raises OverflowError, never decodes silently, when the sum left the plan's limit."""
        p = self.plan
        flat = discrete.decode(
            np.asarray(total).astype(np.uint64), p.bits, self.signs(public_seed), p.dim, p.scale, p.limit
        )
        names = sorted(self.shapes)
        parts = (flat / divide_by).to(torch.float32).split([math.prod(self.shapes[n]) for n in names])
        return {n: part.reshape(self.shapes[n]).clone() for n, part in zip(names, parts, strict=True)}


__all__ = ["SecureRelease"]
