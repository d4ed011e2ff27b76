"""``fedlora evaluate`` (server/evaluate_cli.py): a finished run's adapter scored again reproduces the
run's own final and round-0 evaluations, and scores more held-out examples when asked."""

from __future__ import annotations

import json

import pytest

from common.presets import preset
from server.simulate import simulate
from tests.conftest import run_cli
from tests.harness import TINY


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


@pytest.mark.timeout(600)
def test_the_bench_suite_scores_a_finished_run_again_once(finished_run, tmp_path):
    """A plan run that asks to be scored again (``Run.rescore``) gets ``fedlora evaluate``'s JSON of
    its final adapter and of the base model beside its output, through the real entry point, once."""
    import shutil

    from server.bench.suite.plan import Run
    from server.bench.suite.runner import execute

    run = Run(
        "instruction",
        "instruction-0-s0",
        ("simulate", "--preset", "small"),
        rescore=("--eval-examples", "24"),
    )
    run_dir = tmp_path / "runs" / run.key
    shutil.copytree(finished_run, run_dir / "out")
    (run_dir / "command.json").write_text(json.dumps({"command": run.command}))
    shutil.copy(finished_run / "summary.json", run_dir / "summary.json")
    lines: list[str] = []
    scores = execute(run, tmp_path / "runs", lines.append)["scores"]
    summary = json.loads((finished_run / "summary.json").read_text())
    assert scores["evaluation.json"]["metrics"] == summary["after"]
    assert scores["evaluation-base.json"]["metrics"] == summary["before"]
    assert (
        sum("score instruction-0-s0 again: fedlora evaluate --run RUN --eval-examples 24" in x for x in lines)
        == 2
    )
    lines.clear()
    assert execute(run, tmp_path / "runs", lines.append)["scores"] == scores
    assert not any("again" in x for x in lines)  # scored once
