"""A node's persistent state directory and its two privacy ledgers.

The directory outlives runs and restarts: the sample-level ledger keeps every DP-optimizer round
this node's data went through, the client-level ledger every client-level release the node made
(client/node/release_ledger.py). Rows are keyed by run and round, so a restarted node, or a second
federation over the same data, adds to the history instead of starting from zero.
"""

from __future__ import annotations

import os
from pathlib import Path

from common.errors import FedloraError
from common.privacy.ledger import Ledger

LEDGER_FILE = "sample-ledger.sqlite"
CLIENT_LEDGER_FILE = "client-ledger.sqlite"


def node_state_dir(node_config: dict) -> Path:
    """``state-dir`` from the node config, else ``$FEDLORA_NODE_STATE`` (this node's own directory),
    else ``node-<partition-id>`` under ``$FEDLORA_NODE_STATE_ROOT`` (a simulation's nodes) or under
    ``~/.fedlora``; created if missing."""
    path = node_config.get("state-dir") or os.environ.get("FEDLORA_NODE_STATE")
    root = Path(os.environ.get("FEDLORA_NODE_STATE_ROOT") or Path.home() / ".fedlora")
    path = Path(path) if path else root / f"node-{node_config.get('partition-id', 0)}"
    path.mkdir(parents=True, exist_ok=True)
    return path


def encoder_cache_dir(node_config: dict) -> Path:
    """Where the node keeps the encoders it has received: ``encoder-cache`` from the node config
    (an in-process simulation points every node at one shared directory: one copy of a 37 MB basis
    instead of one per node), else the node's state directory."""
    shared = node_config.get("encoder-cache")
    return Path(shared) if shared else node_state_dir(node_config)


def sample_ledger(state_dir: Path, owner: str, delta: float) -> Ledger:
    """The node's sample-level ledger for the data named ``owner`` (created on first use). A ledger
    there for other data or another δ (its ε is stated at one δ for the whole history), or a
    corrupt one, is an error and is left as it is."""
    return _node_ledger(state_dir / LEDGER_FILE, "sample-level", owner, delta)


def client_ledger(state_dir: Path, owner: str, delta: float) -> Ledger:
    """The node's client-level release ledger for the data named ``owner``, checked like
    :func:`sample_ledger`."""
    return _node_ledger(state_dir / CLIENT_LEDGER_FILE, "client-level", owner, delta)


def _node_ledger(path: Path, unit: str, owner: str, delta: float) -> Ledger:
    if not path.exists():
        return Ledger.create(path, unit, owner, delta)
    ledger = Ledger.open(path, unit, owner)
    if ledger.delta != delta:
        ledger.close()
        raise FedloraError(
            f"node policy: this node's {unit} ledger {path} accounts at delta {ledger.delta:g}; "
            f"the run asks delta {delta:g} (use that delta, or another state directory for this data)"
        )
    return ledger
