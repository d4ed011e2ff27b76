"""A data owner's identity for secure aggregation (issue 74 item 3): ``fedlora node keygen`` makes the
owner's own key, ``ssh-keygen`` keys work as well, and ``fedlora node`` checks its identity and the
roster before anything starts, printing the numbers owners compare (fingerprint, roster SHA-256 and
key count). The owner flow over a real TLS deployment: tests/system/test_owner_flow.py (slow)."""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from client.node import sdk
from common.secagg import identity
from tests.conftest import run_cli

FEDLORA = str(Path(sys.executable).parent / "fedlora")
PAIRS = [("A warm, funny film.", 1), ("Tedious and far too long.", 0)] * 4


def keygen(out: Path) -> subprocess.CompletedProcess:
    """``fedlora node keygen --out OUT`` through the installed console script."""
    return subprocess.run(
        [FEDLORA, "node", "keygen", "--out", str(out)], capture_output=True, text=True, timeout=120
    )


@pytest.fixture()
def node(tmp_path) -> list[str]:
    """``fedlora node`` arguments of a secure-aggregation node, without its keys."""
    data = sdk.prepare_data(PAIRS, tmp_path / "mine.jsonl")
    return [
        "node", "--superlink", "127.0.0.1:8000", "--data", str(data), "--mechanism", "dp-fedavg",
        "--epsilon", "8", "--insecure", "--trust", "aggregate", "--state-dir", str(tmp_path / "state"),
    ]  # fmt: skip


@pytest.fixture()
def no_launch(monkeypatch) -> list:
    """Stand-in for the flower-supernode launch: records each argv instead of running it."""
    launched: list = []
    monkeypatch.setattr(sdk, "run_supernode", lambda argv, env, *_: launched.append(argv) or 0)
    return launched


def _roster(path: Path, *publics: Path) -> Path:
    path.write_bytes(b"".join(p.read_bytes() for p in publics))
    return path


@pytest.mark.process
def test_keygen_writes_an_owner_key_that_loads_and_is_never_overwritten(tmp_path):
    key = tmp_path / "owner" / "identity"
    done = keygen(key)
    assert done.returncode == 0, done.stderr
    public = (tmp_path / "owner" / "identity.pub").read_bytes().strip()
    me = identity.load_identity(str(key))
    assert me.public == public and public.startswith(b"ssh-ed25519 AAAA")
    assert key.stat().st_mode & 0o777 == 0o600
    out = done.stdout.splitlines()
    assert public.decode() in out  # the line to send the operator, on a line of its own
    assert f"fingerprint {identity.fingerprint(public)}" in out
    if shutil.which("ssh-keygen"):  # the same fingerprint ssh-keygen -l prints
        listed = subprocess.run(["ssh-keygen", "-lf", f"{key}.pub"], capture_output=True, text=True)
        assert listed.stdout.split()[1] == identity.fingerprint(public)
    before = key.read_bytes()
    again = keygen(key)
    assert again.returncode == 2 and again.stdout == ""
    assert again.stderr.count("\n") == 1 and "never overwritten" in again.stderr, again.stderr
    assert key.read_bytes() == before


