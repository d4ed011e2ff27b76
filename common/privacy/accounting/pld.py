"""Privacy-loss-distribution (PLD) accounting for Poisson-subsampled Gaussian rounds, import-light.

A port of the path dp_accounting 0.6's ``PLDAccountant`` (add-or-remove-one, pessimistic
connect-the-dots, default truncations) takes for ``PoissonSampledDpEvent(p, GaussianDpEvent(σ))``
(``GaussianDpEvent(σ)`` when p = 1) composed ``count`` times per event, then ``get_epsilon`` /
``get_delta``. It keeps their grids, truncations, rounding and FFT lengths, so ε and δ match theirs
to floating-point noise, without importing dp_accounting, scipy.stats or scipy.signal. Where theirs
breaks down for a small σ this one departs from it: a grid past MAX_GRID_POINTS raises
GridTooWideError (theirs exhausts memory), ε at losses past ~700 nats is found in log space (theirs
underflows e^{-l}, then returns the loss itself or ∞), and δ is kept in [0, 1].

Privacy losses and ε are in nats; σ is the noise multiplier (noise std / L2 sensitivity); p is the
per-round Poisson sampling probability. A PMF holds mass on the grid ``(lower + i)·d`` (d: the
discretization, nats) plus a mass at +∞. Each PLD is a pair of PMFs, REMOVE and ADD adjacency.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
from scipy import special

_LOG_MASS_TRUNCATION = -50.0  # GaussianPrivacyLoss log_mass_truncation_bound
_TAIL_MASS_TRUNCATION = 1e-15  # PrivacyLossDistribution.compose / self_compose default
_MAX_SPARSE_SIZE = 1000  # pld_pmf._MAX_PMF_SPARSE_SIZE
_MAX_NOISE_STD = 1e150
#: from here on dp_accounting's 1 − 1/q (relative error ~1e-16/(1 − q)) is replaced: within ulps of
#: q = 1 it cancels against e^ε to NaN
_NEAR_ONE = 1 - 1e-6


@dataclass(frozen=True)
class _Pmf:
    """Mass ``probs[i]`` at privacy loss ``(lower + i)·d`` nats and ``inf_mass`` at +∞.

    ``sparse`` marks what dp_accounting holds as a SparsePLDPmf (composed exactly, not by FFT)."""

    lower: int
    probs: np.ndarray
    inf_mass: float
    d: float
    sparse: bool


_Pld = tuple[_Pmf, _Pmf]  # (REMOVE, ADD); one object twice when symmetric


def _log_a_exp_b_plus_c(a: float, b: np.ndarray, c: float) -> np.ndarray:
    """ln(a·e^b + c) for a > 0, c ≠ 0; ports common.log_a_times_exp_b_plus_c."""
    log_ab, log_c = b + np.log(a), np.log(abs(c))
    if c > 0:
        hi, lo = np.maximum(log_ab, log_c), np.minimum(log_ab, log_c)
        out = hi + np.log1p(np.exp(lo - hi))
    else:
        out = log_ab + np.log1p(-np.exp(log_c - log_ab))
    return np.where(b == 0, np.log(a + c), out)


def _privacy_loss(x: float, s: float, q: float, add: bool) -> float:
    """Privacy loss (nats) at output x of the Gaussian mechanism with noise std s, sampling prob q."""
    # ports AdditiveNoisePrivacyLoss._privacy_loss_remove/_add with GaussianPrivacyLoss
    if add:
        return -_privacy_loss(-x, s, q, False)
    loss = (-0.5 - x) / s**2
    return loss if q == 1.0 else float(_log_a_exp_b_plus_c(q, loss, 1 - q))


def _log_expm1(z: np.ndarray) -> np.ndarray:
    """ln(e^z − 1) for z ≥ 0 (NaN below), without overflow for large z."""
    return np.where(z > 1, z + np.log1p(-np.exp(-np.maximum(z, 1))), np.log(np.expm1(np.minimum(z, 1))))


def _inverse_privacy_loss(eps: np.ndarray, s: float, q: float, add: bool) -> np.ndarray:
    """Largest output x whose privacy loss is ≥ eps (nats)."""
    # ports AdditiveNoisePrivacyLoss._inverse_privacy_loss_remove/_add with GaussianPrivacyLoss
    if q == 1.0:
        unsampled = eps
    else:
        sign = -1.0 if add else 1.0
        with np.errstate(divide="ignore", invalid="ignore"):
            if q < _NEAR_ONE:
                unsampled = sign * _log_a_exp_b_plus_c(1 / q, sign * eps, 1 - 1 / q)
            else:  # ln((1 − q)·(e^{±ε − ln(1−q)} − 1)/q): the same, without 1 − 1/q
                log_1mq = math.log1p(-q)
                unsampled = sign * (log_1mq + _log_expm1(sign * eps - log_1mq) - math.log(q))
        edge = sign * math.log(1 - q)  # where the unsampled loss is ∓∞ (math.isclose, as theirs)
        unsampled[np.abs(eps - edge) <= 1e-9 * np.maximum(np.abs(eps), abs(edge))] = -sign * math.inf
    x = -0.5 - unsampled * s**2
    return x + 1 if add else x


def _hockey_stick(eps: np.ndarray, s: float, q: float, add: bool) -> np.ndarray:
    """Hockey-stick divergence δ(ε) = ∫ (μ_upper − e^ε·μ_lower)₊ of one round, for each ε (nats)."""
    # ports AdditiveNoisePrivacyLoss.get_delta_for_epsilon with GaussianPrivacyLoss cdfs
    deltas = np.zeros_like(eps)
    if q == 1.0:
        inside = np.ones(eps.shape, dtype=bool)
    elif add:
        inside = eps < -math.log1p(-q)
    else:
        inside = eps > math.log1p(-q)
        deltas[~inside] = -np.expm1(eps[~inside])
    x = _inverse_privacy_loss(eps[inside], s, q, add)
    if q == 1.0:
        upper, log_lower = special.ndtr((x + 1) / s), special.log_ndtr(x / s)
    elif add:
        upper = special.ndtr(x / s)
        log_lower = np.logaddexp(
            np.log1p(-q) + special.log_ndtr(x / s), np.log(q) + special.log_ndtr((x - 1) / s)
        )
    else:
        upper = (1 - q) * special.ndtr(x / s) + q * special.ndtr((x + 1) / s)
        log_lower = special.log_ndtr(x / s)
    deltas[inside] = upper - np.exp(eps[inside] + log_lower)
    return np.clip(deltas, 0, 1)


def _connect_dots(lower: int, deltas: np.ndarray, d: float) -> _Pmf:
    """Pessimistic PMF on losses (lower + i)·d whose hockey-stick curve passes through deltas."""
    # ports pld_pmf.create_pmf_pessimistic_connect_dots_fixed_gap and create_pmf
    deltas = np.minimum.accumulate(deltas)
    if len(deltas) == 1:
        probs = 1 - deltas
    else:
        diffs = np.diff(deltas)
        probs = np.empty_like(deltas)
        probs[0] = 1 - deltas[0] + diffs[0] / math.expm1(d)
        probs[1:-1] = (diffs[1:] - diffs[:-1] * math.exp(d)) / math.expm1(d)
        probs[-1] = diffs[-1] / math.expm1(-d)
    return _Pmf(lower, np.maximum(0.0, probs), float(deltas[-1]), d, len(probs) <= _MAX_SPARSE_SIZE)


#: largest PLD grid, one round's or a composition's (8 MB of float64; a query this size takes a few
#: seconds). dp_accounting has no such guard and exhausts memory for a small noise multiplier
#: (σ = 0.03 asks for 9e6 points per round and more per composition, σ = 1e-6 for 5e15).
#: The accountant (``PldAccountant``) retries on a coarser grid, which is still an upper bound.
MAX_GRID_POINTS = 1 << 20


class GridTooWideError(ValueError):
    """A PLD would span more than MAX_GRID_POINTS grid points (noise too small for the grid)."""

    def __init__(self, what: str, points: float) -> None:
        super().__init__(f"{what} needs {points:.3g} grid points (at most {MAX_GRID_POINTS})")
        self.points = points


def _check_grid(what: str, points: float) -> None:
    if not points <= MAX_GRID_POINTS:  # also catches NaN
        raise GridTooWideError(what, points)


def _gaussian_pmf(s: float, q: float, d: float, add: bool) -> _Pmf:
    """One round of the Gaussian mechanism, noise std s (sensitivity 1), sampling probability q."""
    # ports privacy_loss_distribution._create_pld_pmf_from_monotone_privacy_loss (connect the dots)
    # with GaussianPrivacyLoss.privacy_loss_tail / connect_dots_bounds
    if s * s == 0:  # the privacy loss (·)/s² is unbounded in floating point
        raise GridTooWideError(f"noise std {s:g}", math.inf)
    tail_x = float(special.ndtri(0.5 * math.exp(_LOG_MASS_TRUNCATION))) * s
    lower_x, upper_x = (tail_x, -tail_x + 1) if add else (tail_x - 1, -tail_x)
    top, bottom = _privacy_loss(lower_x, s, q, add) / d, _privacy_loss(upper_x, s, q, add) / d
    if not math.isfinite(top - bottom):
        raise GridTooWideError(f"noise std {s:g}", math.inf)
    lo, hi = math.floor(bottom), math.ceil(top)
    _check_grid(f"noise std {s:g}", hi - lo + 1)
    return _connect_dots(lo, _hockey_stick(np.arange(lo, hi + 1) * d, s, q, add), d)


@functools.lru_cache(maxsize=32)
def _gaussian_pld(s: float, q: float, d: float) -> _Pld:
    """PLD of one round; ports privacy_loss_distribution.from_gaussian_mechanism.

    Noise std is capped at _MAX_NOISE_STD, where s² would overflow: more noise only shrinks the
    privacy loss, so the capped PLD dominates (an upper bound; both have ε ≈ 0 on any grid)."""
    s = min(s, _MAX_NOISE_STD)
    remove = _gaussian_pmf(s, q, d, add=False)
    return (remove, remove) if q == 1.0 else (remove, _gaussian_pmf(s, q, d, add=True))


def _next_fast_len(n: int, primes: tuple[int, ...]) -> int:
    """Smallest m ≥ n with prime factors only in primes; ports scipy.fft.next_fast_len."""
    smooth = [1]
    for prime in primes:
        grown = []
        for m in smooth:
            while m < 2 * n:
                grown.append(m)
                m *= prime
        smooth = grown
    return min(m for m in smooth if m >= n)


def _fft(x: np.ndarray, n: int) -> np.ndarray:
    """Length-n DFT of real x, bitwise as scipy.fft.fft (the Hermitian extension of its rfft)."""
    half = np.fft.rfft(x, n)
    return np.concatenate([half, np.conj(half[1 : n - len(half) + 1][::-1])])


def _convolve(a: np.ndarray, b: np.ndarray, exact: bool) -> np.ndarray:
    """Full linear convolution of a and b."""
    if exact:  # ports SparsePLDPmf.compose's dictionary loop (same summation order)
        out = np.zeros(len(a) + len(b) - 1)
        for i, x in enumerate(a):
            out[i : i + len(b)] += x * b
        return out
    if len(a) == 1 or len(b) == 1:  # scipy.signal.fftconvolve multiplies length-1 axes directly
        return a * b
    # ports scipy.signal.fftconvolve: real FFT at a 5-smooth length
    n = len(a) + len(b) - 1
    fast = _next_fast_len(n, (2, 3, 5))
    return np.fft.irfft(np.fft.rfft(a, fast) * np.fft.rfft(b, fast), fast)[:n]


def _prefix_len(probs: np.ndarray, threshold: float) -> int:
    """Length of the longest prefix of probs whose running sums stay ≤ threshold."""
    over = np.cumsum(probs) > threshold
    return int(over.argmax()) if over.any() else len(probs)


def _truncate_tails(probs: np.ndarray, tail: float) -> tuple[int, np.ndarray, float]:
    """Drop ≤ tail/2 of mass from each end: the low-loss end's mass moves onto the first kept
    point, the high-loss end's is returned (it goes to +∞). Returns (offset, kept probs, to ∞)."""
    # ports pld_pmf._truncate_tails (pessimistic)
    if tail == 0:
        return 0, probs, 0.0
    left = _prefix_len(probs, tail / 2)
    right = max(len(probs) - _prefix_len(probs[::-1], tail / 2), left + 1)
    kept = probs[left:right].copy()
    kept[0] += np.sum(probs[:left])
    return left, kept, float(np.sum(probs[right:]))


