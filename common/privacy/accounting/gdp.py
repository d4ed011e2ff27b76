"""μ-GDP (Dong, Roth & Su) as the DR-Encoder paper uses it: closed forms and robust inverses.

Per round the Gaussian mechanism with noise multiplier σ is G_{1/σ}; T rounds with Poisson rate p
compose by the CLT (Bu et al., 2020) to μ = p·sqrt(T·(e^{1/σ²} − 1)); heterogeneous rounds give
μ² = Σ_t p_t²·(e^{1/σ_t²} − 1). (ε, δ) follow from the GDP duality
δ(ε) = Φ(−ε/μ + μ/2) − e^ε·Φ(−ε/μ − μ/2).

Unlike Opacus's ``eps_from_mu`` (brentq on a fixed [0, 500]), the inverses here never fail:
μ → 0 gives ε = 0, the bracket follows μ, and ε = ∞ only where ε is beyond float range
(σ = 0, or σ so small that μ² overflows); δ(ε) is evaluated without forming e^ε.
"""

from __future__ import annotations

import math

from scipy.special import erfcx, log_ndtr, ndtri

_LOG_MAX = math.log(1.7976931348623157e308)
_SQRT_HALF = math.sqrt(0.5)


def round_mu_squared(sigma: float, p: float) -> float:
    """One round's contribution p²·(e^{1/σ²} − 1) to μ²; ∞ when σ = 0 or when it overflows."""
    if sigma == 0:
        return math.inf if p > 0 else 0.0
    x = (1.0 / sigma) * (1.0 / sigma)  # ∞ or 0 past the float range, where sigma**2 would raise
    if x < 700:
        return p * p * math.expm1(x)
    # e^x alone overflows; a small p can still bring p²·e^x back into range
    log_mu2 = 2 * math.log(p) + x + math.log1p(-math.exp(-x))
    return math.exp(log_mu2) if log_mu2 < _LOG_MAX else math.inf


def mu_poisson(sigma: float, p: float, rounds: int) -> float:
    """CLT μ of ``rounds`` Poisson-subsampled Gaussian rounds (Opacus ``compute_mu_poisson``)."""
    return math.sqrt(rounds * round_mu_squared(sigma, p))


def _log_half_erfcx(u: float) -> float:
    """log(erfcx(u/√2) / 2) for u ≥ 0: Φ(−u) = e^{−u²/2}·erfcx(u/√2)/2 without the e^{−u²/2}."""
    return math.log(0.5 * erfcx(u * _SQRT_HALF)) if u < math.inf else -math.inf


def delta_for_eps(eps: float, mu: float) -> float:
    """δ(ε) = Φ(−y) − e^ε·Φ(−x) of μ-GDP, where y = ε/μ − μ/2 and x = y + μ.

    Since e^ε·φ(x) = φ(y), both terms are φ(y) times a Mills ratio, so e^ε is never formed and
    the difference keeps its relative accuracy for any μ and ε (the naive form overflows, or
    cancels to noise, once ε is in the hundreds)."""
    if math.isinf(mu):
        return 1.0
    if mu == 0 or eps == math.inf:
        return 0.0
    y, x = eps / mu - mu / 2, eps / mu + mu / 2
    if eps < 0:  # outside the accountants' use; the textbook form is accurate here
        a, b = float(log_ndtr(-y)), eps + float(log_ndtr(-x))
        return min(1.0, math.exp(a) * -math.expm1(min(0.0, b - a)))
    if y > 0:  # δ = e^{−y²/2}·(erfcx(y/√2) − erfcx(x/√2))/2
        log_upper = _log_half_erfcx(y)
        log_delta_max = -0.5 * y * y + log_upper  # log Φ(−y)
        if log_delta_max < -746:  # below the smallest subnormal
            return 0.0
        return math.exp(log_delta_max) * -math.expm1(min(0.0, _log_half_erfcx(x) - log_upper))
    # y ≤ 0 ≤ x: δ = P(y < Z < x) − (e^ε − 1)·Φ(−x), no cancellation in the first term
    inside = 0.5 * (math.erf(x * _SQRT_HALF) - math.erf(y * _SQRT_HALF))
    log_excess = -0.5 * y * y + _log_half_erfcx(x) + (math.log(-math.expm1(-eps)) if eps > 0 else -math.inf)
    return min(1.0, max(0.0, inside - math.exp(log_excess)))


def eps_for_delta(mu: float, delta: float) -> float:
    """Smallest ε ≥ 0 with δ(ε) ≤ ``delta`` for μ-GDP; ∞ when that ε is beyond float range."""
    if not 0 < delta < 1:
        raise ValueError(f"delta must be in (0, 1), got {delta}")
    if math.isinf(mu):
        return math.inf
    if mu <= 0 or delta_for_eps(0.0, mu) <= delta:
        return 0.0
    # δ(ε) ≤ Φ(−y), so y = Φ⁻¹(1 − δ/2) (ε = μ·(y + μ/2)) is past the root; doubling only guards
    # against round-off in y = ε/μ − μ/2 when μ is astronomically large
    hi = mu * (mu / 2 - float(ndtri(delta / 2)))
    while hi < math.inf and delta_for_eps(hi, mu) > delta:
        hi *= 2
    if hi == math.inf:
        return math.inf
    from scipy.optimize import brentq  # lazy: 0.4 s to import, not needed for pld/rdp queries

    def excess(e: float) -> float:
        return delta_for_eps(e, mu) - delta

    return brentq(excess, 0.0, hi, xtol=1e-12, rtol=1e-14, maxiter=1000)


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
