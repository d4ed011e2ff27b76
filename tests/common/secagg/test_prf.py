"""Masks from HKDF-SHA256 + ChaCha20 (common/secagg/prf.py): the keystream against RFC 8439's
published vectors, the whole construction against an independent pure-Python HKDF (RFC 5869) and
ChaCha20 block function (RFC 8439 §2.3), uniformity up to the top value, and unrelated masks per
context and per full seed (not per 32-bit fold, as Flower's ``pseudo_rand_gen`` has it)."""

import hashlib
import hmac
import os
import struct

import numpy as np
import pytest

from common.secagg import prf
from common.secagg.errors import SecAggError

# RFC 8439 Appendix A.1, test vectors #1 and #2: key 0, nonce 0, block counters 0 and 1
RFC8439_A1_BLOCK0 = bytes.fromhex(
    "76b8e0ada0f13d90405d6ae55386bd28bdd219b8a08ded1aa836efcc8b770dc7"
    "da41597c5157488d7724e03fb8d84a376a43b8f41518a11cc387b669b2ee6586"
)
RFC8439_A1_BLOCK1 = bytes.fromhex(
    "9f07e7be5551387a98ba977c732d080dcb0f29a048e3656912c6533e32ee7aed"
    "29b721769ce64e43d57133b074d839d531ed1f28510afb45ace10a1f4b794d6f"
)
# RFC 8439 §2.3.2: key 00..1f, nonce 00:00:00:09:00:00:00:4a:00:00:00:00, block counter 1
RFC8439_232_KEY = bytes(range(32))
RFC8439_232_NONCE = bytes.fromhex("000000090000004a00000000")
RFC8439_232_BLOCK = bytes.fromhex(
    "10f1e7e4d13b5915500fdd1fa32071c4c7d1f4c733c068030422aa9ac3d46c4e"
    "d2826446079faa0914c2d705d98b02a2b5129cd1de164eb9cbd083e8a2503c4e"
)


def _reference_block(key: bytes, counter: int, nonce: bytes) -> bytes:
    """The ChaCha20 block function as RFC 8439 §2.3 states it (independent of the library)."""
    state = [
        0x61707865,
        0x3320646E,
        0x79622D32,
        0x6B206574,
        *struct.unpack("<8I", key),
        counter,
        *struct.unpack("<3I", nonce),
    ]
    x = list(state)

    def quarter(a: int, b: int, c: int, d: int) -> None:
        for p, q, r, s in ((a, b, d, 16), (c, d, b, 12), (a, b, d, 8), (c, d, b, 7)):
            x[p] = (x[p] + x[q]) & 0xFFFFFFFF
            v = x[r] ^ x[p]
            x[r] = ((v << s) | (v >> (32 - s))) & 0xFFFFFFFF

    for _ in range(10):
        for a, b, c, d in ((0, 4, 8, 12), (1, 5, 9, 13), (2, 6, 10, 14), (3, 7, 11, 15)):
            quarter(a, b, c, d)
        for a, b, c, d in ((0, 5, 10, 15), (1, 6, 11, 12), (2, 7, 8, 13), (3, 4, 9, 14)):
            quarter(a, b, c, d)
    return struct.pack("<16I", *((xi + si) & 0xFFFFFFFF for xi, si in zip(x, state, strict=True)))


def _reference_hkdf(ikm: bytes, info: bytes) -> bytes:
    """HKDF-SHA256 (RFC 5869) with no salt, 32 output bytes: one extract, one expand block."""
    prk = hmac.new(bytes(32), ikm, hashlib.sha256).digest()
    return hmac.new(prk, info + b"\x01", hashlib.sha256).digest()


def test_reference_block_matches_the_rfc_vectors():
    assert _reference_block(bytes(32), 0, bytes(12)) == RFC8439_A1_BLOCK0
    assert _reference_block(bytes(32), 1, bytes(12)) == RFC8439_A1_BLOCK1
    assert _reference_block(RFC8439_232_KEY, 1, RFC8439_232_NONCE) == RFC8439_232_BLOCK


