"""server/exchange.py: each reply is attributed to the node it answers for, including the error
replies the SuperLink sends for a node it lost (their ``src_node_id`` is the SuperLink's, 1): the
round counts such a node as a dropout, never as a rejected reply from "node 1"."""

from __future__ import annotations

import logging
import uuid

import torch
from flwr.app import Message, Metadata, RecordDict
from flwr.app.error import Error
from flwr.app.message import make_message
from flwr.common.constant import SUPERLINK_NODE_ID, ErrorCode

from common.presets import preset
from common.wire import train_reply
from server.exchange import exchange
from server.releases import make_release
from server.round import RoundContext, run_round
from tests.harness import message_identity

SHAPES = {"l.A": (4, 2), "l.B": (3, 2)}
EXPECTED = {"mechanism": "fedavg", "release": "none", "noise-std": 0.0}


class _Grid:
    """Delivers to every node but ``dead``; for ``dead`` the SuperLink's own "Node Unavailable"."""

    def __init__(self, dead: int, content=RecordDict) -> None:
        self.dead, self.content = dead, content

    def send_and_receive(self, messages, *, timeout=None):
        replies = []
        for msg in messages:
            msg.metadata.__dict__["_message_id"] = str(uuid.uuid4())
            if msg.metadata.dst_node_id != self.dead:
                replies.append(Message(self.content(), reply_to=msg))
                continue
            meta = Metadata(
                run_id=1,
                message_id="",
                src_node_id=SUPERLINK_NODE_ID,
                dst_node_id=SUPERLINK_NODE_ID,
                reply_to_message_id=msg.metadata.message_id,
                group_id=msg.metadata.group_id,
                message_type=msg.metadata.message_type,
                created_at=0.0,
                ttl=10.0,
            )
            replies.append(make_message(meta, error=Error(ErrorCode.NODE_UNAVAILABLE, "Node Unavailable")))
        return replies


def test_superlink_error_replies_are_attributed_to_the_lost_node():
    message_identity()
    messages = [Message(RecordDict(), dst_node_id=n, message_type="train", group_id="1") for n in (7, 9, 11)]
    got = {(r.node, r.relayed, r.message.has_error()) for r in exchange(_Grid(dead=9), messages, 1.0)}
    assert got == {(7, False, False), (9, True, True), (11, False, False)}


def test_a_lost_node_is_a_dropout_of_its_round_not_a_rejection_from_node_1(caplog):
    message_identity()
    cfg = preset("minilm-rt", mechanism="fedavg", num_clients=3, min_replies=1)
    state = {n: torch.zeros(s) for n, s in SHAPES.items()}

    def content() -> RecordDict:
        return train_reply({n: torch.ones(s) for n, s in SHAPES.items()}, 3, 5, {}, EXPECTED)

    with caplog.at_level(logging.WARNING, logger="fedlora.server"):
        ctx = RoundContext(_Grid(9, content), make_release(cfg, None), cfg, SHAPES)
        _, record = run_round(ctx, 3, [7, 9, 11], state)
    assert (record.replied, record.dropouts, record.rejected) == (2, [9], [])
    assert "node 9 unreachable" in caplog.text and "node 1" not in caplog.text


def test_an_in_process_grid_removes_its_temporary_identities_when_it_is_gone():
    """Without a state root, the nodes' identity keys and roster live in a temporary folder of the
    grid's own, removed with the grid (not one more ``fedlora-nodes-*`` left in /tmp per run)."""
    import gc
    from pathlib import Path

    from server.inprocess import FIRST_NODE_ID, InProcessGrid

    grid = InProcessGrid(lambda msg, ctx: msg, 2, {})
    grid.provision()
    key = Path(str(grid.contexts[FIRST_NODE_ID].node_config["identity-key"]))
    assert key.is_file() and key.parents[1].name.startswith("fedlora-nodes-")
    del grid
    gc.collect()
    assert not key.parents[1].exists()
