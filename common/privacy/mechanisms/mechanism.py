"""Client-level mechanisms: one object holds both halves of a release (pfl-research's mechanism).

A :class:`Mechanism` says what a client does to its update (:meth:`~Mechanism.privatize`), what
a round asks of the clients (:meth:`~Mechanism.noise_std`, :meth:`~Mechanism.instruction_clip`),
what a usable reply looks like (:meth:`~Mechanism.reply_shapes`, :meth:`~Mechanism.check`), how the
server turns the usable replies into the released mean (:meth:`~Mechanism.round_sum`), what a round
charges the ledger (:meth:`~Mechanism.events`), and what it keeps between rounds (:meth:`~Mechanism.state`).
Its threat model (common/privacy/participation/threat.py) says who adds the noise and what each observer sees.

Wrappers change one concern of any mechanism, as Flower's DP wrappers wrap any strategy and
pfl-research's adaptive clipping wraps a mechanism: :class:`AdaptiveClipping` (the clip-bit, its
noised count and the clip's move, Andrew et al. 2021) wraps :class:`GaussianMechanism`, and
:class:`PostProcessed` (the public-subspace projection) wraps any round sum. A what-if noise cohort
is the plan's (common/privacy/planning/plan.py ``cohort_scale``), not a wrapper: it scales every noise a
mechanism adds (the client's share, the server's σ and the clip count's) while the ledger charges
the unscaled σ, so it belongs where both halves and the charge are sized, as pfl-research keeps it
in the accountant (``PrivacyAccountant.noise_scale``, read as ``cohort_noise_parameter``).

The round interface is a :class:`RoundSum`: the server adds each usable reply to it and asks for the
release once. Nothing else sees the replies one by one, so a mechanism whose server may only learn
the sum (secure aggregation) provides its own :class:`RoundSum`.

Noise comes from generators seeded with OS entropy (common/privacy/mechanisms/release.py): never from the run's seed.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import torch

from common.config import RunConfig
from common.errors import FedloraError
from common.lazy import load_component
from common.models import AdapterState
from common.privacy.accounting.accountants import Event
from common.privacy.mechanisms.adaptive_clip import next_clip
from common.privacy.mechanisms.release import add_noise, clip, global_norm
from common.privacy.participation.threat import ThreatModel
from common.privacy.planning.plan import NoisePlan, plan_noise
from common.privacy.registry import release_kind
from common.wire import CLIP_BIT, InvalidReply

#: central noise: a reply's norm may exceed C by float round-off only (the server clips it again)
CLIP_SLACK = 1e-4


class RoundSum(Protocol):
    """One round's aggregate: usable replies go in one at a time, one released mean comes out."""

    def add(self, reply: AdapterState, weight: int | None = None) -> None:
        """Add one usable (checked) reply; ``weight``: its example count, None where none may be sent."""

    def release(self) -> tuple[AdapterState, float | None]:
        """The released mean, and the noise multiplier it carries (None: no client-level noise)."""


class ServerHalf(Protocol):
    """What the server asks of a release each round (server/releases/base.py ``Release`` is its view):
    every :class:`Mechanism` is one; so is the no-noise FedAvg of a non-private run. A class that
    subclasses it inherits the no-ops (check, restore and the state hooks) it does not override."""

    clip: float

    def noise_std(self, sampled: int) -> float:
        """The noise std each of ``sampled`` clients adds this round."""

    def instruction_clip(self) -> float:
        """The clip a round's instruction names (0: the run config's)."""

    def expected(self, sampled: int) -> dict[str, object]:
        """Reply meta values that must match what the round asked."""

    def reply_shapes(self, shapes: Mapping[str, tuple[int, ...]]) -> dict[str, tuple[int, ...]]:
        """A reply's tensors for an update of ``shapes``."""

    def check(self, reply: AdapterState) -> None:
        """Raise :class:`InvalidReply` for a reply this mechanism must not use (default: none)."""

    def round_sum(self, sampled: int) -> RoundSum:
        """The aggregate of a round that sampled ``sampled`` clients."""

    def events(self, rnd: int) -> tuple[Event, ...]:
        """What round ``rnd`` charges the ledger (before its instructions go out)."""

    def state(self) -> dict[str, float]:
        """What a checkpoint keeps between rounds (JSON numbers)."""

    def restore(self, state: Mapping[str, float]) -> None:
        """Continue from :meth:`state`."""

    # a stateful mechanism (correlated noise, common/privacy/mechanisms/ftrl_mechanism.py) keeps tensor state
    # across rounds apart from the checkpoint; the others inherit these no-ops
    def open_state(self, run_dir: Path, first: int, shapes: Mapping[str, tuple[int, ...]]) -> None:
        """Bind (or, resuming before round ``first``, reload) its state beside the run in ``run_dir``."""

    def before_round(self, rnd: int) -> None:
        """Bring its state to round ``rnd`` (rounds in between had no release)."""

    def close_state(self) -> None:
        """After the run: remove what it kept."""


