"""Privacy read-outs (issue 53 item 9): every headline that prints both ε leads with the one the run
holds to (the larger, the accountant σ was calibrated with) and says what the other is; a secure
run's summary says why its σ and ε differ from the ledger's and the target; `privacy ledger` on a
run directory without a ledger says whether the run was private."""

import json
from dataclasses import asdict

import pytest

from common.config import RunConfig
from common.presets import preset
from common.privacy.accounting.ledger import Ledger
from common.privacy.accounting.statement import client_level
from common.privacy.planning.plan import plan_noise
from server.federation import _round_line
from tests.conftest import run_cli
from tests.harness import ledger_charge

DELTA = 1e-5


def _ledger(path, sigma, p, rounds):
    ledger = Ledger.create(path, "client-level", "r1", DELTA)
    for rnd in range(1, rounds + 1):
        ledger.charge(ledger_charge(rnd, sigma, p, threat_model="central" if p < 1 else "local"))
    return ledger


@pytest.fixture
def central(tmp_path):
    """Subsampled central noise after one round: the CLT gdp is far below the pld bound."""
    ledger = _ledger(tmp_path / "central.sqlite", 1.0, 0.1, 1)
    yield ledger
    ledger.close()


@pytest.fixture
def local(tmp_path):
    """Local noise (p = 1): the CLT gdp overshoots the pld bound."""
    ledger = _ledger(tmp_path / "local.sqlite", 1.0, 1.0, 2)
    yield ledger
    ledger.close()


def test_the_ledger_headline_leads_with_the_bound_and_names_the_approximation(central, local, capsys):
    for ledger, lead, other in ((central, "pld", "gdp"), (local, "gdp", "pld")):
        r = ledger.report()
        assert (r["eps_tight"] > r["eps_gdp"]) == (lead == "pld")  # the fixtures' premise
        key = {"pld": "eps_tight", "gdp": "eps_gdp"}
        assert run_cli(["privacy", "ledger", str(ledger.path)]) == 0
        head = capsys.readouterr().out.splitlines()[0]
        assert f": epsilon {r['epsilon']:.4g} ({lead}" in head  # the run's ε, = the larger, first
        assert r["epsilon"] == pytest.approx(r[key[lead]])
        assert f"; {other} {r[key[other]]:.4g}" in head
        if lead == "pld":
            assert "(pld, the guarantee" in head and "is the CLT mu-GDP approximation, not a bound" in head
        else:
            assert "above the pld bound here, so the run holds to it" in head
            assert f"pld {r['eps_tight']:.4g} is the tight upper bound" in head
        assert run_cli(["privacy", "ledger", "--json", str(ledger.path)]) == 0  # JSON keys unchanged
        parsed = json.loads(capsys.readouterr().out)
        assert {"epsilon", "eps_gdp", "eps_tight", "mu", "tight_accountant"} <= parsed.keys()


def test_round_lines_lead_with_the_larger_and_say_what_the_other_is(central, local):
    for ledger in (central, local):
        r = ledger.report()
        row = {
            **r["rounds"][-1],
            "phase": "applied",
            "train_loss": None,
            "accuracy": 0.5,
            "bytes_down": 0,
            "bytes_up": 0,
            "seconds": 1.0,
        }
        line = _round_line(row, "accuracy", ledger)
        if r["eps_tight"] >= r["eps_gdp"]:
            assert line.endswith(
                f"client-level eps pld {r['eps_tight']:.3g} (gdp {r['eps_gdp']:.3g}: CLT approximation, no bound)"
            )
        else:
            assert line.endswith(
                f"client-level eps gdp {r['eps_gdp']:.3g} (CLT approximation, above the pld bound "
                f"{r['eps_tight']:.3g}; the budget holds to the larger)"
            )


