"""Rényi DP of the distributed Skellam mechanism (Agarwal, Kairouz & Liu, NeurIPS 2021, arXiv 2110.04995).

Parametrisation. ``Sk(μ)`` here is the symmetric Skellam Pois(μ/2) − Pois(μ/2): mean 0, variance μ,
pmf ``P(k) = e^{−μ}·I_|k|(μ)`` (I the modified Bessel function). The paper writes Sk(μ, μ) =
Pois(μ) − Pois(μ), variance 2μ; its μ is half of ours. Independent Skellams add: n client shares of
variance μ/n sum to exactly Sk(μ), so the accounting is exact for whichever clients' shares are in
the sum (pass the variance of the shares that were actually summed: dropouts lower μ and raise ε).

Mechanism. An integer query f (a client's scaled, rotated, conditionally rounded update; see
common/privacy/discrete.py) with L1 sensitivity Δ1 and L2 sensitivity Δ2, released as f + Sk(μ)^d.
Agarwal et al. (arXiv 2110.04995, the d-dimensional Skellam RDP bound, Theorem 3.5 in the
numbering we could trace; their notation, variance 2μ_p) give, for α > 1,

    ε(α) ≤ αΔ2²/(4μ_p) + min(((2α − 1)Δ2² + 6Δ1)/(16μ_p²), 3Δ1/(4μ_p)),

which with our μ = 2μ_p is :func:`skellam_rdp`:
``αΔ2²/(2μ) + min(((2α − 1)Δ2² + 6Δ1)/(4μ²), 3Δ1/(2μ))``. The first term is the Gaussian RDP at
variance μ; the second vanishes as μ → ∞. tests/common/privacy/test_skellam.py checks the bound
against the exact Rényi divergence between shifted Skellams summed from scipy's pmf.

Sensitivities. After conditional rounding every client's integer vector z has ``‖z‖_2 ≤ Δ2`` (the
rounding bound, enforced); for an integer vector |z_i| ≤ z_i², so ``‖z‖_1 ≤ ‖z‖_2²``, and by
Cauchy–Schwarz ``‖z‖_1 ≤ √D·‖z‖_2``: Δ1 = min(Δ2², √D·Δ2) (:func:`integer_sensitivities`; the
Skellam paper's experiments bound the rounded vector's L1 norm the same way). :func:`rounding_norm_bound` is Kairouz, Liu &
Steinke's (ICML 2021, arXiv 2102.06387, the conditional randomized rounding lemma of §4) bound
for choosing Δ2 so that re-rounding is rarely needed.

Subsampling. Poisson sampling at rate q amplifies any mechanism's RDP at integer α ≥ 2, for
add/remove (and zero-out) neighbours, in both directions (Steinke, "Composition of differential
privacy & privacy amplification by subsampling", arXiv 2210.00597, 2022, the Poisson subsampling
theorem for RDP):

    ε_q(α) ≤ 1/(α−1)·log[(1−q)^{α−1}(1 + (α−1)q) + Σ_{ℓ=2}^{α} C(α,ℓ)q^ℓ(1−q)^{α−ℓ}e^{(ℓ−1)ε(ℓ)}],

where ε(ℓ) bounds the base mechanism's divergence in both directions (true for the Skellam bound:
the noise is symmetric about 0), and never more than ε(α) (joint convexity of e^{(α−1)D_α}). For
the Gaussian curve ε(ℓ) = ℓ/(2σ²) this is exactly the sampled Gaussian's RDP (Mironov, Talwar &
Zhang 2019), so for Skellam noise the only price over central Gaussian noise is the Skellam bound's
excess term. Zhu & Wang's earlier general bound (ICML 2019, Theorem 6) carries a factor 3 on the
ℓ ≥ 3 terms and needed σ 1.775 where this needs 1.398 (ε 3, δ 1e-6, 30 rounds at q 0.1). The
tests check the bound against the exact sampled-Gaussian RDP of common/privacy/rdp.py and against
both directions of the exact divergence of random discrete pairs and of subsampled 1-D Skellams.
Rounds compose additively and :func:`common.privacy.rdp.eps_from_rdp` converts to (ε, δ).

Who the guarantee is against: amplification by sampling assumes the observer does not learn who
was sampled. A secure-aggregation server sees which clients took part in a round; against it, charge
``sample_rate=1`` for the rounds a client took part in. The subsampled figure holds against
observers of the released aggregates only.

numpy/scipy only (no torch), like common/privacy/rdp.py.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np
from scipy import special

from common.privacy.rdp import eps_from_rdp

#: integer RDP orders (the subsampling bound needs integers); dense where (ε, δ) optima usually fall
SKELLAM_ORDERS: tuple[int, ...] = (*range(2, 65), 72, 80, 96, 112, 128, 160, 192, 256)

#: an RDP curve as a function of integer orders: maps an int array of orders to their RDP values
RdpFunction = Callable[[np.ndarray], np.ndarray]


def _check_positive(name: str, value: float) -> None:
    if not (value > 0 and math.isfinite(value)):
        raise ValueError(f"{name} must be finite and > 0, got {value}")


def _check_sensitivities(l1: float, l2: float) -> None:
    _check_positive("l2 sensitivity", l2)
    _check_positive("l1 sensitivity", l1)
    if l1 < l2:
        raise ValueError(f"l1 sensitivity {l1} < l2 sensitivity {l2}: no vector has ‖x‖_1 < ‖x‖_2")


def _check_rate(sample_rate: float) -> None:
    if not 0 < sample_rate <= 1:
        raise ValueError(f"sample rate must be in (0, 1], got {sample_rate}")


def skellam_rdp(order: float | np.ndarray, mu: float, l1: float, l2: float) -> float | np.ndarray:
    """RDP ε(α) of f + Sk(μ)^d for an integer query f with sensitivities ``l1`` = Δ1, ``l2`` = Δ2.

    ``mu`` is the per-coordinate variance of the noise in the released sum (integer units², our
    parametrisation: Pois(μ/2) − Pois(μ/2)); ``order`` α > 1, scalar or array. Agarwal et al.
    Theorem 3.5 rewritten for variance μ:
    ``αΔ2²/(2μ) + min(((2α − 1)Δ2² + 6Δ1)/(4μ²), 3Δ1/(2μ))``."""
    _check_positive("mu (noise variance)", mu)
    _check_sensitivities(l1, l2)
    alpha = np.asarray(order, dtype=float)
    if np.any(alpha <= 1):
        raise ValueError(f"RDP order must be > 1, got {order}")
    gaussian = alpha * l2 * l2 / (2 * mu)
    excess = np.minimum(((2 * alpha - 1) * l2 * l2 + 6 * l1) / (4 * mu * mu), 3 * l1 / (2 * mu))
    out = gaussian + excess
    return float(out) if out.ndim == 0 else out


def subsampled_rdp(rdp: RdpFunction, sample_rate: float, order: int) -> float:
    """RDP at integer ``order`` α ≥ 2 of a mechanism with RDP curve ``rdp`` under Poisson sampling at
    ``sample_rate`` q: Steinke 2022 (arXiv 2210.00597; any mechanism, add/remove or zero-out
    neighbours, both directions; no factor 3, unlike Zhu & Wang 2019 Theorem 6), capped at the
    unsampled ε(α). ``rdp`` must be valid at every integer order 2..α (both directions of the
    add/remove neighbours: true for additive noise symmetric about 0)."""
    _check_rate(sample_rate)
    if int(order) != order or order < 2:
        raise ValueError(f"the subsampling bound needs an integer order >= 2, got {order}")
    alpha = int(order)
    base = np.asarray(rdp(np.arange(2, alpha + 1)), dtype=float)  # ε(2), ..., ε(α)
    if sample_rate == 1:
        return float(base[-1])
    q = sample_rate
    log_q, log_1q = math.log(q), math.log1p(-q)
    ell = np.arange(2, alpha + 1)
    log_binom = special.gammaln(alpha + 1) - special.gammaln(ell + 1) - special.gammaln(alpha - ell + 1)
    terms = log_binom + ell * log_q + (alpha - ell) * log_1q + (ell - 1) * base
    head = (alpha - 1) * log_1q + math.log1p((alpha - 1) * q)  # the ℓ = 0 and ℓ = 1 terms together
    log_sum = float(special.logsumexp(np.append(terms, head)))
    return min(max(0.0, log_sum) / (alpha - 1), float(base[-1]))


def skellam_curve(
    mu: float, l1: float, l2: float, sample_rate: float, orders: Sequence[int] = SKELLAM_ORDERS
) -> np.ndarray:
    """One round's RDP at each of ``orders``: the Skellam bound, Poisson-subsampled at ``sample_rate``."""
    _check_positive("mu (noise variance)", mu)
    _check_sensitivities(l1, l2)

    def base(alpha: np.ndarray) -> np.ndarray:
        return np.asarray(skellam_rdp(alpha, mu, l1, l2))

    return np.array([subsampled_rdp(base, sample_rate, a) for a in orders])