class Mechanism(ServerHalf, Protocol):
    """One client-level release, both halves (see the module docstring): the server's
    (:class:`ServerHalf`) and the client's."""

    name: str
    plan: NoisePlan

    @property
    def threat(self) -> ThreatModel: ...

    def privatize(self, update: AdapterState, noise_std: float, bound: float) -> tuple[AdapterState, dict]:
        """Client half: what leaves a client for ``update`` in a round of clip ``bound`` and noise share
        ``noise_std``, and the reply meta that says what it applied."""

    def round_clip(self, named: float) -> float:
        """Client half: the C to clip to, given the clip the instruction ``named``."""


class GaussianSum:
    """DP-FedAvg's mean of clipped releases (McMahan et al. 2018), as a running sum.

    ``local`` noise: each release carries all the noise, so the mean is over the replies. ``distributed``
    / ``central``: the sum (plus the server's N(0, σ²C²) under ``central``) over the *expected* number
    of clients p·N, a constant, so one client moves the mean by at most C/(p·N) whatever the others did.
    Under ``central`` noise the server clips every reply to C itself: the sensitivity must not rest on
    the clients' clip.
    """

    def __init__(self, threat: ThreatModel, server_sigma: float, bound: float, expected: float) -> None:
        self.threat, self.server_sigma, self.bound, self.expected = threat, server_sigma, bound, expected
        self.total: AdapterState = {}
        self.count = 0

    def add(self, reply: AdapterState, weight: int | None = None) -> None:
        if self.threat.clear_replies:
            reply = clip(reply, self.bound)[0]
        self.total = {k: self.total[k] + v for k, v in reply.items()} if self.total else dict(reply)
        self.count += 1

    def mean(self) -> AdapterState:
        """The released mean (the server's noise drawn now, under central noise)."""
        if not self.count:
            raise ValueError("no replies to aggregate")
        if self.threat.each_reply_private:
            return {k: t / self.count for k, t in self.total.items()}
        total = (
            add_noise(self.total, self.server_sigma * self.bound) if self.threat.clear_replies else self.total
        )
        return {k: t / self.expected for k, t in total.items()}


def private_mean(
    replies: list[AdapterState], threat: ThreatModel, sigma: float, bound: float, expected: float
) -> AdapterState:
    """:class:`GaussianSum`'s mean of ``replies`` (one call)."""
    total = GaussianSum(threat, sigma, bound, expected)
    for reply in replies:
        total.add(reply)
    return total.mean()


@dataclass
class _GaussianRound:
    """A :class:`RoundSum` of the Gaussian mechanism: the mean and the σ the sum carried."""

    mechanism: GaussianMechanism
    sampled: int
    total: GaussianSum

    def add(self, reply: AdapterState, weight: int | None = None) -> None:
        self.total.add(reply)

    def release(self) -> tuple[AdapterState, float | None]:
        return self.total.mean(), self.mechanism.plan.released_sigma(self.sampled, self.total.count)


