"""Correlated noise (--mechanism dp-ftrl) through the real ServerApp and ClientApp: the server keeps
the participation rule its epsilon assumes, every node's ledger agrees, the secret stream is gone
when the run ends, and every epsilon names the rule."""

from __future__ import annotations

import json

import pytest

from common.presets import preset
from common.privacy.accounting.ledger import Ledger
from common.privacy.mechanisms.ftrl_mechanism import NOISE_FILE
from tests.conftest import run_cli
from tests.harness import federate, records

pytestmark = pytest.mark.integration

RUN = dict(max_train_examples=200, eval_examples=20, local_steps=1, batch_size=8, seed=3)
FTRL = dict(mechanism="dp-ftrl", threat_model="central", target_epsilon=8.0, clip=0.5)


def _node_rounds(ledger: Ledger) -> dict[int, list[int]]:
    rounds = {r["seq"]: r["round"] for r in ledger.rows()}
    out: dict[int, list[int]] = {}
    for seq, nodes in ledger.participants().items():
        for node in nodes:
            out.setdefault(node, []).append(rounds[seq])
    return out


def test_a_min_separation_run_keeps_its_rule_and_its_budget(tmp_path, capsys):
    """6 nodes, 2 a round (p 0.34: 2 bands, min-sep 2), 4 rounds: every round applied, no node in two
    rounds less than 2 apart, the worst client within epsilon 8, the stream's file removed."""
    out = tmp_path / "run"
    cfg = preset(
        "minilm-rt", **RUN, **FTRL, num_clients=6, sample_rate=0.34, rounds=4, out_dir=str(out)
    ).check()
    federate(cfg)
    applied = [r for r in records(out) if r.get("applied")]
    assert [r["round"] for r in applied] == [1, 2, 3, 4]
    summary = json.loads((out / "summary.json").read_text())
    assert "assuming min-separation 2" in summary["privacy"]
    assert not (out / NOISE_FILE).exists()
    ledger = Ledger.open(out / "ledger.sqlite", "client-level")
    rounds = _node_rounds(ledger)
    assert sum(map(len, rounds.values())) == 8
    assert all(b - a >= 2 for rs in rounds.values() for a, b in zip(sorted(rs), sorted(rs)[1:], strict=False))
    assert ledger.spent()["eps_tight"] <= 8.0 and max(map(len, rounds.values())) <= 2
    report = ledger.report()  # the run holds to pld alone: the CLT gdp does not apply at p = 1
    assert report["budget"] == "pld" and report["epsilon"] == report["eps_tight"] < report["eps_gdp"]
    capsys.readouterr()
    assert run_cli(["privacy", "ledger", str(out / "ledger.sqlite")]) == 0
    assert f"epsilon {report['eps_tight']:.4g} (pld, the bound the run holds to" in capsys.readouterr().out


def test_a_cyclic_poisson_run_samples_only_the_rounds_group(tmp_path):
    """6 nodes, p 0.5, 2 groups (q = 1): round r draws exactly the nodes of group (r − 1) mod 2, and the
    ledger charges every client one sampled Gaussian per cycle (rounds 1 and 3), nothing in round 2."""
    from common.privacy.participation.participation import group_of

    out = tmp_path / "run"
    cfg = preset(
        "minilm-rt", **RUN, **FTRL, num_clients=6, sample_rate=0.5, rounds=3, participation="cyclic-poisson",
        out_dir=str(out),
    ).check()  # fmt: skip
    grid = federate(cfg)
    nodes = sorted(grid.get_node_ids())
    lines = {r["round"]: r for r in records(out) if r.get("round")}
    for rnd in range(1, 4):
        group = [n for n in nodes if group_of(n, 2) == (rnd - 1) % 2]
        assert lines[rnd]["sampled"] == len(group)
    events = Ledger.open(out / "ledger.sqlite", "client-level").events()
    assert [e.count for e in events] == [1, 0, 1] and {e.p for e in events} == {1.0}
