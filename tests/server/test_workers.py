"""Client worker processes (server/workers.py): the same federation with 1 and 2 workers gives the
same metrics, adapter and ledger."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from flwr.app import ConfigRecord, Message, RecordDict
from flwr.clientapp import ClientApp
from safetensors.torch import load_file

from common.presets import preset
from common.privacy.accounting.ledger import Ledger
from server.checkpoint import CHECKPOINT_FILE
from server.simulate import simulate
from server.workers import WorkerPoolGrid, resolve_workers
from tests.conftest import run_cli
from tests.harness import TINY

#: the sequential engine: a client's training (dropout draws included) depends on its own seed alone, so
#: results are bit-identical across worker counts (the batched engine's depend on the cohort's layout
#: through its dropout draws and rounding: docs/cohort-engine.md)
SETTINGS = {
    **TINY,
    "num_clients": 4,
    "rounds": 2,
    "sample_rate": 1.0,
    "precision": "fp32",
    "engine": "sequential",
}
ROOT = Path(__file__).resolve().parents[2]
LEDGER = ("round", "sigma", "p", "sampled", "replied", "clip", "status", "mu", "eps_gdp", "eps_tight")


def _run(tmp_path, name: str, workers: int, **kw):
    out = tmp_path / name
    simulate(preset("minilm-rt", **{**SETTINGS, **kw, "workers": workers, "out_dir": str(out)}).check())
    return out


def _metrics(out) -> list[dict]:
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if k != "seconds"} for r in lines]


@pytest.mark.slow  # make test-all (as its ledger twin below); make test keeps the worker pool's own tests below
@pytest.mark.integration
def test_one_and_two_workers_give_the_same_federation(tmp_path, one_thread):
    """One worker (the server's process, on one thread as every worker runs) and two workers."""
    one, two = _run(tmp_path, "one", 1), _run(tmp_path, "two", 2)
    assert _metrics(one) == _metrics(two)
    a, b = load_file(one / CHECKPOINT_FILE), load_file(two / CHECKPOINT_FILE)
    assert a.keys() == b.keys() and all(a[k].equal(b[k]) for k in a)
    split = json.loads((two / "summary.json").read_text())["time_split_s"]
    assert split["local-training"] > 0  # the workers' phases come back with their replies


@pytest.mark.slow  # make test-all: ~30 s, and make test is at its 15-minute budget; make test keeps the pool's own tests
@pytest.mark.integration
def test_one_and_two_workers_charge_the_same_ledger(tmp_path, one_thread):
    dp = dict(mechanism="dp-fedavg", threat_model="central", noise_multiplier=1.0, clip=0.5)
    rows = []
    for name, workers in (("one", 1), ("two", 2)):
        ledger = Ledger.open(_run(tmp_path, name, workers, **dp) / "ledger.sqlite", "client-level")
        rows.append([{k: r[k] for k in LEDGER} for r in ledger.rows()])
        ledger.close()
    assert rows[0] == rows[1] and len(rows[0]) == 2


#: a ClientApp that counts, in its node's context.state, the messages the node has answered
counting = ClientApp()


@counting.train()
def _count(msg: Message, context) -> Message:
    seen = int(context.state["count"]["n"]) + 1 if "count" in context.state else 1
    context.state["count"] = ConfigRecord({"n": seen})
    return Message(RecordDict({"count": ConfigRecord({"n": seen})}), reply_to=msg)


def test_a_nodes_state_persists_across_messages_whichever_worker_runs_them():
    """Flower keeps a node's context.state beside the node: the pool ships it with each message and
    back with the reply, so a later message sees it on any worker (secure aggregation's stages)."""
    with WorkerPoolGrid("tests.server.test_workers:counting", 3, {}, 2) as grid:
        for rnd in range(1, 5):
            messages = [
                Message(RecordDict(), dst_node_id=n, message_type="train", group_id=str(rnd))
                for n in grid.get_node_ids()
            ]
            replies = grid.send_and_receive(messages)
            assert [int(r.content["count"]["n"]) for r in replies] == [rnd] * 3


#: a ClientApp that answers with its worker's working directory and one environment variable
placed = ClientApp()


@placed.train()
def _where(msg: Message, context) -> Message:
    where = {"cwd": os.getcwd(), "env": os.environ.get("FEDLORA_TEST_PLACE", "")}
    return Message(RecordDict({"where": ConfigRecord(where)}), reply_to=msg)


def test_workers_take_the_cwd_and_environment_of_when_their_pool_starts(tmp_path, monkeypatch):
    """The forkserver, started by this process's first pool, keeps the directory and environment of
    then: each pool's workers take the server's of when that pool starts, as spawned ones would."""
    for place in ("first", "second"):  # the second pool reuses the forkserver the first started
        (tmp_path / place).mkdir()
        monkeypatch.chdir(tmp_path / place)
        monkeypatch.setenv("FEDLORA_TEST_PLACE", place)
        with WorkerPoolGrid("tests.server.test_workers:placed", 2, {}, 2) as grid:
            messages = [
                Message(RecordDict(), dst_node_id=n, message_type="train", group_id="1")
                for n in grid.get_node_ids()
            ]
            for reply in grid.send_and_receive(messages):
                assert dict(reply.content["where"]) == {"cwd": str(tmp_path / place), "env": place}


def test_workers_default_to_the_cores():
    assert resolve_workers(3) == 3 and resolve_workers(0) >= 1


@pytest.mark.process
def test_workers_exit_when_the_server_process_is_killed():
    """A SIGKILLed server sends no stop: its workers notice they are orphans and exit."""
    code = (
        "import sys, time\n"
        "from server.workers import WorkerPoolGrid\n"
        "if __name__ == '__main__':\n"
        "    grid = WorkerPoolGrid('client.app:app', 2, {}, 2)\n"
        "    print(' '.join(str(p.pid) for p in grid._procs), flush=True)\n"
        "    time.sleep(120)\n"
    )
    server = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    pids = [int(x) for x in server.stdout.readline().split()]
    assert len(pids) == 2
    server.send_signal(signal.SIGKILL)
    server.wait()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and any(_alive(p) for p in pids):
        time.sleep(0.5)
    assert not any(_alive(p) for p in pids)


@pytest.mark.slow  # make test-all: make test keeps the plain kill above
def test_workers_exit_when_the_server_is_killed_half_way_through_sending_a_task():
    """SIGKILL while the task queue's feeder thread is writing a 64 MB task (the workers stopped, so
    the pipe fills after 64 KB): a worker then reads half a message that will never end (it holds
    the pipe's write end too, so no EOF comes), and exits all the same (a watch on its parent,
    apart from the read)."""
    code = (
        "import os, signal, sys, time\n"
        "from server.workers import WorkerPoolGrid\n"
        "if __name__ == '__main__':\n"
        "    grid = WorkerPoolGrid('client.app:app', 2, {}, 2)\n"
        "    print(' '.join(str(p.pid) for p in grid._procs), flush=True)\n"
        "    sys.stdin.readline()\n"
        "    grid._tasks.put(b'x' * (64 << 20))\n"
        "    time.sleep(1.0)\n"
        "    os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    pipe = subprocess.PIPE
    server = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stdin=pipe, stdout=pipe, text=True)
    pids = [int(x) for x in server.stdout.readline().split()]
    assert len(pids) == 2
    time.sleep(3.0)  # the workers are up and waiting for a task
    for p in pids:
        os.kill(p, signal.SIGSTOP)
    server.stdin.write("go\n")
    server.stdin.flush()
    server.wait()
    for p in pids:
        os.kill(p, signal.SIGCONT)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and any(_alive(p) for p in pids):
        time.sleep(0.5)
    left = [p for p in pids if _alive(p)]
    for p in left:
        os.kill(p, signal.SIGKILL)
    assert not left


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").exists() and Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"


@pytest.mark.slow  # make test-all: real processes; make test keeps the SIGKILL-resume test (tests/server/test_resume.py)
@pytest.mark.process
@pytest.mark.timeout(600)
def test_ctrl_c_stops_the_workers_quietly_and_says_how_to_continue(tmp_path):
    """Issue 53 item 7: Ctrl-C at a terminal signals the whole foreground process group, the server
    and its client workers. The workers ignore it (the server stops them), so none prints a
    ``KeyboardInterrupt`` traceback, nothing hangs, and ``fedlora`` exits 130 with one line naming
    the command that continues the run; that command does."""
    out = tmp_path / "run"
    # rounds enough that the interrupt lands mid-run (a warm worker pool trains a tiny round in < 1 s)
    tiny = {
        "--num-clients": 2,
        "--rounds": 12,
        "--local-steps": 4,
        "--batch-size": 8,
        "--engine": "sequential",
    }
    tiny |= {"--max-train-examples": 200, "--eval-examples": 40, "--seed": 5}
    argv = [sys.executable, "-m", "common.cli", "simulate", "--preset", "minilm-rt", "--workers", "2"]
    argv += [
        "--mechanism",
        "dp-adamw",
        "--sample-epsilon",
        "8",
    ]  # the DP step's progress bar: a lock per worker (it leaked)
    argv += [*(str(x) for kv in tiny.items() for x in kv), "--out", str(out)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    pipe = subprocess.PIPE
    server = subprocess.Popen(
        argv,
        cwd=ROOT,
        stdout=pipe,
        stderr=pipe,
        text=True,
        env=env,
        start_new_session=True,
        # SIGINT at its default, as a terminal starts a command: an ignored SIGINT is inherited (and
        # Python then installs no KeyboardInterrupt handler), and in the full suite this process had
        # it ignored, so the run finished through the interrupt (exit 0)
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        first = server.stdout.readline()  # round 0 is being evaluated
        assert first.startswith("round 0: evaluating"), first + server.stderr.read()[-2000:]
        first = server.stdout.readline()  # round 0 is evaluated: round 1 is next (workers start or train)
        assert first.startswith("round 0: held-out"), first + server.stderr.read()[-2000:]
        first = server.stdout.readline()  # round 1 trained: the workers have run a DP step
        assert first.startswith("round 1: "), first + server.stderr.read()[-2000:]
        os.killpg(server.pid, signal.SIGINT)  # as a terminal's Ctrl-C: the whole process group
        _, err = server.communicate(timeout=60)  # before: a hang (the queue's feeder, unread)
    finally:
        if server.poll() is None:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()
    assert server.returncode == 130, err[-3000:]
    deadline = time.monotonic() + 30  # the workers were stopped with the server (its process group)
    while (left := _in_group(server.pid)) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not left, left
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err[-3000:]
    hint = f"fedlora: interrupted; continue with: fedlora simulate --resume --out {out}"
    assert err.strip().splitlines() == [hint], err[-3000:]  # and no "leaked semaphore" warning
    assert run_cli([*shlex.split(hint.split("continue with: fedlora ")[1]), "--workers", "1"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["rounds_completed"] == 12


@pytest.mark.process
@pytest.mark.timeout(300)
def test_ctrl_c_while_the_workers_start_is_one_line(tmp_path):
    """Issue 75 item 9: Ctrl-C while the forkserver still preloads torch (seconds, before any
    worker has started): exit 130, one line, nothing left running. A worker the forkserver started
    after this process was gone found its queues' semaphores unlinked and printed a
    FileNotFoundError traceback (server/workers.py, the forkserver probe)."""
    argv = [sys.executable, "-m", "common.cli", "simulate", "--preset", "minilm-rt", "--workers", "2"]
    argv += ["--num-clients", "2", "--rounds", "2", "--max-train-examples", "200", "--eval-examples", "40"]
    argv += ["--out", str(tmp_path / "run")]
    server = subprocess.Popen(
        argv,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        start_new_session=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),  # as a terminal starts it
    )
    try:
        deadline = time.monotonic() + 120
        while not _forkserver_in(server.pid) and server.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _forkserver_in(server.pid), "no forkserver started"
        os.killpg(server.pid, signal.SIGINT)  # as a terminal's Ctrl-C: the whole process group
        _, err = server.communicate(timeout=120)
        deadline = time.monotonic() + 30  # the forkserver ends once this process is gone
        while (left := _in_group(server.pid)) and time.monotonic() < deadline:
            time.sleep(0.5)
    finally:
        if server.poll() is None:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()
    assert server.returncode == 130, err[-3000:]
    assert err.strip().splitlines() == ["fedlora: interrupted"], err[-3000:]
    assert not left, left


def _forkserver_in(pgid: int) -> bool:
    """Whether process group ``pgid`` holds a multiprocessing forkserver."""
    for pid in _in_group(pgid):
        try:
            if b"multiprocessing.forkserver" in Path(f"/proc/{pid}/cmdline").read_bytes():
                return True
        except OSError:
            continue
    return False


def _in_group(pgid: int) -> list[int]:
    """The live (not zombie) processes of process group ``pgid``."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] != "Z" and int(fields[2]) == pgid:
            found.append(int(stat.parent.name))
    return found
