"""The node's sample-level ledger persists in its state directory across restarts and runs."""

import pytest

from client.node.state import LEDGER_FILE, held_ledger, node_state_dir, sample_ledger
from common.errors import FedloraError
from common.privacy.accounting.ledger import Charge


def _steps(run, rnd, steps=20):
    return Charge(run, rnd, 1.1, 0.01, steps, 0.01, 1, 1.0, "local", "dp-adamw")


def test_sample_ledger_survives_restarts_and_accumulates_runs(tmp_path):
    state = node_state_dir({"state-dir": str(tmp_path / "node"), "partition-id": 3})
    first = sample_ledger(state, "rotten-tomatoes/3-of-4", 1e-5)
    first.charge(_steps("run-a", 1))
    first.close()  # the node restarts
    again = sample_ledger(state, "rotten-tomatoes/3-of-4", 1e-5)
    again.charge(_steps("run-a", 2))
    again.charge(_steps("run-b", 1))  # another federation over the same data adds to the history
    rows = again.rows()
    assert [(r["run"], r["round"], r["count"]) for r in rows] == [
        ("run-a", 1, 20),
        ("run-a", 2, 20),
        ("run-b", 1, 20),
    ]
    assert rows[-1]["eps_tight"] > rows[0]["eps_tight"] > 0


def test_sample_ledger_for_other_data_is_refused(tmp_path):
    sample_ledger(tmp_path, "rotten-tomatoes/0-of-4", 1e-5).close()
    with pytest.raises(FedloraError, match="belongs to"):
        sample_ledger(tmp_path, "bbc-news/0-of-4", 1e-5)


def test_default_state_dir_is_per_partition(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("FEDLORA_NODE_STATE", raising=False)
    monkeypatch.delenv("FEDLORA_NODE_STATE_ROOT", raising=False)
    assert node_state_dir({"partition-id": 2}) == tmp_path / ".fedlora" / "node-2"
    monkeypatch.setenv("FEDLORA_NODE_STATE_ROOT", str(tmp_path / "sim"))  # a simulation's nodes
    assert node_state_dir({"partition-id": 2}) == tmp_path / "sim" / "node-2"
    monkeypatch.setenv("FEDLORA_NODE_STATE", str(tmp_path / "env"))  # this node's own directory
    assert node_state_dir({}) == tmp_path / "env"


def test_a_held_ledger_stays_open_between_messages_and_follows_its_file(tmp_path):
    node = {"state-dir": str(tmp_path / "node"), "ledger-sync": "normal"}
    first = held_ledger(node, LEDGER_FILE, "sample-level", "rotten-tomatoes/0-of-1", 1e-5)
    first.charge(_steps("run-a", 1))
    assert held_ledger(node, LEDGER_FILE, "sample-level", "rotten-tomatoes/0-of-1", 1e-5) is first
    assert first._conn.execute("PRAGMA synchronous").fetchone()[0] == 1  # NORMAL
    with pytest.raises(FedloraError, match="accounts at delta 1e-05; the run asks delta 1e-06"):
        held_ledger(node, LEDGER_FILE, "sample-level", "rotten-tomatoes/0-of-1", 1e-6)
    assert len(first.rows()) == 1  # still open and usable after the refusal
    for name in ("sample-ledger.sqlite", "sample-ledger.sqlite-wal", "sample-ledger.sqlite-shm"):
        (tmp_path / "node" / name).unlink(missing_ok=True)  # the file goes away behind the process
    fresh = held_ledger(node, LEDGER_FILE, "sample-level", "rotten-tomatoes/0-of-1", 1e-5)
    assert fresh is not first and fresh.rows() == []


def test_a_bad_ledger_sync_is_refused_before_any_file_is_made(tmp_path):
    node = {"state-dir": str(tmp_path / "node"), "ledger-sync": "off"}
    with pytest.raises(FedloraError, match="ledger-sync must be one of full, normal, got 'off'"):
        held_ledger(node, LEDGER_FILE, "sample-level", "rotten-tomatoes/0-of-1", 1e-5)
    assert not (tmp_path / "node" / LEDGER_FILE).exists()
    full = held_ledger({"state-dir": str(tmp_path / "node")}, LEDGER_FILE, "sample-level", "x/0-of-1", 1e-5)
    assert full._conn.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL, the default
