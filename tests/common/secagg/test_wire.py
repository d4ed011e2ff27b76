"""The stages' Flower records (common/secagg/wire.py): masked vectors packed to b bits round-trip."""

from __future__ import annotations

import os

import numpy as np
import pytest

from common.secagg import wire as sw
from common.secagg.protocol import Params


@pytest.mark.parametrize("bits", [1, 7, 16, 20, 33, 62])
def test_a_vector_packed_to_b_bits_round_trips_in_its_packed_size(bits):
    words = np.random.default_rng(bits).integers(0, 1 << bits, 1001, dtype=np.int64)
    words[:2] = [0, (1 << bits) - 1]  # both ends of the range
    params = Params(1, (1, 2, 3), 2, 2, bits, words.size, os.urandom(16)).validate()
    packed = sw.vector_values(words, bits)
    assert len(packed["masked"]) == sw.packed_size(words.size, bits) == -(-words.size * bits // 8)
    assert np.array_equal(sw.vector_from(packed, params), words)
