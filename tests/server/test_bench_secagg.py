"""``fedlora bench secagg`` (server/bench/secagg.py): the protocol timing checks its own sum and times
every stage; bad options are one line."""

from __future__ import annotations

import pytest

from server.bench import secagg
from server.bench.secagg import protocol_cost
from tests.conftest import run_cli


def test_the_protocol_cost_times_every_stage_of_a_correct_sum():
    """protocol_cost raises if the unmasked sum is not the inputs' sum; each stage is timed."""
    cost = protocol_cost(4, 256, 16)
    assert set(cost) == {"setup", "share", "mask", "check", "unmask", "server"}
    assert all(v > 0 for v in cost.values())


def test_the_active_server_check_verifies_a_majority_and_grows_with_the_round():
    """consistency_cost raises if a valid signature fails; a round of 200 checks ~2x the signatures of 50."""
    small, large = secagg.consistency_cost(50), secagg.consistency_cost(200)
    assert 0 < small < large


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--neighbours", "0"], "--neighbours"),
        (["--round-nodes", "0"], "--round-nodes"),
        (["--rounds", "1"], "--rounds"),
    ],
)
def test_bad_options_are_one_line(argv, message, capsys):
    assert run_cli(["bench", "secagg", *argv]) != 0
    err = capsys.readouterr().err.strip()
    assert message in err and "\n" not in err


def test_with_json_the_runs_echo_goes_to_stderr(tmp_path, monkeypatch, capsys):
    """``--json`` keeps stdout for the one JSON object: each arm's run prints its rounds to stderr."""
    import argparse
    import json

    import server.simulate

    def fake(cfg, out):
        print("round 1: the run's echo")
        out.mkdir(parents=True)
        rows = [{"phase": "train", "round": 1, "seconds": 1.0, "sampled": 10, "bytes_down": 1, "bytes_up": 1}]
        (out / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        return out

    monkeypatch.setattr(server.simulate, "simulate", fake)
    args = argparse.Namespace(json=True, rounds=2, preset="minilm-rt-xdev", epsilon=8.0, workers=1)
    rounds = secagg.round_seconds(args, tmp_path)
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("the run's echo") == len(secagg.ARMS)
    assert set(rounds) == set(secagg.ARMS)
