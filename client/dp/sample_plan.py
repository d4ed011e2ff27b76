"""Sample-level privacy of one client's local DP steps: the noise plan and its ledger charges.

Neighbouring datasets differ by adding or removing one of the client's examples; every step is a
Poisson-subsampled Gaussian mechanism with rate ``q = b/N`` and noise multiplier σ, and the guarantee
covers everything the steps release (every noisy update, hence the trained adapter). σ is calibrated
with the tight accountant (PLD) so that the planned number of steps meets the target (ε, δ).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Sequence
from dataclasses import dataclass, replace

from common.errors import FedloraError
from common.privacy.accounting.accountants import Event
from common.privacy.accounting.calibration import calibrate_sigma, epsilon_for, events_epsilon
from common.privacy.accounting.ledger import Charge
from common.privacy.mechanisms.wishart import WishartEpsilon, wishart_claim, wishart_epsilon, wishart_sigma

log = logging.getLogger("fedlora.client")

#: accountant that calibrates σ (the ledger reports the CLT μ-GDP ε beside it)
SAMPLE_ACCOUNTANT = "pld"


@dataclass(frozen=True)
class SamplePlan:
    """``steps`` DP steps over ``examples`` at rate ``sample_rate`` with clip ``clip`` and noise
    multiplier ``sigma``; ``target_epsilon`` is 0 when σ was given instead of calibrated."""

    examples: int
    sample_rate: float
    steps: int
    clip: float
    sigma: float
    delta: float
    target_epsilon: float
    #: the wishart optimizer's (rank, dim, grad_rank): σ is calibrated for the amplified ε
    projection: tuple[int, int, int] | None = None

    @property
    def expected_batch(self) -> float:
        return self.sample_rate * self.examples

    @property
    def event(self) -> Event:
        return Event(self.sigma, self.sample_rate, self.steps)

    def epsilon(self, accountant: str = SAMPLE_ACCOUNTANT) -> float:
        """ε at ``delta`` after all planned steps."""
        return epsilon_for(accountant, self.sigma, self.sample_rate, self.steps, self.delta)

    @functools.cached_property
    def amplified(self) -> WishartEpsilon | None:
        """The Wishart-amplified ε beside the baseline (None: no random projection). The ledger keeps
        the baseline, which holds whether or not M2's assumptions do."""
        if self.projection is None:
            return None
        return wishart_epsilon(self.sigma, self.sample_rate, self.steps, self.delta, *self.projection)

    def claimed_epsilon(self, assumptions: dict | None = None) -> tuple[float, str]:
        """The ε this plan may claim and why: Wishart-amplified when it has a projection and the run
        met every M2 assumption (``assumptions``: the wishart optimizer's summary), else the PLD ε."""
        amplified = self.amplified
        if amplified is None:
            return self.epsilon(), SAMPLE_ACCOUNTANT
        try:
            wishart_claim(**(assumptions or {}))
        except (FedloraError, TypeError) as exc:  # TypeError: no assumptions reported at all
            return self.epsilon(), f"baseline ({SAMPLE_ACCOUNTANT}): {exc}"
        return amplified.epsilon, f"{amplified.claimed}: {amplified.reason}"

    def charge(self, run: str, rnd: int, count: int, mechanism: str) -> Charge:
        """A ledger row for ``count`` steps (``sampled`` holds N, the population q applies to)."""
        return Charge(
            run=run,
            round=rnd,
            sigma=self.sigma,
            p=self.sample_rate,
            count=count,
            sample_rate=self.sample_rate,
            sampled=self.examples,
            clip=self.clip,
            threat_model="local",
            mechanism=mechanism,
        )


