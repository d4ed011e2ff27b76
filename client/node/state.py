"""A node's persistent state directory and its two privacy ledgers.

The directory outlives runs and restarts: the sample-level ledger keeps every DP-optimizer round
this node's data went through, the client-level ledger every client-level release the node made
(client/node/release_ledger.py). Rows are keyed by run and round, so a restarted node, or a second
federation over the same data, adds to the history instead of starting from zero.
"""

from __future__ import annotations

import os
import resource
from collections import OrderedDict
from functools import cache
from pathlib import Path

from common.errors import FedloraError
from common.privacy.accounting.ledger import LEDGER_SYNC, Ledger, check_sync

LEDGER_FILE = "sample-ledger.sqlite"
CLIENT_LEDGER_FILE = "client-ledger.sqlite"

#: the ledgers this process's nodes keep open between messages: path -> (pid, file id, ledger)
_HELD: OrderedDict[Path, tuple[int, tuple[int, int], Ledger]] = OrderedDict()


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


def held_ledger(node_config: dict, file: str, unit: str, owner: str, delta: float) -> Ledger:
    """The node's ledger ``file`` (:data:`LEDGER_FILE` or :data:`CLIENT_LEDGER_FILE`) in its state
    directory, checked like :func:`sample_ledger`, opened once per process and kept open between
    the node's messages (reopening costs a WAL checkpoint and a sync on every close; callers never
    close it). Committed at the node config's :data:`LEDGER_SYNC`. A file replaced or removed behind
    the process's back is opened again, never written through a stale handle."""
    path = node_state_dir(node_config) / file
    sync = check_sync(str(node_config.get(LEDGER_SYNC) or "full"))  # before any file is touched
    kept = _HELD.pop(path, None)
    if kept is not None:
        pid, ident, ledger = kept
        if pid == os.getpid() and ident == file_id(path) and (ledger.unit, ledger.owner) == (unit, owner):
            _HELD[path] = kept  # the most recently used last
            return _check_delta(ledger, delta)
        if pid == os.getpid():
            ledger.close()
    ledger = _node_ledger(path, unit, owner, delta, sync)
    _HELD[path] = (os.getpid(), file_id(path), ledger)
    while len(_HELD) > _held_max():
        _HELD.popitem(last=False)[1][2].close()
    return ledger


def file_id(path: Path) -> tuple[int, int]:
    """``(device, inode)`` of ``path`` (``(-1, -1)``: none): a handle kept open is stale once it differs."""
    try:
        st = path.stat()
    except OSError:
        return (-1, -1)
    return (st.st_dev, st.st_ino)


@cache
def _held_max() -> int:
    """How many ledgers a process keeps open: an open WAL ledger holds three file descriptors, so an
    eighth of the soft limit, raised to the hard limit first (a 1,000-node simulation keeps 1,000)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 16)
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):
            pass
    return max(16, min(soft, 1 << 20) // 8)


def _check_delta(ledger: Ledger, delta: float) -> Ledger:
    if ledger.delta != delta:
        raise FedloraError(
            f"node policy: this node's {ledger.unit} ledger {ledger.path} accounts at delta "
            f"{ledger.delta:g}; the run asks delta {delta:g} (use that delta, or another state "
            "directory for this data)"
        )
    return ledger


def _node_ledger(path: Path, unit: str, owner: str, delta: float, sync: str = "full") -> Ledger:
    if not path.exists():
        return Ledger.create(path, unit, owner, delta, sync=sync)
    ledger = Ledger.open(path, unit, owner, sync=sync)
    try:
        return _check_delta(ledger, delta)
    except FedloraError:
        ledger.close()
        raise
