"""Noise multiplier σ for a target (ε, δ) after T rounds at Poisson rate p.

``gdp`` has a closed form (μ* from the GDP duality, then σ = 1/sqrt(ln(1 + μ*²/(p²T))));
``rdp`` and ``pld`` use Brent's method on ε(σ) and return the conservative side: the returned σ
always gives ε(σ) ≤ target under that accountant (``pld`` searches on a coarser grid whose ε is
itself an upper bound, so the fine-grid ε at the returned σ is at or below the target).
``prior`` events (charged before round 1, e.g. a noised statistics round) are composed first.
"""

from __future__ import annotations

from collections.abc import Sequence

from common.privacy.accounting import gdp
from common.privacy.accounting.accountants import Event, PldAccountant, make_accountant

#: accountants whose larger ε every budget decision uses
BUDGET_ACCOUNTANTS = ("gdp", "pld")

#: PLD grid used while searching: 10x coarser, ~10x faster, still a valid (looser) upper bound.
SEARCH_PLD_DISCRETIZATION = 1e-3


def events_epsilon(accountant: str, events: Sequence[Event], delta: float, coarse: bool = False) -> float:
    """ε of ``events`` composed; ``coarse`` uses the search grid for ``pld``."""
    acc = (
        PldAccountant(SEARCH_PLD_DISCRETIZATION)
        if coarse and accountant == "pld"
        else make_accountant(accountant)
    )
    for event in events:
        acc.compose(event)
    return acc.epsilon(delta)


def epsilon_for(
    accountant: str,
    sigma: float,
    p: float,
    rounds: int,
    delta: float,
    coarse: bool = False,
    prior: Sequence[Event] = (),
) -> float:
    """ε after the ``prior`` events and ``rounds`` identical rounds; ``coarse`` uses the search grid
    for ``pld``."""
    return events_epsilon(accountant, (*prior, Event(sigma, p, rounds)), delta, coarse)


def calibrate_sigma(
    accountant: str, epsilon: float, delta: float, p: float, rounds: int, prior: Sequence[Event] = ()
) -> float:
    """Smallest σ (to ~1e-4 relative, never below the true one) with ε(prior, σ) ≤ ``epsilon``."""
    if epsilon <= 0:
        raise ValueError(f"epsilon must be > 0, got {epsilon}")
    if not 0 < delta < 1:
        raise ValueError(f"delta must be in (0, 1), got {delta}")
    if prior and events_epsilon(accountant, prior, delta) >= epsilon:
        raise ValueError(f"the events before round 1 alone spend epsilon {epsilon:g} ({accountant})")
    if accountant == "gdp":
        # μ² composes additively (CLT): the rounds get μ*² minus what the prior spent
        spent = sum(e.count * gdp.round_mu_squared(e.sigma, e.p) for e in prior)
        sigma = gdp.sigma_for_mu((gdp.mu_for_eps(epsilon, delta) ** 2 - spent) ** 0.5, p, rounds)
        return sigma * (1 + 1e-12)  # float round-off must not land on the unsafe side

    def excess(s: float) -> float:
        return epsilon_for(accountant, s, p, rounds, delta, coarse=True, prior=prior) - epsilon

    hi = max(1.0, gdp.sigma_for_mu(gdp.mu_for_eps(epsilon, delta), p, rounds))
    while excess(hi) > 0:
        hi *= 2
        if hi > 1e6:
            raise ValueError("no noise multiplier below 1e6 reaches this epsilon")
    lo = hi / 2
    while excess(lo) <= 0:
        hi, lo = lo, lo / 2
        if lo < 1e-6:
            return hi
    from scipy.optimize import brentq  # lazy: 0.4 s to import, not needed for epsilon queries

    sigma = brentq(excess, lo, hi, xtol=1e-5, rtol=1e-5)
    while excess(sigma) > 0:  # step to the safe side of the root
        sigma *= 1 + 1e-5
    return sigma


__all__ = ["BUDGET_ACCOUNTANTS", "calibrate_sigma", "epsilon_for", "events_epsilon"]
