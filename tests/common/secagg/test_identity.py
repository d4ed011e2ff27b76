"""Node identities for the active-server variant (common/secagg/identity.py): Ed25519 against RFC
8032's first test vector, Flower's P-384 SuperNode keys read as identities, rosters and their
one-line errors, and signatures bound to the round's parameters, the node and the survivor set."""

from __future__ import annotations

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519

from common.secagg import identity
from common.secagg.errors import SecAggError

# RFC 8032 §7.1, TEST 1: secret key, public key, and the signature of the empty message
RFC8032_SECRET = bytes.fromhex("9d61b19deffd5a60ba844af492ec2cc44449c5697b326919703bac031cae7f60")
RFC8032_PUBLIC = bytes.fromhex("d75a980182b10ab7d54bfed3c964073a0ee172f3daa62325af021a68f707511a")
RFC8032_SIGNATURE = bytes.fromhex(
    "e5564300c360ac729086e2cc806e828a84877f1eb8e5d974d873e065224901555fb8821590a33bacc61e39701cf9b46bd25bf5f0595bbe24655141438e7a100b"
)


def test_an_ed25519_identity_signs_as_rfc_8032_and_verifies_on_its_roster(tmp_path):
    key = ed25519.Ed25519PrivateKey.from_private_bytes(RFC8032_SECRET)
    raw = key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    assert raw == RFC8032_PUBLIC
    path = tmp_path / "node" / "identity"
    pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()
    )
    path.parent.mkdir()
    path.write_bytes(pem)
    me = identity.load_identity(str(path))
    assert me.sign(b"") == RFC8032_SIGNATURE
    roster = frozenset({me.public})
    assert identity.verify(me.public, RFC8032_SIGNATURE, b"", roster)
    assert not identity.verify(me.public, RFC8032_SIGNATURE, b"x", roster)  # another message
    assert not identity.verify(me.public, RFC8032_SIGNATURE, b"", frozenset())  # off the roster


def test_flowers_p384_supernode_keys_serve_as_identities(tmp_path):
    """A SuperNode authentication key (ECDSA P-384, OpenSSH, as scripts/generate_certs.sh writes it)
    is a node's identity; its .pub line (with a comment) is its roster entry."""
    key = ec.generate_private_key(ec.SECP384R1())
    (tmp_path / "supernode-1.key").write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()
        )
    )
    line = key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
    (tmp_path / "roster.pub").write_bytes(b"# the operator's list\n\n" + line + b" node-1@site\n")
    me = identity.load_identity(str(tmp_path / "supernode-1.key"))
    roster = identity.load_roster(str(tmp_path / "roster.pub"))
    assert roster == {me.public}
    assert identity.verify(me.public, me.sign(b"keys"), b"keys", roster)
    assert not identity.verify(me.public, me.sign(b"keys"), b"other", roster)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"", "no keys"),
        (b"ssh-rsa AAAAB3NzaC1yc2E= x\n", "line 1: not an OpenSSH public key"),
        (b"garbage\n", "line 1: not an OpenSSH public key"),
    ],
)
def test_a_bad_roster_is_one_line(tmp_path, content, message):
    path = tmp_path / f"roster-{len(content)}.pub"
    path.write_bytes(content)
    with pytest.raises(SecAggError, match=message) as err:
        identity.load_roster(str(path))
    assert "\n" not in str(err.value)


def test_a_key_listed_twice_or_a_p256_key_is_refused(tmp_path):
    line = identity.new_identity().public
    (tmp_path / "twice.pub").write_bytes(line + b"\n" + line + b"\n")
    with pytest.raises(SecAggError, match="listed twice"):
        identity.load_roster(str(tmp_path / "twice.pub"))
    p256 = ec.generate_private_key(ec.SECP256R1())
    (tmp_path / "p256").write_bytes(
        p256.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()
        )
    )
    with pytest.raises(SecAggError, match="must be on P-384"):
        identity.load_identity(str(tmp_path / "p256"))
    with pytest.raises(SecAggError, match=r"identity key .*missing"):
        identity.load_identity(str(tmp_path / "missing"))


def test_provision_keeps_existing_keys_and_lists_them_all(tmp_path):
    paths = [tmp_path / f"node-{k}" / "identity" for k in range(3)]
    identity.provision(paths[:1], tmp_path / "roster.pub")
    first = paths[0].read_bytes()
    identity.provision(paths, tmp_path / "roster.pub")
    assert paths[0].read_bytes() == first  # kept
    assert oct(paths[1].stat().st_mode & 0o777) == "0o600"
    roster = identity.load_roster(str(tmp_path / "roster.pub"))
    assert roster == {identity.load_identity(str(p)).public for p in paths} and len(roster) == 3


