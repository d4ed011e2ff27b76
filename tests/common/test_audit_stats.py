"""The audits' statistics: the one-run bound against scipy's binomial and a simulated ε-DP randomized
response, the AUC against scipy's Mann-Whitney U, the one-shot estimate on Gaussian scores of known
μ, the K-models threshold bound against scipy's exact binomial interval and a Gaussian mechanism of
known ε (common/privacy/audit.py)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from scipy import stats

from common.errors import FedloraError
from common.privacy.accounting.gdp import eps_for_delta
from common.privacy.audit import (
    auc,
    clopper_pearson_upper,
    one_run_bound,
    one_run_epsilon,
    one_run_p_value,
    one_shot_mu,
    summarize,
    threshold_bound,
)


def test_p_value_without_delta_is_the_binomial_tail():
    for m, r, v, eps in ((100, 40, 30, 1.0), (1000, 200, 150, 0.5), (50, 50, 50, 3.0)):
        q = math.exp(eps) / (1 + math.exp(eps))
        assert one_run_p_value(m, r, v, eps, 0.0) == pytest.approx(stats.binom.sf(v - 1, r, q), rel=1e-12)
    # δ > 0: the paper's Algorithm 2, transcribed literally (one term at a time)
    for m, r, v, eps, delta in ((100, 40, 30, 1.0, 1e-3), (1000, 300, 200, 0.7, 1e-5)):
        q = 1 / (1 + math.exp(-eps))
        alpha, mass = 0.0, 0.0
        for i in range(1, v + 1):
            mass += stats.binom.pmf(v - i, r, q)
            alpha = max(alpha, mass / i)
        expected = min(stats.binom.sf(v - 1, r, q) + alpha * delta * 2 * m, 1.0)
        assert one_run_p_value(m, r, v, eps, delta) == pytest.approx(expected, rel=1e-10)
    # δ only adds: the p-value grows with δ and so the bound shrinks
    assert one_run_p_value(100, 40, 30, 1.0, 1e-3) > one_run_p_value(100, 40, 30, 1.0, 0.0)
    assert one_run_epsilon(1000, 200, 180, 1e-3) < one_run_epsilon(1000, 200, 180, 0.0)


def test_bound_is_valid_and_tight_for_randomized_response():
    """Guesses that are ε0-randomized response: the 95 % bound stays below ε0 in ≥ 95 % of trials
    (up to sampling error) and comes close to it with many guesses."""
    rng = np.random.default_rng(0)
    eps0, m, trials = 2.0, 2000, 200
    q = math.exp(eps0) / (1 + math.exp(eps0))
    bounds = [one_run_epsilon(m, m, int(rng.binomial(m, q)), 0.0, 0.95) for _ in range(trials)]
    assert np.mean(np.asarray(bounds) > eps0) <= 0.05 + 3 * math.sqrt(0.05 * 0.95 / trials)
    assert np.median(bounds) > 0.8 * eps0


def test_bonferroni_bound_over_guess_counts_and_canary_minimum():
    rng = np.random.default_rng(1)
    included = rng.random(400) < 0.5
    scores = included + rng.normal(0, 0.3, 400)  # a strong attack
    best = one_run_bound(scores, included, 1e-5)
    assert best["eps_lower_bound"] > 1 and best["correct"] <= best["guesses"] <= 400
    null = one_run_bound(rng.normal(size=400), included, 1e-5)  # scores independent of membership
    assert null["eps_lower_bound"] < 0.5
    with pytest.raises(FedloraError, match="at least 10 canaries"):
        one_run_bound(scores[:9], included[:9], 1e-5)


def test_auc_is_the_mann_whitney_statistic():
    rng = np.random.default_rng(2)
    a, b = rng.normal(0.5, 1, 70), np.concatenate([rng.normal(0, 1, 50), [0.5, 0.5]])
    u = stats.mannwhitneyu(a, b, alternative="two-sided").statistic
    assert auc(a, b) == pytest.approx(u / (len(a) * len(b)), rel=1e-12)
    assert auc([1, 2, 3], [0, -1]) == 1.0 and auc([0], [0]) == 0.5


@pytest.mark.parametrize("mu", [0.5, 1.5])
def test_one_shot_estimate_recovers_the_gdp_mu_of_gaussian_scores(mu):
    """Scores of a μ-GDP Gaussian mechanism: N(μs, s²) included, N(0, s²) excluded."""
    rng = np.random.default_rng(4)
    s = 0.003
    inc = rng.random(20000) < 0.5
    scores = rng.normal(0, s, 20000) + inc * mu * s
    out = summarize(scores, inc, 1e-6)
    assert out["mu_estimate"] == pytest.approx(mu, abs=0.05)
    assert out["eps_estimate"] == pytest.approx(eps_for_delta(out["mu_estimate"], 1e-6), rel=1e-12)
    assert one_shot_mu(np.zeros(3) - 1, rng.normal(size=50)) == 0.0  # a negative shift is no leak


def test_summary_reports_auc_bound_and_estimate():
    rng = np.random.default_rng(3)
    included = rng.random(200) < 0.5
    scores = np.where(included, 1.0, 0.0) + rng.normal(0, 1, 200)
    out = summarize(scores, included, 1e-5)
    assert 0.6 < out["auc"] < 0.9 and 0 < out["eps_estimate"] < 10 and out["included"] == included.sum()
    assert json.dumps(out, allow_nan=False)


def test_clopper_pearson_upper_matches_scipys_exact_interval():
    """One-sided (1 − α) upper = the upper end of scipy's two-sided exact interval at 1 − 2α."""
    for k, n, alpha in ((0, 10, 0.05), (3, 10, 0.01), (9, 10, 0.001), (17, 400, 0.025)):
        want = stats.binomtest(k, n).proportion_ci(confidence_level=1 - 2 * alpha, method="exact").high
        assert clopper_pearson_upper(k, n, alpha) == pytest.approx(want, rel=1e-9)
    assert clopper_pearson_upper(10, 10, 0.05) == 1.0
    assert clopper_pearson_upper(0, 20, 0.05) == pytest.approx(1 - 0.05 ** (1 / 20))  # closed form


def test_threshold_bound_closed_form_and_validity():
    # perfectly separated K/2 + K/2 models: both rates 0 at the cut; 2n distinct cuts share the 5 %
    n = 20
    bound = threshold_bound(np.arange(n) + 100.0, np.arange(n), delta=0.0)
    u = 1 - (0.05 / (2 * 2 * n)) ** (1 / n)
    assert (
        bound["eps_lower_bound"] == pytest.approx(math.log((1 - u) / u)) and bound["fpr"] == 0 == bound["fnr"]
    )
    assert threshold_bound(np.zeros(10), np.zeros(10), 1e-5)["eps_lower_bound"] == 0.0
    # the Gaussian mechanism at μ = 1 (ε at δ = 1e-5 known in closed form): the 95 % bound stays
    # below it in ≥ 95 % of trials and is positive with 2,000 models
    rng = np.random.default_rng(4)
    true_eps = eps_for_delta(1.0, 1e-5)
    bounds = [
        threshold_bound(rng.normal(1, 1, 1000), rng.normal(0, 1, 1000), 1e-5)["eps_lower_bound"]
        for _ in range(40)
    ]
    assert np.mean(np.asarray(bounds) > true_eps) <= 0.05 and min(bounds) > 0
    with pytest.raises(FedloraError, match="finite scores"):
        threshold_bound([1.0], [], 1e-5)
