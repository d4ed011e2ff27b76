"""A finished run that applied no round (server/outcome.py): the one line that says what became of
each round and the ε it still charged, and the exit code of ``fedlora deploy up`` for it (issue 53
item 5), decided on the run directory a real run leaves (``summary.json``, ``metrics.jsonl``).
``fedlora simulate`` in the same case: tests/common/test_cli_errors.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from server.deploy import Result, up
from server.outcome import NoRoundApplied, check_applied, no_round_applied
from tests.conftest import run_cli

#: the client-level ε of the issue's run (small preset, 2 nodes, sample rate 0.5, one round)
PRIVACY = {"eps_gdp": 6.0123, "eps_tight": 4.3812, "tight_accountant": "pld", "what_if": ""}


def _run_dir(path: Path, rounds: list[dict], completed: int = 0, **summary) -> Path:
    """A run directory as the ServerApp leaves it: its metrics lines (round 0, then ``rounds``) and
    the summary keys server/outcome.py reads."""
    path.mkdir(parents=True)
    lines = [{"round": 0, "phase": "initial", "accuracy": 0.5}, *rounds]
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    values = {"rounds_completed": completed, "num_clients": 2, "sample_rate": 0.5, "stopped": None}
    (path / "summary.json").write_text(json.dumps({**values, **summary}))
    return path


def _nobody(rnd: int, online: int = 2) -> dict:
    return {"round": rnd, "phase": "skipped", "sampled": 0, "replied": 0, "online": online}


def test_a_run_that_sampled_nobody_says_so_and_what_it_charged(tmp_path):
    run = _run_dir(tmp_path / "run", [_nobody(1)], client_privacy=PRIVACY)
    assert no_round_applied(run) == (
        "no round was applied: round 1 sampled nobody (sample rate 0.5 over 2 nodes); charged all the "
        f"same: client-level eps gdp 6.01 (CLT approximation, above the pld bound 4.38; the budget holds to the larger); the adapter in {run} is the initial one"
    )
    with pytest.raises(NoRoundApplied) as err:
        check_applied(run)
    assert err.value.exit_code == 1


def test_every_way_a_round_ends_unapplied_is_named(tmp_path):
    rounds = [
        _nobody(1),
        _nobody(2, online=1),
        {"round": 3, "phase": "train", "sampled": 2, "replied": 1, "applied": False},
        {"round": 4, "phase": "interrupted", "sampled": 2},
        {"round": 5, "phase": "skipped", "sampled": 1, "replied": 0, "online": 2},
        {"round": 6, "phase": "stopped", "reason": "client-level budget reached"},
    ]
    secure = {"eps_gdp": 1.0, "eps_tight": 2.5, "tight_accountant": "rdp", "what_if": ""}
    why = no_round_applied(_run_dir(tmp_path / "run", rounds, client_privacy=secure))
    assert why.startswith(
        "no round was applied: rounds 1 and 2 sampled nobody (sample rate 0.5 over 1-2 nodes); "
        "round 5 sampled fewer clients than min-replies (nothing sent); "
        "round 3 withheld (fewer usable replies than min-replies); round 4 interrupted by a crash; "
        "round 6 not run: client-level budget reached; charged all the same: client-level eps rdp 2.5; "
    )


def test_a_run_that_applied_a_round_or_charged_nothing(tmp_path):
    applied = _run_dir(tmp_path / "applied", [_nobody(1)], completed=1)
    assert no_round_applied(applied) is None
    check_applied(applied)
    many = _run_dir(tmp_path / "many", [_nobody(k) for k in range(1, 7)])
    assert no_round_applied(many).startswith("no round was applied: 6 rounds sampled nobody (sample rate 0.5")
    assert "charged" not in no_round_applied(many)  # no client-level DP: nothing to charge
    assert "summary.json is missing" in no_round_applied(tmp_path / "nothing")


def test_deploy_result_to_exit(tmp_path):
    with pytest.raises(NoRoundApplied, match="round 1 sampled nobody") as err:
        up.check_result(Result(7, "finished:completed", tmp_path, 1.0, no_round="round 1 sampled nobody"))
    assert err.value.exit_code == 1
    up.check_result(Result(7, "finished:completed", tmp_path, 1.0))


@pytest.fixture()
def fake_deployment(monkeypatch):
    """``deploy up`` with no process started: the run 'completes' with the run directory the test
    sets in ``run_dirs[0]``; everything else (options, work dir, the result and exit code) is real."""
    run_dirs: list[Path] = []
    monkeypatch.setattr(up, "bring_up", lambda dep: [])
    monkeypatch.setattr(
        up, "run_and_wait", lambda dep, flat: Result(7, "finished:completed", run_dirs[0], 41.2, dep)
    )
    monkeypatch.setattr(up, "shutdown", lambda dep: None)
    monkeypatch.setattr(up, "leftovers", lambda dep: [])
    return run_dirs


def test_deploy_up_that_applied_no_round_exits_1_in_one_line(tmp_path, capsys, fake_deployment):
    """The issue's run: `deploy up --nodes 2` with the small preset (sample rate 0.5), round 1
    sampled nobody: exit 1 (was 0), and the run's last line says no round was applied."""
    fake_deployment.append(_run_dir(tmp_path / "run", [_nobody(1)], client_privacy=PRIVACY))
    argv = [
        "deploy",
        "up",
        "--nodes",
        "2",
        "--work-dir",
        str(tmp_path / "w"),
        "--run-config",
        "preset='small'",
    ]
    assert run_cli(argv) == 1
    captured = capsys.readouterr()
    assert "[deploy] run 7 finished:completed in 41 s; no round was applied" in captured.out.splitlines()
    err = captured.err.strip()
    assert len(err.splitlines()) == 1, err
    assert err.startswith(
        "fedlora: error: no round was applied: round 1 sampled nobody (sample rate 0.5 over 2"
    )
    assert (
        "charged all the same: client-level eps gdp 6.01 (CLT approximation, above the pld bound 4.38; the budget holds to the larger)"
        in err
    )


