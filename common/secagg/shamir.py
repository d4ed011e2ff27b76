"""t-of-m Shamir sharing of short secrets (Shamir 1979), through Flower's ``create_shares`` and
``combine_shares`` (reused: pycryptodome's Shamir over GF(2^128) with coefficients from its CSPRNG,
the secret padded to 16-byte chunks, one polynomial per chunk).

A share is Flower's byte string: 4-byte little-endian index (1..m), then 16 bytes per chunk; a
32-byte seed gives 52-byte shares, a 48-byte P-384 scalar 68-byte shares. Any t shares give the
secret back; t-1 shares give a value independent of it (each chunk is a degree t-1 polynomial).
This wrapper adds the checks Flower leaves to the caller: the count against the threshold, distinct
indices, and the recovered length (t-1 shares "combine" to garbage without an error).
"""

from __future__ import annotations

from collections.abc import Sequence

from flwr.common.secure_aggregation.crypto.shamir import combine_shares, create_shares

from common.secagg.errors import SecAggError


def split(secret: bytes, threshold: int, count: int) -> list[bytes]:
    """``count`` shares of ``secret``, any ``threshold`` of which recover it; share i has index i+1."""
    if not 2 <= threshold <= count:
        raise SecAggError(
            f"Shamir sharing needs 2 <= threshold <= shares, got threshold {threshold} of {count}"
        )
    return create_shares(secret, threshold, count)


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
    try:
        secret = combine_shares(list(shares[:threshold]))
    except ValueError:
        secret = b""
    if len(secret) != size:
        raise SecAggError(f"the shares do not combine to a {size}-byte secret (corrupt or mixed shares)")
    return secret
