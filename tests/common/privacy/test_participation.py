"""Who takes part in a round (common/privacy/participation/participation.py), as each run's plan declares it: the
server's sampler and stop rule, and a node's own coin, which comes from OS entropy so that neither
the run's seed nor the server can predict it."""

from __future__ import annotations

import math

import numpy as np
import pytest

from common.config import RunConfig
from common.privacy.participation import participation
from common.privacy.participation.participation import CappedCohorts, PoissonSampling
from common.privacy.planning.plan import plan_noise


def test_the_coin_comes_up_at_its_rate_and_ignores_every_seed():
    """20,000 draws at p 0.1 land within 5 standard deviations of 2,000; p 1 always comes up; two
    runs of draws after seeding numpy, torch and random identically differ (OS entropy, not a seed)."""
    import random

    import torch

    n, rate = 20_000, 0.1
    hits = sum(participation.contributes(rate) for _ in range(n))
    assert abs(hits - n * rate) < 5 * math.sqrt(n * rate * (1 - rate))
    assert all(participation.contributes(1.0) for _ in range(1000))
    runs = []
    for _ in range(2):
        random.seed(RunConfig().seed)
        np.random.seed(RunConfig().seed)
        torch.manual_seed(RunConfig().seed)
        runs.append([participation.contributes(0.5) for _ in range(128)])
    assert runs[0] != runs[1]


def _plan(threat_model: str, **change):
    from common.presets import preset

    values = dict(mechanism="dp-fedavg", threat_model=threat_model, target_epsilon=8.0, clip=0.5)
    return plan_noise(preset("minilm-rt-xdev", **{**values, **change}).check(), 74_000)


@pytest.mark.parametrize(
    ("threat_model", "change", "expected"),
    [
        ("central", {}, PoissonSampling(0.1)),
        ("distributed", {"min_replies": 50}, PoissonSampling(0.1)),
        ("secure-aggregation", {"min_replies": 90, "max_participations": 3}, CappedCohorts(100, 3, 90, 1.0)),
        ("secure-aggregation-hidden", {"min_replies": 900}, CappedCohorts(1000, 30, 900, 0.1)),
    ],
)
def test_each_plan_declares_its_participation(threat_model, change, expected):
    """Central and distributed noise: Poisson sampling at the run's rate, charged to everyone;
    secure aggregation: cohorts of p·N under the cap, never fewer than min-replies, charged per
    client; hidden participation: every client every round, each contributing by its coin at p."""
    rule = _plan(threat_model, **change).participation
    assert rule == expected
    assert rule.per_client == isinstance(expected, CappedCohorts) != rule.charges_empty


def test_a_hidden_plans_coin_comes_up_at_the_sample_rate_and_a_visible_ones_always():
    hidden = _plan("secure-aggregation-hidden", min_replies=900).participation
    visible = _plan("secure-aggregation", min_replies=90, max_participations=3).participation
    assert all(visible.contributes() for _ in range(500))
    assert all(PoissonSampling(0.1).contributes() for _ in range(500))
    hits = sum(hidden.contributes() for _ in range(20_000))
    assert abs(hits - 2_000) < 5 * math.sqrt(20_000 * 0.1 * 0.9)


def test_capped_cohorts_send_nothing_below_the_fewest_survivors_and_stop_once_the_cap_leaves_too_few():
    """A draw smaller than ``least`` is dropped whole (``drawn`` still says how many it had); the run
    stops once fewer than ``least`` nodes are under the cap, without asking the budget (the cap is
    what bounds each client); Poisson sampling defers to the budget."""
    rule, rng = CappedCohorts(cohort=4, cap=2, least=3), np.random.default_rng(0)
    assert rule.sample([1, 2], {}, rng) == ([], 2)
    assert rule.sample([1, 2, 3, 4, 5], {}, rng)[1] == 4
    taken = {1: 2, 2: 2, 3: 2, 4: 1}
    assert rule.online([1, 2, 3, 4, 5], taken, 1) == [4, 5]
    assert "fewer than min-replies 3" in rule.stop_reason([4, 5], lambda: pytest.fail("asked the budget"))
    assert rule.stop_reason([4, 5, 6], lambda: "spent") is None
    assert PoissonSampling(0.5).stop_reason([1], lambda: "spent") == "spent"
    assert PoissonSampling(0.5).taken(None, 1) == {} and rule.taken(None, 1) == {}


def test_a_cyclic_node_keeps_to_one_group_even_if_its_id_changes():
    """The node's own check: its group's rounds only, and never rounds of two residues (a node whose id
    changed on a restart would otherwise take part in a second group's rounds)."""
    from common.privacy.participation.participation import CyclicPoisson, group_of

    rule = CyclicPoisson(3, 0.3)
    node = next(n for n in range(1000, 1100) if group_of(n, 3) == 1)  # rounds 2, 5, 8, ...
    assert rule.refuses(node, 5, [2]) == ""
    assert "is group 0's and this node is in cyclic group 1 of 3" in rule.refuses(node, 4, [2])
    moved = next(n for n in range(1000, 1100) if group_of(n, 3) == 0)  # a new id in group 0
    assert "took part in round 2, of another cyclic group than round 4's" in rule.refuses(moved, 4, [2])


def test_min_separation_draws_the_cohort_from_the_nodes_not_in_the_last_rounds():
    from common.privacy.participation.participation import MinSeparation

    rule = MinSeparation(3, 2)
    taken = {1: 4, 2: 3}  # last rounds: node 1 in round 4, node 2 in round 3 (round 5: both too recent)
    assert rule.online([1, 2, 3, 4, 5], taken, 5) == [3, 4, 5]
    sampled, drawn = rule.sample([3, 4, 5], taken, np.random.default_rng(0))
    assert len(sampled) == drawn == 2 and set(sampled) <= {3, 4, 5}
    assert "took part in round 4, less than the run's min-separation 3" in rule.refuses(7, 6, [1, 4])
    assert rule.refuses(7, 7, [1, 4]) == ""