def _compose(a: _Pmf, b: _Pmf, tail: float = _TAIL_MASS_TRUNCATION) -> _Pmf:
    """PMF of the sum of independent losses from a and b, tails truncated by ≤ tail."""
    # ports pld_pmf.compose_pmfs, SparsePLDPmf.compose and DensePLDPmf.compose
    _check_grid("a composition", len(a.probs) + len(b.probs) - 1)
    sparse = a.sparse and b.sparse and len(a.probs) * len(b.probs) <= _MAX_SPARSE_SIZE
    offset, probs, to_inf = _truncate_tails(_convolve(a.probs, b.probs, exact=sparse), tail)
    inf_mass = a.inf_mass + b.inf_mass - a.inf_mass * b.inf_mass + to_inf
    return _Pmf(a.lower + b.lower + offset, probs, inf_mass, a.d, sparse)


def _log_sum_exp(exponents: np.ndarray, weights: np.ndarray) -> float:
    """ln Σ weights·e^exponents for weights ≥ 0; rounds as scipy.special.logsumexp(exponents, b=weights)."""
    top = int(np.where(weights != 0, exponents, -np.inf).argmax())
    scaled = weights * np.exp(exponents - exponents[top])
    scaled[top] = 0.0  # scipy adds the largest term separately, through log(weight) + log1p
    return float(np.log1p(np.sum(scaled) / weights[top]) + np.log(weights[top]) + exponents[top])


