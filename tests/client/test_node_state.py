"""The node's sample-level ledger persists in its state directory across restarts and runs."""

import pytest

from client.node.state import node_state_dir, sample_ledger
from common.errors import FedloraError
from common.privacy.ledger import Charge


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