class GaussianMechanism(Mechanism):
    """Clip the update's global L2 norm to C, add Gaussian noise where the threat model says
    (DP-FedAvg); common/privacy/planning/plan.py sizes σ. ``expected``: p·N, the constant the sum is divided by."""

    name = "gaussian"

    def __init__(self, plan: NoisePlan, expected: float) -> None:
        self.plan, self.expected_count = plan, expected
        self.clip = plan.clip  # the round's C (a wrapper may move it)

    @property
    def threat(self) -> ThreatModel:
        return self.plan.threat

    def privatize(self, update: AdapterState, noise_std: float, bound: float) -> tuple[AdapterState, dict]:
        return add_noise(clip(update, bound)[0], noise_std), {}

    def noise_std(self, sampled: int) -> float:
        return self.plan.client_std(sampled, self.clip)

    def instruction_clip(self) -> float:
        return 0.0

    def round_clip(self, named: float) -> float:
        return self.plan.clip

    def expected(self, sampled: int) -> dict[str, object]:
        return {"noise-std": self.noise_std(sampled)}

    def reply_shapes(self, shapes: Mapping[str, tuple[int, ...]]) -> dict[str, tuple[int, ...]]:
        return dict(shapes)

    def check(self, reply: AdapterState) -> None:
        if self.threat.clear_replies and (norm := global_norm(reply)) > self.clip * (1 + CLIP_SLACK):
            raise InvalidReply(f"increment norm {norm:.4g} exceeds the clip {self.clip:g}")

    def round_sum(self, sampled: int) -> RoundSum:
        total = GaussianSum(self.threat, self.plan.server_sigma, self.clip, self.expected_count)
        return _GaussianRound(self, sampled, total)

    def events(self, rnd: int) -> tuple[Event, ...]:
        return (self.plan.event,)

    def state(self) -> dict[str, float]:
        return {"clip": self.clip}

    def restore(self, state: Mapping[str, float]) -> None:
        self.clip = float(state.get("clip", self.plan.clip))


class PostProcessed:
    """A round sum whose released mean goes through ``post`` (the public-subspace projection,
    server/public_prior.py): post-processing of a private release, free of privacy cost, so it wraps
    any mechanism's round sum and changes nothing that is charged."""

    def __init__(self, inner: RoundSum, post: Callable[[AdapterState], AdapterState]) -> None:
        self.inner, self.post = inner, post

    def add(self, reply: AdapterState, weight: int | None = None) -> None:
        self.inner.add(reply, weight)

    def release(self) -> tuple[AdapterState, float | None]:
        mean, sigma = self.inner.release()
        return self.post(mean), sigma


def _update(reply: AdapterState) -> AdapterState:
    """A reply's update without adaptive clipping's bit."""
    return {k: v for k, v in reply.items() if k != CLIP_BIT}


class _AdaptiveRound:
    """The inner round's sum of updates, beside the sum of clip-bits; the clip moves on release."""

    def __init__(self, wrapper: AdaptiveClipping, inner: RoundSum, sampled: int) -> None:
        self.wrapper, self.inner, self.sampled = wrapper, inner, sampled
        self.centred = 0.0

    def add(self, reply: AdapterState, weight: int | None = None) -> None:
        # Σ(b − ½): the centred bit moves the sum by ½ whether a client is added or removed
        self.centred += float(reply[CLIP_BIT][0]) - 0.5
        self.inner.add(_update(reply))

    def release(self) -> tuple[AdapterState, float | None]:
        mean, sigma = self.inner.release()
        self.wrapper.move(self.centred, self.sampled)
        return mean, sigma


