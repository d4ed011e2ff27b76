"""What a node's identity has signed in secure aggregation (common/secagg/identity.py), kept in its
state directory so that it signs nothing twice, across restarts.

A node signs two statements a SecAgg+ round: its round keys (stage 0) and the survivor set it was
given (the consistency check). Each is committed here, keyed by the identity's fingerprint, the
Flower run and the round, *before* the signature leaves; a second request for the same (identity,
run, round, statement) is refused, whatever the server says about it. A restarted node has lost its
round secrets (they live in ``context.state``), so a server that restarts a round cannot collect a
second set of keys or a second survivor-set signature from it: only new rounds are answered.

The file (``secagg-signed.sqlite``) holds no secret: fingerprints, run ids, round numbers and the
SHA-256 digests each statement was bound to (the round's parameters, or its transcript).
"""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

from client.node.state import file_id, node_state_dir
from common.errors import FedloraError
from common.privacy.accounting.ledger import LEDGER_SYNC, check_sync, connect

SIGNED_FILE = "secagg-signed.sqlite"
KINDS = ("keys", "survivors")  # the statements a node signs in a round, in order

_SCHEMA = """CREATE TABLE IF NOT EXISTS signed (
    identity TEXT NOT NULL, run TEXT NOT NULL, round INTEGER NOT NULL, kind TEXT NOT NULL,
    digest BLOB NOT NULL, PRIMARY KEY (identity, run, round, kind))"""

#: connections this process keeps open: path -> (pid, file id, connection)
_OPEN: dict[Path, tuple[int, tuple[int, int], sqlite3.Connection]] = {}


def _connection(node_config: dict) -> sqlite3.Connection:
    """The node's record, opened once per process and kept open, as the node's ledgers are
    (client/node/state.py :func:`held_ledger`): a file replaced or removed behind the process's back
    is opened again, never written through a stale handle."""
    path = node_state_dir(node_config) / SIGNED_FILE
    sync = check_sync(str(node_config.get(LEDGER_SYNC) or "full"))
    kept = _OPEN.get(path)
    if kept is not None and kept[:2] == (os.getpid(), file_id(path)):
        return kept[2]
    if kept is not None and kept[0] == os.getpid():
        kept[2].close()  # the file it wrote is gone or replaced
    try:
        db = connect(path, sync)
        with db:
            db.execute(_SCHEMA)
    except sqlite3.Error as exc:
        raise FedloraError(f"secure aggregation: the node's signing record {path}: {exc}") from None
    _OPEN[path] = (os.getpid(), file_id(path), db)
    return db


def record(node_config: dict, identity: str, run: int, rnd: int, kind: str, digest: bytes) -> None:
    """Commit that ``identity`` (a fingerprint) signs ``kind`` (:data:`KINDS`) for round ``rnd`` of
    run ``run``, bound to ``digest``; a one-line refusal if it already has (nothing is signed then)."""
    if kind not in KINDS:
        raise ValueError(f"unknown statement {kind!r}")
    db = _connection(node_config)
    try:
        with db:  # one transaction, committed (at the node's ledger-sync level) before the signature leaves
            db.execute(
                "INSERT INTO signed (identity, run, round, kind, digest) VALUES (?, ?, ?, ?, ?)",
                (identity, str(run), rnd, kind, digest),
            )
    except sqlite3.IntegrityError:
        raise FedloraError(
            f"secure aggregation: this node's identity already signed its {kind} for round {rnd} of run "
            f"{run}; a node signs each round once (a repeated or replayed round is refused)"
        ) from None
    except sqlite3.Error as exc:
        raise FedloraError(f"secure aggregation: the node's signing record: {exc}; nothing signed") from None


__all__ = ["KINDS", "SIGNED_FILE", "record"]
