"""The Skellam mechanism (Agarwal, Kairouz & Liu 2021): a client-level release whose both halves work
on integers, so that a transport which sums integer vectors modulo 2^b (SecAgg+: client/secure.py,
server/secure_round.py, common/secagg/) carries it knowing nothing of its noise, as TFF keeps its
DP query (DDGauss, Skellam) apart from the secure-sum factory.

Client half (:meth:`SkellamMechanism.privatize`): the update clipped to C, scaled, rotated, rounded
to an integer vector of norm ≤ Δ2, plus this client's Skellam share μ/m, mod 2^b (common/privacy/
discrete.py). Server half (:class:`SkellamSum`): the sum mod 2^b of such vectors (added one at a
time, or as the one sum a secure transport reveals) decoded back to the sum of the clipped updates
plus the summed noise, over the expected cohort p·N. Its planning is the run's noise plan, whose
family is common/privacy/planning/secure_plan.py's ``SecurePlan`` (σ the Gaussian equivalent, μ, Δ2, b).

The flat vector is every tensor of the adapter flattened in sorted-name order (the same order on
every node and the server). The rotation signs come from the round's public seed, which the server
draws fresh for every round and sends with the transport's parameters: public randomness, the same
for everyone, so it need not be secret (:meth:`SkellamMechanism.for_round` binds a round's seed and
the adapter's shapes).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np
import torch

from common.config import RunConfig
from common.errors import FedloraError
from common.models import AdapterState
from common.privacy.accounting.accountants import SkellamEvent
from common.privacy.mechanisms import discrete
from common.privacy.mechanisms.mechanism import GaussianMechanism, RoundSum
from common.privacy.planning.plan import NoisePlan, planned_for_target
from common.privacy.planning.secure_plan import IntegerFormat, SecurePlan, run_secure_plan
from common.wire import InvalidReply

_SIGNS = b"fedlora-dp/secure-release/rotation/"
#: the one tensor of a Skellam reply: its words mod 2^b, int64 (padded D,)
WORDS = "words"


class SkellamMechanism(GaussianMechanism):
    """Skellam noise on the clipped update's integer encoding. What it shares with the Gaussian
    mechanism is its planning (noise std asked of a round, the charge, the clip kept in a
    checkpoint); its release and its sum are integers. ``public_seed`` and ``shapes`` (a round's,
    :meth:`for_round`) are needed to encode or decode. Every update, a zero one included (a hidden coin
    that did not come up), is encoded with the same work (clip, rotation, rounding, share), so that the
    time it takes does not show which it was."""

    name = "skellam"

    def __init__(
        self,
        plan: NoisePlan,
        expected: float,
        public_seed: bytes = b"",
        shapes: Mapping[str, tuple[int, ...]] | None = None,
    ) -> None:
        super().__init__(plan, expected)
        if not isinstance(plan.family, SecurePlan):
            raise FedloraError("the skellam release needs a secure-aggregation plan (its Skellam numbers)")
        self.secure: SecurePlan = plan.family
        self.public_seed, self.shapes = public_seed, dict(shapes or {})
        if (
            shapes is not None
            and (size := sum(math.prod(s) for s in self.shapes.values())) != self.secure.dim
        ):
            raise ValueError(f"the adapter has {size} coordinates, the plan is for {self.secure.dim}")

    def for_round(self, public_seed: bytes, shapes: Mapping[str, tuple[int, ...]]) -> SkellamMechanism:
        """This mechanism bound to a round's public seed (its rotation) and the adapter's ``shapes``."""
        return SkellamMechanism(self.plan, self.expected_count, public_seed, shapes)

    @property
    def words(self) -> IntegerFormat:
        """What its releases ask of a transport (:class:`IntegerFormat`)."""
        p = self.secure
        return IntegerFormat(p.bits, p.padded, p.min_survivors, p.cohort, p.neighbours, p.threshold)

    def round_checks(self, bits: int, length: int, noise_std: float) -> tuple[tuple[bool, str], ...]:
        """Client: (holds, why not) of a round's words against this plan's, and of its named share
        against the one this node adds (from its own plan); the transport refuses on the first that
        fails (client/secure.py ``check_params``)."""
        p = self.secure
        return (
            (bits == p.bits, f"{bits} bits per coordinate: the plan's are {p.bits}"),
            (length == p.padded, f"{length} coordinates: the plan's are {p.padded}"),
            (
                math.isclose(noise_std, p.share_std, rel_tol=1e-9),
                f"noise share std {noise_std:.6g}: the plan's is {p.share_std:.6g}",
            ),
        )

    def released_event(self, survivors: int) -> SkellamEvent:
        """The charge of a sum of ``survivors`` shares: Skellam noise of variance r·μ/m at the plan's
        sample rate (1, or each client's hidden coin)."""
        p = self.secure
        return SkellamEvent(math.sqrt(survivors * p.share_variance) / p.l2, p.sample_rate, 1, p.l1, p.l2)

    def signs(self) -> torch.Tensor:
        """The round's rotation signs (D,), from its public seed."""
        if not self.public_seed:
            raise ValueError("a Skellam release needs its round's public seed (for_round)")
        return discrete.rotation_signs(_SIGNS + self.public_seed, self.secure.dim)

    def privatize(self, update: AdapterState, noise_std: float, bound: float) -> tuple[AdapterState, dict]:
        """``update`` clipped to C, scaled, rotated, rounded to ‖z‖ ≤ Δ2, plus this client's Skellam
        share μ/m (the plan's: ``noise_std`` was checked against it, :meth:`round_checks`), mod 2^b:
        ``{WORDS: int64 (D,)}`` in [0, 2^b)."""
        if set(update) != set(self.shapes):
            raise ValueError("the update's tensors are not the plan's adapter")
        if not math.isclose(bound, self.secure.clip):
            raise ValueError(f"a Skellam release clips to its plan's C {self.secure.clip:g}, not {bound:g}")
        flat = torch.cat([update[name].reshape(-1).to(torch.float64) for name in sorted(self.shapes)])
        p = self.secure
        words = discrete.encode(flat, p.clip, p.scale, self.signs(), p.l2, p.share_variance, p.bits)
        return {WORDS: torch.from_numpy(np.asarray(words, dtype=np.int64))}, {}

    def reply_shapes(self, shapes: Mapping[str, tuple[int, ...]]) -> dict[str, tuple[int, ...]]:
        return {WORDS: (self.secure.padded,)}

    def check(self, reply: AdapterState) -> None:
        words = reply.get(WORDS)
        if words is None or set(reply) != {WORDS} or tuple(words.shape) != (self.secure.padded,):
            raise InvalidReply(f"a Skellam reply is {self.secure.padded} words, nothing else")
        if words.dtype != torch.int64 or int(words.min()) < 0 or int(words.max()) >= 1 << self.secure.bits:
            raise InvalidReply(f"a Skellam reply's words are integers in [0, 2^{self.secure.bits})")

    def round_sum(self, sampled: int) -> SkellamSum:
        return SkellamSum(self)

    def decode(self, total: np.ndarray) -> AdapterState:
        """Server: the sum Σ privatize(...) mod 2^b (D,) -> the sum of the clipped updates plus the
        summed noise, divided by the expected cohort p·N (a constant), as an adapter state. Raises
        OverflowError, never decodes silently, when the sum left the plan's limit."""
        p = self.secure
        flat = discrete.decode(
            np.asarray(total).astype(np.uint64), p.bits, self.signs(), p.dim, p.scale, p.limit
        )
        names = sorted(self.shapes)
        parts = (
            (flat / self.expected_count).to(torch.float32).split([math.prod(self.shapes[n]) for n in names])
        )
        return {n: part.reshape(self.shapes[n]).clone() for n, part in zip(names, parts, strict=True)}


class SkellamSum(RoundSum):
    """A round's sum of Skellam releases mod 2^b: replies one at a time (:meth:`add`) or the sum a
    secure transport revealed (:meth:`add_sum`); released decoded, with the σ of the shares summed."""

    def __init__(self, mechanism: SkellamMechanism) -> None:
        self.mechanism, self.count = mechanism, 0
        self.total = np.zeros(mechanism.secure.padded, dtype=np.uint64)

    def add(self, reply: AdapterState, weight: int | None = None) -> None:
        self.add_sum(reply[WORDS].numpy(), 1)

    def add_sum(self, total: np.ndarray, count: int) -> None:
        """Add the sum mod 2^b of ``count`` replies (what a secure transport unmasks)."""
        self.total = discrete.modular_sum([self.total, np.asarray(total)], self.mechanism.secure.bits)
        self.count += count

    def release(self) -> tuple[AdapterState, float | None]:
        if not self.count:
            raise ValueError("no replies to aggregate")
        return self.mechanism.decode(self.total), self.mechanism.released_event(self.count).sigma


def skellam_noise(cfg: RunConfig, dim: int) -> NoisePlan:
    """The Skellam release's plan (secure aggregation's, common/privacy/planning/secure_plan.py): σ the
    Gaussian equivalent of its Skellam noise, p = 1 (the server sees who takes part; the sample rate
    with hidden participation), calibrated by construction to the target over the participation cap."""
    if dim < 1:
        raise FedloraError("a secure-aggregation plan needs the adapter's size (its coordinates)")
    try:
        secure = run_secure_plan(cfg, dim)
    except ValueError as exc:  # the accountant's: no variance reaches the target
        raise FedloraError(f"cannot plan the secure-aggregation noise: {exc}") from None
    return planned_for_target(cfg, secure.sigma, secure.sample_rate, family=secure)


def skellam_mechanism(plan: NoisePlan, cfg: RunConfig) -> SkellamMechanism:
    """The Skellam release of ``plan`` (the ``skellam`` release kind: common/privacy/registry.py)."""
    return SkellamMechanism(plan, cfg.expected_cohort)


__all__ = ["WORDS", "SkellamMechanism", "SkellamSum", "skellam_mechanism", "skellam_noise"]
