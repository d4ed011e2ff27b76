"""The plan of a secure-aggregation release (common/privacy/planning/secure_plan.py): its noise meets the
target against independent accountants, its modulus holds the worst-case sum, bad plans fail in one line."""

from __future__ import annotations

import json
import math

import pytest

from common.errors import FedloraError
from common.privacy.accounting.calibration import calibrate_sigma
from common.privacy.planning.secure_plan import HEADROOM_SDS, SecureTarget, contributor_bound, plan_secure
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
    from common.privacy.accounting.calibration import epsilon_for

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
        (
            dict(mechanism="dr-encoder"),
            r"the secagg\+ transport carries integer-valued releases only \(skellam\), not dr-encoder",
        ),
        (
            dict(adaptive_clip=True),
            r"--adaptive-clip: its noised clip bit has no place in the secagg\+ transport",
        ),
        (dict(target_epsilon=0.0, noise_multiplier=1.0), "drop --noise-multiplier"),
        (dict(target_epsilon=0.0), "needs --target-epsilon"),
        (
            dict(secagg_neighbours=10, secagg_threshold=11),
            "threshold 11 must be above half the 10 neighbours",
        ),
        (dict(secagg_threshold=5), "threshold 5 must be above half"),
        (dict(min_replies=4), r"min survivors 4 \(--min-replies\) must be at least the threshold 6"),
        (
            dict(threat_model="secure-aggregation-hidden"),
            "asks every client every round; drop --max-participations",
        ),
        (
            dict(threat_model="secure-aggregation-hidden", max_participations=0, max_cohort=50),
            "drop --max-cohort",
        ),
        (
            dict(threat_model="secure-aggregation-hidden", max_participations=0, min_replies=1001),
            "--min-replies 1001 exceeds the 1000 clients",
        ),
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
    from common.privacy.planning.plan import plan_noise
    from common.privacy.planning.secure_plan import cohort_bound, participation_cap

    cfg = _secure_cfg().check()
    plan = plan_noise(cfg, 74_000)
    assert plan.p == 1.0 and plan.family.participations == 5 and plan.family.cohort == 100
    assert plan.sigma == plan.family.sigma and plan.event.l2 == plan.family.l2
    # the ledger's RDP accountant (a finer grid of orders than the plan's search) lands at or below it
    assert 7.5 < plan.planned_epsilon(30) <= plan.family.epsilon <= 8.0
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


def test_hidden_participation_charges_every_round_at_the_sample_rate_and_needs_less_noise():
    """Hidden participation (every client in every round, each contributing by its own coin at p):
    μ meets the target over all rounds Poisson-sampled at p, by the independent sampled-Gaussian RDP
    of common/privacy/accounting/rdp.py as a floor (the Skellam bound is never below it); it needs less noise
    than the same clients taking part 3 times at p = 1, and sits within 2 % of the Gaussian's RDP σ
    for the same sampling (the amplification bound is exact for the Gaussian curve; what is left is
    the Skellam bound's excess term and the rounding: 0.847 against 0.838 here)."""
    hidden = plan_secure(SecureTarget(8.0, 1e-6, 30, 0.1), **{**MINILM, "survivors": (900, 1000)})
    visible = plan_secure(SecureTarget(8.0, 1e-6, 3), **{**MINILM, "survivors": (90, 100)})
    assert hidden.sample_rate == 0.1 and hidden.epsilon == pytest.approx(8.0, rel=1e-4)
    gaussian = calibrate_sigma("rdp", 8.0, 1e-6, 0.1, 30)
    assert gaussian < hidden.sigma < 1.02 * gaussian
    assert hidden.sigma < visible.sigma


def test_the_bits_hold_the_likely_contributors_not_every_contacted_client():
    """With 1,000 clients contacted at p 0.1, the modulus holds the sum of the binomial's 1 - 1e-9
    quantile of contributors (an independent tail sum with math.comb agrees), not 1,000 of them."""
    bound = contributor_bound(1000, 0.1)
    tail = sum(math.comb(1000, j) * 0.1**j * 0.9 ** (1000 - j) for j in range(bound, 1001))
    above = sum(math.comb(1000, j) * 0.1**j * 0.9 ** (1000 - j) for j in range(bound - 1, 1001))
    assert tail < 1e-9 <= above  # the smallest count exceeded with probability below 1e-9
    plan = plan_secure(
        SecureTarget(8.0, 1e-6, 30, 0.1), **{**MINILM, "survivors": (900, 1000)}, contributors=bound
    )
    everyone = plan_secure(SecureTarget(8.0, 1e-6, 30, 0.1), **{**MINILM, "survivors": (900, 1000)})
    assert plan.contributors == bound and plan.bits <= 20 < everyone.bits
    assert contributor_bound(20, 1.0) == 20


def test_a_hidden_participation_runs_plan_asks_everyone_every_round_at_the_sample_rate():
    """``secure-aggregation-hidden``: the cohort is every client, every round counts (at p), the plan's
    event is Poisson-sampled at the run's rate, and the bits hold the likely contributors."""
    from common.privacy.planning.plan import plan_noise
    from common.privacy.planning.secure_plan import cohort_bound, contributor_bound, participation_cap

    cfg = _secure_cfg(threat_model="secure-aggregation-hidden", max_participations=0, min_replies=900).check()
    plan = plan_noise(cfg, 74_000)
    assert (cohort_bound(cfg), participation_cap(cfg)) == (1000, 30)
    assert plan.p == plan.event.p == plan.family.sample_rate == 0.1
    assert plan.family.contributors == contributor_bound(1000, 0.1) and plan.family.bits <= 20
    assert 7.5 < plan.planned_epsilon(30) <= 8.0


def test_the_cli_plans_hidden_participation_for_every_round_at_the_sample_rate(capsys):
    args = "--epsilon 8 --delta 1e-6 --participations 1 --dim 74000 --clip 0.5 --min-survivors 900"
    graph = "--cohort 1000 --neighbours 10 --threshold 6"
    code = run_cli(f"privacy secagg {args} {graph} --hidden --sample-rate 0.1 --rounds 30 --json".split())
    out = json.loads(capsys.readouterr().out)
    expected = plan_secure(
        SecureTarget(8.0, 1e-6, 30, 0.1),
        **{**MINILM, "survivors": (900, 1000)},
        contributors=contributor_bound(1000, 0.1),
    )
    assert code == 0 and (out["sigma"], out["bits"]) == (expected.sigma, expected.bits)
    assert "who contributed is hidden" in out["guarantee"] and "p = 0.1" in out["accountant"]
    assert run_cli(f"privacy secagg {args} {graph} --hidden".split()) == 2
    assert "--hidden needs --sample-rate and --rounds" in capsys.readouterr().err
