"""Key agreement and authenticated encryption of Shamir shares (Bonawitz et al. 2017, §4 rounds 0-1).

Reused from Flower, judged sound: ECDH on NIST P-384 (``generate_key_pairs``) followed by HKDF-SHA256
to 32 bytes (``generate_shared_key``), and Fernet (``encrypt`` / ``decrypt``: AES-128-CBC with a random
IV, then HMAC-SHA256 over version, timestamp, IV and ciphertext: encrypt-then-MAC).

Fernet takes no associated data, so each share is bound to its place by a header INSIDE the
authenticated plaintext: (domain, round, sender, receiver). :func:`open_share` checks the MAC, then
the header against the expected (round, sender, receiver): a tampered token fails the MAC, and a
token replayed into another round or to another pair (including the reverse direction, whose key
is the same) fails the header check.

A private mask key travels as its 48-byte big-endian scalar (not Flower's PEM), so its Shamir shares
are 68 bytes instead of ~250; :func:`scalar_to_private` rebuilds it and the server checks the result
against the advertised public key.
"""

from __future__ import annotations

import base64
import struct

from cryptography.fernet import InvalidToken
from cryptography.hazmat.primitives.asymmetric import ec
from flwr.common.secure_aggregation.crypto.symmetric_encryption import decrypt, encrypt, generate_shared_key
from flwr.supercore.primitives.asymmetric import bytes_to_public_key, generate_key_pairs, public_key_to_bytes

from common.secagg.errors import SecAggError, ShareAuthError

CURVE = ec.SECP384R1()
#: bytes of a P-384 private scalar
SCALAR_BYTES = 48
_HEADER = struct.Struct("<16sQQQ")
_DOMAIN = b"fedlora-secagg-1"


def new_key_pair() -> tuple[ec.EllipticCurvePrivateKey, bytes]:
    """A fresh P-384 key pair from the OS CSPRNG (OpenSSL): (private key, public key as PEM)."""
    private, public = generate_key_pairs()
    return private, public_key_to_bytes(public)


def load_public(pem: bytes) -> ec.EllipticCurvePublicKey:
    """A peer's PEM public key; one-line error unless it is a valid P-384 point."""
    try:
        key = bytes_to_public_key(pem)
    except ValueError as exc:
        raise SecAggError(f"not a PEM public key: {exc}".splitlines()[0]) from None
    if not isinstance(key, ec.EllipticCurvePublicKey) or key.curve.name != CURVE.name:
        raise SecAggError(f"public keys must be on {CURVE.name}")
    return key


def agree(private: ec.EllipticCurvePrivateKey, peer_public: bytes) -> bytes:
    """32 secret bytes both ends compute: HKDF-SHA256 of the ECDH shared point (Flower's ``generate_shared_key``)."""
    return base64.urlsafe_b64decode(generate_shared_key(private, load_public(peer_public)))


def private_to_scalar(private: ec.EllipticCurvePrivateKey) -> bytes:
    """The private scalar, 48 bytes big-endian."""
    return private.private_numbers().private_value.to_bytes(SCALAR_BYTES, "big")


def scalar_to_private(scalar: bytes) -> ec.EllipticCurvePrivateKey:
    """The private key of a 48-byte big-endian scalar."""
    return ec.derive_private_key(int.from_bytes(scalar, "big"), CURVE)


def public_bytes(private: ec.EllipticCurvePrivateKey) -> bytes:
    """The PEM public key of ``private``."""
    return public_key_to_bytes(private.public_key())


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
