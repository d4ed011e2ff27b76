"""Long-term node identities for the active-server variant of SecAgg+ (Bonawitz et al. 2017 §6).

Against a server that deviates from the protocol, two things must not rest on the server's word:

- **whose keys a node talks to.** Each node signs its round keys (c_u^PK, s_u^PK) with its identity
  key, bound to its node id and to a digest of the round's parameters; a node verifies every
  neighbour's signature against the federation's roster before it seals a share. A server that
  substitutes its own keys, or adds nodes of its own, is refused (Bonawitz §6, round 0-1).
- **who survived.** Before any share is revealed, each survivor signs the survivor set it was given
  (consistency check, Bonawitz §6 round 4), bound to the round's transcript (every node's signed
  round keys, :func:`transcript_digest`, whose entries for itself and its neighbours each node has
  checked), and unmasks only for a set that carries valid signatures of a strict majority of the
  round's nodes, itself among them, each counted only from the identity the transcript names for
  that node. An honest node signs one set per round, and its fresh round keys are in the
  transcript, so two different sets cannot both gather a majority, not even with signatures
  replayed from another run or round, or from nodes shown another view of this one: the server
  cannot tell some nodes that u survived (to collect shares of its self-mask b_u) and others that
  u's neighbours dropped (to collect their mask keys s_v), the attack that recovers x_u exactly.
  A node also keeps a durable record of the (run, round) it has signed (client/node/signed.py)
  and signs none twice, across restarts.

What remains assumed: the roster (the operator's list of node identity keys, distributed out of band
as Flower's registered SuperNode keys are) names real, distinct data owners, none of whom colludes
with the server (no Sybils), and fewer than t of any node's neighbours are corrupt.

Keys: Ed25519 (RFC 8032; a simulation gives every node one) or ECDSA on P-384 with SHA-384 (Flower's
SuperNode authentication keys, ``flwr supernode register``), read as OpenSSH or PEM private keys;
public keys travel and sit in the roster in OpenSSH's one-line form (``ssh-ed25519 AAAA...``).
Signing keys come from the OS CSPRNG (``cryptography``/OpenSSL).
"""

from __future__ import annotations

import base64
import hashlib
import struct
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519

from common.secagg.errors import SecAggError

_DOMAIN = b"fedlora-secagg-identity-1"
IDENTITY_KEY = "identity-key"  # node config: this node's identity key file
ROSTER = "secagg-roster"  # node config: the federation's identity public keys, one per line
_ECDSA = ec.ECDSA(hashes.SHA384())


@dataclass(frozen=True)
class Identity:
    """A node's long-term signing key; ``public``: its OpenSSH one-line public key (bytes, no comment)."""

    key: ed25519.Ed25519PrivateKey | ec.EllipticCurvePrivateKey = field(repr=False)
    public: bytes

    def sign(self, data: bytes) -> bytes:
        if isinstance(self.key, ed25519.Ed25519PrivateKey):
            return self.key.sign(data)
        return self.key.sign(data, _ECDSA)


def _public_line(key) -> bytes:
    return key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)


def _checked(key, where: str) -> Identity:
    if isinstance(key, ec.EllipticCurvePrivateKey) and not isinstance(key.curve, ec.SECP384R1):
        raise SecAggError(f"{where}: an ECDSA identity key must be on P-384 (Flower's), got {key.curve.name}")
    if not isinstance(key, ed25519.Ed25519PrivateKey | ec.EllipticCurvePrivateKey):
        raise SecAggError(f"{where}: an identity key is Ed25519 or ECDSA P-384, got {type(key).__name__}")
    return Identity(key, _public_line(key))


def new_identity() -> Identity:
    """A fresh Ed25519 identity (OS CSPRNG)."""
    return _checked(ed25519.Ed25519PrivateKey.generate(), "new identity")


def save_identity(identity: Identity, path: Path) -> None:
    """Write ``identity`` as an unencrypted OpenSSH private key (mode 0600) and ``path``.pub beside it."""
    raw = identity.key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(raw)
    path.chmod(0o600)
    path.with_name(path.name + ".pub").write_bytes(identity.public + b"\n")


