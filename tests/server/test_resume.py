"""Crash safety with real processes: SIGKILL the server mid-run, restart it with --resume; no round
is lost, none is charged twice; a changed configuration or a corrupt ledger is refused untouched."""

import hashlib
import json
import math
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import time

import pytest
from safetensors import safe_open

from tests.conftest import run_cli

pytestmark = pytest.mark.process

SIGMA, CLIP, ROUNDS = 1.5, 0.5, 5
RUN = [
    "simulate",
    "--preset", "minilm-rt",
    "--mechanism", "dp-fedavg",
    "--noise-multiplier", str(SIGMA),
    "--threat-model", "central",
    "--clip", str(CLIP),
    "--num-clients", "2",
    "--sample-rate", "1.0",
    "--rounds", str(ROUNDS),
    "--local-steps", "2",
    "--max-train-examples", "200",
    "--eval-examples", "16",
    "--workers", "1",  # the clients in the server's process: a worker's start costs ~10 s on 2 cores
]  # fmt: skip


def _fedlora(*args: str, **kw) -> subprocess.Popen:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    return subprocess.Popen([sys.executable, "-m", "common.cli", *args], env=env, text=True, **kw)


def _rows(path) -> list[dict]:
    conn = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
    conn.row_factory = sqlite3.Row
    try:
        return [dict(r) for r in conn.execute("SELECT * FROM charges ORDER BY seq")]
    except sqlite3.OperationalError:  # not created yet
        return []
    finally:
        conn.close()


def kill_after(proc: subprocess.Popen, ledger, applied: int, pause: float = 0.0) -> None:
    """SIGKILL ``proc`` once ``ledger`` holds ``applied`` applied rounds (and ``pause`` seconds more)."""
    deadline = time.monotonic() + 300
    while sum(r["status"] == "applied" for r in (_rows(ledger) if ledger.exists() else [])) < applied:
        assert proc.poll() is None, "the run ended before it could be killed"
        assert time.monotonic() < deadline, f"{applied} rounds did not finish in time"
        time.sleep(0.1)
    time.sleep(pause)
    proc.send_signal(signal.SIGKILL)
    proc.wait()