def _self_convolve_bounds(probs: np.ndarray, n: int, tail: float) -> tuple[int, int]:
    """Index range holding all but ≤ tail of the n-fold self-convolution of probs."""
    # ports common.compute_self_convolve_bounds (Chernoff bound at 40 fixed orders)
    lower, upper = 0, (len(probs) - 1) * n
    index = np.arange(len(probs))
    for order in np.concatenate((np.arange(-20, 0), np.arange(1, 21))) / len(probs):
        bound = (n * _log_sum_exp(index * order, probs) + math.log(2 / tail)) / order
        if math.isfinite(bound):
            if order > 0:
                upper = min(upper, math.ceil(bound))
            else:
                lower = max(lower, math.floor(bound))
    return lower, upper


def _self_compose(pmf: _Pmf, n: int, tail: float = _TAIL_MASS_TRUNCATION) -> _Pmf:
    """PMF of the sum of n independent losses from pmf."""
    if pmf.sparse and len(pmf.probs) ** min(n, 10) <= _MAX_SPARSE_SIZE:
        # ports SparsePLDPmf.self_compose: repeated exact composition, truncating only at the end
        result = pmf
        for i in range(2, n + 1):
            result = _compose(result, pmf, tail if i == n else 0.0)
        return result
    # ports DensePLDPmf.self_compose and common.self_convolve: FFT power at an 11-smooth length
    lower, upper = _self_convolve_bounds(pmf.probs, n, tail)
    size = upper - lower + 1
    _check_grid(f"{n} rounds", size)
    fast = _next_fast_len(max(size, len(pmf.probs)), (2, 3, 5, 7, 11))
    probs = np.roll(np.real(np.fft.ifft(_fft(pmf.probs, fast) ** n)), -lower)[:size]
    inf_mass = tail - math.expm1(n * math.log1p(-pmf.inf_mass))
    return _Pmf(pmf.lower * n + lower, probs, inf_mass, pmf.d, False)


