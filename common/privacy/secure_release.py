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

from common.errors import FedloraError
from common.models import AdapterState
from common.privacy import discrete
from common.privacy.accountants import SkellamEvent
from common.privacy.secure_plan import SecurePlan, round_graph
from common.secagg.protocol import Params

_SIGNS = b"fedlora-dp/secure-release/rotation/"


@dataclass(frozen=True)
class SecureRelease:
    """``plan``: the run's release numbers; ``shapes``: name -> shape of the adapter's tensors,
    whose sizes add up to ``plan.dim``. Every update, a zero one included (a hidden coin that did
    not come up), is encoded with the same work (clip, rotation, rounding, share), so that the time
    it takes does not show which it was."""

    plan: SecurePlan
    shapes: Mapping[str, tuple[int, ...]]

    def __post_init__(self) -> None:
        size = sum(math.prod(s) for s in self.shapes.values())
        if size != self.plan.dim:
            raise ValueError(f"the adapter has {size} coordinates, the plan is for {self.plan.dim}")

    @property
    def noise_std(self) -> float:
        """Std of each client's Skellam share, in units of the update (√(μ/m) / s)."""
        return self.plan.share_std

    def params(self, rnd: int, sampled: tuple[int, ...], public_seed: bytes, run_id: int = 0) -> Params:
        """Server: round ``rnd`` of run ``run_id``'s protocol parameters for the ``sampled`` nodes
        (their words are the padded rotation's D coordinates of b bits; the graph from
        :func:`round_graph`)."""
        k, t = round_graph(self.plan, len(sampled))
        return Params(
            rnd, tuple(sorted(sampled)), k, t, self.plan.bits, self.plan.padded, public_seed, run_id
        ).validate()

    def check_params(self, params: Params, node: int, noise_std: float) -> None:
        """Client: refuse, in one line and before anything is trained or sent, a round whose protocol
        parameters are not this plan's: the node among the round's nodes, at most the cohort bound, the
        neighbours and threshold of :func:`round_graph`, the plan's bits and length, and the share
        the instruction names equal to the one this node adds (which it takes from its own plan)."""
        p, n = self.plan, len(params.node_ids)
        graph = round_graph(p, n)
        checks = (
            (node in params.node_ids, f"this node ({node}) is not among the round's {n} nodes"),
            (n <= p.cohort, f"{n} nodes exceed the plan's cohort bound {p.cohort}"),
            (
                n >= p.min_survivors,
                f"{n} nodes < min-replies {p.min_survivors}: no sum of theirs carries the planned noise",
            ),
            (
                n < 2 or (params.k, params.threshold) == graph,
                f"k {params.k}, t {params.threshold}: the plan's are {graph}",
            ),
            (params.bits == p.bits, f"{params.bits} bits per coordinate: the plan's are {p.bits}"),
            (params.length == p.padded, f"{params.length} coordinates: the plan's are {p.padded}"),
            (
                math.isclose(noise_std, self.noise_std, rel_tol=1e-9),
                f"noise share std {noise_std:.6g}: the plan's is {self.noise_std:.6g}",
            ),
        )
        for ok, why in checks:
            if not ok:
                raise FedloraError(f"node policy: secure aggregation: {why}; nothing sent")

    def released_event(self, survivors: int) -> SkellamEvent:
        """The charge of a sum of ``survivors`` shares: Skellam noise of variance r·μ/m at the plan's
        sample rate (1, or each client's hidden coin)."""
        p = self.plan
        return SkellamEvent(math.sqrt(survivors * p.share_variance) / p.l2, p.sample_rate, 1, p.l1, p.l2)

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
