"""Pseudo-random masks for secure aggregation, from a cryptographic PRF (replaces Flower's
``secaggplus_utils.pseudo_rand_gen``).

Flower folds the 32-byte seed into 32 bits by XOR and expands it with numpy's Mersenne Twister
(not a cryptographic generator, and ``randint(0, num_range - 1)`` never draws the top value). Here
a mask is: key = HKDF-SHA256 (RFC 5869) of the FULL 32-byte seed with the mask's context (round,
pair or self, node ids) as ``info``; keystream = ChaCha20 (RFC 8439) under that key, zero nonce and
counter 0 (each key is used for one context only); coordinate i = the low ``bits`` bits of the
i-th little-endian keystream word of :func:`word_dtype` (32 bits when ``bits`` ≤ 32, else 64). A
keystream word is uniform on [0, 2^w) and 2^bits divides 2^w, so each coordinate is exactly uniform
on [0, 2^bits), and sums of masks can be taken in w-bit words, whose wrap-around is a multiple of
2^bits.

Cost: one HKDF and 4·d (8·d above 32 bits) keystream bytes per mask of d coordinates (a few GB/s
in OpenSSL).
"""

from __future__ import annotations

import struct

import numpy as np
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from common.secagg.errors import SecAggError

#: mask seeds are 32 bytes (256 bits), used whole
SEED_BYTES = 32
#: at most 62 bits per coordinate: a sum of masked values stays below 2^63 (int64-safe)
MAX_BITS = 62
#: HKDF ``info`` prefix: separates these keys from any other use of the same seed
DOMAIN = b"fedlora-dp/secagg/mask/v1"
#: cryptography's ChaCha20 nonce: 4-byte little-endian block counter, then the 12-byte RFC 8439 nonce
ZERO_NONCE = bytes(16)
_ZEROS = b""


def context(round_number: int, purpose: str, *node_ids: int) -> bytes:
    """The PRF context of one mask: round, purpose (``"self"``, ``"pair"``) and the node ids
    (for a pair: the smaller id first, so both ends derive the same mask)."""
    tag = purpose.encode()
    return struct.pack(
        f"<QB{len(tag)}sB{len(node_ids)}Q", round_number, len(tag), tag, len(node_ids), *node_ids
    )


def derive_key(seed: bytes, info: bytes) -> bytes:
    """HKDF-SHA256 (RFC 5869, no salt) of the whole 32-byte ``seed``: a 32-byte ChaCha20 key for ``info``."""
    if len(seed) != SEED_BYTES:
        raise SecAggError(f"a mask seed has {SEED_BYTES} bytes, not {len(seed)}")
    return HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=DOMAIN + info).derive(seed)


def word_dtype(bits: int) -> np.dtype:
    """The words masks of ``bits`` bits per coordinate are drawn and summed in: uint32 when
    ``bits`` ≤ 32, else uint64."""
    return np.dtype(np.uint32 if bits <= 32 else np.uint64)


def _zeros(size: int) -> memoryview:
    """``size`` zero bytes, a view of one buffer kept and grown (a fresh ``bytes(size)`` of a
    131,072-word mask costs more than its keystream)."""
    global _ZEROS
    if len(_ZEROS) < size:
        _ZEROS = bytes(size)
    return memoryview(_ZEROS)[:size]


def keystream_words(key: bytes, count: int, nonce: bytes = ZERO_NONCE, dtype=np.uint64) -> np.ndarray:
    """The first ``count`` little-endian words (``dtype``: uint64 or uint32) of the ChaCha20
    keystream: shape (count,).

    ``nonce`` as ``cryptography`` takes it: 4-byte little-endian initial block counter, then the
    12-byte nonce of RFC 8439 §2.3.
    """
    dtype = np.dtype(dtype)
    size = dtype.itemsize * count
    out = np.empty(size + 16, dtype=np.uint8)  # update_into wants a block's slack
    encryptor = Cipher(algorithms.ChaCha20(key, nonce), mode=None).encryptor()
    written = encryptor.update_into(_zeros(size), out)
    encryptor.finalize()  # a stream cipher: nothing left to write
    assert written == size
    return out[:size].view(dtype.newbyteorder("<")).astype(dtype, copy=False)


def pad(seed: bytes, count: int, bits: int, info: bytes) -> np.ndarray:
    """The words a mask of ``bits`` bits is the low bits of: shape (count,), of :func:`word_dtype`
    (``bits``), each uniform on [0, 2^w). Sums of pads taken in w-bit words and reduced mod 2^bits at
    the end equal sums of masks mod 2^bits (2^bits divides 2^w), one reduction instead of one a mask.

    ``seed``: 32 secret bytes (a self-mask seed b_u or a pairwise seed s_uv, Bonawitz et al. 2017
    §4); ``info``: the mask's :func:`context`, so one seed gives unrelated masks per round and use.
    """
    if not 1 <= bits <= MAX_BITS:
        raise SecAggError(f"bits per coordinate must be in [1, {MAX_BITS}], got {bits}")
    if count < 0:
        raise SecAggError(f"a mask has a non-negative number of coordinates, got {count}")
    return keystream_words(derive_key(seed, info), count, dtype=word_dtype(bits))


def mask(seed: bytes, count: int, bits: int, info: bytes) -> np.ndarray:
    """A mask of ``count`` coordinates, each uniform on [0, 2^bits): shape (count,), of
    :func:`word_dtype` (``bits``): the low ``bits`` bits of :func:`pad`."""
    words = pad(seed, count, bits, info)
    words &= words.dtype.type((1 << bits) - 1)
    return words
