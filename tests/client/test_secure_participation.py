"""A node's hidden-participation coin (client/secure.py ``contributes``): it comes up at its rate,
from OS entropy, so neither the run's seed nor the server can predict it."""

from __future__ import annotations

import math

import numpy as np

from client import secure
from common.config import RunConfig


def test_the_coin_comes_up_at_its_rate_and_ignores_every_seed():
    """20,000 draws at p 0.1 land within 5 standard deviations of 2,000; p 1 always comes up; two
    runs of draws after seeding numpy, torch and random identically differ (OS entropy, not a seed)."""
    import random

    import torch

    n, rate = 20_000, 0.1
    hits = sum(secure.contributes(rate) for _ in range(n))
    assert abs(hits - n * rate) < 5 * math.sqrt(n * rate * (1 - rate))
    assert all(secure.contributes(1.0) for _ in range(1000))
    runs = []
    for _ in range(2):
        random.seed(RunConfig().seed)
        np.random.seed(RunConfig().seed)
        torch.manual_seed(RunConfig().seed)
        runs.append([secure.contributes(0.5) for _ in range(128)])
    assert runs[0] != runs[1]


def test_takes_part_flips_the_coin_only_under_secure_aggregation():
    """No plan or no secure plan: always; a secure plan: the coin at its sample rate (1 when
    participation is visible), the one coin real clients and audit canaries share."""
    from types import SimpleNamespace

    plan = SimpleNamespace(secure=SimpleNamespace(sample_rate=0.1))
    assert secure.takes_part(None) and secure.takes_part(SimpleNamespace(secure=None))
    assert all(
        secure.takes_part(SimpleNamespace(secure=SimpleNamespace(sample_rate=1.0))) for _ in range(500)
    )
    hits = sum(secure.takes_part(plan) for _ in range(20_000))
    assert abs(hits - 2_000) < 5 * math.sqrt(20_000 * 0.1 * 0.9)