def test_keystream_words_are_the_rfc_8439_keystream():
    words = prf.keystream_words(bytes(32), 16)
    assert words.dtype == np.uint64 and words.shape == (16,)
    assert words.astype("<u8").tobytes() == RFC8439_A1_BLOCK0 + RFC8439_A1_BLOCK1
    nonce = (1).to_bytes(4, "little") + RFC8439_232_NONCE
    assert prf.keystream_words(RFC8439_232_KEY, 8, nonce).astype("<u8").tobytes() == RFC8439_232_BLOCK
    narrow = prf.keystream_words(bytes(32), 32, dtype=np.uint32)
    assert (
        narrow.dtype == np.uint32 and narrow.astype("<u4").tobytes() == RFC8439_A1_BLOCK0 + RFC8439_A1_BLOCK1
    )


def test_mask_is_the_low_bits_of_the_chacha20_keystream_under_the_hkdf_key():
    seed, info = os.urandom(32), prf.context(7, "pair", 3, 11)
    key = _reference_hkdf(seed, prf.DOMAIN + info)
    stream = b"".join(_reference_block(key, block, bytes(12)) for block in range(3))
    for bits, word in ((1, "<u4"), (13, "<u4"), (32, "<u4"), (33, "<u8"), (62, "<u8")):
        words = np.frombuffer(stream, dtype=word)[:20].astype(np.uint64)
        got = prf.mask(seed, 20, bits, info)
        assert got.dtype == prf.word_dtype(bits) and got.dtype.itemsize == int(word[-1])
        assert np.array_equal(got, words & np.uint64((1 << bits) - 1))


def test_every_value_up_to_the_top_one_occurs_and_nothing_above():
    values = prf.mask(os.urandom(32), 4000, 2, b"top")
    assert set(np.unique(values).tolist()) == {0, 1, 2, 3}  # Flower's randint(0, 2^b - 1) never draws 3
    big = prf.mask(os.urandom(32), 4000, 62, b"top")
    assert int(big.max()) < 2**62 and int(big.max()) > 2**61


def test_contexts_and_rounds_give_unrelated_masks():
    seed = os.urandom(32)
    base = prf.mask(seed, 1000, 16, prf.context(1, "pair", 2, 5))
    for other in (prf.context(2, "pair", 2, 5), prf.context(1, "self", 2, 5), prf.context(1, "pair", 2, 6)):
        assert np.count_nonzero(base == prf.mask(seed, 1000, 16, other)) <= 5  # 1000 / 2^16 expected
    assert np.array_equal(base, prf.mask(seed, 1000, 16, prf.context(1, "pair", 2, 5)))


def _xor_fold32(seed: bytes) -> int:
    """Flower's ``pseudo_rand_gen`` seed: the XOR of the seed's eight 32-bit words."""
    folded = 0
    for i in range(0, len(seed), 4):
        folded ^= int.from_bytes(seed[i : i + 4], "little")
    return folded


def test_masks_use_the_whole_seed_not_a_32_bit_fold():
    first = os.urandom(32)
    flip = os.urandom(4)
    second = bytes(a ^ b for a, b in zip(first, flip * 2 + bytes(24), strict=True))  # same fold, other seed
    assert first != second and _xor_fold32(first) == _xor_fold32(second)
    assert np.count_nonzero(prf.mask(first, 1000, 16, b"c") == prf.mask(second, 1000, 16, b"c")) <= 5


@pytest.mark.parametrize("bits", [0, 63, 64])
def test_bits_outside_1_to_62_are_refused(bits):
    with pytest.raises(SecAggError, match=r"bits per coordinate must be in \[1, 62\]"):
        prf.mask(os.urandom(32), 4, bits, b"c")


def test_a_short_seed_is_refused():
    with pytest.raises(SecAggError, match="a mask seed has 32 bytes, not 4"):
        prf.mask(b"\x00" * 4, 4, 8, b"c")
