"""The plan of a secure-aggregation release (common/privacy/secure_plan.py): its noise meets the
target against independent accountants, its modulus holds the worst-case sum, bad plans fail in one line."""

from __future__ import annotations

import json
import math

import pytest

from common.errors import FedloraError
from common.privacy.calibration import calibrate_sigma
from common.privacy.secure_plan import HEADROOM_SDS, SecureTarget, plan_secure
from tests.conftest import run_cli

MINILM = dict(dim=74_000, clip=0.5, survivors=(75, 130), graph=(10, 6))


@pytest.mark.parametrize("participations", [3, 5, 30])
def test_the_noise_meets_the_target_and_costs_little_more_than_the_gaussian(participations):
    """The Skellam variance meets ε 8 at p = 1 (its own RDP accountant), and its Gaussian
    equivalent σ sits just above the σ a Gaussian needs for the same ε by the PLD (dp_accounting's
    algorithm): RDP's conversion and the Skellam excess cost a few percent, never less noise."""
    plan = plan_secure(SecureTarget(8.0, 1e-6, participations), **MINILM)
    assert plan.epsilon <= 8.0 and plan.epsilon == pytest.approx(8.0, rel=1e-4)
    gaussian = calibrate_sigma("pld", 8.0, 1e-6, 1.0, participations)
    assert gaussian < plan.sigma < 1.12 * gaussian
    assert plan.share_variance * plan.min_survivors == pytest.approx(plan.mu)


