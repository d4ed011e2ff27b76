"""Poisson client sampling, secure aggregation's balanced cohorts, and FedAvg of increments."""

import numpy as np
import pytest
import torch

from common.privacy.participation.participation import balanced_sample, eligible, poisson_sample
from server.aggregate import apply_increment, weighted_mean


def test_poisson_inclusion_rate_matches_p():
    rng = np.random.default_rng(0)
    nodes = list(range(50))
    counts = np.zeros(50)
    trials = 4000
    for _ in range(trials):
        for n in poisson_sample(nodes, 0.1, rng):
            counts[n] += 1
    rate = counts / trials
    # each node: Binomial(4000, 0.1) has std 0.0047; 5 sigma bound
    assert np.all(np.abs(rate - 0.1) < 0.024)
    assert abs(rate.mean() - 0.1) < 0.004


def test_poisson_can_sample_nobody_and_everybody():
    rng = np.random.default_rng(1)
    sizes = {len(poisson_sample(list(range(3)), 0.2, rng)) for _ in range(500)}
    assert 0 in sizes and 3 in sizes
    assert poisson_sample([1, 2, 3], 1.0, rng) == [1, 2, 3]


def test_balanced_cohorts_use_every_cap_and_run_every_round():
    """Cohorts of 100 from 1,000 clients with a cap of 3: 30 rounds run, every client takes part
    exactly 3 times, and nobody takes a second turn before everyone had a first; within a tier the
    draw is random (two runs differ)."""
    runs = []
    for seed in (0, 1):
        rng, taken, cohorts = np.random.default_rng(seed), {}, []
        while len(online := eligible(list(range(1000)), taken, 3)) >= 100:
            cohort = balanced_sample(online, taken, 100, rng)
            assert len(cohort) == 100 and cohort == sorted(set(cohort))
            assert max(taken.get(n, 0) for n in cohort) == min(taken.get(n, 0) for n in online)
            for n in cohort:
                taken[n] = taken.get(n, 0) + 1
            cohorts.append(cohort)
        assert len(cohorts) == 30 and set(taken.values()) == {3} and len(taken) == 1000
        runs.append(cohorts)
    assert runs[0][0] != runs[1][0]


def test_a_cohort_spans_tiers_when_the_least_used_do_not_fill_it():
    taken = {1: 0, 2: 1, 3: 1, 4: 1, 5: 2}
    cohort = balanced_sample([1, 2, 3, 4, 5], taken, 3, np.random.default_rng(0))
    assert 1 in cohort and 5 not in cohort and len(cohort) == 3
    assert balanced_sample([4, 2], taken, 3, np.random.default_rng(0)) == [2, 4]


@pytest.mark.parametrize("p", [0.0, -0.1, 1.5])
def test_invalid_rate(p):
    with pytest.raises(ValueError):
        poisson_sample([1], p, np.random.default_rng(0))


def test_weighted_mean_is_example_weighted():
    a, b = {"x": torch.tensor([1.0, 0.0])}, {"x": torch.tensor([0.0, 4.0])}
    mean = weighted_mean([a, b], [3, 1])
    torch.testing.assert_close(mean["x"], torch.tensor([0.75, 1.0]))
    torch.testing.assert_close(
        apply_increment({"x": torch.ones(2)}, mean, 2.0)["x"], torch.tensor([2.5, 3.0])
    )
