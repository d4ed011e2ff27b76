"""``fedlora bench suite``: the miniature (``--profile tiny``) end to end, reuse of finished runs, and
one-line errors. The figures in the report must be the runs' own numbers."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from common.cli import main
from server.bench.suite.plan import Run, profile, runs
from server.bench.suite.runner import execute

REPO = Path(__file__).resolve().parents[2]
SECTIONS = (
    "client-level",
    "correlated-noise",
    "sample-level",
    "generative",
    "cross-silo",
    "instruction",
    "chat",
    "privacy",
    "communication",
    "speed",
    "scale",
    "audit",
)


def _fedlora(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "common.cli", *argv], cwd=REPO, capture_output=True, text=True, timeout=900
    )


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> tuple[Path, Path, subprocess.CompletedProcess]:
    root = tmp_path_factory.mktemp("suite")
    docs = root / "docs"
    docs.mkdir()
    # two runs at once: the parallel path (each simulate's clients in-process) makes every figure
    done = _fedlora(
        "bench", "suite", "--profile", "tiny", "--out", str(root / "out"), "--docs", str(docs), "--jobs", "2"
    )
    return root / "out", docs, done


@pytest.mark.process
def test_tiny_suite_writes_every_section_from_the_runs_outputs(tiny):
    out, docs, done = tiny
    assert done.returncode == 0, done.stdout + done.stderr
    results = json.loads((out / "results.json").read_text())
    assert [s["name"] for s in results["sections"]] == list(SECTIONS)
    sections = {s["name"]: s for s in results["sections"]}
    # the client-level dp arm's epsilons are its summary's (nothing typed in)
    summary = json.loads((out / "runs" / "client-level-1-s0" / "summary.json").read_text())
    dp_row = sections["client-level"]["rows"][1]
    assert dp_row["ε (tight: PLD, or RDP where marked)"] == f"{summary['client_privacy']['eps_tight']:.2f}"
    assert dp_row["accuracy after (mean ± std)"] == f"{summary['after']['accuracy']:.3f} (n = 1)"
    result = json.loads((out / "runs" / "sample-level-0-s0" / "result.json").read_text())
    assert (
        sections["sample-level"]["rows"][0]["ε (tight: PLD, or RDP where marked)"]
        == f"{result['privacy']['epsilon']:.2f}"
    )
    privacy_runs = {r["run"] for r in sections["privacy"]["rows"]}
    assert privacy_runs == {"dp-fedavg central ε=8", "prism ε=3"}  # the non-private arm spends nothing
    assert any("audit section" in n for n in sections["privacy"]["notes"])
    # the round's time split comes from the in-process run, every phase present
    split = summary["time_split_s"]
    assert split["local-training"] > 0 and split["evaluation"] > 0
    speed = {r["what"].split(" (")[0]: r for r in sections["speed"]["rows"]}
    assert {"plain step", "prism step", "dp-adamw step", "prism / plain", "dp-adamw / plain"} <= set(speed)
    assert "peak memory" in speed["dp-adamw / plain"]["share / ratio"]
    # figures are PNGs, linked from the Markdown, copied with it into --docs
    md = (docs / "RESULTS.md").read_text()
    assert md == (out / "RESULTS.md").read_text()
    for sec in results["sections"]:
        assert f"## {sec['title']}" in md
        for name in sec["figures"]:
            assert (docs / "results" / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
            assert f"(results/{name})" in md
    assert "accuracy-vs-epsilon.png" in sections["client-level"]["figures"]
    assert "(not run in this profile)" in md  # scale is not in the tiny profile
    assert sections["scale"]["made"] is None  # nothing of it was made: its heading names no date
    scale = md.split(f"## {sections['scale']['title']}")[1].split("\n## ")[0]
    assert "Made on" not in scale and "Made on" in md
    for run in runs(profile("tiny")):
        assert " ".join(run.command) in md


@pytest.mark.slow  # make test-all: make test keeps the unit tests of reuse (a changed command runs again)
@pytest.mark.process
def test_a_second_suite_reuses_finished_runs(tiny):
    out, _, first = tiny
    assert first.returncode == 0
    again = _fedlora("bench", "suite", "--profile", "tiny", "--out", str(out), "--sections", "client-level")
    assert again.returncode == 0, again.stderr
    assert again.stdout.count("[suite] reuse") == 2 and "[suite] run " not in again.stdout
    suite = json.loads((out / "results.json").read_text())["suite"]
    assert suite["reused"] == suite["runs"] == 2 and suite["runs_wall_s"] > suite["wall_s"]


def test_a_changed_command_runs_again(tmp_path):
    argv = (
        "privacy",
        "epsilon",
        "--noise-multiplier",
        "1.0",
        "--sample-rate",
        "0.1",
        "--rounds",
        "10",
        "--delta",
        "1e-5",
    )
    lines: list[str] = []
    first = execute(Run("x", "eps", (*argv, "--json"), output="json"), tmp_path, lines.append)
    assert first["error"] is None and first["output"]["epsilon"] > 0
    same = execute(Run("x", "eps", (*argv, "--json"), output="json"), tmp_path, lines.append)
    assert same["output"] == first["output"] and lines[-1].startswith("[suite] reuse")
    changed = (*argv[:-1], "1e-6", "--json")
    other = execute(Run("x", "eps", changed, output="json"), tmp_path, lines.append)
    assert lines[-1].startswith("[suite] run") and other["output"]["epsilon"] > first["output"]["epsilon"]


def test_runs_at_once_keep_the_plan_order_and_record_their_own_wall_time_and_memory(tmp_path):
    """``execute_all`` with 2 jobs gives the serial records' outputs in the plan's order; each run
    records its command as planned (what is added to run it, e.g. ``--workers 1``, is not part of
    it), its wall time and its own peak resident memory."""
    from server.bench.suite.runner import execute_all

    def plan(sigma: str) -> Run:
        argv = ("privacy", "epsilon", "--noise-multiplier", sigma, "--sample-rate", "0.1", "--rounds", "5")
        return Run("x", f"eps-{sigma}", (*argv, "--delta", "1e-5", "--json"), output="json")

    sigmas = ("0.8", "1.0", "1.5")
    records = execute_all([plan(s) for s in sigmas], tmp_path / "par", lambda line: None, jobs=2)
    serial = execute_all([plan(s) for s in sigmas], tmp_path / "ser", lambda line: None)
    assert [r["output"] for r in records] == [r["output"] for r in serial]
    assert [r["output"]["noise_multiplier"] for r in records] == [float(s) for s in sigmas]
    for run, record in zip([plan(s) for s in sigmas], records, strict=True):
        assert record["command"] == run.command and record["wall_s"] > 0 and record["peak_rss_mb"] > 10


def test_a_failed_command_is_reported_not_hidden(tmp_path):
    lines: list[str] = []
    bad = execute(
        Run(
            "x",
            "bad",
            (
                "privacy",
                "epsilon",
                "--noise-multiplier",
                "-1",
                "--sample-rate",
                "0.1",
                "--rounds",
                "1",
                "--delta",
                "1e-5",
                "--json",
            ),
            output="json",
        ),
        tmp_path,
        lines.append,
    )
    assert bad["output"] is None and bad["error"] and "FAILED" in lines[-1]


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--sections", "utility"], "--sections: unknown utility"),
        (["--docs", "/nonexistent/docs"], "not a directory"),
        (["--jobs", "0"], "--jobs must be >= 1"),
        (["--seeds", "0,x"], "--seeds 0,x: not a comma-separated list"),
    ],
)
def test_bad_input_is_one_line(tmp_path, capsys, argv, message):
    rc = main(["bench", "suite", "--profile", "tiny", "--out", str(tmp_path / "o"), *argv])
    err = capsys.readouterr().err.strip()
    assert rc != 0 and message in err and len(err.splitlines()) == 1
    assert not (tmp_path / "o").exists()  # refused before anything ran


@pytest.mark.parametrize("name", ["tiny", "quick", "full"])
def test_every_planned_federation_is_a_valid_configuration(name):
    """Each profile's simulate commands parse and pass RunConfig.check (a typo in the plan would
    otherwise surface hours into the full suite)."""
    import argparse

    from server import simulate_cli as simulate

    planned = [r for r in runs(profile(name)) if r.argv[0] == "simulate"]
    assert planned
    for run in planned:
        parser = argparse.ArgumentParser()
        simulate.add_arguments(parser)
        simulate.config_from_args(parser.parse_args([*run.command[2:], "--out", "x"]))


@pytest.mark.parametrize("name", ["tiny", "full"])
def test_the_correlated_noise_arms_hold_the_same_participation_rule(name):
    """The same-rule DP-FedAvg arm's --min-separation is the separation the MF arm of the same base
    resolves (its auto bands, 1/p): otherwise the paired comparison compares two rules."""
    import argparse

    from common.privacy.planning.ftrl_plan import auto_bands
    from server import simulate_cli as simulate

    planned = [r for r in runs(profile(name)) if r.section == "correlated-noise"]
    assert planned
    for run in planned:
        parser = argparse.ArgumentParser()
        simulate.add_arguments(parser)
        cfg = simulate.config_from_args(parser.parse_args([*run.command[2:], "--out", "x"]))
        if cfg.mechanism == "dp-ftrl":
            separation = cfg.min_separation or cfg.bands or auto_bands(cfg.sample_rate)
            assert str(separation) in run.arm.label


def test_the_correlated_noise_section_pairs_each_budget_s_first_arm_with_the_others_seed_by_seed():
    from server.bench.suite.plan import Arm
    from server.bench.suite.sections import correlated_noise

    def out(acc: float) -> dict:
        return {"before": {"accuracy": 0.69}, "after": {"accuracy": acc, "top_class_share": 0.6}}

    mf, same, amp = Arm("mf", (), 3.0), Arm("same", (), 3.0), Arm("amp", (), 3.0)
    accs = {mf: (0.76, 0.75, 0.78), same: (0.74, 0.75, 0.75), amp: (0.77, 0.74, 0.79)}
    made = {"date": "2026-11-30", "commit": "abc1234", "device": "cpu"}
    done = [
        {
            "run": Run("correlated-noise", f"k{i}{s}", (), arm=arm, seed=s),
            "output": out(a),
            "error": None,
            "wall_s": 1000.0 * (i + 1) + s,
            "made": made,
        }
        for i, (arm, values) in enumerate(accs.items())
        for s, a in enumerate(values)
        if not (arm is amp and s == 2)  # an unfinished seed: paired over the seeds both ran
    ]
    sec = correlated_noise(done)
    assert [r["arm"] for r in sec["rows"]] == ["mf", "same", "amp"]
    assert sec["rows"][0]["accuracy after (mean ± std)"] == "0.763 ± 0.015"
    paired = [n for n in sec["notes"] if " − " in n]
    assert (
        paired[0]
        == "mf − same, points by seed (0, 1, 2): +2.0, +0.0, +3.0; mean +1.7 ± 1.5, standard error 0.9"
    )
    assert paired[1] == "mf − amp, points by seed (0, 1): -1.0, +1.0; mean +0.0 ± 1.4, standard error 1.0"
    # the runs behind each mean, one line each: seed, accuracy, wall time, commit
    runs = [n for n in sec["notes"] if n.startswith("run ")]
    assert len(runs) == 8
    assert (
        runs[4] == "run k11 (same, seed 1): 0.750 after the last round, 2,001 s, made 2026-11-30 at abc1234"
    )


@pytest.mark.parametrize("winner", [None, "ffa", "dp-adamw"])
def test_the_big_silo_federates_each_method_at_its_validated_settings_and_the_winner_alone(winner):
    """Every cross-silo federation of the full profile runs the big-silo preset with its method's
    validated options; the winner (once known) adds its federation with the public prior and each
    of its nodes alone at the same options."""
    import argparse

    from common.presets import PRESETS
    from server import simulate_cli as simulate
    from server.bench.suite.adopt import _train_local_config
    from server.bench.suite.plan import BIGSILO_TUNED, _bigsilo

    base, arms, alone_base, alone_arms = _bigsilo(winner)
    configs = []
    for arm in arms:
        parser = argparse.ArgumentParser()
        simulate.add_arguments(parser)
        cfg = simulate.config_from_args(parser.parse_args([*base[1:], *arm.argv, "--out", "x"]))
        tuned = BIGSILO_TUNED[cfg.mechanism]
        assert f" {tuned} " in f" {' '.join(arm.argv)} " and cfg.lr == float(tuned.split()[1]), arm.label
        assert cfg.users_per_client == PRESETS["smollm2-shakespeare-bigsilo"]["users_per_client"]
        configs.append(cfg)
    assert [c.mechanism for c in configs] == [
        "fedavg",
        "prism",
        "dp-adamw",
        "ffa",
        *([winner] if winner else []),
    ]
    assert [c.public_subspace for c in configs] == [0, 0, 0, 0, *([128] if winner else [])]
    assert len(alone_arms) == (PRESETS["smollm2-shakespeare-bigsilo"]["num_clients"] if winner else 0)
    for arm in alone_arms:
        alone = _train_local_config([*alone_base[1:], *arm.argv])
        assert (alone["mechanism"], alone["lr"], alone["users_per_client"]) == (winner, configs[-1].lr, 7)
        assert alone["lora_init"] == configs[-1].lora_init, "a node alone starts from its federation's init"


@pytest.mark.parametrize("preset", ["smollm2-shakespeare-silo", "smollm2-shakespeare-bigsilo"])
def test_a_node_alone_holds_the_shard_it_holds_in_the_federation(preset):
    """``train-local --node K`` of the plan's alone arms resolves every option that picks the split as
    the silo preset does (a different cap or users per client would train another shard)."""
    from common.presets import preset as load
    from server.bench.suite.adopt import _train_local_config
    from server.bench.suite.plan import _alone

    federation = load(preset)
    base, arms = _alone(preset, "ffa", {"ffa": "--lr 3e-2"})
    same = ("num_clients", "partition", "partition_by", "users_per_client", "max_train_examples")
    same += (
        "test_fraction",
        "eval_examples",
        "max_length",
        "lm_blocks",
        "sample_epsilon",
        "delta",
        "batch_size",
    )
    for arm in arms:
        alone = _train_local_config([*base[1:], *arm.argv])
        for option in same:
            assert alone[option] == getattr(federation, option), option
        assert alone["local_steps"] == federation.rounds * federation.local_steps
        assert (alone["mechanism"], alone["lr"]) == ("ffa", 3e-2)


def test_the_audit_section_shows_each_arm_beside_its_claim():
    from server.bench.suite.sections import audit

    mia = {
        "arm": "prism ε=3",
        "unit": "sample-level (add/remove one example)",
        "epsilon": 2.9999,
        "delta": 1e-5,
    }
    mia |= {"auc": 0.5649, "eps_lower_bound": 0.0, "confidence": 0.95, "eps_estimate": 0.767, "canaries": 100}
    k_models = {**mia, "arm": "no noise", "epsilon": None, "eps_lower_bound": 1.234, "eps_estimate": None}
    del k_models["canaries"]
    done = [
        {
            "run": Run("audit", "audit-0", ("audit", "mia", "--quick")),
            "output": [mia, k_models],
            "error": None,
        }
    ]
    rows = audit(done)["rows"]
    assert [
        (
            r["claimed ε (PLD, or RDP where marked)"],
            r["AUC"],
            r["ε lower bound"],
            r["ε estimate (one-shot)"],
            r["canaries"],
        )
        for r in rows
    ] == [
        ("3.00", "0.565", "0.00 (95%)", "0.77", 100),
        ("none (not private)", "0.565", "1.23 (95%)", "n/a", "n/a"),
    ]
    assert rows[0]["audit"] == "mia"


def _eps_run(key: str) -> Run:
    argv = ("privacy", "epsilon", "--noise-multiplier", "1.0", "--sample-rate", "0.1", "--rounds", "5")
    return Run("x", key, (*argv, "--delta", "1e-5", "--json"), output="json")


def test_each_run_is_kept_as_it_ends_and_an_interrupt_stops_the_runs_under_way(tmp_path, monkeypatch):
    """A suite invocation of hours may be stopped: the runs it finished are handed on (the suite
    saves their records) before the interrupt, and a command still running is terminated."""
    from server.bench.suite import runner

    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    real = runner.execute

    def execute_or_stop(run, *args):
        if run.key == "second":  # as if Ctrl-C came while the second command ran
            runner._LIVE.add(sleeper)
            raise KeyboardInterrupt
        return real(run, *args)

    monkeypatch.setattr(runner, "execute", execute_or_stop)
    kept: list[str] = []
    try:
        with pytest.raises(KeyboardInterrupt):
            runner.execute_all(
                [_eps_run("first"), _eps_run("second")],
                tmp_path,
                lambda line: None,
                on_done=lambda run, record: kept.append((run.key, record["error"])),
            )
        assert kept == [("first", None)]
        assert sleeper.wait(timeout=10) == -signal.SIGTERM
    finally:
        runner._LIVE.discard(sleeper)
        sleeper.kill()


def test_sigterm_is_taken_as_an_interrupt_that_says_how_to_continue():
    from server.bench.suite.cli import RESUME_HINT, _terminate_as_interrupt

    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(KeyboardInterrupt, match="run the same command again"), _terminate_as_interrupt():
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)  # the handler raises here
    assert signal.getsignal(signal.SIGTERM) is before and "resumes" in RESUME_HINT


def _record_starts(monkeypatch) -> list[list[str]]:
    """The argv (after ``python -m common.cli``) of every command the suite's runner starts from now
    on; each runs as a child that prints ``{}`` (a JSON command's output) and exits."""
    from server.bench.suite import runner

    started: list[list[str]] = []
    real = subprocess.Popen

    def recorded(args, **kwargs):
        started.append(list(args[3:]))
        return real([sys.executable, "-c", "print('{}')"], **kwargs)

    monkeypatch.setattr(runner.subprocess, "Popen", recorded)
    return started


def test_the_engine_is_how_a_federation_runs_not_what_it_is(tmp_path, monkeypatch):
    """``--engine batched``: every ``simulate`` the suite starts, or resumes, runs with it, while its
    command, and so its reuse and its record, stay the plan's (the engine is not part of a run's
    identity: server/run_dir.py NOT_IDENTITY); other commands are left as they are."""
    started = _record_starts(monkeypatch)
    fed = Run("x", "fed", ("simulate", "--preset", "small", "--rounds", "1"))
    out = str(tmp_path / "fed" / "out")
    first = execute(fed, tmp_path, lambda line: None, engine="batched")
    assert started[-1] == [
        "simulate",
        "--preset",
        "small",
        "--rounds",
        "1",
        "--out",
        out,
        "--engine",
        "batched",
    ]
    assert first["command"] == fed.command
    (tmp_path / "fed" / "out" / "checkpoint.safetensors").parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / "fed" / "out" / "checkpoint.safetensors").write_bytes(b"")  # an interrupted run
    execute(fed, tmp_path, lambda line: None, engine="batched")
    assert started[-1] == ["simulate", "--out", out, "--resume", "--engine", "batched"]
    execute(_eps_run("eps"), tmp_path, lambda line: None, engine="batched")
    assert "--engine" not in started[-1]
    execute(fed, tmp_path, lambda line: None)  # auto: the command as planned
    assert "--engine" not in started[-1]


