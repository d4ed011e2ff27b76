"""μ-GDP (Dong, Roth & Su) as the DR-Encoder paper uses it: closed forms and robust inverses.

Per round the Gaussian mechanism with noise multiplier σ is G_{1/σ}; T rounds with Poisson rate p
compose by the CLT (Bu et al., 2020) to μ = p·sqrt(T·(e^{1/σ²} − 1)); heterogeneous rounds give
μ² = Σ_t p_t²·(e^{1/σ_t²} − 1). (ε, δ) follow from the GDP duality
δ(ε) = Φ(−ε/μ + μ/2) − e^ε·Φ(−ε/μ − μ/2).

Unlike Opacus's ``eps_from_mu`` (brentq on a fixed [0, 500]), the inverses here never fail:
μ → 0 gives ε = 0, large μ expands the bracket, σ = 0 gives ε = ∞.
"""

from __future__ import annotations

import math

from scipy.special import log_ndtr


def round_mu_squared(sigma: float, p: float) -> float:
    """One round's contribution p²·(e^{1/σ²} − 1) to μ²; ∞ when σ = 0."""
    if sigma == 0:
        return math.inf if p > 0 else 0.0
    x = 1.0 / sigma**2
    return p * p * math.expm1(x) if x < 700 else math.inf


def mu_poisson(sigma: float, p: float, rounds: int) -> float:
    """CLT μ of ``rounds`` Poisson-subsampled Gaussian rounds (Opacus ``compute_mu_poisson``)."""
    return math.sqrt(rounds * round_mu_squared(sigma, p))


def delta_for_eps(eps: float, mu: float) -> float:
    """δ(ε) of μ-GDP, computed in log space so that large μ and ε stay finite."""
    if mu == 0:
        return 0.0
    if math.isinf(mu):
        return 1.0
    a = log_ndtr(-eps / mu + mu / 2)
    b = eps + log_ndtr(-eps / mu - mu / 2)
    return max(0.0, math.exp(a) * -math.expm1(b - a)) if a > -745 else 0.0


def eps_for_delta(mu: float, delta: float) -> float:
    """Smallest ε ≥ 0 with δ(ε) ≤ ``delta`` for μ-GDP."""
    if not 0 < delta < 1:
        raise ValueError(f"delta must be in (0, 1), got {delta}")
    if math.isinf(mu):
        return math.inf
    if mu <= 0 or delta_for_eps(0.0, mu) <= delta:
        return 0.0
    hi = max(1.0, mu * mu)
    while delta_for_eps(hi, mu) > delta:
        hi *= 2
        if hi > 1e12:
            return math.inf
    from scipy.optimize import brentq  # lazy: 0.4 s to import, not needed for pld/rdp queries

    return brentq(lambda e: delta_for_eps(e, mu) - delta, 0.0, hi, xtol=1e-12, rtol=1e-14)


def mu_for_eps(eps: float, delta: float) -> float:
    """The μ whose δ(ε) equals ``delta`` (μ* of the calibration); δ(ε) increases with μ."""
    if eps <= 0:
        raise ValueError(f"epsilon must be > 0, got {eps}")
    lo, hi = 0.0, 1.0
    while delta_for_eps(eps, hi) < delta:
        lo, hi = hi, hi * 2
    from scipy.optimize import brentq  # lazy, as above

    return brentq(lambda m: delta_for_eps(eps, m) - delta, lo, hi, xtol=1e-14, rtol=1e-15)


def sigma_for_mu(mu: float, p: float, rounds: int) -> float:
    """Closed form σ = 1/sqrt(ln(1 + μ²/(p²T))), the inverse of :func:`mu_poisson`."""
    return 1.0 / math.sqrt(math.log1p(mu * mu / (p * p * rounds)))
