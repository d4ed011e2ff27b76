"""The statistics of empirical privacy audits: from canary scores to an ε lower bound, an AUC and a
one-shot ε estimate. The attacks that produce the scores live in server/audit/ (canary clients) and client/audit/ (canary examples).

- **One-run lower bound** (Steinke, Nasr & Jagielski, NeurIPS 2023, "Privacy auditing with one (1)
  training run", Theorem 3.1 / their Algorithm 2 p-value): ``m`` canaries, each included independently
  with probability ½; the auditor guesses "in" for its ``k`` highest scores and "out" for its ``k``
  lowest, abstaining on the rest. Under (ε, δ)-DP, ``v`` correct of ``r`` guesses has p-value at most
  ``P[Bin(r, q) ≥ v] + 2mδ·α`` with ``q = e^ε / (1 + e^ε)``; the bound is the largest ε rejected at
  the stated confidence. Several ``k`` are tried with a Bonferroni correction, so the reported bound
  keeps its confidence.
- **K-models threshold bound** (Jagielski, Ullman & Oprea 2020; Nasr et al. 2021): K models, one
  canary in each included with probability ½; for every threshold on the canary's score, the attack's
  false-positive and false-negative rates get Clopper–Pearson upper bounds and DP's
  ``FPR + e^ε·FNR ≥ 1 − δ`` (both ways round) gives ``ε ≥ log((1 − δ − FPR) / FNR)``. Every threshold
  and both directions share the confidence (Bonferroni), so the maximum keeps it.
- **AUC** of the canary scores, in vs out (the Mann-Whitney statistic).
- **One-shot estimate** (Andrew et al., ICLR 2024, "One-shot empirical privacy estimation for federated
  learning", §3): the included canaries' mean score shift in units of the excluded ones' spread, read
  as μ-GDP, and its ε at δ. It is an estimate (right for the Gaussian mechanism), not a bound with a
  confidence.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from common.errors import FedloraError
from common.privacy.accounting.gdp import eps_for_delta

#: fewest canaries an audit accepts
MIN_CANARIES = 10
#: fewest models a K-models audit accepts
MIN_MODELS = 10


def one_run_p_value(m: int, r: int, v: int, eps: float, delta: float) -> float:
    """P[≥ v correct of r guesses] under (ε, δ)-DP with m canaries (Steinke et al. 2023, Algorithm 2)."""
    if not 0 <= v <= r <= m:
        raise ValueError(f"need 0 <= v <= r <= m, got v={v}, r={r}, m={m}")
    from scipy import stats  # here, not at import: `fedlora audit --help` reads this module's minimums

    q = 1.0 / (1.0 + math.exp(-eps))  # accuracy of ε-DP randomized response
    beta = stats.binom.sf(v - 1, r, q)  # P[Bin(r, q) ≥ v]
    if delta == 0 or v == 0:
        return float(min(beta, 1.0))
    i = np.arange(1, v + 1)
    mass = np.cumsum(stats.binom.pmf(v - i, r, q))  # P[v > Bin(r, q) ≥ v - i]
    alpha = float((mass / i).max())
    return float(min(beta + alpha * delta * 2 * m, 1.0))


def one_run_epsilon(m: int, r: int, v: int, delta: float, confidence: float = 0.95) -> float:
    """The largest ε that ``v`` correct of ``r`` guesses reject at ``confidence`` (0 if none)."""
    p = 1.0 - confidence
    if one_run_p_value(m, r, v, 0.0, delta) >= p:
        return 0.0
    hi = 1.0
    while one_run_p_value(m, r, v, hi, delta) < p:
        hi *= 2
        if hi > 1e3:  # cannot happen for finite m: ≥ v correct has probability ≥ q^r > 0
            return math.inf
    from scipy import optimize

    return float(optimize.brentq(lambda e: one_run_p_value(m, r, v, e, delta) - p, 0.0, hi, xtol=1e-6))


def guesses(scores: np.ndarray, included: np.ndarray, k: int) -> tuple[int, int]:
    """``(r, v)``: guess "in" for the ``k`` highest scores and "out" for the ``k`` lowest."""
    order = np.argsort(scores, kind="stable")
    low, high = order[:k], order[len(order) - k :]
    return 2 * k, int((~included[low]).sum() + included[high].sum())


def one_run_bound(
    scores: Sequence[float], included: Sequence[bool], delta: float, confidence: float = 0.95
) -> dict:
    """The best ε lower bound over guess counts ``k`` ∈ {m/20, m/10, m/4, m/2} (each side), each tested
    at ``1 - (1 - confidence)/4`` so the maximum holds at ``confidence`` (Bonferroni)."""
    s, inc = np.asarray(scores, dtype=float), np.asarray(included, dtype=bool)
    m = check_canaries(s, inc)
    ks = sorted({max(1, m // d) for d in (20, 10, 4)} | {m // 2})
    each = 1.0 - (1.0 - confidence) / len(ks)
    best = {"eps_lower_bound": 0.0, "guesses": 0, "correct": 0}
    for k in ks:
        r, v = guesses(s, inc, k)
        eps = one_run_epsilon(m, r, v, delta, each)
        if eps > best["eps_lower_bound"] or best["guesses"] == 0:
            best = {"eps_lower_bound": eps, "guesses": r, "correct": v}
    return {**best, "canaries": m, "confidence": confidence, "delta": delta}


def clopper_pearson_upper(k, n: int, alpha: float):
    """One-sided (1 − α) Clopper–Pearson upper bound on a rate after ``k`` events (an int or an
    array) in ``n`` trials."""
    k = np.asarray(k)
    if n < 1 or (k < 0).any() or (k > n).any():
        raise ValueError(f"need 0 <= k <= n and n >= 1, got k={k}, n={n}")
    from scipy import stats

    upper = np.where(k == n, 1.0, stats.beta.ppf(1.0 - alpha, k + 1, np.maximum(n - k, 1)))
    return float(upper) if upper.ndim == 0 else upper


def threshold_bound(
    scores_in: Sequence[float], scores_out: Sequence[float], delta: float, confidence: float = 0.95
) -> dict:
    """The K-models ε lower bound (module docstring) from one canary score per model, split by
    whether the model trained on the canary; ``threshold`` is the best cut ("in" when score ≥ it)."""
    a, b = np.sort(np.asarray(scores_in, dtype=float)), np.sort(np.asarray(scores_out, dtype=float))
    if len(a) < 1 or len(b) < 1 or not (np.isfinite(a).all() and np.isfinite(b).all()):
        raise FedloraError("a threshold bound needs finite scores of models with and without the canary")
    cuts = np.unique(np.concatenate([a, b]))
    alpha = (1.0 - confidence) / (2 * len(cuts))  # two bounds per threshold
    fp = len(b) - np.searchsorted(b, cuts, side="left")  # out-models scoring ≥ the cut
    fn = np.searchsorted(a, cuts, side="left")  # in-models scoring below it
    fpr, fnr = clopper_pearson_upper(fp, len(b), alpha), clopper_pearson_upper(fn, len(a), alpha)
    with np.errstate(divide="ignore", invalid="ignore"):
        eps = np.maximum(np.log((1.0 - delta - fpr) / fnr), np.log((1.0 - delta - fnr) / fpr))
    eps = np.nan_to_num(eps, nan=0.0, neginf=0.0)
    best = {"eps_lower_bound": 0.0, "threshold": None, "fpr": None, "fnr": None}
    i = int(np.argmax(eps))
    if eps[i] > 0:
        best = {
            "eps_lower_bound": float(eps[i]),
            "threshold": float(cuts[i]),
            "fpr": float(fp[i] / len(b)),
            "fnr": float(fn[i] / len(a)),
        }
    return {**best, "models_in": len(a), "models_out": len(b), "confidence": confidence, "delta": delta}


def check_canaries(scores: np.ndarray, included: np.ndarray) -> int:
    if scores.shape != included.shape or scores.ndim != 1:
        raise FedloraError("one score and one inclusion bit per canary")
    if len(scores) < MIN_CANARIES:
        raise FedloraError(f"an audit needs at least {MIN_CANARIES} canaries, got {len(scores)}")
    if not np.isfinite(scores).all():
        raise FedloraError("canary scores must be finite")
    return len(scores)


def auc(scores_in: Sequence[float], scores_out: Sequence[float]) -> float:
    """P[score of an included canary > that of an excluded one] (ties count ½)."""
    a, b = np.asarray(scores_in, dtype=float), np.asarray(scores_out, dtype=float)
    if len(a) == 0 or len(b) == 0:
        return math.nan
    from scipy import stats

    ranks = stats.rankdata(np.concatenate([a, b]))
    return float((ranks[: len(a)].sum() - len(a) * (len(a) + 1) / 2) / (len(a) * len(b)))


def one_shot_mu(scores_in: np.ndarray, scores_out: np.ndarray) -> float:
    """``μ̂ = (mean_in − mean_out) / sd_out`` (≥ 0): the shift of the included canaries' scores in units
    of the null spread. Under the Gaussian mechanism both groups' scores are Gaussian with the null's
    variance and the release is μ-GDP with this μ (Andrew et al. 2024, §3). Fitting the included
    group's variance separately instead makes the privacy loss unbounded whenever the two fitted
    variances differ, so a small-sample variance ratio alone would drive the estimate at small δ."""
    return max(0.0, float((scores_in.mean() - scores_out.mean()) / scores_out.std(ddof=1)))


def summarize(
    scores: Sequence[float], included: Sequence[bool], delta: float, confidence: float = 0.95
) -> dict:
    """Everything an audit reports from its canaries' scores: AUC, the one-run lower bound, the one-shot
    estimate and the means of both groups."""
    s, inc = np.asarray(scores, dtype=float), np.asarray(included, dtype=bool)
    check_canaries(s, inc)
    a, b = s[inc], s[~inc]
    out = {"auc": auc(a, b), **one_run_bound(s, inc, delta, confidence)}
    out["mu_estimate"] = out["eps_estimate"] = None
    if len(a) > 0 and len(b) > 1 and b.std(ddof=1) > 0:
        mu = one_shot_mu(a, b)
        out["mu_estimate"], out["eps_estimate"] = mu, eps_for_delta(mu, delta)
    out.update(included=int(inc.sum()), mean_in=float(a.mean()), mean_out=float(b.mean()))
    return out
