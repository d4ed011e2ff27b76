"""t-of-m Shamir sharing of short secrets (Shamir 1979): pycryptodome's Shamir over GF(2^128), with
coefficients from its CSPRNG, one polynomial per 16-byte chunk of the PKCS#7-padded secret, in
Flower's share format (``flwr.common.secure_aggregation.crypto.shamir``; a test combines each
side's shares with the other's code).

Flower's ``create_shares`` / ``combine_shares`` are not called: each call starts a thread pool to
share the chunks in parallel, and pure-Python field arithmetic under the GIL gains nothing from it;
the pool's start-up cost more than the sharing (a node shares two secrets a round, the server
combines one per node). Combining is our own Lagrange interpolation at 0 in pycryptodome's field
(a test checks it against pycryptodome's and Flower's): pycryptodome's constant-time
multiplication takes about 4 ms per secret, 4 s a round for 1,000 survivors, and the server,
which combines, holds nothing a timing channel could leak to anyone else. The coefficients depend
only on the share indices, the same for most nodes of a round, and are cached.

A share is Flower's byte string: 4-byte little-endian index (1..m), then 16 bytes per chunk; a
32-byte seed gives 52-byte shares, a 48-byte P-384 scalar 68-byte shares. Any t shares give the
secret back; t-1 shares give a value independent of it (each chunk is a degree t-1 polynomial).
This module adds the checks Flower leaves to the caller: the count against the threshold, distinct
indices, and the recovered length (t-1 shares "combine" to garbage without an error).
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache

from Crypto.Protocol.SecretSharing import Shamir
from Crypto.Util.Padding import pad, unpad

from common.secagg.errors import SecAggError

_CHUNK = 16  # bytes of one GF(2^128) element
#: pycryptodome's field: GF(2)[x] / (x^128 + x^7 + x^2 + x + 1), an element's bit i the coefficient
#: of x^i, encoded as 16 big-endian bytes
_MODULUS = (1 << 128) | 0x87


def _mul(a: int, b: int) -> int:
    """a·b in the field (shift-and-add; not constant-time: only the server combines)."""
    z = 0
    while b:
        if b & 1:
            z ^= a
        b >>= 1
        a <<= 1
        if a >> 128:
            a ^= _MODULUS
    return z


def _inverse(a: int) -> int:
    """a^-1 in the field, by the extended Euclidean algorithm over GF(2)[x] (Hankerson, Menezes and
    Vanstone, Guide to Elliptic Curve Cryptography, Alg. 2.48): g1·a ≡ u, g2·a ≡ v mod the modulus."""
    if not a:
        raise ZeroDivisionError("0 has no inverse")
    u, v, g1, g2 = a, _MODULUS, 1, 0
    while u != 1:
        j = u.bit_length() - v.bit_length()
        if j < 0:
            u, v, g1, g2, j = v, u, g2, g1, -j
        u ^= v << j
        g1 ^= g2 << j
    return g1


@lru_cache(maxsize=4096)
def _lagrange_at_zero(indices: tuple[int, ...]) -> tuple[int, ...]:
    """l_j(0) = Π_{m≠j} x_m / (x_j − x_m) for the evaluation points ``indices`` (in characteristic 2,
    − is +, i.e. XOR)."""
    coefficients = []
    for j, xj in enumerate(indices):
        num, den = 1, 1
        for m, xm in enumerate(indices):
            if m != j:
                num, den = _mul(num, xm), _mul(den, xj ^ xm)
        coefficients.append(_mul(num, _inverse(den)))
    return tuple(coefficients)


def split(secret: bytes, threshold: int, count: int) -> list[bytes]:
    """``count`` shares of ``secret``, any ``threshold`` of which recover it; share i has index i+1."""
    if not 2 <= threshold <= count:
        raise SecAggError(
            f"Shamir sharing needs 2 <= threshold <= shares, got threshold {threshold} of {count}"
        )
    padded = pad(secret, _CHUNK)
    shares = [bytearray(i.to_bytes(4, "little")) for i in range(1, count + 1)]
    for start in range(0, len(padded), _CHUNK):
        for index, part in Shamir.split(threshold, count, padded[start : start + _CHUNK], ssss=False):
            shares[index - 1] += part
    return [bytes(share) for share in shares]


def share_index(share: bytes) -> int:
    """The evaluation point (1..m) a share carries."""
    return int.from_bytes(share[:4], "little")


def combine(shares: Sequence[bytes], threshold: int, size: int) -> bytes:
    """The ``size``-byte secret from at least ``threshold`` shares of it (the first ``threshold`` are used)."""
    if len(shares) < threshold:
        raise SecAggError(f"{len(shares)} shares cannot recover a secret shared {threshold}-of-m")
    indices = [share_index(share) for share in shares]
    if len(set(indices)) != len(indices):
        raise SecAggError(f"shares with repeated indices {sorted(indices)}")
    used = shares[:threshold]
    chunks = (len(used[0]) - 4) // _CHUNK
    weights = _lagrange_at_zero(tuple(indices[:threshold]))
    try:
        if any(len(share) != 4 + chunks * _CHUNK for share in used):
            raise ValueError("shares of different lengths")
        padded = b""
        for c in range(chunks):
            value = 0
            for weight, share in zip(weights, used, strict=True):
                value ^= _mul(weight, int.from_bytes(share[4 + c * _CHUNK : 4 + (c + 1) * _CHUNK], "big"))
            padded += value.to_bytes(_CHUNK, "big")
        secret = unpad(padded, _CHUNK)
    except ValueError:
        secret = b""
    if len(secret) != size:
        raise SecAggError(f"the shares do not combine to a {size}-byte secret (corrupt or mixed shares)")
    return secret
