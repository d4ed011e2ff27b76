"""``fedlora bench prism-step``: both optimizers measured in one process; the JSON has the ratios."""

import json

from tests.conftest import run_cli


def test_prism_step_bench_reports_ratios(capsys):
    argv = ["bench", "prism-step", "--batch", "2", "--seq", "16", "--repeats", "1", "--json"]
    assert run_cli(argv) == 0
    record = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    for method in ("prism", "dp_adamw"):
        assert record[method]["seconds"] > 0 and record[method]["peak_bytes"] > 0
    assert record["time_ratio"] == record["prism"]["seconds"] / record["dp_adamw"]["seconds"]
    assert 0.2 < record["memory_ratio"] < 5  # process peak RSS, model included
    assert record["targets"] == "q_proj,k_proj,v_proj,o_proj" and record["device"] == "cpu"
