"""Sampling a client's Skellam noise share Sk(λ, λ) (variance x = 2λ) by inversion of a 128-bit CDF
table, with uniforms from a ChaCha20 keystream under a key from ``os.urandom`` (a CSPRNG).

Why: numpy's ``Generator.poisson`` (two draws per coordinate) is a floating-point transformed
rejection sampler driven by PCG64, which is not a cryptographic generator; and it costs ~50 ns a
coordinate, which under hidden participation every online node pays on every coordinate of its
share, every round (docs/secure-aggregation.md). Here a coordinate costs a table look-up.

Exactness. The pmf is p(k) = e^{−x}·I_|k|(x) (Skellam 1946; I the modified Bessel function of the
first kind), computed in ``mpmath`` at :data:`PRECISION` bits by Miller's backward recurrence
I_{k−1}(x) = I_{k+1}(x) + (2k/x)·I_k(x) (Abramowitz & Stegun 9.6.26), normalised by
Σ_{k∈ℤ} p(k) = 1 (A&S 9.6.37: e^x = I_0(x) + 2·Σ_{k≥1} I_k(x)). The table covers [−K, K] with K
from Bernstein's inequality for the sub-gamma variable Sk (variance factor x, scale 1/3):
P(|Sk| > K) ≤ 2·exp(−K²/(2(x + K/3))) ≤ 2^−140; that tail mass is folded into the end atoms.
Thresholds are T_i = ⌊CDF(−K + i)·2^128⌋, clamped to [0, 2^128 − 1] (the folded tail is a
difference at :data:`PRECISION` bits, clamped at 0 too: at variances below ~10 it could come out
−2^−257 and T_0 = −1), and a draw is −K + #{i : T_i ≤ U} for U uniform on [0, 2^128) (its low
64 bits are drawn only when its high word ties a threshold's, probability ≤ 2^−64 · (distinct high
words)). So each atom's probability is off by < 2^−128 + the fold, and the
total variation distance to Sk(λ, λ) is at most (2K + 1)·2^−128 + 2^−140 per coordinate: 2^−117 at
variance 2,644 (K = 753), 2^−111 at :data:`MAX_TABLE_VARIANCE`. Over a whole run (MiniLM: 77,824
coordinates × 1,000 nodes × 30 rounds < 2^32 draws) that is < 2^−79 added to δ: nothing next to δ =
1e-6 ≈ 2^−20. Tests check the table against ``mpmath.besseli`` and scipy, and the draws by a
chi-square.

Speed: a guide table on the top 14 bits of U gives the index of ~99 % of draws; the rest are
searched (``np.searchsorted``): ~2 ms for 131,072 coordinates against ~7 ms for numpy's Poisson.
Variances above :data:`MAX_TABLE_VARIANCE` are drawn as the sum of r shares of variance x/r
(Skellam shares add exactly), keeping tables small.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from functools import lru_cache

import mpmath
import numpy as np

from common.secagg.prf import keystream_words

#: bits of mpmath precision of the pmf and CDF (the thresholds keep 128 of them)
PRECISION = 256
#: the table's tail mass bound, each side: P(|Sk| > K) ≤ 2^-TAIL_BITS
TAIL_BITS = 140
#: largest variance tabulated directly (K ≈ 14·√x, about 57,000 entries at 2^24); larger ones are sums
MAX_TABLE_VARIANCE = float(2**24)
_GUIDE_BITS = 14
_ONE = 1 << 128


@dataclass(frozen=True)
class Table:
    """The inverse-CDF table of Sk(λ, λ), variance ``variance``: thresholds T_i (i < 2K) split in
    64-bit words ``high``, ``low`` (uint64, shape (2K + 1,), a sentinel 2^64 − 1 last), draw =
    −``half_width`` + #{i < 2K : T_i ≤ U}; ``guide`` (int64, shape (2^14,)): #{i : high_i < j·2^50},
    a lower bound of the count for U's top 14 bits j."""

    variance: float
    half_width: int
    high: np.ndarray
    low: np.ndarray
    guide: np.ndarray

    @property
    def size(self) -> int:
        """2K, the number of thresholds."""
        return 2 * self.half_width


def half_width(variance: float) -> int:
    """K: the smallest integer with 2·exp(−K²/(2(x + K/3))) ≤ 2^−TAIL_BITS (Bernstein), at least 1."""
    c = (TAIL_BITS + 1) * math.log(2)  # K² ≥ 2c·(x + K/3)
    return max(1, math.ceil((2 * c / 3 + math.sqrt((2 * c / 3) ** 2 + 8 * c * variance)) / 2))