class AdaptiveClipping:
    """Adaptive clipping around ``inner`` (Andrew et al. 2021; common/privacy/mechanisms/adaptive_clip.py): each
    reply also carries the bit [‖Δ‖ ≤ C] (with its noise share under distributed noise); the server
    noises their centred sum and moves C toward the ``quantile`` at rate ``lr``. The count is part of
    the charged mechanism: the plan's σ covers the pair, the update carries z_Δ."""

    def __init__(self, inner: GaussianMechanism, quantile: float, lr: float) -> None:
        self.inner, self.quantile, self.lr = inner, quantile, lr
        self.name, self.plan = inner.name, inner.plan

    @property
    def threat(self) -> ThreatModel:
        return self.inner.threat

    @property
    def clip(self) -> float:
        return self.inner.clip

    @clip.setter
    def clip(self, value: float) -> None:
        self.inner.clip = value

    def privatize(self, update: AdapterState, noise_std: float, bound: float) -> tuple[AdapterState, dict]:
        norm = global_norm(update)
        sent, meta = self.inner.privatize(update, noise_std, bound)
        plan = self.plan
        # the count's share is sized like the update's: σ_b/sqrt(m) against z_Δ·C/sqrt(m) (distributed
        # noise); no share where the client adds no update noise (central: the server noises the count)
        share = noise_std * plan.count_std / (plan.update_sigma * bound) if noise_std else 0.0
        sent[CLIP_BIT] = add_noise({CLIP_BIT: torch.tensor([float(norm <= bound)])}, share)[CLIP_BIT]
        return sent, {**meta, "clip": bound}

    def noise_std(self, sampled: int) -> float:
        return self.inner.noise_std(sampled)

    def instruction_clip(self) -> float:
        return self.clip

    def round_clip(self, named: float) -> float:
        if named <= 0:
            raise FedloraError("an adaptive-clipping round must name its clip (> 0)")
        return named

    def expected(self, sampled: int) -> dict[str, object]:
        return {**self.inner.expected(sampled), "clip": self.clip}

    def reply_shapes(self, shapes: Mapping[str, tuple[int, ...]]) -> dict[str, tuple[int, ...]]:
        return {**self.inner.reply_shapes(shapes), CLIP_BIT: (1,)}

    def check(self, reply: AdapterState) -> None:
        self.inner.check(_update(reply))
        bit = float(reply[CLIP_BIT][0])
        if self.threat.clear_replies and bit not in (0.0, 1.0):
            raise InvalidReply(f"clip-bit must be 0 or 1 under central noise, got {bit:.4g}")

    def round_sum(self, sampled: int) -> RoundSum:
        return _AdaptiveRound(self, self.inner.round_sum(sampled), sampled)

    def move(self, centred: float, sampled: int) -> None:
        """C ← C·exp(−η(b̄ − γ)) from the noised centred count (K = p·N, never the replies' count)."""
        _, server_std = self.plan.count_stds(sampled)
        noised = float(add_noise({"count": torch.tensor(centred, dtype=torch.float64)}, server_std)["count"])
        expected = self.inner.expected_count
        self.clip = next_clip(self.clip, noised + expected / 2, expected, self.quantile, self.lr)

    def events(self, rnd: int) -> tuple[Event, ...]:
        return self.inner.events(rnd)

    def state(self) -> dict[str, float]:
        return self.inner.state()

    def restore(self, state: Mapping[str, float]) -> None:
        self.inner.restore(state)

    def open_state(self, run_dir: Path, first: int, shapes: Mapping[str, tuple[int, ...]]) -> None:
        self.inner.open_state(run_dir, first, shapes)

    def before_round(self, rnd: int) -> None:
        self.inner.before_round(rnd)

    def close_state(self) -> None:
        self.inner.close_state()


#: builds a release's mechanism from the run's noise plan and configuration
MechanismFactory = Callable[[NoisePlan, RunConfig], Mechanism]


def gaussian_mechanism(plan: NoisePlan, cfg: RunConfig) -> Mechanism:
    """The Gaussian mechanism of ``plan`` (sum divided by p·N), wrapped in adaptive clipping when the
    run asks for it (the ``gaussian`` and ``dr-encoder`` releases: common/privacy/registry.py)."""
    mechanism = GaussianMechanism(plan, cfg.expected_cohort)
    return AdaptiveClipping(mechanism, cfg.target_quantile, cfg.clip_lr) if cfg.adaptive_clip else mechanism


def mechanism_for(plan: NoisePlan, cfg: RunConfig) -> Mechanism:
    """The mechanism of ``cfg``'s release for its noise ``plan`` (its factory in the registry)."""
    return load_component(release_kind(cfg.release_kind).mechanism)(plan, cfg)


def run_mechanism(cfg: RunConfig, dim: int = 0) -> Mechanism | None:
    """The run's client-level mechanism (None without a client-level release): both halves build it
    from the run configuration alone (and the adapter's size ``dim``, which a Skellam plan needs)."""
    plan = plan_noise(cfg, dim)
    return None if plan is None else mechanism_for(plan, cfg)


__all__ = [
    "CLIP_SLACK",
    "AdaptiveClipping",
    "GaussianMechanism",
    "GaussianSum",
    "Mechanism",
    "MechanismFactory",
    "PostProcessed",
    "RoundSum",
    "ServerHalf",
    "gaussian_mechanism",
    "mechanism_for",
    "private_mean",
    "run_mechanism",
]