def test_a_resumed_federation_records_the_whole_run_s_wall_time_and_keeps_its_log(tmp_path, monkeypatch):
    """A federation interrupted in an earlier session resumes: its log goes on after the earlier
    session's lines, and its record's ``wall_s`` is the summary's ``wall_time_s`` (every session's
    rounds), not the resuming session's seconds alone (a 300-round run recorded 4,078 s of 14,686)."""
    from server.bench.suite import runner

    real = subprocess.Popen
    finish = (
        "import json, pathlib, sys; out = pathlib.Path(sys.argv[1]); "
        "(out / 'summary.json').write_text(json.dumps({'wall_time_s': 14685.93})); "
        "print('session 2', file=sys.stderr)"
    )

    def resumed(args, **kwargs):
        assert list(args[3:6]) == ["simulate", "--out", str(tmp_path / "fed" / "out")] and "--resume" in args
        return real([sys.executable, "-c", finish, args[5]], **kwargs)

    monkeypatch.setattr(runner.subprocess, "Popen", resumed)
    fed = Run("x", "fed", ("simulate", "--preset", "small", "--rounds", "300"))
    (tmp_path / "fed" / "out").mkdir(parents=True)
    (tmp_path / "fed" / "out" / "checkpoint.safetensors").write_bytes(b"")
    (tmp_path / "fed" / "command.json").write_text(json.dumps({"command": list(fed.command)}))
    (tmp_path / "fed" / "log.txt").write_text("session 1\n")
    record = execute(fed, tmp_path, lambda line: None)
    assert record["error"] is None and record["wall_s"] == 14685.9
    assert json.loads((tmp_path / "fed" / "command.json").read_text())["wall_s"] == 14685.9
    assert (tmp_path / "fed" / "log.txt").read_text().splitlines() == ["session 1", "session 2"]


