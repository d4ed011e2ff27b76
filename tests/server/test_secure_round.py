"""A secure-aggregation round on the Message API (server/secure_round.py, client/secure.py): real
ClientApp handlers behind the in-process grid, the node's state kept in ``context.state``."""

from __future__ import annotations

import math
import os
from collections.abc import Callable

import numpy as np
import pytest
import torch
from flwr.app import Context, Message
from flwr.clientapp import ClientApp

from client import secure
from common.privacy import discrete
from common.privacy.skellam import rounding_norm_bound
from common.secagg import wire as sw
from common.secagg.protocol import Params, PublicKeys
from server.exchange import exchange
from server.inprocess import InProcessGrid
from server.secure_round import secure_sum

BITS, LENGTH = 20, 300


def _input(node: int) -> np.ndarray:
    return (np.arange(LENGTH, dtype=np.int64) * node) % (1 << BITS)


def _app(drop_at: dict[int, str] | None = None, inputs: Callable[[int], np.ndarray] = _input) -> ClientApp:
    """Nodes whose train handler encodes ``inputs(node)``; ``drop_at``: node -> the stage it dies at."""
    app, drop_at = ClientApp(), drop_at or {}

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        rnd = int(msg.metadata.group_id)
        keys = secure.begin(context, sw.fields(msg, rnd), rnd, context.node_id, inputs(context.node_id))
        return Message(sw.record(rnd, **keys), reply_to=msg)

    for stage, handler in secure.HANDLERS.items():

        def staged(msg: Message, context: Context, stage=stage, handler=handler) -> Message:
            if drop_at.get(context.node_id) == stage:
                raise RuntimeError("node died")
            return handler(msg, context)

        app.train(stage.removeprefix("train."))(staged)
    return app


def _round(grid: InProcessGrid, rnd: int = 1, k: int = 4, t: int = 3, bits: int = BITS, length: int = LENGTH):
    nodes = tuple(sorted(grid.get_node_ids()))
    params = Params(rnd, nodes, k, t, bits, length, os.urandom(16)).validate()
    messages = [
        Message(
            sw.record(rnd, **sw.params_record(params)), dst_node_id=n, message_type="train", group_id=str(rnd)
        )
        for n in nodes
    ]
    advertised = {}
    for node, reply, relayed in exchange(grid, messages, 60):
        if not relayed:
            advertised[node] = sw.keys_from(sw.fields(reply, rnd), node)
    return params, secure_sum(grid, params, advertised, 60)


def _expected(nodes) -> np.ndarray:
    return sum(_input(n) for n in nodes) % (1 << BITS)


def test_the_sum_of_every_node_comes_out_and_nothing_else():
    grid = InProcessGrid(_app(), 8, {})
    params, result = _round(grid)
    assert not result.failure and result.survivors == list(params.node_ids)
    assert np.array_equal(result.total.astype(np.int64), _expected(params.node_ids))
    assert all(secure.STATE not in c.state for c in grid.contexts.values())  # secrets gone after unmask
    assert result.bytes_up > 4 * LENGTH * len(
        params.node_ids
    )  # the masked vectors went up, 4-byte words at b = 20


@pytest.mark.parametrize("stage", ["train.secagg_mask", "train.secagg_unmask"])
def test_a_node_that_dies_mid_protocol_is_dropped_and_the_rest_unmask(stage):
    """A node dying before its masked upload is dropped (its pairwise masks removed through the
    threshold shares); one dying after it still counts (its self-mask is recovered from shares)."""
    grid = InProcessGrid(_app({1002: stage}), 10, {}, raise_errors=False)
    params, result = _round(grid)
    assert not result.failure, result.failure
    survivors = (
        [n for n in params.node_ids if n != 1002] if stage == "train.secagg_mask" else list(params.node_ids)
    )
    assert result.survivors == survivors
    assert np.array_equal(result.total.astype(np.int64), _expected(survivors))
    assert 1002 in result.rejected


