"""The data owners' flow of docs/deployment.md ("Node identities and the roster") over real processes
(issue 74 item 3): the roster carries the secure-aggregation guarantee, so its keys must come from
the owners, not from the operator.

Each of three owners makes their own identity key (``fedlora node keygen``) and their own SuperNode
key (``ssh-keygen``), each in their own directory, and sends only the public halves. The operator
assembles the roster from the identity lines and registers the SuperNode keys with a TLS SuperLink
(``--enable-supernode-auth``). Every owner checks the roster with ``fedlora node --print-command``
(their fingerprint on it, the same SHA-256 and key count as the others), then joins with ``fedlora
node --trust aggregate``, and a secure-aggregation round runs over them (slow: ``make test-all``).
The checks without processes: tests/client/test_owner_roster.py."""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from client.node import sdk
from common.flower_processes import free_port
from common.privacy.accounting.ledger import Ledger
from common.secagg import identity
from server.deploy import (
    Options,
    leftovers,
    prepare,
    register_node,
    resolve_run_config,
    run_and_wait,
    shutdown,
    spawn,
    start_superlink,
    wait_for_nodes,
)

pytestmark = [
    pytest.mark.process,
    pytest.mark.slow,  # ≈ 2.5 minutes on 2 cores: a TLS SuperLink, 3 SuperNodes, a secure round
    pytest.mark.skipif(
        shutil.which("ssh-keygen") is None, reason="owners make their SuperNode keys with ssh-keygen"
    ),
]

FEDLORA = str(Path(sys.executable).parent / "fedlora")
OWNERS = 3
PAIRS = [("A warm, funny film.", 1), ("Tedious and far too long.", 0)] * 6
RUN = (
    "preset='minilm-rt' rounds=1 local-steps=2 batch-size=8 max-train-examples=200 eval-examples=40 "
    "seed=5 mechanism='dp-fedavg' threat-model='secure-aggregation' target-epsilon=8.0 clip=0.5 "
    f"min-replies={OWNERS} round-timeout=240 sample-rate=1.0"
)
ROSTER_LINE = re.compile(r"^roster (\S+): (\d+) keys, sha256 ([0-9a-f]{64}) ", re.M)
IDENTITY_LINE = re.compile(r"^node identity (SHA256:\S+) ", re.M)


def _fedlora(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([FEDLORA, *argv], capture_output=True, text=True, timeout=300)


def _owner_makes_keys(home: Path) -> str:
    """An owner's own machine: an identity key and a SuperNode key, made here; returns the
    identity's fingerprint as ``fedlora node keygen`` printed it."""
    home.mkdir()
    made = _fedlora("node", "keygen", "--out", str(home / "identity"))
    assert made.returncode == 0, made.stderr
    ecdsa = ["ssh-keygen", "-q", "-t", "ecdsa", "-b", "384", "-N", "", "-C", home.name]
    subprocess.run([*ecdsa, "-f", str(home / "node.key")], check=True)
    sdk.prepare_data(PAIRS, home / "data.jsonl", dataset="rotten-tomatoes")
    return re.search(r"^fingerprint (SHA256:\S+)$", made.stdout, re.M).group(1)


def _node_argv(home: Path, superlink: str, ca: Path, roster: Path) -> list[str]:
    return [
        FEDLORA, "node", "--superlink", superlink, "--data", str(home / "data.jsonl"),
        "--dataset", "rotten-tomatoes", "--mechanism", "dp-fedavg", "--epsilon", "10",
        "--trust", "aggregate", "--root-certificates", str(ca), "--auth-key", str(home / "node.key"),
        "--identity-key", str(home / "identity"), "--roster", str(roster), "--state-dir", str(home / "state"),
    ]  # fmt: skip


def test_owners_make_their_own_keys_check_the_roster_and_run_a_secure_round(tmp_path):
    owners = [tmp_path / f"owner-{k}" for k in range(OWNERS)]
    fingerprints = [_owner_makes_keys(home) for home in owners]

    # the operator: the roster from the identity lines the owners sent, nothing else of theirs
    roster = tmp_path / "operator" / "roster.pub"
    roster.parent.mkdir()
    roster.write_bytes(b"".join((home / "identity.pub").read_bytes() for home in owners))
    digest = hashlib.sha256(roster.read_bytes()).hexdigest()
    opts = Options(
        nodes=OWNERS, tls=True, work_dir=tmp_path / "operator" / "work", port=free_port(),
        timeout=900.0, grace=10.0, run_config=(RUN,), quiet=True,
    )  # fmt: skip
    lines: list[str] = []
    dep = prepare(opts, echo=lines.append)  # CA and SuperLink certificate (its node keys go unused)
    flat = resolve_run_config(opts.run_config, OWNERS, dep.work_dir)

    # every owner checks the roster before joining: their key on it, the digest all of them see
    for home, fingerprint in zip(owners, fingerprints, strict=True):
        checked = _fedlora(*_node_argv(home, dep.address, dep.tls.ca, roster)[1:], "--print-command")
        assert checked.returncode == 0, checked.stderr
        assert IDENTITY_LINE.search(checked.stderr).group(1) == fingerprint
        assert ROSTER_LINE.search(checked.stderr).group(2, 3) == (str(OWNERS), digest)
        assert identity.load_identity(str(home / "identity")).public in identity.load_roster(str(roster))

    try:
        start_superlink(dep)
        assert all(register_node(dep, home / "node.key.pub") is not None for home in owners)
        nodes = [
            spawn(dep, home.name, _node_argv(home, dep.address, dep.tls.ca, roster), echo=False)
            for home in owners
        ]
        wait_for_nodes(dep, nodes, time.monotonic() + 300)
        result = run_and_wait(dep, flat)
    finally:
        shutdown(dep)
    logs = "\n".join(node.tail(30) for node in nodes) + "\n".join(lines[-30:])
    assert result.status == "finished:completed", logs
    deadline = time.monotonic() + 10
    while leftovers(dep) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert leftovers(dep) == []
    for node in nodes:  # each node said, at its real start, what its owner compared
        log = node.log_path.read_text()
        assert ROSTER_LINE.search(log).group(3) == digest, log[-2000:]
    [rec] = [
        json.loads(ln)
        for ln in (result.run_dir / "metrics.jsonl").read_text().splitlines()
        if '"train"' in ln
    ]
    assert rec["applied"] and rec["secure"]["masked"] == OWNERS and rec["secure"]["unmasked"] == OWNERS, rec
    ledger = Ledger.open(result.run_dir / "ledger.sqlite", "client-level")
    try:
        assert len(ledger.participations()) == OWNERS and ledger.events()[0].kind == "skellam"
    finally:
        ledger.close()