def test_the_modulus_holds_the_worst_case_sum_with_its_headroom_and_no_more_bits():
    plan = plan_secure(SecureTarget(3.0, 1e-6, 5), **MINILM)
    signal = plan.cohort * plan.l2  # every client at its L2 bound on one coordinate
    sd = math.sqrt(plan.cohort * plan.mu / plan.min_survivors)  # n shares of μ/m
    need = 2 * signal + 3 * HEADROOM_SDS * sd
    assert 2**plan.bits >= need > 2 ** (plan.bits - 1)
    assert plan.limit == pytest.approx(signal + HEADROOM_SDS * sd) and plan.limit < 2 ** (plan.bits - 1)
    assert plan.bits <= 20 and plan.vector_bytes == -(-plan.padded * plan.bits // 8)


@pytest.mark.parametrize(
    "change, message",
    [
        (dict(graph=(10, 5)), "threshold 5 must be above half"),
        (dict(graph=(10, 11)), "at most 10"),
        (dict(survivors=(4, 130)), r"min survivors 4 \(--min-replies\) must be at least the threshold 6"),
        (dict(bits=16), "16 bits per coordinate are too few"),
    ],
)
def test_a_plan_that_cannot_hold_fails_in_one_line(change, message):
    with pytest.raises(FedloraError, match=message) as err:
        plan_secure(SecureTarget(8.0, 1e-6, 5), **{**MINILM, **change})
    assert "\n" not in str(err.value)


def test_the_cli_prints_the_plan(capsys):
    args = "--epsilon 8 --delta 1e-6 --participations 5 --dim 74000 --clip 0.5 --min-survivors 75"
    code = run_cli(f"privacy secagg {args} --cohort 130 --neighbours 10 --threshold 6 --json".split())
    out = json.loads(capsys.readouterr().out)
    assert code == 0 and out["bits"] == plan_secure(SecureTarget(8.0, 1e-6, 5), **MINILM).bits
    assert "who participated is visible" in out["guarantee"]
    assert run_cli(f"privacy secagg {args} --cohort 130 --neighbours 10 --threshold 5".split()) == 2
    assert "threshold 5" in capsys.readouterr().err


def test_against_observers_of_the_adapter_sampling_amplifies_and_the_cli_says_whom_it_holds_against(capsys):
    """The same μ spends less against observers who do not see the sample than against the server,
    never less than the exact sampled Gaussian of the same σ (the PLD accountant, independent)."""
    from common.privacy.calibration import epsilon_for

    plan = plan_secure(SecureTarget(8.0, 1e-6, 5), **MINILM)
    observers = plan.observers_epsilon(0.1, 30)
    assert epsilon_for("pld", plan.sigma, 0.1, 30, 1e-6) < observers < plan.epsilon
    args = (
        "--epsilon 8 --delta 1e-6 --participations 5 --dim 74000 --clip 0.5 --min-survivors 75 --cohort 130"
    )
    code = run_cli(
        f"privacy secagg {args} --neighbours 10 --threshold 6 --sample-rate 0.1 --rounds 30 --json".split()
    )
    out = json.loads(capsys.readouterr().out)
    assert code == 0 and out["epsilon_adapter_observers"] == pytest.approx(observers)
    assert "not against the server" in out["adapter_observers"]
    assert run_cli(f"privacy secagg {args} --neighbours 10 --threshold 6 --rounds 30".split()) == 2
    assert "go together" in capsys.readouterr().err


def _secure_cfg(**change):
    from common.presets import preset

    values = dict(
        mechanism="dp-fedavg",
        threat_model="secure-aggregation",
        target_epsilon=8.0,
        clip=0.5,
        min_replies=75,
        max_participations=5,
    )
    return preset("minilm-rt-xdev", **{**values, **change})


@pytest.mark.parametrize(
    "change, message",
    [
        (dict(mechanism="dr-encoder"), "supports the gaussian release"),
        (dict(adaptive_clip=True), "drop --adaptive-clip"),
        (dict(target_epsilon=0.0, noise_multiplier=1.0), "drop --noise-multiplier"),
        (dict(target_epsilon=0.0), "needs --target-epsilon"),
        (
            dict(secagg_neighbours=10, secagg_threshold=11),
            "threshold 11 must be above half the 10 neighbours",
        ),
        (dict(secagg_threshold=5), "threshold 5 must be above half"),
        (dict(min_replies=4), r"min survivors 4 \(--min-replies\) must be at least the threshold 6"),
    ],
)
def test_a_secure_run_config_that_cannot_hold_fails_in_one_line(change, message):
    with pytest.raises(FedloraError, match=message) as err:
        _secure_cfg(**change).check()
    assert "\n" not in str(err.value)


def test_a_secure_runs_plan_is_derived_from_its_config_and_the_adapters_size():
    """Both halves derive the same plan from the run config and the adapter's size: the cap and the
    cohort from the options (or the expected cohort p·N and the mean participations), p = 1,
    σ the Skellam plan's Gaussian equivalent, the planned ε the target over the cap; too few bits
    for the cohort, or no size, fail in one line before any round."""
    from common.privacy.plan import plan_noise
    from common.privacy.secure_plan import cohort_bound, participation_cap

    cfg = _secure_cfg().check()
    plan = plan_noise(cfg, 74_000)
    assert plan.p == 1.0 and plan.secure.participations == 5 and plan.secure.cohort == 100
    assert plan.sigma == plan.secure.sigma and plan.event.l2 == plan.secure.l2
    # the ledger's RDP accountant (a finer grid of orders than the plan's search) lands at or below it
    assert 7.5 < plan.planned_epsilon(30) <= plan.secure.epsilon <= 8.0
    assert plan.budget_accountants == ("rdp",)
    derived = cfg.replace(max_participations=0)
    # 30 rounds of 100 of 1,000 clients: 3 participations each on average, the default cap
    assert participation_cap(derived) == 3 and cohort_bound(cfg.replace(max_cohort=120)) == 120
    assert participation_cap(derived.replace(max_cohort=150)) == 5  # ceil(30 * 150 / 1000)
    with pytest.raises(FedloraError, match="needs the adapter's size"):
        plan_noise(cfg)
    with pytest.raises(FedloraError, match="8 bits per coordinate are too few") as err:
        plan_noise(cfg.replace(secagg_bits=8), 74_000)
    assert "\n" not in str(err.value)