@lru_cache(maxsize=4096)
def load_identity(path: str) -> Identity:
    """The identity key at ``path`` (OpenSSH or PEM, unencrypted), or a one-line error."""
    try:
        raw = Path(path).read_bytes()
    except OSError as exc:
        raise SecAggError(f"identity key {path}: {exc.strerror or exc}") from None
    loaders = (serialization.load_ssh_private_key, serialization.load_pem_private_key)
    for load in loaders:
        try:
            return _checked(load(raw, password=None), f"identity key {path}")
        except (ValueError, TypeError, UnsupportedAlgorithm):
            continue
    raise SecAggError(f"identity key {path}: not an unencrypted OpenSSH or PEM private key")


def provision(keys: list[Path], roster: Path) -> None:
    """The operator's step for a federation it sets up itself (a simulation, ``fedlora deploy``): a
    fresh Ed25519 identity at each path in ``keys`` that has none (an existing one is kept), and
    ``roster`` listing all of their public keys."""
    lines = []
    for path in keys:
        if not path.exists():
            save_identity(new_identity(), path)
        lines.append(load_identity(str(path)).public)
    roster.parent.mkdir(parents=True, exist_ok=True)
    roster.write_bytes(b"".join(line + b"\n" for line in lines))
    load_roster.cache_clear()


def public_line(line: bytes) -> bytes:
    """The canonical form of an OpenSSH public key line (type and base64, comment dropped), or a
    one-line error unless it is an Ed25519 or P-384 key."""
    try:
        key = serialization.load_ssh_public_key(b" ".join(line.split()[:2]))
    except (ValueError, UnsupportedAlgorithm, IndexError):
        raise SecAggError(f"not an OpenSSH public key: {line[:40]!r}") from None
    if isinstance(key, ec.EllipticCurvePublicKey) and not isinstance(key.curve, ec.SECP384R1):
        raise SecAggError(f"an ECDSA identity key must be on P-384, got {key.curve.name}")
    if not isinstance(key, ed25519.Ed25519PublicKey | ec.EllipticCurvePublicKey):
        raise SecAggError(f"an identity key is Ed25519 or ECDSA P-384, got {type(key).__name__}")
    return key.public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)


def fingerprint(public: bytes) -> str:
    """``ssh-keygen -l``'s fingerprint of an OpenSSH public key line: ``SHA256:`` and the unpadded
    base64 of the SHA-256 of the key blob (what owners read to each other to compare keys)."""
    blob = base64.b64decode(public.split()[1])
    return "SHA256:" + base64.b64encode(hashlib.sha256(blob).digest()).decode().rstrip("=")


def roster_digest(path: str) -> tuple[str, int]:
    """``(SHA-256 hex of the roster file's bytes, its number of keys)``: what the owners of a
    federation compare out of band before they join (the file is checked by :func:`load_roster`)."""
    keys = load_roster(path)
    return hashlib.sha256(Path(path).read_bytes()).hexdigest(), len(keys)


@lru_cache(maxsize=16)
def load_roster(path: str) -> frozenset[bytes]:
    """The federation's roster: one OpenSSH public key per line (``#`` comments and blank lines
    skipped), as canonical lines; a one-line error names the first bad line."""
    try:
        text = Path(path).read_bytes()
    except OSError as exc:
        raise SecAggError(f"roster {path}: {exc.strerror or exc}") from None
    keys = []
    for number, line in enumerate(text.splitlines(), 1):
        if line.strip() and not line.lstrip().startswith(b"#"):
            try:
                keys.append(public_line(line))
            except SecAggError as exc:
                raise SecAggError(f"roster {path}, line {number}: {exc}") from None
    if len(set(keys)) != len(keys):
        raise SecAggError(f"roster {path}: a key is listed twice")
    if not keys:
        raise SecAggError(f"roster {path}: no keys")
    return frozenset(keys)


def member(key: str, roster: str, after: str) -> tuple[Identity, frozenset[bytes]]:
    """This node's identity (from ``key``) and the roster it must be on; a one-line refusal, ending
    in ``after`` (what did not happen), when it is not."""
    me, members = load_identity(key), load_roster(roster)
    if me.public not in members:
        raise SecAggError(
            f"this node's identity key {key} ({fingerprint(me.public)}) is not on the roster {roster}: {after}"
        )
    return me, members


@lru_cache(maxsize=4096)
def _public_key(line: bytes):
    return serialization.load_ssh_public_key(line)