def _event_pld(sigma: float, p: float, count: int, d: float) -> _Pld:
    """PLD of ``count`` rounds with noise multiplier sigma and sampling probability p."""
    # ports PLDAccountant._maybe_compose for GaussianDpEvent / PoissonSampledDpEvent
    if p == 1.0:
        return _gaussian_pld(sigma / math.sqrt(count), 1.0, d)
    remove, add = _gaussian_pld(sigma, p, d)
    return _self_compose(remove, count), _self_compose(add, count)


def _history_pld(events: Iterable[tuple[float, float, int]], d: float) -> _Pld:
    """PLD of a sequence of (sigma, p, count) events, composed in order from the identity."""
    identity = _Pmf(0, np.ones(1), 0.0, d, True)
    pld = (identity, identity)
    for sigma, p, count in events:
        if not (sigma > 0 and 0 < p <= 1 and count >= 0 and int(count) == count):
            raise ValueError(f"need sigma > 0, 0 < p <= 1, integer count >= 0; got {(sigma, p, count)}")
        if count:
            event = _event_pld(float(sigma), float(p), int(count), d)
            remove = _compose(pld[0], event[0])
            symmetric = pld[0] is pld[1] and event[0] is event[1]
            pld = (remove, remove if symmetric else _compose(pld[1], event[1]))
    if pld[0] is identity:
        raise ValueError("no rounds to account for")
    return pld


def _losses(pmf: _Pmf) -> np.ndarray:
    """Grid privacy losses (nats) of pmf, as key·d."""
    return (np.arange(len(pmf.probs)) + pmf.lower) * pmf.d