def plan_sample_noise(
    examples: int,
    batch_size: float,
    steps: int,
    clip: float,
    delta: float,
    epsilon: float = 0.0,
    noise_multiplier: float = 0.0,
    projection: tuple[int, int, int] | None = None,
) -> SamplePlan:
    """σ for ``steps`` steps of expected batch ``batch_size`` over ``examples`` examples: the given
    ``noise_multiplier``, or calibrated for ``epsilon`` at ``delta`` (with ``projection`` = the
    wishart optimizer's (rank, dim, grad_rank): for its amplified ε). Warns when δ ≥ 1/N."""
    if examples < 1:
        raise FedloraError("no training examples")
    if steps < 1 or batch_size <= 0:
        raise FedloraError("steps and batch size must be positive")
    if batch_size > examples:
        raise FedloraError(f"expected batch size {batch_size:g} exceeds the {examples} training examples")
    if not (clip > 0):
        raise FedloraError(f"clip must be > 0, got {clip}")
    if not 0 < delta < 1:
        raise FedloraError(f"delta must be in (0, 1), got {delta}")
    if (epsilon > 0) == (noise_multiplier > 0):
        raise FedloraError("give exactly one of a sample-level epsilon and a noise multiplier (both > 0)")
    if delta >= 1.0 / examples:
        log.warning(
            "delta = %.3g >= 1/N = %.3g: such a guarantee allows publishing an example outright; "
            "use delta << 1/N",
            delta,
            1.0 / examples,
        )
    q = batch_size / examples
    if noise_multiplier:
        sigma = noise_multiplier
    elif projection is not None:
        sigma = wishart_sigma(epsilon, q, steps, delta, *projection)
    else:
        sigma = calibrate_sigma(SAMPLE_ACCOUNTANT, epsilon, delta, q, steps)
    return SamplePlan(examples, q, steps, clip, sigma, delta, epsilon, projection)


def replan(plan: SamplePlan, history: Sequence[Event], remaining: int) -> SamplePlan:
    """The plan for the rest of a run whose ledger already holds ``history`` (this run's charges,
    interrupted attempts included) with ``remaining`` steps still to take, this round's included.

    Unchanged when σ was given (no target), when the history is at most what the plan foresaw (its
    steps, each at the plan's σ and rate), or when the history plus ``remaining`` steps at σ still meets the
    target. Otherwise (a round charged, interrupted and run again: its steps were counted twice) σ
    is calibrated again for the remaining steps after the history, so that the run ends at or under
    its target (PLD, composed with the history); a one-line refusal when the history alone spends it.
    Wishart plans are re-planned on their baseline (PLD) ε, which holds whatever M2's assumptions."""
    if not plan.target_epsilon:
        return plan
    if _on_plan(plan, history, remaining):
        return plan
    ahead = (*history, Event(plan.sigma, plan.sample_rate, remaining))
    if _epsilon(ahead, plan.delta) <= plan.target_epsilon * (1 + _TOLERANCE):
        return plan
    try:
        sigma = calibrate_sigma(
            SAMPLE_ACCOUNTANT,
            plan.target_epsilon,
            plan.delta,
            plan.sample_rate,
            remaining,
            prior=tuple(history),
        )
    except ValueError:
        raise FedloraError(
            f"node: this run's sample-level history already spends its target epsilon "
            f"{plan.target_epsilon:g} (a round interrupted and run again); not trained"
        ) from None
    log.warning(
        "this run's sample-level history holds more than its plan (a round interrupted and run again): "
        "noise multiplier %.4g -> %.4g for its %d remaining steps, to end at or under epsilon %g",
        plan.sigma,
        sigma,
        remaining,
        plan.target_epsilon,
    )
    return replace(plan, sigma=max(sigma, plan.sigma))


#: relative: the same composition grouped in other rounds lands on the target up to round-off
_TOLERANCE = 1e-6


def _on_plan(plan: SamplePlan, history: Sequence[Event], remaining: int) -> bool:
    """Whether ``history`` and the ``remaining`` steps are at most the plan's steps, all at its σ and
    rate (a node not asked every round is under its plan: fewer steps of one mechanism, less ε)."""
    return sum(e.count for e in history) + remaining <= plan.steps and all(
        (e.sigma, e.p) == (plan.sigma, plan.sample_rate) for e in history
    )


@functools.lru_cache(maxsize=256)
def _epsilon(events: tuple[Event, ...], delta: float) -> float:
    return events_epsilon(SAMPLE_ACCOUNTANT, events, delta)


__all__ = ["SAMPLE_ACCOUNTANT", "SamplePlan", "plan_sample_noise", "replan"]