@lru_cache(maxsize=1 << 16)
def _valid(public: bytes, signature: bytes, data: bytes) -> bool:
    """The signature check itself, remembered per exact (key, signature, message): in a simulation
    every node of a round checks the same survivors' signatures, and a result for the same bytes
    cannot differ."""
    key = _public_key(public)
    try:
        if isinstance(key, ed25519.Ed25519PublicKey):
            key.verify(signature, data)
        else:
            key.verify(signature, data, _ECDSA)
    except InvalidSignature:
        return False
    return True


def forget_checks() -> None:
    """Drop the remembered signature checks (a benchmark timing each client's own checks)."""
    _valid.cache_clear()


def verify(public: bytes, signature: bytes, data: bytes, roster: frozenset[bytes]) -> bool:
    """Whether ``signature`` is ``public``'s on ``data`` and ``public`` is in ``roster``."""
    if public not in roster or not isinstance(signature, bytes):
        return False
    return _valid(public, signature, data)


def round_digest(
    run_id: int, round_number: int, node_ids: tuple[int, ...], numbers: tuple[int, ...], seed: bytes
) -> bytes:
    """SHA-256 of a round's public parameters (its Flower run id, its number, its node ids, k, t, b,
    d and its public seed): what every key signature of the round is bound to, so a node that was
    shown other parameters than its neighbours cannot be made to accept their keys."""
    h = hashlib.sha256(_DOMAIN + b"/params")
    h.update(struct.pack("<QQQ", run_id, round_number, len(node_ids)))
    h.update(struct.pack(f"<{len(node_ids)}Q", *node_ids))
    h.update(struct.pack(f"<{len(numbers)}Q", *numbers))
    h.update(seed)
    return h.digest()


def entry_digest(node: int, public: bytes, cipher: bytes, mask: bytes) -> bytes:
    """SHA-256 of node ``node``'s signed round keys: its identity's public line and its two round
    public keys (one entry of a round's transcript)."""
    h = hashlib.sha256(_DOMAIN + b"/entry" + struct.pack("<QH", node, len(public)))
    h.update(public + cipher + mask)
    return h.digest()


def transcript_digest(digest: bytes, entries: dict[int, bytes]) -> bytes:
    """SHA-256 of a round's transcript: the round's parameters (``digest``) and every node's
    :func:`entry_digest` (``entries``: node -> entry, in node order). Every survivor-set signature
    is bound to it, and each node has checked its own entry and its neighbours' in it: the node's
    fresh round keys are in it, so no signature of another run, round or view of the round can be
    counted in this one (Bonawitz et al. 2017 §6 bind the consistency check to the round the same
    way)."""
    ids = sorted(entries)
    h = hashlib.sha256(_DOMAIN + b"/transcript" + digest + struct.pack(f"<Q{len(ids)}Q", len(ids), *ids))
    for v in ids:
        h.update(entries[v])
    return h.digest()


def keys_statement(digest: bytes, node: int, cipher: bytes, mask: bytes) -> bytes:
    """What node ``node`` signs in stage 0: its two public keys for the round of ``digest``."""
    return _DOMAIN + b"/keys" + digest + struct.pack("<Q", node) + cipher + mask


def survivors_digest(survivors: frozenset[int]) -> bytes:
    """SHA-256 of a survivor set (its ids sorted, 8-byte little-endian words)."""
    ids = sorted(survivors)
    return hashlib.sha256(_DOMAIN + b"/set" + struct.pack(f"<Q{len(ids)}Q", len(ids), *ids)).digest()


def survivors_statement(transcript: bytes, node: int, survivors: bytes) -> bytes:
    """What node ``node`` signs in the consistency check: the survivor set it was given, by its
    :func:`survivors_digest` ``survivors``, for the round whose :func:`transcript_digest` is
    ``transcript``."""
    return _DOMAIN + b"/survivors" + transcript + struct.pack("<Q", node) + survivors


def majority(nodes: int) -> int:
    """The signatures a survivor set needs in a round of ``nodes`` nodes: a strict majority, so that
    two different sets cannot both gather one from nodes that each sign once."""
    return nodes // 2 + 1


__all__ = [
    "IDENTITY_KEY",
    "ROSTER",
    "Identity",
    "entry_digest",
    "fingerprint",
    "forget_checks",
    "keys_statement",
    "load_identity",
    "load_roster",
    "majority",
    "member",
    "new_identity",
    "provision",
    "public_line",
    "roster_digest",
    "round_digest",
    "save_identity",
    "survivors_digest",
    "survivors_statement",
    "transcript_digest",
    "verify",
]