def pmf(variance: float, k_max: int) -> list:
    """p(0), …, p(k_max) of Sk(x/2, x/2) as mpmath numbers at :data:`PRECISION` bits (p(−k) = p(k))."""
    with mpmath.workprec(PRECISION):
        x = mpmath.mpf(variance)
        # Miller: start far beyond the table's reach (the normalisation sums every atom that matters)
        start = max(k_max, half_width(variance)) + math.ceil(10 * math.sqrt(variance)) + 100
        above, here = mpmath.mpf(0), mpmath.mpf(2) ** -PRECISION
        values = [mpmath.mpf(0)] * (start + 1)
        values[start] = here
        for k in range(start, 0, -1):  # I_{k-1} = I_{k+1} + (2k/x)·I_k
            above, here = here, above + 2 * k / x * here
            values[k - 1] = here
        total = values[0] + 2 * mpmath.fsum(values[1:])  # Σ over ℤ of I_k, ∝ e^x
        return [v / total for v in values[: k_max + 1]]


@lru_cache(maxsize=8)
def table(variance: float) -> Table:
    """The sampling table of Sk with ``variance`` (0 < x ≤ :data:`MAX_TABLE_VARIANCE`), cached."""
    if not 0 < variance <= MAX_TABLE_VARIANCE:
        raise ValueError(f"tabulated variances lie in (0, {MAX_TABLE_VARIANCE:g}], got {variance}")
    k = half_width(variance)
    p = pmf(variance, k)
    with mpmath.workprec(PRECISION):
        # P(Sk < −K), folded into −K. Obtained by cancellation, so off by up to ~2^−PRECISION: where
        # the true tail is below that (variances under ~10, K ≫ √x) it can come out negative
        # (−4.3e-78 at x = 3), so it is clamped at 0; that moves an atom by ~2^−256
        lower_tail = max(mpmath.mpf(0), (1 - p[0] - 2 * mpmath.fsum(p[1:])) / 2)
        cdf, thresholds = lower_tail, []
        for j in range(-k, k):  # CDF(j) for j = −K .. K−1; CDF(K) = 1
            cdf += p[abs(j)]
            thresholds.append(int(mpmath.floor(cdf * _ONE)))
    # each threshold in [0, 2^128 − 1] (a rounding error of the CDF must not reach −1 or 2^128,
    # which the uint64 words cannot hold), then the sentinel
    thresholds = [min(max(t, 0), _ONE - 1) for t in thresholds] + [_ONE - 1]
    high = np.array([t >> 64 for t in thresholds], dtype=np.uint64)
    low = np.array([t & (2**64 - 1) for t in thresholds], dtype=np.uint64)
    starts = np.arange(1 << _GUIDE_BITS, dtype=np.uint64) << np.uint64(64 - _GUIDE_BITS)
    guide = np.searchsorted(high, starts, side="left").astype(np.int64)
    return Table(variance, k, high, low, guide)


def _uniform_words(count: int) -> np.ndarray:
    """``count`` uniform uint64 words: a ChaCha20 keystream (RFC 8439, common/secagg/prf.py) under a
    fresh 32-byte key from ``os.urandom``."""
    return keystream_words(os.urandom(32), count, dtype=np.uint64)


def _count_at_most(t: Table, high: np.ndarray) -> np.ndarray:
    """#{i : T_i ≤ U} for each U with high word ``high`` (uint64) -> int64, same shape; low words
    are drawn only where ``high`` equals a threshold's high word."""
    n = t.size
    # top bits of U: a signed view shifted and masked (numpy's uint64 -> intp cast is slow)
    idx = t.guide[(high.view(np.int64) >> (64 - _GUIDE_BITS)) & ((1 << _GUIDE_BITS) - 1)]
    # idx must grow to #{i : high_i < U_high} where the guide's bucket holds a threshold (~1 % of
    # draws at variance 2,644): searched (high[n] is a sentinel, 2^64 − 1, so idx ≤ n stays in range)
    late = np.flatnonzero(t.high[idx] < high)
    idx[late] = np.searchsorted(t.high[:n], high[late], side="left")
    for j in np.flatnonzero(t.high[idx] == high):  # high_i == U_high: the low words decide
        low = int.from_bytes(os.urandom(8), "little")
        while idx[j] < n and t.high[idx[j]] == high[j] and int(t.low[idx[j]]) <= low:
            idx[j] += 1
    return idx


def skellam(count: int, variance: float) -> np.ndarray:
    """``count`` independent draws of Sk(x/2, x/2), variance ``variance`` = x ≥ 0: int64 (count,)."""
    if not (variance >= 0 and math.isfinite(variance)):
        raise ValueError(f"noise variance must be finite and >= 0, got {variance}")
    total = np.zeros(count, dtype=np.int64)
    if variance == 0 or count == 0:
        return total
    parts = math.ceil(variance / MAX_TABLE_VARIANCE)
    t = table(variance / parts)
    for _ in range(parts):
        total += _count_at_most(t, _uniform_words(count)) - t.half_width
    return total


__all__ = ["MAX_TABLE_VARIANCE", "Table", "half_width", "pmf", "skellam", "table"]