def _delta_for_epsilon(pmf: _Pmf, eps: float) -> float:
    """Hockey-stick divergence δ at ε (nats): P[L = ∞] + E[(1 − e^{ε−L})₊]."""
    # ports pld_pmf._get_delta_for_epsilon
    losses = _losses(pmf)
    above = losses > eps
    value = float(pmf.inf_mass + np.dot(-np.expm1(eps - losses[above]), pmf.probs[above]))
    return min(1.0, max(0.0, value))  # FFT round-off can land a few ulps outside [0, 1]


def _log_tail_exp_mass(losses: np.ndarray, probs: np.ndarray, d: float) -> np.ndarray:
    """ln E[e^{-L}; L ≥ l_k] at each k for losses l_k descending by about d: ln of a signed sum (FFT
    round-off leaves probabilities a few ulps below 0), −∞ where that sum is not positive.

    The sum is carried as e^{-l_k}·t_k, t_k = e^{l_k − l_{k−1}}·t_{k−1} + p_k, so that nothing under- or
    overflows however far the losses reach; blocks spanning ≤ 500 nats are summed with one cumsum."""
    n, out, carry = len(losses), np.empty(len(losses)), 0.0
    block = max(1, int(500 / d))
    for start in range(0, n, block):
        top, span = losses[start], losses[start : start + block]
        before = losses[start - 1] if start else top
        t = np.exp(span - top) * np.cumsum(probs[start : start + block] * np.exp(top - span))
        t += np.exp(span - before) * carry
        with np.errstate(divide="ignore", invalid="ignore"):
            out[start : start + block] = np.where(t > 0, np.log(t), -np.inf) - span
        carry = t[-1]
    return out


def _epsilon_for_delta(pmf: _Pmf, delta: float) -> float:
    """Smallest ε ≥ 0 (nats) whose hockey-stick divergence is ≤ delta; ∞ if none."""
    # ports pld_pmf._get_epsilon_for_delta, vectorised: scanning losses l from the top, state k holds
    # upper = P[L > l_k] (with +∞) and lower = E[e^{-L}; L > l_k]; stop once ln((upper−δ)/lower) ≥ l_k.
    # lower is kept as a logarithm: dp_accounting's e^{-l} underflows for losses past ~700 nats (small
    # σ), where it returns the loss itself rather than a bound, or its ratio overflows to ε = ∞.
    if pmf.inf_mass > delta:
        return math.inf
    n, probs = len(pmf.probs), pmf.probs[::-1]
    if pmf.sparse:
        losses = _losses(pmf)[::-1]
    else:  # DensePLDPmf walks itertools.count(top, -d), accumulating the step
        losses = np.cumsum(np.r_[(pmf.lower + n - 1) * pmf.d, np.full(n - 1, -pmf.d)])
    upper = np.cumsum(np.r_[pmf.inf_mass, probs])
    log_lower = np.r_[-np.inf, _log_tail_exp_mass(losses, probs, pmf.d)]
    with np.errstate(invalid="ignore", divide="ignore"):  # states with upper ≤ δ are never used
        candidate = np.log(upper - delta) - log_lower  # the ε solving upper − e^ε·lower = δ
    found = (upper[:-1] > delta) & (log_lower[:-1] > -np.inf) & (candidate[:-1] >= losses)
    stop = int(found.argmax()) if found.any() else n
    if upper[stop] <= delta or candidate[stop] <= 0:
        return 0.0
    return float(candidate[stop])


def epsilon(events: Iterable[tuple[float, float, int]], delta: float, discretization: float = 1e-4) -> float:
    """ε (nats) of the composed (sigma, p, count) events at the given δ; dp_accounting's
    ``PLDAccountant(value_discretization_interval=discretization).get_epsilon(delta)``."""
    remove, add = _history_pld(events, discretization)
    eps = _epsilon_for_delta(remove, delta)
    return eps if remove is add else max(eps, _epsilon_for_delta(add, delta))


def delta(events: Iterable[tuple[float, float, int]], epsilon: float, discretization: float = 1e-4) -> float:
    """δ of the composed (sigma, p, count) events at the given ε (nats); dp_accounting's
    ``PLDAccountant(value_discretization_interval=discretization).get_delta(epsilon)``."""
    remove, add = _history_pld(events, discretization)
    value = _delta_for_epsilon(remove, epsilon)
    return value if remove is add else max(value, _delta_for_epsilon(add, epsilon))