def skellam_epsilon(
    mu: float,
    l1: float,
    l2: float,
    sample_rate: float,
    rounds: int,
    delta: float,
    orders: Sequence[int] = SKELLAM_ORDERS,
) -> float:
    """ε at ``delta`` after ``rounds`` rounds of the Skellam mechanism with summed noise variance
    ``mu`` (integer units²), sensitivities ``l1``/``l2`` (integer units) and Poisson rate
    ``sample_rate``: the per-round curve (:func:`skellam_curve`) times ``rounds`` (RDP composition),
    converted by :func:`common.privacy.rdp.eps_from_rdp` (Balle et al. 2020, Thm 21)."""
    if not 0 < delta < 1:
        raise ValueError(f"delta must be in (0, 1), got {delta}")
    if rounds < 0 or int(rounds) != rounds:
        raise ValueError(f"rounds must be a non-negative integer, got {rounds}")
    curve = skellam_curve(mu, l1, l2, sample_rate, orders)
    return 0.0 if rounds == 0 else eps_from_rdp(curve * rounds, orders, delta)


def skellam_mu(
    target_epsilon: float,
    l1: float,
    l2: float,
    sample_rate: float,
    rounds: int,
    delta: float,
    orders: Sequence[int] = SKELLAM_ORDERS,
) -> float:
    """Smallest summed noise variance μ (to ~1e-6 relative, never below the true one) with
    :func:`skellam_epsilon` ≤ ``target_epsilon``; bisection on log μ (ε decreases in μ)."""
    _check_positive("target epsilon", target_epsilon)
    _check_sensitivities(l1, l2)
    _check_rate(sample_rate)

    def ok(mu: float) -> bool:
        return skellam_epsilon(mu, l1, l2, sample_rate, rounds, delta, orders) <= target_epsilon

    hi = max(l2 * l2, 1e-6)
    while not ok(hi):
        hi *= 4
        if hi > 1e300:
            raise ValueError(f"no noise variance reaches epsilon {target_epsilon} (delta {delta})")
    lo = hi / 4
    while ok(lo) and lo > 1e-300:
        lo, hi = lo / 4, lo
    while hi / lo > 1 + 1e-7:
        mid = math.sqrt(lo * hi)
        lo, hi = (lo, mid) if ok(mid) else (mid, hi)
    return hi