def test_a_run_stopped_by_the_suite_s_interrupt_is_reported_stopped_not_failed(tmp_path, monkeypatch):
    """Ctrl-C or SIGTERM stops the commands under way: each says it was stopped (the next invocation
    takes it up again), not FAILED; a command that fails on its own is still FAILED."""
    from server.bench.suite import runner

    real_popen, real_execute = subprocess.Popen, runner.execute
    monkeypatch.setattr(
        runner.subprocess,
        "Popen",
        lambda args, **kw: real_popen([sys.executable, "-c", "import time; time.sleep(60)"], **kw),
    )

    def execute_or_stop(run, *args):
        if run.key == "stop":  # Ctrl-C once the other command runs
            deadline = time.monotonic() + 30
            while not runner._LIVE and time.monotonic() < deadline:
                time.sleep(0.05)
            raise KeyboardInterrupt
        return real_execute(run, *args)

    monkeypatch.setattr(runner, "execute", execute_or_stop)
    said: list[str] = []
    with pytest.raises(KeyboardInterrupt):
        runner.execute_all([_eps_run("stop"), _eps_run("long")], tmp_path, said.append, jobs=2)
    long = [line for line in said if " long" in line]
    assert long[0].startswith("[suite] run long: fedlora privacy epsilon")
    assert long[1].startswith("[suite] stopped (the next invocation takes it up again) long (")
    assert not any("FAILED" in line for line in said)
    monkeypatch.setattr(
        runner.subprocess,
        "Popen",
        lambda args, **kw: real_popen([sys.executable, "-c", "raise SystemExit(3)"], **kw),
    )
    runner.execute_all([_eps_run("broken")], tmp_path, said.append)
    assert said[-1].startswith("[suite] FAILED broken")


