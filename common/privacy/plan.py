"""Client-level privacy of a run: the noise plan, the noise each client adds, the ε the run plans,
and the budget stop. The server (server/federation.py) and a data owner's node (client/node/policy.py)
judge a run by this one plan.

Distributed noise is sized for the fewest replies a round may be applied with: each of the K
sampled clients adds N(0, σ²C²/m) with m = min(min-replies, K), so every applied round's sum
carries at least σ (dropouts can only add noise), and the planned σ is what the ledger charges.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

from common.config import RunConfig
from common.errors import FedloraError
from common.privacy.accountants import Event
from common.privacy.calibration import calibrate_sigma, events_epsilon
from common.privacy.ledger import Ledger
from common.privacy.threat import CLIENT_LEVEL, Guarantee

#: accountants whose larger ε every budget decision uses
BUDGET_ACCOUNTANTS = ("gdp", "pld")
STATS_ROUND = 0  # the DR-Encoder statistics round's row in the client-level ledger


@dataclass(frozen=True)
class NoisePlan:
    """Client-level Gaussian release of one run. ``p`` is the rate the accountant may use: the
    sampling rate, or 1 where the observer knows who was sampled (``local`` noise). ``prior``:
    events charged before round 1 (the DR-Encoder statistics round, when noised)."""

    sigma: float
    p: float
    clip: float
    threat_model: str
    target_epsilon: float  # 0 = no budget
    delta: float
    calibrated: bool
    min_replies: int = 1
    prior: tuple[Event, ...] = ()

    @property
    def event(self) -> Event:
        return Event(self.sigma, self.p)

    @property
    def guarantee(self) -> Guarantee:
        return CLIENT_LEVEL[self.threat_model]

    def shares(self, sampled: int) -> int:
        """m = min(min-replies, K): the replies a distributed-noise share is sized for."""
        return max(1, min(self.min_replies, sampled))

    def client_std(self, sampled: int) -> float:
        """Noise std one of ``sampled`` clients adds to its clipped increment."""
        if self.threat_model == "local":
            return self.sigma * self.clip
        if self.threat_model == "distributed":
            return self.sigma * self.clip / math.sqrt(self.shares(sampled))
        return 0.0  # central: the server adds it

    def released_sigma(self, sampled: int, replied: int) -> float:
        """Noise multiplier of the sum of ``replied`` releases; at least σ once replied ≥ m."""
        if self.threat_model == "distributed":
            return self.sigma * math.sqrt(replied / self.shares(sampled))
        return self.sigma

    def planned_epsilon(self, rounds: int) -> float:
        """The larger ε of :data:`BUDGET_ACCOUNTANTS` after the prior events and ``rounds`` rounds,
        capped by the target (the server stops before exceeding it)."""
        events = [*self.prior, Event(self.sigma, self.p, rounds)]
        eps = max(events_epsilon(name, events, self.delta) for name in BUDGET_ACCOUNTANTS)
        return min(eps, self.target_epsilon) if self.target_epsilon > 0 else eps


def statistics_events(cfg: RunConfig) -> tuple[Event, ...]:
    """The DR-Encoder statistics round as a client-level event (every connected client, local
    noise: p = 1), or nothing when there is none or it is sent in the clear (see :func:`uncovered`)."""
    if cfg.release_kind == "dr-encoder" and cfg.stats_noise_multiplier > 0:
        return (Event(cfg.stats_noise_multiplier, 1.0, 1),)
    return ()


def uncovered(cfg: RunConfig) -> list[tuple[int, str]]:
    """``(round, what)`` for client data a run releases outside its client-level guarantee (empty
    for most runs); round 0 is the statistics round."""
    if cfg.release_kind == "dr-encoder" and cfg.stats_noise_multiplier == 0:
        return [
            (
                STATS_ROUND,
                "DR-Encoder statistics sent in the clear (mean and std of every connected client's "
                "local increment per LoRA factor, as in the paper)",
            )
        ]
    return []


@lru_cache(maxsize=8)
def plan_noise(cfg: RunConfig) -> NoisePlan | None:
    """The run's noise plan, or None without a client-level release. With ``noise_multiplier`` 0 and
    a target ε, σ is calibrated so that the statistics round (if noised) and ``rounds`` rounds meet
    the target under both accountants. Cached per configuration (a node checks it every round)."""
    if cfg.release_kind == "none":
        return None
    p = cfg.sample_rate if CLIENT_LEVEL[cfg.threat_model].amplified else 1.0
    prior = statistics_events(cfg)
    sigma, calibrated = cfg.noise_multiplier, False
    if sigma == 0:
        try:
            sigma = max(
                calibrate_sigma(name, cfg.target_epsilon, cfg.delta, p, cfg.rounds, prior=prior)
                for name in BUDGET_ACCOUNTANTS
            )
        except ValueError as exc:
            raise FedloraError(f"cannot calibrate the noise: {exc}") from None
        calibrated = True
    return NoisePlan(
        sigma,
        p,
        cfg.clip,
        cfg.threat_model,
        cfg.target_epsilon,
        cfg.delta,
        calibrated,
        cfg.min_replies,
        prior,
    )


def budget_stop(ledger: Ledger, plan: NoisePlan) -> str | None:
    """Why the next round must not run (its charge would exceed the budget), or None."""
    if plan.target_epsilon <= 0:
        return None
    spent = ledger.spent(plan.event)
    worst = max(spent["eps_gdp"], spent["eps_tight"])
    if worst <= plan.target_epsilon:
        return None
    return (
        f"client-level budget reached: one more round would spend epsilon {worst:.4g} "
        f"(gdp {spent['eps_gdp']:.4g}, pld {spent['eps_tight']:.4g}) > {plan.target_epsilon:g} "
        f"at delta {plan.delta:g}"
    )


__all__ = [
    "BUDGET_ACCOUNTANTS",
    "STATS_ROUND",
    "NoisePlan",
    "budget_stop",
    "plan_noise",
    "statistics_events",
    "uncovered",
]