def test_every_statement_is_bound_to_the_run_the_round_the_node_and_the_set():
    base = identity.round_digest(7, 3, (1, 2, 3), (2, 2, 20, 64), b"s" * 32)
    others = [
        identity.round_digest(7, 4, (1, 2, 3), (2, 2, 20, 64), b"s" * 32),
        identity.round_digest(7, 3, (1, 2, 4), (2, 2, 20, 64), b"s" * 32),
        identity.round_digest(7, 3, (1, 2, 3), (2, 2, 21, 64), b"s" * 32),
        identity.round_digest(7, 3, (1, 2, 3), (2, 2, 20, 64), b"t" * 32),
        identity.round_digest(8, 3, (1, 2, 3), (2, 2, 20, 64), b"s" * 32),  # another run
    ]
    assert len({base, *others}) == 6
    me = identity.new_identity()
    roster = frozenset({me.public})
    survivors = identity.survivors_digest(frozenset({1, 2, 3}))
    signed = me.sign(identity.survivors_statement(base, 1, survivors))
    assert identity.verify(me.public, signed, identity.survivors_statement(base, 1, survivors), roster)
    for statement in (
        identity.survivors_statement(base, 2, survivors),  # another node
        identity.survivors_statement(others[0], 1, survivors),  # another round
        identity.survivors_statement(base, 1, identity.survivors_digest(frozenset({1, 2}))),  # another set
        identity.keys_statement(base, 1, b"c" * 32, b"m" * 32),  # another kind of statement
    ):
        assert not identity.verify(me.public, signed, statement, roster)
    assert identity.majority(6) == 4 and identity.majority(7) == 4 and identity.majority(1000) == 501


def test_a_transcript_binds_every_nodes_identity_and_round_keys():
    """The transcript digest changes with any node's identity or either round key, with the round's
    parameters and with who is listed: a survivor-set signature bound to it cannot be counted in
    another run, round or view of the round."""
    base = identity.round_digest(1, 1, (1, 2), (1, 1, 8, 4), b"s" * 32)
    a, b = identity.new_identity().public, identity.new_identity().public
    entries = {
        1: identity.entry_digest(1, a, b"c" * 32, b"m" * 32),
        2: identity.entry_digest(2, b, b"d" * 32, b"n" * 32),
    }
    digest = identity.transcript_digest(base, entries)
    variants = [
        {**entries, 1: identity.entry_digest(1, b, b"c" * 32, b"m" * 32)},  # another identity
        {**entries, 1: identity.entry_digest(1, a, b"x" * 32, b"m" * 32)},  # another cipher key
        {**entries, 1: identity.entry_digest(1, a, b"c" * 32, b"x" * 32)},  # another mask key
        {**entries, 1: identity.entry_digest(3, a, b"c" * 32, b"m" * 32)},  # signed for another id
        {1: entries[1]},  # a node left out
    ]
    assert len({digest, *(identity.transcript_digest(base, v) for v in variants)}) == 6
    other_round = identity.round_digest(1, 2, (1, 2), (1, 1, 8, 4), b"s" * 32)
    assert identity.transcript_digest(other_round, entries) != digest


def test_a_fingerprint_is_ssh_keygens(tmp_path):
    """``identity.fingerprint`` prints what ``ssh-keygen -l`` prints for the same public key, and the
    roster digest is the file's SHA-256 with its key count."""
    import hashlib
    import shutil
    import subprocess

    me = identity.new_identity()
    identity.save_identity(me, tmp_path / "id")
    if shutil.which("ssh-keygen"):
        out = subprocess.run(["ssh-keygen", "-lf", str(tmp_path / "id.pub")], capture_output=True, text=True)
        assert out.stdout.split()[1] == identity.fingerprint(me.public)
    else:  # the same computation by hand: SHA-256 of the key blob, base64 without padding
        import base64

        blob = base64.b64decode(me.public.split()[1])
        assert identity.fingerprint(me.public) == "SHA256:" + base64.b64encode(
            hashlib.sha256(blob).digest()
        ).decode().rstrip("=")
    roster = tmp_path / "roster.pub"
    roster.write_bytes(b"# owners\n" + me.public + b" alice\n" + identity.new_identity().public + b"\n")
    assert identity.roster_digest(str(roster)) == (hashlib.sha256(roster.read_bytes()).hexdigest(), 2)