def _finish(*args: str) -> subprocess.CompletedProcess:
    proc = _fedlora(*args, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out, err = proc.communicate(timeout=600)
    return subprocess.CompletedProcess(args, proc.returncode, out, err)


@pytest.fixture(scope="module")
def crashed_and_resumed(tmp_path_factory):
    out = tmp_path_factory.mktemp("crash") / "run"
    ledger = out / "ledger.sqlite"
    proc = _fedlora(*RUN, "--out", str(out), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    kill_after(proc, ledger, 2, pause=0.5)  # into round 3: charged, clients training
    before = _rows(ledger)
    with safe_open(out / "checkpoint.safetensors", framework="pt") as fh:
        killed = json.loads(fh.metadata()["loop"])  # the last round committed before the kill
    resumed = _finish("simulate", "--resume", "--out", str(out))
    return out, proc.returncode, before, resumed, killed


def test_sigkill_then_resume_loses_no_round_and_charges_none_twice(crashed_and_resumed):
    out, killed_rc, before, resumed, _ = crashed_and_resumed
    assert killed_rc == -signal.SIGKILL and 2 <= len(before) < ROUNDS
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    rows = _rows(out / "ledger.sqlite")
    assert [r["round"] for r in rows] == list(range(1, ROUNDS + 1))  # every round, each once
    assert {r["status"] for r in rows} <= {"applied", "interrupted"}
    for old, new in zip(before, rows, strict=False):  # charges made before the crash stand unchanged
        assert (old["sigma"], old["p"], old["eps_gdp"], old["eps_tight"]) == (
            new["sigma"],
            new["p"],
            new["eps_gdp"],
            new["eps_tight"],
        )
    # exactly ROUNDS charges composed: μ = p·sqrt(T·(e^{1/σ²} − 1)) with p = 1
    assert rows[-1]["mu"] == pytest.approx(math.sqrt(ROUNDS * math.expm1(SIGMA**-2)), rel=1e-9)
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert sorted(m["round"] for m in metrics) == list(range(ROUNDS + 1))  # one line per round
    summary = json.loads((out / "summary.json").read_text())
    interrupted = [r["round"] for r in rows if r["status"] == "interrupted"]
    assert summary["rounds_completed"] + len(interrupted) == ROUNDS
    assert summary.get("rounds_interrupted", []) == interrupted
    assert summary["client_privacy"]["eps_tight"] == rows[-1]["eps_tight"]
    assert "resuming" in resumed.stderr + resumed.stdout


def test_a_resumed_run_s_wall_time_counts_the_session_before_the_kill(crashed_and_resumed):
    """The summary's wall time is the whole run's: the seconds to the last round committed before the
    kill (kept in the checkpoint) plus every round the resumed session ran, not that session alone."""
    out, *_, killed = crashed_and_resumed
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    after_kill = sum(m.get("seconds", 0) for m in metrics if m["round"] > killed["round"])
    assert killed["elapsed_s"] >= sum(m.get("seconds", 0) for m in metrics if m["round"] <= killed["round"])
    summary = json.loads((out / "summary.json").read_text())
    assert summary["wall_time_s"] >= killed["elapsed_s"] + after_kill


def _digest(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_resume_with_another_configuration_is_refused(crashed_and_resumed, capsys):
    out = crashed_and_resumed[0]
    digest = _digest(out / "ledger.sqlite")
    assert run_cli(["simulate", "--resume", "--out", str(out), "--rounds", "9"]) == 2
    assert "configuration differs in rounds" in capsys.readouterr().err
    assert _digest(out / "ledger.sqlite") == digest


def test_resume_with_a_corrupt_ledger_is_refused_untouched(crashed_and_resumed, tmp_path, capsys):
    out = tmp_path / "copy"
    shutil.copytree(crashed_and_resumed[0], out)
    (out / "ledger.sqlite").write_bytes(b"\x00garbage" * 512)
    for side in ("ledger.sqlite-wal", "ledger.sqlite-shm"):
        (out / side).unlink(missing_ok=True)
    digest = _digest(out / "ledger.sqlite")
    assert run_cli(["simulate", "--resume", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "not a readable fedlora ledger" in err and len(err.strip().splitlines()) == 1
    assert _digest(out / "ledger.sqlite") == digest


def test_new_run_into_an_existing_run_is_refused(crashed_and_resumed, capsys):
    out = crashed_and_resumed[0]
    digest = _digest(out / "ledger.sqlite")
    assert run_cli([*RUN, "--out", str(out)]) == 2
    assert "already holds a run" in capsys.readouterr().err
    assert _digest(out / "ledger.sqlite") == digest


def test_a_run_stored_before_an_option_existed_resumes_at_its_default(tmp_path):
    """A config.json written before ``public_subspace`` existed lacks the key: the run had the
    default, so resuming at the default is the same run, and at another value it is not."""
    from dataclasses import asdict

    from common.errors import FedloraError
    from common.presets import preset
    from server.run_dir import RunDir, fingerprint

    cfg = preset("minilm-rt-xdev", out_dir=str(tmp_path))
    stored = {k: v for k, v in asdict(cfg).items() if k != "public_subspace"}
    (tmp_path / "config.json").write_text(json.dumps(stored))
    resumed = RunDir(tmp_path, cfg.replace(resume=True))  # no error, and the run keeps its identity
    assert resumed.run_id == fingerprint(stored) != fingerprint(cfg)
    with pytest.raises(FedloraError, match="differs in public_subspace"):
        RunDir(tmp_path, cfg.replace(resume=True, public_subspace=8))


@pytest.mark.slow  # 34 s of real processes (make test-all): make test keeps the central SIGKILL-resume test
def test_a_secure_aggregation_run_resumes_with_each_clients_participations(tmp_path):
    """SIGKILL during a secure-aggregation run, then --resume: every round charged once, each to the
    clients it named; the resumed server counts each client's participations from the ledger (the
    cap holds across the crash) and the ε stays the worst client's, within the target."""
    out = tmp_path / "run"
    secure = [
        "simulate", "--preset", "minilm-rt", "--mechanism", "dp-fedavg", "--clip", str(CLIP),
        "--threat-model", "secure-aggregation", "--target-epsilon", "8", "--min-replies", "3",
        "--num-clients", "4", "--sample-rate", "1.0", "--rounds", "4", "--local-steps", "4",
        "--max-train-examples", "200", "--eval-examples", "40",
    ]  # fmt: skip
    proc = _fedlora(*secure, "--out", str(out), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    ledger = out / "ledger.sqlite"
    kill_after(proc, ledger, 2)
    resumed = _finish("simulate", "--resume", "--out", str(out))
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert "resuming" in resumed.stderr + resumed.stdout
    from common.privacy.accounting.ledger import Ledger

    led = Ledger.open(ledger, "client-level")
    rows = led.rows()
    assert [r["round"] for r in rows] == [1, 2, 3, 4]
    assert set(led.participations().values()) == {4}  # every node sampled (p = 1) in every charged round
    summary = json.loads((out / "summary.json").read_text())
    assert summary["client_privacy"]["eps_tight"] == led.spent()["eps_tight"] <= 8.0


def test_a_sample_level_run_killed_mid_round_and_resumed_ends_within_its_target(tmp_path):
    """The user's report: a cross-silo run (no client-level release, so no server ledger) killed while
    its nodes train round 2, then --resume: round 2 runs again and every node charges it again. Each
    node re-plans its remaining steps so that its own ledger ends at or under the run's sample-level
    target, and the attempt the kill cut short is marked ``interrupted``, as docs/deployment.md says."""
    from common.privacy.accounting.ledger import Ledger

    out, target = tmp_path / "run", 3.0
    silo = [
        "simulate", "--preset", "minilm-rt-silo", "--num-clients", "2", "--rounds", "4",
        "--local-steps", "3", "--batch-size", "16", "--max-train-examples", "200", "--eval-examples", "16",
        "--sample-epsilon", str(target), "--workers", "1",
    ]  # fmt: skip
    proc = _fedlora(*silo, "--out", str(out), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    ledgers, deadline = (
        [out / "nodes" / f"node-{k}" / "sample-ledger.sqlite" for k in (0, 1)],
        time.monotonic() + 300,
    )
    while not any(
        r["round"] == 2 and r["status"] == "charged" for p in ledgers if p.exists() for r in _rows(p)
    ):
        assert proc.poll() is None and time.monotonic() < deadline, "round 2 never started training"
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    resumed = _finish("simulate", "--resume", "--out", str(out))
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    twice = 0
    for path in ledgers:
        led = Ledger.open(path, "sample-level")
        rows = led.rows()
        twice += [r["round"] for r in rows].count(2) == 2  # round 2 charged again on resume ...
        assert led.spent()["eps_tight"] <= target * (1 + 1e-6), rows  # ... every node within its target
        assert {r["status"] for r in rows} <= {"applied", "interrupted"}
    assert twice and any(r["status"] == "interrupted" for p in ledgers for r in _rows(p))
