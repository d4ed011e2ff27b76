"""Key agreement and authenticated encryption of Shamir shares (Bonawitz et al. 2017, §4 rounds 0-1).

Key agreement is X25519 (RFC 7748, OpenSSL through ``cryptography``) followed by HKDF-SHA256 to 32
bytes, as Flower's ``generate_shared_key`` does after its ECDH on NIST P-384. Flower's curve was
replaced: a P-384 agreement costs ~0.28 ms and re-deriving a key from its scalar ~0.23 ms here,
against ~0.02 ms each for X25519, and a node agrees 2k keys a round (k neighbours), which under
hidden participation every online node does, contributing or not (docs/secure-aggregation.md).
X25519 needs no point validation: every 32-byte string is a public key, and the all-zero shared
secret of a small-order point is refused (OpenSSL), with a one-line error here.

Shares are sealed with Flower's Fernet (``encrypt`` / ``decrypt``: AES-128-CBC with a random IV,
then HMAC-SHA256 over version, timestamp, IV and ciphertext: encrypt-then-MAC).

Fernet takes no associated data, so each share is bound to its place by a header INSIDE the
authenticated plaintext: (domain, round, sender, receiver). :func:`open_share` checks the MAC, then
the header against the expected (round, sender, receiver): a tampered token fails the MAC, and a
token replayed into another round or to another pair (including the reverse direction, whose key
is the same) fails the header check.

Public keys travel as their 32 raw bytes, private mask keys (Shamir-shared for dropout recovery) as
their 32-byte scalar: :func:`scalar_to_private` rebuilds one and the server checks the result
against the advertised public key.
"""

from __future__ import annotations

import base64
import struct

from cryptography.fernet import InvalidToken
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from flwr.common.secure_aggregation.crypto.symmetric_encryption import decrypt, encrypt

from common.secagg.errors import SecAggError, ShareAuthError

#: bytes of an X25519 private scalar and of a public key (RFC 7748 §5)
SCALAR_BYTES = 32
PUBLIC_BYTES = 32
_HEADER = struct.Struct("<16sQQQ")
_DOMAIN = b"fedlora-secagg-1"


def new_key_pair() -> tuple[X25519PrivateKey, bytes]:
    """A fresh X25519 key pair from the OS CSPRNG (OpenSSL): (private key, 32-byte public key)."""
    private = X25519PrivateKey.generate()
    return private, public_bytes(private)


def load_public(raw: bytes) -> X25519PublicKey:
    """A peer's public key; one-line error unless it is 32 bytes."""
    if not isinstance(raw, bytes) or len(raw) != PUBLIC_BYTES:
        size = len(raw) if isinstance(raw, bytes) else type(raw).__name__
        raise SecAggError(f"an X25519 public key has {PUBLIC_BYTES} bytes, got {size}")
    return X25519PublicKey.from_public_bytes(raw)


def agree(private: X25519PrivateKey, peer_public: bytes) -> bytes:
    """32 secret bytes both ends compute: HKDF-SHA256 (no salt, no info) of the X25519 shared secret,
    Flower's derivation (``generate_shared_key``) on another curve."""
    try:
        shared = private.exchange(load_public(peer_public))
    except ValueError:  # OpenSSL refuses the all-zero secret of a small-order point
        raise SecAggError("a peer's public key is a small-order point (no shared secret)") from None
    return HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=None).derive(shared)


def private_to_scalar(private: X25519PrivateKey) -> bytes:
    """The private scalar, its 32 raw bytes (RFC 7748)."""
    return private.private_bytes_raw()


def scalar_to_private(scalar: bytes) -> X25519PrivateKey:
    """The private key of a 32-byte scalar; one-line error for any other length."""
    if len(scalar) != SCALAR_BYTES:
        raise SecAggError(f"an X25519 private scalar has {SCALAR_BYTES} bytes, got {len(scalar)}")
    return X25519PrivateKey.from_private_bytes(scalar)


def public_bytes(private: X25519PrivateKey) -> bytes:
    """The 32-byte public key of ``private``."""
    return private.public_key().public_bytes_raw()


def _header(round_number: int, sender: int, receiver: int) -> bytes:
    return _HEADER.pack(_DOMAIN, round_number, sender, receiver)


def seal_share(key: bytes, where: tuple[int, int, int], payload: bytes) -> bytes:
    """Fernet token of ``payload`` under the 32-byte pair key, bound to ``where`` = (round, sender, receiver)."""
    return encrypt(base64.urlsafe_b64encode(key), _header(*where) + payload)


def open_share(key: bytes, where: tuple[int, int, int], token: bytes) -> bytes:
    """The payload of a :func:`seal_share` token; :class:`ShareAuthError` unless it authenticates
    under ``key`` and was sealed for exactly ``where`` = (round, sender, receiver)."""
    round_number, sender, receiver = where
    try:
        plain = decrypt(base64.urlsafe_b64encode(key), token)
    except InvalidToken:
        raise ShareAuthError(
            f"round {round_number}: the share from node {sender} to node {receiver} failed authentication"
        ) from None
    if plain[: _HEADER.size] != _header(*where):
        _, r, s, t = (
            _HEADER.unpack(plain[: _HEADER.size]) if len(plain) >= _HEADER.size else (b"", -1, -1, -1)
        )
        raise ShareAuthError(
            f"a share for round {round_number}, node {sender} -> {receiver} is bound to round {r}, node {s} -> {t}"
        )
    return plain[_HEADER.size :]