def test_federations_left_interrupted_are_taken_up_before_new_runs(tmp_path, monkeypatch):
    """An invocation resumes the federations an earlier one left interrupted (a checkpoint of this very
    command, no output) before it starts any new run; the records stay in the plan's order."""
    from server.bench.suite import runner

    started = _record_starts(monkeypatch)
    new, left, other = (Run("x", k, ("simulate", "--preset", "small", "--rounds", "3")) for k in "abc")
    for run, command in ((left, left.command), (other, ["fedlora", "simulate", "--rounds", "9"])):
        (tmp_path / run.key / "out").mkdir(parents=True)
        (tmp_path / run.key / "out" / "checkpoint.safetensors").write_bytes(b"")
        (tmp_path / run.key / "command.json").write_text(json.dumps({"command": command}))
    assert [runner.interrupted(r, tmp_path) for r in (new, left, other)] == [False, True, False]
    records = runner.execute_all([new, left, other], tmp_path, lambda line: None)
    assert started[0] == ["simulate", "--out", str(tmp_path / "b" / "out"), "--resume"]
    assert [s[-1] for s in started[1:]] == [str(tmp_path / "a" / "out"), str(tmp_path / "c" / "out")]
    assert [r["dir"] for r in records] == [str(tmp_path / k) for k in "abc"]
