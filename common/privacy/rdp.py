"""Rényi DP of the Poisson-subsampled Gaussian mechanism (Mironov, Talwar & Zhang, 2019).

The same analysis as Opacus's ``accountants/analysis/rdp.py`` (tests compare the two to 1e-6),
written against numpy/scipy only so that ``fedlora privacy`` answers without importing torch.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from scipy import special


def _log_add(a: float, b: float) -> float:
    """log(e^a + e^b)."""
    lo, hi = min(a, b), max(a, b)
    return hi if lo == -math.inf else math.log1p(math.exp(lo - hi)) + hi


def _log_sub(a: float, b: float) -> float:
    """log(e^a − e^b) for a ≥ b."""
    if b == -math.inf:
        return a
    if a == b:
        return -math.inf
    return math.log(math.expm1(a - b)) + b


def _log_erfc(x: float) -> float:
    return math.log(2) + special.log_ndtr(-x * 2**0.5)


def _log_a_int(q: float, sigma: float, alpha: int) -> float:
    """log A_α for integer α (MTZ19 Eq. 3 expanded binomially)."""
    log_a = -math.inf
    for i in range(alpha + 1):
        log_coef = math.log(special.binom(alpha, i)) + i * math.log(q) + (alpha - i) * math.log(1 - q)
        log_a = _log_add(log_a, log_coef + (i * i - i) / (2 * sigma**2))
    return log_a


def _log_a_frac(q: float, sigma: float, alpha: float) -> float:
    """log A_α for fractional α (MTZ19 §3.3), summed until the terms fall below e^-30."""
    log_a0, log_a1 = -math.inf, -math.inf
    z0 = sigma**2 * math.log(1 / q - 1) + 0.5
    i = 0
    while True:
        coef = special.binom(alpha, i)
        log_coef = math.log(abs(coef))
        j = alpha - i
        log_t0 = log_coef + i * math.log(q) + j * math.log(1 - q)
        log_t1 = log_coef + j * math.log(q) + i * math.log(1 - q)
        log_e0 = math.log(0.5) + _log_erfc((i - z0) / (math.sqrt(2) * sigma))
        log_e1 = math.log(0.5) + _log_erfc((z0 - j) / (math.sqrt(2) * sigma))
        log_s0 = log_t0 + (i * i - i) / (2 * sigma**2) + log_e0
        log_s1 = log_t1 + (j * j - j) / (2 * sigma**2) + log_e1
        if coef > 0:
            log_a0, log_a1 = _log_add(log_a0, log_s0), _log_add(log_a1, log_s1)
        else:
            log_a0, log_a1 = _log_sub(log_a0, log_s0), _log_sub(log_a1, log_s1)
        i += 1
        if max(log_s0, log_s1) < -30:
            return _log_add(log_a0, log_a1)


def rdp_subsampled_gaussian(q: float, sigma: float, order: float) -> float:
    """RDP ε(α) of one round: Gaussian with noise multiplier σ, Poisson rate q."""
    if q == 0:
        return 0.0
    if sigma == 0:
        return math.inf
    if q == 1.0:
        return order / (2 * sigma**2)
    if float(order).is_integer():
        return _log_a_int(q, sigma, int(order)) / (order - 1)
    return _log_a_frac(q, sigma, order) / (order - 1)


def rdp_curve(q: float, sigma: float, steps: int, orders: Sequence[float]) -> np.ndarray:
    """RDP at each order after ``steps`` rounds (RDP composes additively)."""
    return np.array([rdp_subsampled_gaussian(q, sigma, a) for a in orders]) * steps


def eps_from_rdp(rdp: np.ndarray, orders: Sequence[float], delta: float) -> float:
    """(ε, δ)-DP from an RDP curve, the conversion Opacus uses (Balle et al. 2020, Thm. 21)."""
    orders_arr = np.asarray(orders, dtype=float)
    eps = (
        rdp
        - (math.log(delta) + np.log(orders_arr)) / (orders_arr - 1)
        + np.log((orders_arr - 1) / orders_arr)
    )
    return math.inf if np.isnan(eps).all() else float(np.nanmin(eps))


def delta_from_rdp(rdp: np.ndarray, orders: Sequence[float], eps: float) -> float:
    """Smallest δ with :func:`eps_from_rdp` ≤ ``eps`` at some order (the same bound, inverted)."""
    orders_arr = np.asarray(orders, dtype=float)
    log_delta = (orders_arr - 1) * (rdp - eps + np.log1p(-1 / orders_arr)) - np.log(orders_arr)
    return float(min(1.0, np.exp(np.nanmin(log_delta))))
