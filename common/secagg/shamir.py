"""t-of-m Shamir sharing of short secrets (Shamir 1979) over the prime field GF(p), p = 2^521 − 1
(the Mersenne prime M521), with coefficients from the OS CSPRNG (``secrets.randbelow``).

Replaces Flower's ``create_shares`` / ``combine_shares`` (pycryptodome's Shamir over GF(2^128),
one polynomial per 16-byte chunk of the PKCS#7-padded secret): its field product is carry-less
multiplication in interpreted Python (~5 µs), and a node splits two secrets t-of-k every round
(2.9 ms at k = 10, 4.3 ms for a 48-byte secret at k = 20), which under hidden participation every
online node does. One element of GF(M521) holds a whole secret of up to 64 bytes, and its product
is one machine-coded multiplication of Python integers, so a split costs k·t products (~0.1 ms).

Encoding: a secret s of ``size`` bytes (≤ 64) is the element a_0 = 2^520 + int(s) (big-endian);
the fixed top bit gives every secret the same bit length, so the work of splitting does not depend
on the secret's magnitude. Share i (1..m) is (i, f(i)) with f(x) = a_0 + a_1·x + … + a_{t−1}·x^{t−1}
mod p and a_1..a_{t−1} uniform on GF(p): any t shares give a_0 by Lagrange interpolation at 0, and
any t − 1 shares are uniform whatever the secret (the Vandermonde map from (a_1..a_{t−1}) to them
is a bijection for each a_0). A share is its 4-byte little-endian index, then f(i) as 66 big-endian
bytes: 70 bytes whatever the secret's size.

This module checks what Flower leaves to the caller: the count against the threshold, distinct
indices, and the recovered value (t − 1 or mixed shares interpolate to a uniform element, which is
a ``size``-byte secret under the top bit with probability 2^(8·size − 521), so they are refused).
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from functools import lru_cache

from common.secagg.errors import SecAggError

#: the field's modulus, the Mersenne prime 2^521 − 1 (tests check its primality independently)
PRIME = (1 << 521) - 1
#: bytes of one field element (521 bits)
ELEMENT_BYTES = 66
#: the largest secret: 8·64 bits under the fixed top bit 2^520
MAX_SECRET_BYTES = 64
_TOP = 1 << 520
_INDEX_BYTES = 4


@lru_cache(maxsize=4096)
def _lagrange_at_zero(indices: tuple[int, ...]) -> tuple[int, ...]:
    """l_j(0) = Π_{m≠j} x_m / (x_m − x_j) mod p for the evaluation points ``indices``."""
    weights = []
    for j, xj in enumerate(indices):
        num, den = 1, 1
        for m, xm in enumerate(indices):
            if m != j:
                num, den = num * xm % PRIME, den * (xm - xj) % PRIME
        weights.append(num * pow(den, -1, PRIME) % PRIME)
    return tuple(weights)


def split(secret: bytes, threshold: int, count: int) -> list[bytes]:
    """``count`` shares of ``secret`` (≤ 64 bytes), any ``threshold`` of which recover it; share i
    has index i+1."""
    if not 2 <= threshold <= count:
        raise SecAggError(
            f"Shamir sharing needs 2 <= threshold <= shares, got threshold {threshold} of {count}"
        )
    if len(secret) > MAX_SECRET_BYTES:
        raise SecAggError(f"Shamir secrets have at most {MAX_SECRET_BYTES} bytes, got {len(secret)}")
    # highest degree first, for Horner's rule
    poly = [secrets.randbelow(PRIME) for _ in range(threshold - 1)] + [_TOP + int.from_bytes(secret, "big")]
    shares = []
    for x in range(1, count + 1):
        y = 0
        for a in poly:
            y = (y * x + a) % PRIME
        shares.append(x.to_bytes(_INDEX_BYTES, "little") + y.to_bytes(ELEMENT_BYTES, "big"))
    return shares


def share_index(share: bytes) -> int:
    """The evaluation point (1..m) a share carries."""
    return int.from_bytes(share[:_INDEX_BYTES], "little")


def combine(shares: Sequence[bytes], threshold: int, size: int) -> bytes:
    """The ``size``-byte secret from at least ``threshold`` shares of it (the first ``threshold`` are used)."""
    if len(shares) < threshold:
        raise SecAggError(f"{len(shares)} shares cannot recover a secret shared {threshold}-of-m")
    indices = [share_index(share) for share in shares]
    if len(set(indices)) != len(indices):
        raise SecAggError(f"shares with repeated indices {sorted(indices)}")
    used = shares[:threshold]
    weights = _lagrange_at_zero(tuple(indices[:threshold]))
    value = 0
    for weight, share in zip(weights, used, strict=True):
        value += weight * int.from_bytes(share[_INDEX_BYTES:], "big")
    secret = value % PRIME - _TOP
    well_formed = all(len(share) == _INDEX_BYTES + ELEMENT_BYTES for share in used)
    if not (well_formed and 0 <= secret < 1 << (8 * size)):
        raise SecAggError(f"the shares do not combine to a {size}-byte secret (corrupt or mixed shares)")
    return secret.to_bytes(size, "big")
