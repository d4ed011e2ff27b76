"""``fedlora bench compare``: every method tuned on the same grid scored on validation examples, the
best point run with each seed on the test split."""

from __future__ import annotations

import json

import pytest

from tests.conftest import run_cli

TINY = ["--max-train-examples", "40", "--eval-examples", "8", "--max-length", "16", "--local-steps", "2"]
TINY += ["--batch-size", "4", "--validation", "8", "--lrs", "1e-4,1e-2", "--clips", "1.0", "--seeds", "0,1"]


@pytest.mark.integration
def test_compare_picks_each_methods_best_validation_point_and_runs_its_seeds(tmp_path, capsys):
    out = tmp_path / "cmp"
    code = run_cli(["bench", "compare", "--methods", "dp-adamw,fedavg", *TINY, "--out", str(out)])
    printed = capsys.readouterr().out
    assert code == 0
    results = json.loads((out / "results.json").read_text())
    rows = {r["method"]: r for r in results["methods"]}
    for method, row in rows.items():
        assert len(row["grid"]) == 2
        assert row["lr"] == max(row["grid"], key=lambda g: g["score"])["lr"]
        assert len(row["scores"]) == 2 and abs(row["mean"] - sum(row["scores"]) / 2) < 1e-12
        for seed in (0, 1):
            result = json.loads((out / "test" / f"{method}-s{seed}" / "result.json").read_text())
            assert result["eval_split"] == "test" and result["lr"] == row["lr"] and result["seed"] == seed
        grid_run = json.loads((out / "grid" / f"{method}-lr0.01-clip1" / "result.json").read_text())
        assert grid_run["eval_split"] == "validation" and grid_run["examples"] == 40 - 8
    assert rows["dp-adamw"]["epsilon"] > 0 and rows["fedavg"]["epsilon"] is None
    assert "not accounted" in printed and "| dp-adamw |" in printed and "none (not private)" in printed


def test_compare_refuses_bad_input_before_running(tmp_path, capsys):
    code = run_cli(["bench", "compare", "--methods", "dp-fedavg", *TINY, "--out", str(tmp_path / "a")])
    assert code != 0 and "--methods takes" in capsys.readouterr().err
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "keep").write_text("x")
    code = run_cli(["bench", "compare", "--methods", "ffa", *TINY, "--out", str(tmp_path / "b")])
    assert code != 0 and "not empty" in capsys.readouterr().err
    code = run_cli(
        ["bench", "compare", "--methods", "ffa", *TINY, "--microbatch", "8", "--out", str(tmp_path / "c")]
    )
    assert code != 0 and "exceeds the logical batch" in capsys.readouterr().err
    assert not (tmp_path / "a").exists() and not (tmp_path / "c").exists()


@pytest.mark.integration
def test_compare_tunes_on_one_nodes_shard(tmp_path):
    """``--num-clients N --node K`` (a silo's data): the grid is scored on validation examples carved
    from node K's shard, and the seeds train on that shard; a node outside the split is refused first."""
    shard = ["--num-clients", "2", "--node", "1", "--seeds", "0"]
    bad = run_cli(
        [
            "bench",
            "compare",
            "--methods",
            "fedavg",
            *TINY,
            *shard[:2],
            "--node",
            "2",
            "--out",
            str(tmp_path / "x"),
        ]
    )
    assert bad != 0 and not (tmp_path / "x").exists()
    out = tmp_path / "cmp"
    assert run_cli(["bench", "compare", "--methods", "fedavg", *TINY, *shard, "--out", str(out)]) == 0
    grid_run = json.loads((out / "grid" / "fedavg-lr0.01-clip1" / "result.json").read_text())
    test_run = json.loads((out / "test" / "fedavg-s0" / "result.json").read_text())
    assert grid_run["node"] == test_run["node"] == 1 and grid_run["num_clients"] == 2
    assert grid_run["examples"] == test_run["examples"] - 8 and test_run["examples"] < 40
    assert json.loads((out / "results.json").read_text())["settings"]["shard"]["node"] == 1