def integer_sensitivities(l2_bound: float, dim: int) -> tuple[float, float]:
    """(Δ1, Δ2) of an integer vector of ``dim`` coordinates with ‖z‖_2 ≤ ``l2_bound``:
    Δ1 = min(Δ2², √dim·Δ2) (|z_i| ≤ z_i² for integers; Cauchy–Schwarz), Δ2 = ``l2_bound``."""
    _check_positive("l2 bound", l2_bound)
    if dim < 1:
        raise ValueError(f"dim must be >= 1, got {dim}")
    return min(l2_bound * l2_bound, math.sqrt(dim) * l2_bound), float(l2_bound)


def rounding_norm_bound(norm: float, dim: int, beta: float) -> float:
    """Kairouz, Liu & Steinke (arXiv 2102.06387, §4, randomized rounding lemma): a vector of L2 norm
    ≤ ``norm`` in ``dim`` coordinates, each rounded up with probability its fractional part, has
    ‖rounded‖_2 ≤ min(norm + √dim, sqrt(norm² + dim/4 + √(2 log(1/β))·(norm + √dim/2))) with
    probability ≥ 1 − ``beta``. Used as the conditional rounding bound (hence Δ2); the first term
    holds always (each coordinate moves by < 1)."""
    if norm < 0 or not math.isfinite(norm):
        raise ValueError(f"norm must be finite and >= 0, got {norm}")
    if not 0 < beta < 1:
        raise ValueError(f"beta must be in (0, 1), got {beta}")
    if dim < 1:
        raise ValueError(f"dim must be >= 1, got {dim}")
    root_d = math.sqrt(dim)
    squared = norm * norm + dim / 4 + math.sqrt(2 * math.log(1 / beta)) * (norm + root_d / 2)
    return min(norm + root_d, math.sqrt(squared))


__all__ = [
    "SKELLAM_ORDERS",
    "integer_sensitivities",
    "rounding_norm_bound",
    "skellam_curve",
    "skellam_epsilon",
    "skellam_mu",
    "skellam_rdp",
    "subsampled_rdp",
]
