"""Client-level privacy of a run: the noise plan (fixed or calibrated σ) and the budget stop."""

from __future__ import annotations

from dataclasses import dataclass

from common.config import RunConfig
from common.errors import FedloraError
from common.privacy.accountants import Event
from common.privacy.calibration import calibrate_sigma
from common.privacy.ledger import Ledger

#: accountants whose larger ε every budget decision uses (DESIGN §5)
BUDGET_ACCOUNTANTS = ("gdp", "pld")


@dataclass(frozen=True)
class NoisePlan:
    """Client-level Gaussian release of one run. ``p`` is the rate the accountant may use: the
    sampling rate, or 1 under ``local`` noise (the server knows who was sampled: no amplification)."""

    sigma: float
    p: float
    clip: float
    threat_model: str
    target_epsilon: float  # 0 = no budget
    delta: float
    calibrated: bool

    @property
    def event(self) -> Event:
        return Event(self.sigma, self.p)


def plan_noise(cfg: RunConfig) -> NoisePlan | None:
    """The run's noise plan, or None without a client-level release. With ``noise_multiplier`` 0 and
    a target ε, σ is calibrated so that ``rounds`` rounds meet the target under both accountants."""
    if cfg.release_kind == "none":
        return None
    p = 1.0 if cfg.threat_model == "local" else cfg.sample_rate
    sigma, calibrated = cfg.noise_multiplier, False
    if sigma == 0:
        try:
            sigma = max(
                calibrate_sigma(name, cfg.target_epsilon, cfg.delta, p, cfg.rounds)
                for name in BUDGET_ACCOUNTANTS
            )
        except ValueError as exc:
            raise FedloraError(f"cannot calibrate the noise: {exc}") from None
        calibrated = True
    return NoisePlan(sigma, p, cfg.clip, cfg.threat_model, cfg.target_epsilon, cfg.delta, calibrated)


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
