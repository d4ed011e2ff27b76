"""Banded Toeplitz matrix factorization of a run's workload: the strategy of DP-FTRL with correlated
noise (Choquette-Choo et al. 2023, "(Amplified) Banded Matrix Factorization", arXiv 2306.08153).

A run releases a linear function ``A·x`` of the stream of round sums ``x`` (n rounds × D): the
*workload* A, lower-triangular Toeplitz with coefficients ``a_j`` (``A[t, s] = a_{t-s}``), fixed by
the server optimizer (prefix sums for SGD; ``(1 - β^{j+1}) / (1 - β)`` for momentum β). Factor
``A = B·C`` with C lower-triangular Toeplitz of ``b`` bands, coefficients ``c_0..c_{b-1}``, ‖c‖₂ = 1,
and release ``x + C⁻¹z`` (z i.i.d. N(0, σ²ζ²)): round t adds ``w_t = (C⁻¹z)_t`` to its sum. Privacy is
that of the Gaussian release ``Cx + z``, whose sensitivity depends on the rounds one client may take
part in; the error of query t is ``σ²ζ² ‖(A C⁻¹)[t, :]‖²`` (eq. 2 of 2306.08153). C = I (one band)
is DP-FedAvg.

Conventions (jax_privacy's, written into every plan): *min-sep b* means one client's participations
in rounds i ≠ j satisfy |i − j| ≥ b; a strategy of ≤ b bands then has orthogonal columns for any two
of them, so the sensitivity is a sum of column norms (:func:`minsep_sensitivity_squared`). Rounds
are 0-based here. Everything is float64 numpy: no jax at run time.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

#: workload coefficients ``a_j`` (j = 0..n-1) of a server optimizer, at server learning rate 1 (the
#: rate scales the error, not the optimal strategy); ``beta`` is the server momentum
WORKLOADS: dict[str, Callable[[int, float], np.ndarray]] = {
    "sgd": lambda n, beta: np.ones(n),
    "momentum": lambda n, beta: (1.0 - beta ** np.arange(1, n + 1)) / (1.0 - beta),
}


def workload(kind: str, n: int, beta: float = 0.0) -> np.ndarray:
    """``(n,)`` Toeplitz coefficients of the workload of server optimizer ``kind`` (see
    :data:`WORKLOADS`)."""
    if kind not in WORKLOADS:
        raise ValueError(f"no linear workload for server optimizer '{kind}' (have: {', '.join(WORKLOADS)})")
    return WORKLOADS[kind](n, beta).astype(np.float64)


def toeplitz(coefs: np.ndarray, n: int) -> np.ndarray:
    """The ``(n, n)`` lower-triangular Toeplitz matrix ``M[t, s] = coefs[t - s]`` (0 beyond them)."""
    col = np.zeros(n)
    col[: min(n, len(coefs))] = coefs[:n]
    idx = np.subtract.outer(np.arange(n), np.arange(n))
    return np.where(idx >= 0, col[np.clip(idx, 0, n - 1)], 0.0)


def inverse_coefs(coefs: np.ndarray, n: int) -> np.ndarray:
    """``(n,)`` coefficients of C⁻¹ for C Toeplitz of ``coefs`` (the inverse of a lower-triangular
    Toeplitz matrix is one): the impulse response of ``1 / c(x)``."""
    return _power_series(np.ones(1), coefs, n)


def per_query_error(coefs: np.ndarray, work: np.ndarray) -> np.ndarray:
    """``(n,)`` squared error of each query t per unit σζ: ``‖(A C⁻¹)[t, :]‖²``, n = ``len(work)``.
    ``A C⁻¹`` is Toeplitz with coefficients ``e = a * ĉ`` (the impulse response of a(x) / c(x))."""
    e = _power_series(work, coefs, len(work))
    return np.cumsum(e**2)


def _power_series(num: np.ndarray, den: np.ndarray, n: int) -> np.ndarray:
    """``(n,)`` first coefficients of the power series of ``num(x) / den(x)``: the impulse response
    of the filter ``num / den``."""
    from scipy.signal import lfilter  # imported here: scipy.signal alone costs ~0.8 s of every CLI start

    impulse = np.zeros(n)
    impulse[0] = 1.0
    return lfilter(num, den, impulse)


def mean_error(coefs: np.ndarray, work: np.ndarray) -> float:
    """Mean over the n queries of :func:`per_query_error`: the objective the strategy minimises."""
    return float(per_query_error(coefs, work).mean())


def sqrt_coefs(bands: int) -> np.ndarray:
    """The first ``bands`` coefficients of ``1/√(1 − x)``, ∏(2i−1)/(2i), normalised: the optimum for
    the max error of prefix sums under single participation, the optimizer's start."""
    c = np.cumprod(np.r_[1.0, (2 * np.arange(1, bands) - 1) / (2 * np.arange(1, bands))])
    return c / np.linalg.norm(c)


