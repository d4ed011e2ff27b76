"""A secure-aggregation round on the Message API (server/secure_round.py, client/secure.py): real
ClientApp handlers behind the in-process grid, the node's state kept in ``context.state``."""

from __future__ import annotations

import os

import numpy as np
import pytest
from flwr.app import Context, Message
from flwr.clientapp import ClientApp

from client import secure
from common.secagg import wire as sw
from common.secagg.protocol import Params, PublicKeys
from server.exchange import exchange
from server.inprocess import InProcessGrid
from server.secure_round import secure_sum

BITS, LENGTH = 20, 300


def _input(node: int) -> np.ndarray:
    return (np.arange(LENGTH, dtype=np.int64) * node) % (1 << BITS)


def _app(drop_at: dict[int, str] | None = None) -> ClientApp:
    """Nodes whose train handler encodes ``_input(node)``; ``drop_at``: node -> the stage it dies at."""
    app, drop_at = ClientApp(), drop_at or {}

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        rnd = int(msg.metadata.group_id)
        keys = secure.begin(context, sw.fields(msg, rnd), rnd, context.node_id, _input(context.node_id))
        return Message(sw.record(rnd, **keys), reply_to=msg)

    for stage, handler in secure.HANDLERS.items():

        def staged(msg: Message, context: Context, stage=stage, handler=handler) -> Message:
            if drop_at.get(context.node_id) == stage:
                raise RuntimeError("node died")
            return handler(msg, context)

        app.train(stage.removeprefix("train."))(staged)
    return app


def _round(grid: InProcessGrid, rnd: int = 1, k: int = 4, t: int = 3):
    nodes = tuple(sorted(grid.get_node_ids()))
    params = Params(rnd, nodes, k, t, BITS, LENGTH, os.urandom(16)).validate()
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
    assert result.bytes_up > 8 * LENGTH * len(params.node_ids)  # the masked vectors went up


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
    with pytest.raises(Exception, match="below 2"):
        sw.vector_from(sw.vector_values(np.array([0, 1, 2, 256])), params)
    with pytest.raises(Exception, match="bytes"):
        sw.vector_from({"masked": b"\x00" * 7}, params)
    with pytest.raises(Exception, match="keys advertised"):
        sw.keys_from(sw.keys_values(PublicKeys(2, b"a", b"b")), 3)
