"""The time-left estimate (common/progress.py) counts the evaluations still to come (issue 75 item 10)."""

from common.progress import eta_line


def test_the_estimate_adds_the_evaluations_the_first_round_did_not_have():
    # 12 rounds of a run evaluated every 12: round 1 took 60 s without an evaluation, 11 rounds are
    # left, one of them (the last) evaluated, and round 0's evaluation took 300 s
    line = eta_line(1, 60.0, 11, evaluations=1, evaluation_s=300.0)
    assert line == "about 16.0 min for the 11 rounds left (60.0 s a round so far, and 1 evaluation of 300 s)"
    assert eta_line(1, 60.0, 11) == "about 11.0 min for the 11 rounds left (60.0 s a round so far)"


def test_a_redirected_run_says_how_its_evaluation_and_rounds_progress(tmp_path, capsys, monkeypatch):
    """Issue 75 item 10 through `fedlora simulate` with stderr not a terminal (captured): a plain
    progress line every LOG_EVERY_S seconds (0 here: each step but the last) for the held-out
    evaluation and for each round's clients, where tqdm's bar stayed silent."""
    from common import progress
    from tests.conftest import run_cli

    monkeypatch.setattr(progress, "LOG_EVERY_S", 0.0)
    argv = ["simulate", "--preset", "minilm-rt", "--rounds", "1", "--num-clients", "3", "--local-steps", "1"]
    argv += ["--batch-size", "8", "--max-train-examples", "120", "--eval-examples", "200", "--workers", "1"]
    argv += ["--out", str(tmp_path / "r")]
    assert run_cli(argv) == 0
    err = capsys.readouterr().err.splitlines()
    evaluating = [line for line in err if line.startswith("evaluating: ")]
    assert evaluating and evaluating[0].startswith("evaluating: ") and " examples, " in evaluating[0], err
    assert any(line.startswith("round 1 train: 1/3 clients, ") for line in err), err


def test_a_log_bar_is_silent_for_short_work_and_paces_the_rest(monkeypatch, capsys):
    from common import progress

    clock = iter([0.0, 1.0, 20.0, 21.0, 40.0])
    monkeypatch.setattr(progress.time, "monotonic", lambda: next(clock))
    with progress.LogBar(4, "scoring options", "option", every=15.0) as log:
        for _ in range(4):
            log.update(1)
    # at 1 s: too soon; at 20 s (2 of 4 done): a line, time left at that pace; at 21 s: too soon
    # since; at 40 s the work is done: no line for it
    assert capsys.readouterr().err.splitlines() == ["scoring options: 2/4 options, 20 s, about 20 s left"]


def test_make_runs_command_says_what_it_loads_within_seconds_with_stdout_redirected(tmp_path):
    """Issue 75 item 10's done-when: `make run` (fedlora simulate --preset default) prints progress
    within 10 s with stdout redirected. Its first line comes before the data and the model load; the
    run is then stopped (what follows it: the other tests here)."""
    import os
    import select
    import signal
    import subprocess
    import sys
    import time

    argv = [
        sys.executable,
        "-m",
        "common.cli",
        "simulate",
        "--preset",
        "default",
        "--out",
        str(tmp_path / "r"),
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    start = time.monotonic()
    proc = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, start_new_session=True
    )
    try:
        ready, _, _ = select.select([proc.stdout], [], [], 10.0)
        first = proc.stdout.readline() if ready else ""
        took = time.monotonic() - start
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    assert first.startswith(
        "fedlora simulate: minilm-l6 on rotten-tomatoes, 1000 clients, 15 rounds, dp-fedavg"
    ), first
    assert took < 10, took