def optimize_banded(n: int, bands: int, work: np.ndarray | None = None) -> np.ndarray:
    """Unit-norm coefficients of the ``bands``-banded Toeplitz C that minimise the mean error of the
    workload ``work`` (prefix sums when None) over ``n`` rounds: L-BFGS over c/‖c‖ from
    :func:`sqrt_coefs`. Refuses a result whose ``c(x)`` has a root in the closed unit disk (its
    streaming inverse would not decay)."""
    if bands < 1 or n < 1:
        raise ValueError(f"bands and rounds must be >= 1, got {bands} and {n}")
    work = np.ones(n) if work is None else work
    if bands == 1:
        return np.ones(1)
    from scipy.optimize import minimize  # imported here, like lfilter: only planning optimizes

    res = minimize(lambda v: mean_error(v / np.linalg.norm(v), work), sqrt_coefs(bands), method="L-BFGS-B")
    coefs = np.asarray(res.x, dtype=np.float64)
    coefs = coefs / np.linalg.norm(coefs)
    if coefs[0] < 0:
        coefs = -coefs
    if min(abs(np.roots(coefs[::-1]))) <= 1.0:
        raise ValueError(
            f"the optimized {bands}-band strategy is not stable (a root of c(x) in the unit disk)"
        )
    return coefs


def column_norms_squared(coefs: np.ndarray, n: int) -> np.ndarray:
    """``(n,)`` ``‖C[:, j]‖²`` of the ``(n, n)`` banded Toeplitz C: column j holds lags 0..n−1−j."""
    tail = np.cumsum(coefs**2)
    return tail[np.minimum(len(coefs), n - np.arange(n)) - 1]


def minsep_sensitivity_squared(norms_sq: np.ndarray, min_sep: int, participations: int) -> float:
    """sens² of a strategy whose columns at least ``min_sep`` apart are orthogonal (≤ ``min_sep``
    bands), under min-sep ``min_sep`` and at most ``participations`` rounds per client: the largest
    sum of ``norms_sq`` over indices ``min_sep`` apart, by dynamic programming (Algorithm 3,
    "VecSens", of 2306.08153): ``best[i, k]`` is the best over indices ≥ i with at most k of them."""
    n = len(norms_sq)
    if min_sep < 1 or participations < 1:
        raise ValueError("min-sep and participations must be >= 1")
    best = np.zeros((n + min_sep + 1, participations + 1))
    for i in range(n - 1, -1, -1):
        best[i, 1:] = np.maximum(best[i + 1, 1:], norms_sq[i] + best[i + min_sep, :-1])
    return float(best[0, participations])


def max_participations(n: int, min_sep: int) -> int:
    """The most rounds of ``n`` one client can take part in under min-sep ``min_sep``: ⌈n / b⌉."""
    return math.ceil(n / min_sep)


def prefix_sensitivities(coefs: np.ndarray, n: int, min_sep: int, participations: int) -> np.ndarray:
    """``(n,)`` sens²(t): the min-sep sensitivity² of the release's first t+1 rounds (the leading
    ``(t+1, t+1)`` block of C), non-decreasing in t. The release up to round t is one Gaussian
    mechanism of noise multiplier σ/sens(t), so round t may be charged σ/√(sens²(t) − sens²(t−1))
    and their composition is exactly that Gaussian (μ² adds)."""
    if len(coefs) > min_sep:
        raise ValueError(f"{len(coefs)} bands exceed the min-sep {min_sep}: columns would not be orthogonal")
    return np.array(
        [
            minsep_sensitivity_squared(column_norms_squared(coefs, t + 1), min_sep, participations)
            for t in range(n)
        ]
    )


__all__ = [
    "WORKLOADS",
    "column_norms_squared",
    "inverse_coefs",
    "max_participations",
    "mean_error",
    "minsep_sensitivity_squared",
    "optimize_banded",
    "per_query_error",
    "prefix_sensitivities",
    "sqrt_coefs",
    "toeplitz",
    "workload",
]
