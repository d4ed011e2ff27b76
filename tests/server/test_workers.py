"""Client worker processes (server/workers.py): the same federation with 1 and 2 workers gives the
same metrics, adapter and ledger."""

from __future__ import annotations

import json
import os
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
from common.privacy.ledger import Ledger
from server.checkpoint import CHECKPOINT_FILE
from server.simulate import simulate
from server.workers import WorkerPoolGrid, resolve_workers
from tests.harness import TINY

SETTINGS = {**TINY, "num_clients": 4, "rounds": 2, "sample_rate": 1.0, "precision": "fp32"}
ROOT = Path(__file__).resolve().parents[2]
LEDGER = ("round", "sigma", "p", "sampled", "replied", "clip", "status", "mu", "eps_gdp", "eps_tight")


def _run(tmp_path, name: str, workers: int, **kw):
    out = tmp_path / name
    simulate(preset("minilm-rt", **{**SETTINGS, **kw}, workers=workers, out_dir=str(out)).check())
    return out


def _metrics(out) -> list[dict]:
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if k != "seconds"} for r in lines]


@pytest.mark.integration
def test_one_and_two_workers_give_the_same_federation(tmp_path, one_thread):
    """One worker (the server's process, on one thread as every worker runs) and two workers."""
    one, two = _run(tmp_path, "one", 1), _run(tmp_path, "two", 2)
    assert _metrics(one) == _metrics(two)
    a, b = load_file(one / CHECKPOINT_FILE), load_file(two / CHECKPOINT_FILE)
    assert a.keys() == b.keys() and all(a[k].equal(b[k]) for k in a)
    split = json.loads((two / "summary.json").read_text())["time_split_s"]
    assert split["local-training"] > 0  # the workers' phases come back with their replies


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


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").exists() and Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