def test_the_summary_privacy_line_leads_with_the_run_s_epsilon(central, local):
    cfg = preset("minilm-rt", mechanism="dp-fedavg", threat_model="central", target_epsilon=8.0).check()
    plan = plan_noise(cfg)
    line = client_level(plan, central.report())
    r = central.report()
    assert (
        f"epsilon {r['eps_tight']:.4g} (pld, the guarantee: a tight upper bound) at delta {plan.delta:g}; gdp {r['eps_gdp']:.4g} "
        in line
    )
    assert "is the CLT mu-GDP approximation, not a bound; add/remove one client" in line
    r = local.report()
    line = client_level(plan, r)
    assert line.split("): ", 1)[1].startswith(
        f"epsilon {r['eps_gdp']:.4g} (gdp, mu {r['mu']:.4g}: the CLT mu-GDP approximation, above the pld "
        f"bound here, so the run holds to it) at delta {plan.delta:g}; pld {r['eps_tight']:.4g} is the tight "
        "upper bound; add/remove one client"
    )


SECURE = dict(
    mechanism="dp-fedavg",
    threat_model="secure-aggregation",
    target_epsilon=8.0,
    clip=0.5,
    min_replies=4,
    secagg_neighbours=5,
    sample_rate=1.0,
    max_participations=2,
    num_clients=6,
    rounds=2,
)


def test_a_secure_summary_says_why_sigma_and_epsilon_differ_from_the_ledger_and_the_target():
    """The plan's σ is for the fewest survivors m; rounds with more survivors carry more noise (the
    ledger's σ), which, or fewer participations than the cap, leaves the worst client below target."""
    plan = plan_noise(preset("minilm-rt", **SECURE).check(), 1000)
    realised = plan.sigma * (6 / 4) ** 0.5
    totals = {
        "eps_tight": 6.292,
        "eps_gdp": 7.574,
        "mu": 1.0,
        "tight_accountant": "rdp",
        "rounds": [{"sigma": realised}, {"sigma": realised}],
        "most_participations": 2,
    }
    line = client_level(plan, totals)
    assert f"sigma {plan.sigma:.4g} calibrated for the fewest survivors m = 4" in line
    assert "a round with r > m survivors carries sigma x sqrt(r/m), the ledger's" in line
    assert (
        f"epsilon 6.292 (rdp, the worst client's; below the target 8: rounds had more survivors than "
        f"m = 4, so more noise (sigma up to {realised:.4g}))" in line
    )
    fewer = {**totals, "rounds": [{"sigma": plan.sigma}], "most_participations": 1}
    line = client_level(plan, fewer)
    assert "below the target 8: the worst client took part in 1 of at most 2 rounds)" in line
    at_target = {**fewer, "eps_tight": 8.0, "most_participations": 2}
    assert "below the target" not in client_level(plan, at_target)


def test_privacy_ledger_on_a_run_directory_says_whether_the_run_was_private(tmp_path, capsys):
    plain = tmp_path / "plain"
    plain.mkdir()
    (plain / "config.json").write_text(json.dumps(asdict(RunConfig(mechanism="fedavg"))))
    assert run_cli(["privacy", "ledger", str(plain)]) == 2
    err = capsys.readouterr().err
    assert f"no ledger in {plain}: the run was not private" in err
    clip = tmp_path / "clip"
    clip.mkdir()
    (clip / "config.json").write_text(json.dumps(asdict(RunConfig(mechanism="dp-fedavg", clip_only=True))))
    assert run_cli(["privacy", "ledger", str(clip)]) == 2
    assert "the run was not private (clip-only diagnostic" in capsys.readouterr().err
    other = tmp_path / "other"
    other.mkdir()
    assert run_cli(["privacy", "ledger", str(other)]) == 2
    err = capsys.readouterr().err
    assert f"no ledger at {other}" in err and "not a run directory" in err
    run = tmp_path / "run"  # a private run's directory: its ledger
    run.mkdir()
    _ledger(run / "ledger.sqlite", 1.0, 0.1, 1).close()
    assert run_cli(["privacy", "ledger", str(run)]) == 0
    assert "client-level ledger" in capsys.readouterr().out
