"""``fedlora evaluate`` (server/evaluate_cli.py): a finished run's adapter scored again reproduces the
run's own final and round-0 evaluations, and scores more held-out examples when asked."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from common.presets import preset
from server.simulate import simulate
from tests.conftest import run_cli
from tests.harness import TINY

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("evaluate") / "run"
    cfg = preset("small", **{**TINY, "precision": "fp32", "sample_rate": 1.0, "eval_examples": 24})
    simulate(cfg.check(), run_dir)
    return run_dir


def _evaluate(argv: list[str], capsys) -> dict:
    assert run_cli(["evaluate", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


@pytest.mark.timeout(600)
def test_the_run_s_own_evaluations_are_reproduced_and_more_examples_are_scored(finished_run, capsys):
    summary = json.loads((finished_run / "summary.json").read_text())
    final = _evaluate(["--run", str(finished_run)], capsys)
    assert (final["adapter"], final["round"], final["eval_examples"]) == ("final", 1, 24)
    assert final["metrics"] == summary["after"]
    base = _evaluate(["--run", str(finished_run), "--base"], capsys)
    assert base["round"] == 0 and base["metrics"] == summary["before"]
    more = _evaluate(["--run", str(finished_run), "--eval-examples", "100000"], capsys)
    assert more["eval_examples"] > 24 and more["metrics"] != summary["after"]
    rounded = _evaluate(["--run", str(finished_run), "--precision", "bf16"], capsys)
    assert rounded["config"]["precision"] == "bf16" and rounded["metrics"]["loss"] != final["metrics"]["loss"]
    assert run_cli(["evaluate", "--run", str(finished_run)]) == 0  # the lines a person reads
    out = capsys.readouterr().out
    assert "round 1, 24 held-out examples" in out and "accuracy" in out


def test_a_directory_that_is_not_a_finished_run_is_refused_in_one_line(tmp_path, capsys):
    (tmp_path / "config.json").write_text("{}")
    assert run_cli(["evaluate", "--run", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "not a run directory with a checkpoint" in err[0]
    assert run_cli(["evaluate", "--run", str(tmp_path / "nowhere"), "--eval-examples", "0"]) == 2


def _result(accuracy: float, items: int = 753, **per_set: float) -> dict:
    metrics = {"accuracy": accuracy, "acc_norm": 0.5, "exact_match": 0.25, "perplexity": 1.5}
    return {
        "eval_examples": items,
        "metrics": {**metrics, **{f"accuracy/{k}": v for k, v in per_set.items()}},
    }


def test_the_evaluation_table_averages_each_arm_over_its_seeds_against_the_base():
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "evaluation_table", REPO / "scripts" / "evaluation_table.py"
    )
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    base = _result(0.30, a=0.2, b=0.4)
    text = script.table(base, [("np", [_result(0.34, a=0.3, b=0.4), _result(0.36, a=0.5, b=0.2)])])
    row = next(line for line in text.splitlines() if line.startswith("| np |"))
    assert "| 2 | 0.350 ± 0.014 | 0.050 ± 0.014 |" in row
    assert "np, accuracy per set (base → after, mean over seeds): a 0.20 → 0.40, b 0.40 → 0.30" in text
    with pytest.raises(SystemExit, match="different numbers of items"):
        script.table(base, [("np", [_result(0.34, items=195)])])
