"""Rényi DP of the Poisson-subsampled Gaussian mechanism (Mironov, Talwar & Zhang, 2019).

The same analysis as Opacus's ``accountants/analysis/rdp.py`` (tests compare the two to 1e-6),
written against numpy/scipy only so that ``fedlora privacy`` answers without importing torch.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence

import numpy as np
from scipy import special


def _log_add(a: float, b: float) -> float:
    """log(e^a + e^b)."""
    lo, hi = min(a, b), max(a, b)
    return hi if lo == -math.inf or hi == math.inf else math.log1p(math.exp(lo - hi)) + hi


def _log_erfc(x: np.ndarray) -> np.ndarray:
    return math.log(2) + special.log_ndtr(-x * 2**0.5)


def _log_a_int(q: float, sigma: float, alpha: int) -> float:
    """log A_α for integer α (MTZ19 Eq. 3 expanded binomially)."""
    log_a = -math.inf
    for i in range(alpha + 1):
        log_coef = math.log(special.binom(alpha, i)) + i * math.log(q) + (alpha - i) * math.log(1 - q)
        log_a = _log_add(log_a, log_coef + (i * i - i) / (2 * sigma**2))
    return log_a


def _frac_terms(q: float, sigma: float, alpha: float, i: np.ndarray) -> tuple[np.ndarray, ...]:
    """log|term| of both halves of the fractional-α series at indices ``i``, and the terms' sign."""
    z0 = sigma**2 * math.log(1 / q - 1) + 0.5
    coef = special.binom(alpha, i)
    with np.errstate(divide="ignore"):
        log_coef = np.log(np.abs(coef))
    j = alpha - i
    log_t0 = log_coef + i * math.log(q) + j * math.log(1 - q)
    log_t1 = log_coef + j * math.log(q) + i * math.log(1 - q)
    log_e0 = math.log(0.5) + _log_erfc((i - z0) / (math.sqrt(2) * sigma))
    log_e1 = math.log(0.5) + _log_erfc((z0 - j) / (math.sqrt(2) * sigma))
    log_s0 = log_t0 + (i * i - i) / (2 * sigma**2) + log_e0
    log_s1 = log_t1 + (j * j - j) / (2 * sigma**2) + log_e1
    return log_s0, log_s1, np.sign(coef)


def _add_signed(acc: tuple[float, float], log_abs: np.ndarray, sign: np.ndarray) -> tuple[float, float]:
    """Add Σ sign·e^{log_abs} to a running sum held as (log scale, scaled total)."""
    scale = max(acc[0], float(np.max(log_abs)))
    if scale == -math.inf:
        return acc
    total = acc[1] * math.exp(acc[0] - scale) + float(np.sum(sign * np.exp(log_abs - scale)))
    return scale, total


def _log_of(acc: tuple[float, float]) -> float:
    """log of a running sum; −∞ when it is not positive (round-off in a cancelling series)."""
    return acc[0] + math.log(acc[1]) if acc[1] > 0 else -math.inf


#: fractional-α series length at which :func:`_log_a_frac` gives up (no bound: RDP = ∞); the slowest
#: case (α = 1.1, q = 1/2, σ ≥ 10) needs 1.6e6 terms
_MAX_TERMS = 1 << 24


def _log_a_frac(q: float, sigma: float, alpha: float) -> float:
    """log A_α for fractional α (MTZ19 §3.3), summed up to and including the first index whose
    terms both fall below e^-30 (Opacus's stopping rule), evaluated in vectorised chunks: near
    q = 1/2 with large σ the terms decay only like i^(-α-1), and millions of them are needed.
    NaN if the terms cannot be evaluated or do not fall off."""
    a0, a1 = (-math.inf, 0.0), (-math.inf, 0.0)
    start, size = 0, 64
    while start <= _MAX_TERMS:
        log_s0, log_s1, sign = _frac_terms(q, sigma, alpha, np.arange(start, start + size, dtype=float))
        if np.isnan(log_s0).any() or np.isnan(log_s1).any():
            break
        small = np.maximum(log_s0, log_s1) < -30
        stop = int(small.argmax()) + 1 if small.any() else size
        a0, a1 = _add_signed(a0, log_s0[:stop], sign[:stop]), _add_signed(a1, log_s1[:stop], sign[:stop])
        if small.any():
            return _log_add(_log_of(a0), _log_of(a1))
        start, size = start + size, min(2 * size, 1 << 16)
    return math.nan


def rdp_subsampled_gaussian(q: float, sigma: float, order: float) -> float:
    """RDP ε(α) of one round: Gaussian with noise multiplier σ, Poisson rate q.

    Outside what the series can evaluate the answer is a bound, not a value: σ² overflowing gives 0
    (the RDP is below α/(2σ²) < 1e-300), σ < 1e-150 gives ∞ (it is above
    α(α−1)/(2σ²) + α·log q > 1e297, from A_α ≥ q^α·e^{α(α−1)/(2σ²)})."""
    if q == 0:
        return 0.0
    variance = sigma * sigma
    if variance < 1e-300:
        return math.inf
    if variance == math.inf:
        return 0.0
    if q == 1.0:
        return order / (2 * variance)
    log_a = _log_a_int(q, sigma, int(order)) if float(order).is_integer() else _log_a_frac(q, sigma, order)
    # A_α ≥ 1 (a Rényi divergence is ≥ 0): a negative log A is round-off; NaN means no bound
    return math.inf if math.isnan(log_a) else max(0.0, log_a) / (order - 1)


@functools.lru_cache(maxsize=256)
def _round_curve(q: float, sigma: float, orders: tuple[float, ...]) -> np.ndarray:
    curve = np.array([rdp_subsampled_gaussian(q, sigma, a) for a in orders])
    curve.flags.writeable = False  # shared by every caller
    return curve


def rdp_curve(q: float, sigma: float, steps: int, orders: Sequence[float]) -> np.ndarray:
    """RDP at each order after ``steps`` rounds (RDP composes additively); one round's curve is
    cached, as ε and δ queries, the ledger and calibration ask for the same (q, σ) again."""
    return _round_curve(q, sigma, tuple(orders)) * steps


def eps_from_rdp(rdp: np.ndarray, orders: Sequence[float], delta: float) -> float:
    """(ε, δ)-DP from an RDP curve, the conversion Opacus uses (Balle et al. 2020, Thm. 21)."""
    orders_arr = np.asarray(orders, dtype=float)
    eps = (
        rdp
        - (math.log(delta) + np.log(orders_arr)) / (orders_arr - 1)
        + np.log((orders_arr - 1) / orders_arr)
    )
    # ε < 0 at some order still certifies (0, δ): δ(ε) does not increase with ε (dp_accounting clamps too)
    return math.inf if np.isnan(eps).all() else max(0.0, float(np.nanmin(eps)))


def delta_from_rdp(rdp: np.ndarray, orders: Sequence[float], eps: float) -> float:
    """Smallest δ with :func:`eps_from_rdp` ≤ ``eps`` at some order (the same bound, inverted)."""
    orders_arr = np.asarray(orders, dtype=float)
    with np.errstate(invalid="ignore"):  # ∞ − ∞ (ε = ∞ against an infinite order): no bound there
        log_delta = (orders_arr - 1) * (rdp - eps + np.log1p(-1 / orders_arr)) - np.log(orders_arr)
    if np.isnan(log_delta).all():
        return 1.0
    return float(np.exp(min(0.0, np.nanmin(log_delta))))