def test_too_many_dropouts_fail_the_round_in_one_line():
    grid = InProcessGrid(
        _app({n: "train.secagg_unmask" for n in (1001, 1002, 1003, 1004)}), 6, {}, raise_errors=False
    )
    _, result = _round(grid, k=4, t=3)
    assert result.total is None and "shares" in result.failure and "\n" not in result.failure


def test_a_node_refuses_parameters_that_break_the_threshold_rule():
    grid = InProcessGrid(_app(), 6, {}, raise_errors=False)
    rnd, nodes = 1, tuple(sorted(grid.get_node_ids()))
    bad = Params(rnd, nodes, 4, 2, BITS, LENGTH, os.urandom(16))  # t = k/2: two disjoint share groups
    message = Message(
        sw.record(rnd, **sw.params_record(bad)), dst_node_id=nodes[0], message_type="train", group_id=str(rnd)
    )
    [(node, reply, _)] = exchange(grid, [message], 60)
    assert reply.has_error() and "threshold" in reply.error.reason
    assert secure.STATE not in grid.contexts[node].state  # nothing kept


def test_a_forged_masked_vector_is_rejected_not_summed():
    params = Params(1, (1, 2, 3), 2, 2, 8, 4, os.urandom(16)).validate()
    assert np.array_equal(
        sw.vector_from(sw.vector_values(np.array([0, 1, 2, 255]), 8), params), [0, 1, 2, 255]
    )
    with pytest.raises(ValueError, match="below 2"):
        sw.vector_values(np.array([0, 1, 2, 256]), 8)
    with pytest.raises(Exception, match="bytes"):
        sw.vector_from({"masked": b"\x00" * 5}, params)  # 4 words of 8 bits: 4 bytes
    odd = Params(1, (1, 2, 3), 2, 2, 5, 3, os.urandom(16)).validate()  # 15 bits in 2 bytes
    with pytest.raises(Exception, match="past the last word"):
        sw.vector_from({"masked": b"\x00\x80"}, odd)
    with pytest.raises(Exception, match="keys advertised"):
        sw.keys_from(sw.keys_values(PublicKeys(2, b"a", b"b")), 3)


def test_float_updates_encoded_with_skellam_shares_decode_to_the_survivors_clipped_sum():
    """The whole data path: each node clips, scales, rotates, rounds and adds its Skellam share
    (common/privacy/discrete.py), the protocol sums mod 2^b, the server decodes; a node dying after
    its masked upload still counts, one dying before it does not."""
    dim, clip, scale, nodes = 500, 1.0, 200.0, 12
    signs = discrete.rotation_signs(b"round-1-rotation", dim)
    bound = rounding_norm_bound(scale * clip, discrete.padded_dim(dim), 1e-6)
    mu = (0.5 * scale * clip) ** 2  # summed noise variance: std 0.5·C in model units
    bits = discrete.choose_bits(nodes, bound, mu, 6.0)
    updates = {
        1001 + i: torch.randn(dim, dtype=torch.float64, generator=torch.Generator().manual_seed(i))
        for i in range(nodes)
    }
    encoded = {
        n: discrete.encode(u, clip, scale, signs, bound, mu / nodes, bits).astype(np.int64)
        for n, u in updates.items()
    }

    drop = {1003: "train.secagg_mask", 1007: "train.secagg_unmask"}
    grid = InProcessGrid(_app(drop, encoded.__getitem__), nodes, {}, raise_errors=False)
    params, result = _round(grid, k=6, t=4, bits=bits, length=discrete.padded_dim(dim))
    assert result.survivors == [n for n in params.node_ids if n != 1003]
    total = discrete.decode(
        result.total, bits, signs, dim, scale, discrete.decode_limit(nodes, bound, mu, 6.0)
    )
    truth = sum(discrete.clip_l2(updates[n], clip) for n in result.survivors)
    error = (total - truth).numpy()
    # noise of 11 of 12 shares (std 0.5·C·sqrt(11/12)) plus rounding: within 6 sd on every coordinate
    assert np.abs(error).max() < 6 * 0.5 * clip * math.sqrt(11 / 12) + 1e-3
    assert 0.3 < error.std() / (0.5 * clip * math.sqrt(11 / 12)) < 1.3
