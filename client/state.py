"""A node's persistent state directory and its sample-level privacy ledger.

The directory outlives runs and restarts: the sample-level ledger in it keeps the whole privacy
history of this node's data (rows are keyed by run and round), so a restarted node, or a second
federation over the same data, adds to the history instead of starting from zero.
"""

from __future__ import annotations

import os
from pathlib import Path

from common.privacy.ledger import Ledger

LEDGER_FILE = "sample-ledger.sqlite"


def node_state_dir(node_config: dict) -> Path:
    """``state-dir`` from the node config, else ``$FEDLORA_NODE_STATE``, else
    ``~/.fedlora/node-<partition-id>``; created if missing."""
    path = node_config.get("state-dir") or os.environ.get("FEDLORA_NODE_STATE")
    path = Path(path) if path else Path.home() / ".fedlora" / f"node-{node_config.get('partition-id', 0)}"
    path.mkdir(parents=True, exist_ok=True)
    return path


def sample_ledger(state_dir: Path, owner: str, delta: float) -> Ledger:
    """The node's sample-level ledger for the data named ``owner`` (created on first use). A ledger
    there for other data, or a corrupt one, is an error and is left as it is."""
    path = state_dir / LEDGER_FILE
    if path.exists():
        return Ledger.open(path, "sample-level", owner)
    return Ledger.create(path, "sample-level", owner, delta)
