"""A run whose sample-level history holds more than its plan (a round interrupted and run again) is
re-planned so that it ends at or under its target (client/dp/sample_plan.py ``replan``)."""

from __future__ import annotations

import pytest

from client.dp.sample_plan import plan_sample_noise, replan
from common.errors import FedloraError
from common.privacy.accounting.accountants import Event, RdpAccountant
from common.privacy.accounting.calibration import events_epsilon

TARGET, DELTA, STEPS = 3.0, 1e-5, 20


@pytest.fixture(scope="module")
def plan():
    return plan_sample_noise(1000, 50, STEPS, 1.0, DELTA, TARGET)


def test_a_history_on_or_under_its_plan_keeps_sigma(plan):
    at = Event(plan.sigma, plan.sample_rate, 2)
    assert replan(plan, (at,) * 3, STEPS - 6) is plan  # rounds 1-3 of 10, two steps each
    assert replan(plan, (at,), STEPS - 6) is plan  # a node asked in one round of three: under its plan
    given = plan_sample_noise(1000, 50, STEPS, 1.0, DELTA, noise_multiplier=1.1)
    assert replan(given, (at,) * 20, STEPS) is given  # no target to hold: sigma as given


def test_a_round_charged_twice_is_paid_by_more_noise_on_the_rest(plan):
    """Round 4 of 10 interrupted after its charge and run again: 4 rounds' steps charged before the
    7 still to run. Without re-planning the run ends above its target; re-planned, it ends at it
    (PLD), and by an independent accountant (RDP, looser) the re-planned rest is the noisier one."""
    at = Event(plan.sigma, plan.sample_rate, 2)
    history, remaining = (at,) * 4, STEPS - 6
    over = events_epsilon("pld", (*history, Event(plan.sigma, plan.sample_rate, remaining)), DELTA)
    assert over > TARGET * 1.01  # what today's resumed run spent
    again = replan(plan, history, remaining)
    assert again.sigma > plan.sigma and (again.steps, again.sample_rate) == (plan.steps, plan.sample_rate)
    ahead = (*history, Event(again.sigma, plan.sample_rate, remaining))
    assert TARGET * 0.995 <= events_epsilon("pld", ahead, DELTA) <= TARGET
    rdp = [RdpAccountant(), RdpAccountant()]
    for acc, sigma in zip(rdp, (plan.sigma, again.sigma), strict=True):
        for event in (*history, Event(sigma, plan.sample_rate, remaining)):
            acc.compose(event)
    assert rdp[1].epsilon(DELTA) < rdp[0].epsilon(DELTA)
    # the rounds after the re-planned one keep its sigma: their history is on the new course
    later = (*history, Event(again.sigma, plan.sample_rate, 2))
    assert replan(plan, later, remaining - 2).sigma == pytest.approx(again.sigma, rel=1e-3)


def test_a_history_that_spends_the_target_alone_is_one_line(plan):
    history = (Event(plan.sigma, plan.sample_rate, 2),) * 30  # three times the plan
    with pytest.raises(FedloraError, match="already spends its target epsilon 3") as err:
        replan(plan, history, 2)
    assert "\n" not in str(err.value)