def test_deploy_up_that_applied_a_round_exits_0(tmp_path, capsys, fake_deployment):
    fake_deployment.append(_run_dir(tmp_path / "run", [_nobody(1)], completed=1, client_privacy=PRIVACY))
    argv = [
        "deploy",
        "up",
        "--nodes",
        "2",
        "--work-dir",
        str(tmp_path / "w"),
        "--run-config",
        "preset='small'",
    ]
    assert run_cli(argv) == 0
    captured = capsys.readouterr()
    assert "[deploy] run 7 finished:completed in 41 s" in captured.out.splitlines() and not captured.err


def test_the_serverapp_fails_a_run_that_applied_no_round(tmp_path, monkeypatch):
    """Issue 75 item 6, the by-hand route (`flwr run`, whose exit code is 0 whatever the run did):
    the ServerApp itself fails, so Flower records the run ``finished:failed`` with the line saying
    why; a run that applied a round returns normally."""
    from flwr.app import Context, RecordDict

    import server.app as server_app
    from common.config import to_flat
    from common.presets import preset

    outcomes = {"none": ([_nobody(1)], 0), "one": ([], 1)}
    for name, (rounds, completed) in outcomes.items():
        out = tmp_path / name
        cfg = preset("small", out_dir=str(out), mechanism="dp-fedavg", target_epsilon=8.0)
        monkeypatch.setattr(
            server_app,
            "run_federation",
            lambda grid, cfg, run_dir, r=rounds, c=completed: _run_dir(run_dir, r, c, client_privacy=PRIVACY),
        )
        context = Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config=to_flat(cfg))
        if completed:
            server_app.main(None, context)
            continue
        with pytest.raises(NoRoundApplied, match="no round was applied: round 1 sampled nobody"):
            server_app.main(None, context)


def test_deploy_reports_a_serverapp_failed_for_no_round_as_no_round(tmp_path, monkeypatch):
    """The ServerApp's failure for no round applied is `deploy up`'s no-round line (exit 1, via
    check_result), not a generic failed run; any other failed run stays one (RunFailed)."""
    from types import SimpleNamespace

    from server.deploy import RunFailed

    def failed(*_args, **_kwargs):
        raise RunFailed("run 7 finished:failed: ServerApp failed with exception: ...")

    monkeypatch.setattr(up, "flwr_run", lambda dep, flat: 7)
    monkeypatch.setattr(up, "wait_for_run", failed)
    monkeypatch.setattr(up, "supervisor", lambda dep: None)
    dep = SimpleNamespace(opts=SimpleNamespace(timeout=60.0), say=lambda line: None)
    run = _run_dir(tmp_path / "run", [_nobody(1)], client_privacy=PRIVACY)
    result = up.run_and_wait(dep, {"out-dir": str(run)})
    assert (result.run_id, result.status, result.run_dir) == (7, "finished:failed", run)
    with pytest.raises(RunFailed, match="ServerApp failed"):  # no summary: it failed before the end
        up.run_and_wait(dep, {"out-dir": str(tmp_path / "crashed")})
