"""The stages' Flower records (common/secagg/wire.py): masked vectors packed to b bits round-trip."""

from __future__ import annotations

import os

import numpy as np
import pytest

from common.secagg import wire as sw
from common.secagg.protocol import Params
from common.wire import InvalidReply


@pytest.mark.parametrize("bits", [1, 7, 16, 20, 33, 62])
def test_a_vector_packed_to_b_bits_round_trips_in_its_packed_size(bits):
    words = np.random.default_rng(bits).integers(0, 1 << bits, 1001, dtype=np.int64)
    words[:2] = [0, (1 << bits) - 1]  # both ends of the range
    params = Params(1, (1, 2, 3), 2, 2, bits, words.size, os.urandom(16)).validate()
    packed = sw.vector_values(words, bits)
    assert len(packed["masked"]) == sw.packed_size(words.size, bits) == -(-words.size * bits // 8)
    assert np.array_equal(sw.vector_from(packed, params), words)


def _reference_stream(words: np.ndarray, bits: int) -> bytes:
    """The wire's layout bit by bit: word i's bits, least significant first, at i·b ..., packed
    into bytes least significant bit first."""
    planes = (words.astype(np.uint64)[:, None] >> np.arange(bits, dtype=np.uint64)) & np.uint64(1)
    return np.packbits(planes.astype(np.uint8).reshape(-1), bitorder="little").tobytes()


@pytest.mark.parametrize("bits", [1, 3, 8, 13, 19, 20, 24, 32, 33, 47, 62])
@pytest.mark.parametrize("count", [1, 7, 8, 9, 130])
def test_the_packed_layout_is_the_bit_stream_and_stray_bits_are_refused(bits, count):
    words = np.random.default_rng(bits * 1000 + count).integers(0, 1 << bits, count, dtype=np.int64)
    packed = sw.vector_values(words, bits)["masked"]
    assert packed == _reference_stream(words, bits)
    params = Params(1, (1, 2, 3), 2, 2, bits, count, os.urandom(16)).validate()
    assert np.array_equal(sw.vector_from({"masked": packed}, params), words)
    if count * bits % 8:  # a bit past the last word, in the last byte's unused high bits
        stray = packed[:-1] + bytes([packed[-1] | 0x80])
        with pytest.raises(InvalidReply, match="bits set past the last word"):
            sw.vector_from({"masked": stray}, params)


def test_a_nodes_round_state_round_trips_through_its_record_values():
    """client_values / client_from (what a node keeps in its context.state between stages): a client
    after masking, with its peers, pair keys, held shares, transcript and signed set, reads back equal."""
    from tests.common.secagg.test_protocol import params, run_to_masked

    p = params(n=6, k=4, t=3)
    r = run_to_masked(p)
    node = p.node_ids[0]
    client = r.clients[node]
    back = sw.client_from(sw.client_values(client), p.round_number)
    assert sw.client_values(back) == sw.client_values(client)
    assert (back.held, back.transcript, back.signed) == (client.held, client.transcript, client.signed)
    # a neighbour's keys are kept without its identity and signature: checked once, at stage 1, and
    # bound to the round by the transcript
    assert {u: (k.cipher, k.mask) for u, k in back.peers.items()} == {
        u: (k.cipher, k.mask) for u, k in client.peers.items()
    }
