"""Amplification of Rényi DP by Poisson sampling, for any mechanism given its RDP curve.

Neighbours: add/remove, or zero-out (one client's update replaced by zero; the secure-aggregation
releases). Either way the subsampled pair is R = (1 − q)·Q + q·P against Q, where (P, Q) is the
base mechanism on the two neighbours, and a guarantee must bound both D_α(R‖Q) ("remove") and
D_α(Q‖R) ("add"). With L = P/Q and S(ε) the binomial sum

    S(ε) = (1−q)^{α−1}(1 + (α−1)q) + Σ_{ℓ=2}^{α} C(α,ℓ) q^ℓ (1−q)^{α−ℓ} e^{(ℓ−1)ε(ℓ)},

at integer α ≥ 2 and with ε(ℓ) bounding D_ℓ(P‖Q) and D_ℓ(Q‖P) (so the curve must hold in both
directions; it does for additive noise symmetric about 0):

* remove: e^{(α−1)D_α(R‖Q)} = E_Q[(1 − q + qL)^α] ≤ S(ε) by the binomial theorem, any mechanism
  (Mironov, Talwar & Zhang 2019; Zhu & Wang 2019; Steinke 2022, arXiv 2210.00597).
* add: e^{(α−1)D_α(Q‖R)} = E_Q[f(L)] with f(L) = (1 − q + qL)^{1−α}. Zhu & Wang's general bound
  (ICML 2019, Theorem 6) pays a factor 3 on the ℓ ≥ 3 terms; their tight form (Theorem 8) needs a
  sign condition on the mechanism's odd Pearson–Vajda divergences that we cannot prove for Skellam
  noise. Instead, :func:`add_certificate` finds λ ∈ [0, 1] with, for every L > 0,

      f(L) ≤ λ·g1(L) + (1 − λ)·g2(L) + c·(L − 1),  g1 = (1 − q + qL)^α,  g2 = L·(1 − q + q/L)^α,

  c fixed by matching slopes at L = 1, where all three sides equal 1 (λ is then fixed by the Taylor
  expansion there: :func:`add_certificate`). Taking E_Q: E_Q[L − 1] = 0,
  E_Q[g1] = e^{(α−1)D_α(R‖Q)} ≤ S(ε), and E_Q[g2] = E_P[(1 − q + q/L)^α] = e^{(α−1)D_α((1−q)P+qQ‖P)}
  ≤ S(ε) (the same expansion with D_ℓ(Q‖P)), so the add direction is ≤ S(ε) too. The pointwise
  inequality in L does not involve the mechanism: near L = 1 it holds by its Taylor expansion
  (closed form); elsewhere it is checked numerically, once per (q, α), on a grid of log L over
  [−60, 60] with spacing 0.002; beyond the grid the dominant term (g1 for large L, g2 for small L)
  grows without bound. Where it does not pass, the factor 3 comes back for that order.

For the Gaussian curve ε(ℓ) = ℓ/(2σ²), S is exactly the sampled Gaussian's RDP, so Skellam noise
then costs only the Skellam bound's own excess over the Gaussian (common/privacy/accounting/skellam.py).

numpy/scipy only, like common/privacy/accounting/rdp.py.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

import numpy as np
from scipy import special

#: an RDP curve as a function of integer orders: maps an int array of orders to their RDP values
RdpFunction = Callable[[np.ndarray], np.ndarray]

#: log L on which the add-direction certificate is checked, away from L = 1 (spacing 0.002)
_LOG_L = np.concatenate([np.linspace(-60.0, -0.05, 29_976), np.linspace(0.05, 60.0, 29_976)])


def _certificate_margin(q: float, alpha: int, lam: float, t: np.ndarray = _LOG_L) -> float:
    """min over the log L grid ``t`` of [λ·g1 + (1 − λ)·g2 + c(L − 1) − f], each point divided by its
    largest term (the sign is what matters; the terms span hundreds of orders of magnitude)."""
    log_u = np.log1p(q * np.expm1(t))  # log(1 − q + qL)
    log_f, log_g1 = (1 - alpha) * log_u, alpha * log_u
    log_g2 = t + alpha * np.log1p(q * np.expm1(-t))
    c = (1 - alpha) * q - (lam * alpha * q + (1 - lam) * (1 - alpha * q))  # f'(1) − λg1'(1) − (1 − λ)g2'(1)
    linear = c * np.expm1(t)
    top = np.maximum.reduce([log_f, log_g1, log_g2, np.log(np.abs(linear) + 1e-300)])
    h = lam * np.exp(log_g1 - top) + (1 - lam) * np.exp(log_g2 - top) + linear * np.exp(-top)
    return float(np.min(h - np.exp(log_f - top)))


@functools.lru_cache(maxsize=4096)
def add_certificate(q: float, alpha: int) -> float | None:
    """The λ of the add-direction certificate at Poisson rate ``q`` and integer order ``alpha``, or
    None where it does not pass.

    With h = λ·g1 + (1 − λ)·g2 + c(L − 1) − f, h(1) = h′(1) = 0 by the choice of c, and h″(1) = 0
    for every λ (f, g1 and g2 all have second derivative α(α − 1)q² at L = 1), so h ≥ 0 near L = 1
    needs h‴(1) = 0, which fixes λ = 3(1 − q)/(3 + 2q(α − 2)); then h⁗(1) = 4α(α − 1)(2α − 1)q³(1 − q)
    > 0 and h > 0 near L = 1. Away from it (|log L| ≥ 0.05) the margin on the grid must be strictly
    positive (no second point of contact that the grid could step over)."""
    lam = 3 * (1 - q) / (3 + 2 * q * (alpha - 2))
    return lam if _certificate_margin(q, alpha, lam) > 0 else None


def subsampled_rdp(rdp: RdpFunction, sample_rate: float, order: int) -> float:
    """RDP at integer ``order`` α ≥ 2 of a mechanism with RDP curve ``rdp`` under Poisson sampling at
    ``sample_rate`` q: log S(ε)/(α − 1) where :func:`add_certificate` passes, else Zhu & Wang's
    bound with its factor 3; never more than the unsampled ε(α) (joint convexity of
    e^{(α−1)D_α}). ``rdp`` must hold at every integer order 2..α in both directions."""
    if not 0 < sample_rate <= 1:
        raise ValueError(f"sample rate must be in (0, 1], got {sample_rate}")
    if int(order) != order or order < 2:
        raise ValueError(f"the subsampling bound needs an integer order >= 2, got {order}")
    alpha = int(order)
    base = np.asarray(rdp(np.arange(2, alpha + 1)), dtype=float)  # ε(2), ..., ε(α)
    if sample_rate == 1:
        return float(base[-1])
    q = sample_rate
    ell = np.arange(2, alpha + 1)
    log_binom = special.gammaln(alpha + 1) - special.gammaln(ell + 1) - special.gammaln(alpha - ell + 1)
    terms = log_binom + ell * math.log(q) + (alpha - ell) * math.log1p(-q) + (ell - 1) * base
    if add_certificate(q, alpha) is None:
        terms[1:] += math.log(3)  # Zhu & Wang's factor 3 on ℓ ≥ 3
    head = (alpha - 1) * math.log1p(-q) + math.log1p((alpha - 1) * q)  # the ℓ = 0 and ℓ = 1 terms
    log_sum = float(special.logsumexp(np.append(terms, head)))
    return min(max(0.0, log_sum) / (alpha - 1), float(base[-1]))