def test_keygen_refuses_a_path_whose_public_half_exists(tmp_path, capsys):
    (tmp_path / "identity.pub").write_text("someone else's\n")
    assert run_cli(["node", "keygen", "--out", str(tmp_path / "identity")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("fedlora: error: ") and err.count("\n") == 1 and "identity.pub exists" in err
    assert not (tmp_path / "identity").exists()


def test_keygen_takes_no_node_options_and_a_node_needs_its_own(tmp_path, capsys):
    assert run_cli(["node", "keygen", "--superlink", "h:8000"]) == 2
    assert "takes only --out" in capsys.readouterr().err
    assert run_cli(["node", "--data", "x.jsonl"]) == 2
    err = capsys.readouterr().err
    assert "needs --superlink, --mechanism" in err and err.count("\n") == 1


def test_trust_aggregate_without_a_roster_refuses_at_start(node, tmp_path, capsys, no_launch):
    """Refused before anything starts (was: only when the first secure round arrived)."""
    assert run_cli(node) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1, captured
    assert captured.err.startswith("fedlora: error: trust aggregate is secure aggregation, which needs")
    assert "--roster" in captured.err and "nothing started" in captured.err
    assert no_launch == [] and not (tmp_path / "state").exists()


@pytest.mark.parametrize("case", ["not on the roster", "unreadable key", "no identity key", "bad roster"])
def test_a_node_checks_its_identity_and_roster_before_it_starts(node, tmp_path, capsys, no_launch, case):
    identity.provision([tmp_path / "me", tmp_path / "other"], tmp_path / "both.pub")
    _roster(tmp_path / "other-only.pub", tmp_path / "other.pub")
    (tmp_path / "garbage").write_text("not a key\n")
    (tmp_path / "bad.pub").write_text("ssh-rsa AAAAB3NzaC1yc2E\n")
    argv, message = {
        "not on the roster": (
            ["--identity-key", str(tmp_path / "me"), "--roster", str(tmp_path / "other-only.pub")],
            "is not on the roster",
        ),
        "unreadable key": (
            ["--identity-key", str(tmp_path / "garbage"), "--roster", str(tmp_path / "both.pub")],
            "not an unencrypted OpenSSH or PEM private key",
        ),
        "no identity key": (["--roster", str(tmp_path / "both.pub")], "needs this node's identity key"),
        "bad roster": (
            ["--identity-key", str(tmp_path / "me"), "--roster", str(tmp_path / "bad.pub")],
            "line 1",
        ),
    }[case]
    assert run_cli([*node, *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("fedlora: error: ") and err.count("\n") == 1 and message in err, err
    assert no_launch == []


def test_a_node_prints_its_fingerprint_and_the_roster_digest_before_it_starts(
    node, tmp_path, capsys, no_launch
):
    """On a real start (the launch stubbed: no SuperLink) and under --print-command, on stderr, so the
    printed command stays alone on stdout."""
    identity.provision([tmp_path / "me", tmp_path / "b", tmp_path / "c"], tmp_path / "roster.pub")
    keys = ["--identity-key", str(tmp_path / "me"), "--roster", str(tmp_path / "roster.pub")]
    digest = hashlib.sha256((tmp_path / "roster.pub").read_bytes()).hexdigest()
    fingerprint = identity.fingerprint((tmp_path / "me.pub").read_bytes())
    for extra in ([], ["--print-command"]):
        assert run_cli([*node, *keys, *extra]) == 0
        captured = capsys.readouterr()
        lines = captured.err.splitlines()[-2:]  # after the budget lines (tests/client/test_node_join.py)
        assert lines[0].startswith(f"node identity {fingerprint} ("), lines
        assert f"roster {tmp_path / 'roster.pub'}: 3 keys, sha256 {digest} " in lines[1], lines
    assert len(no_launch) == 1 and Path(no_launch[0][0]).name == "flower-supernode"
    assert len(captured.out.splitlines()) == 1 and "flower-supernode" in captured.out


@pytest.mark.skipif(shutil.which("ssh-keygen") is None, reason="needs ssh-keygen")
def test_an_ssh_keygen_key_is_an_identity(node, tmp_path, capsys):
    """``ssh-keygen -t ed25519`` (with its comment) works as ``fedlora node keygen`` does."""
    key = tmp_path / "id_ed25519"
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "owner@host", "-f", str(key)], check=True
    )
    sdk.keygen(tmp_path / "other")
    roster = _roster(tmp_path / "roster.pub", tmp_path / "other.pub", tmp_path / "id_ed25519.pub")
    assert run_cli([*node, "--identity-key", str(key), "--roster", str(roster), "--print-command"]) == 0
    err = capsys.readouterr().err
    listed = subprocess.run(["ssh-keygen", "-lf", f"{key}.pub"], capture_output=True, text=True, check=True)
    assert f"node identity {listed.stdout.split()[1]} " in err and ": 2 keys, sha256 " in err
    assert identity.load_identity(str(key)).public in identity.load_roster(str(roster))
