"""Poisson client sampling and FedAvg of increments."""

import numpy as np
import pytest
import torch

from server.aggregate import apply_increment, weighted_mean
from server.sampling import poisson_sample


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
