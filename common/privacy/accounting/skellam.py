"""Rényi DP of the distributed Skellam mechanism (Agarwal, Kairouz & Liu, NeurIPS 2021, arXiv 2110.04995).

Parametrisation. ``Sk(μ)`` here is the symmetric Skellam Pois(μ/2) − Pois(μ/2): mean 0, variance μ,
pmf ``P(k) = e^{−μ}·I_|k|(μ)`` (I the modified Bessel function). The paper writes Sk(μ, μ) =
Pois(μ) − Pois(μ), variance 2μ; its μ is half of ours. Independent Skellams add: n client shares of
variance μ/n sum to exactly Sk(μ), so the accounting is exact for whichever clients' shares are in
the sum (pass the variance of the shares that were actually summed: dropouts lower μ and raise ε).

Mechanism. An integer query f (a client's scaled, rotated, conditionally rounded update; see
common/privacy/mechanisms/discrete.py) with L1 sensitivity Δ1 and L2 sensitivity Δ2, released as f + Sk(μ)^d.
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

Subsampling. Poisson sampling at rate q amplifies the Skellam bound at integer orders by
:func:`common.privacy.accounting.amplification.subsampled_rdp` (both directions of zero-out neighbours; for the
Gaussian curve it is exactly the sampled Gaussian's RDP, so Skellam noise costs only the bound's
excess term: σ 1.398 where Zhu & Wang's general bound needed 1.775, ε 3, δ 1e-6, 30 rounds at
q 0.1). Rounds compose additively and :func:`common.privacy.accounting.rdp.eps_from_rdp` converts to (ε, δ).

Who the guarantee is against: amplification by sampling assumes the observer does not learn who
was sampled. A secure-aggregation server sees which clients took part in a round; against it, charge
``sample_rate=1`` for the rounds a client took part in. The subsampled figure holds against
observers of the released aggregates only.

numpy/scipy only (no torch), like common/privacy/accounting/rdp.py.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from common.privacy.accounting.amplification import subsampled_rdp
from common.privacy.accounting.rdp import eps_from_rdp

#: integer RDP orders (the subsampling bound needs integers); dense where (ε, δ) optima usually fall
SKELLAM_ORDERS: tuple[int, ...] = (*range(2, 65), 72, 80, 96, 112, 128, 160, 192, 256)


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
    converted by :func:`common.privacy.accounting.rdp.eps_from_rdp` (Balle et al. 2020, Thm 21)."""
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
