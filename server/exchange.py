"""Sending messages to nodes and knowing which node each reply is for.

A reply normally comes from the node it answers (``src_node_id``), but the SuperLink answers for a
node it can no longer reach (its heartbeat expired, the node died) with an error message of its own,
whose ``src_node_id`` is the SuperLink's id (1 in Flower 1.41). Such a reply is attributed through
``reply_to_message_id`` to the destination of the message it answers.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from flwr.app import Message
from flwr.serverapp import Grid


class Reply(NamedTuple):
    """A reply and the node it answers for; ``relayed``: the SuperLink sent it for the node (the
    node itself never answered: an error such as Flower's "Node Unavailable")."""

    node: int
    message: Message
    relayed: bool


def message_bytes(msg: Message) -> int:
    """Bytes of ``msg``'s records as Flower counts them (the records that can count themselves)."""
    return sum(r.count_bytes() for r in msg.content.values() if hasattr(r, "count_bytes"))


def exchange(grid: Grid, messages: Sequence[Message], timeout: float) -> list[Reply]:
    """``grid.send_and_receive(messages)``, each reply with the node it answers for.

    Grids give every pushed message its id in ``metadata.message_id`` (Flower's own grids and
    server/inprocess.py); a reply to no message we sent keeps its ``src_node_id``."""
    replies = list(grid.send_and_receive(messages, timeout=timeout))
    sent_to = {m.metadata.message_id: m.metadata.dst_node_id for m in messages if m.metadata.message_id}
    out = []
    for r in replies:
        node = sent_to.get(r.metadata.reply_to_message_id, r.metadata.src_node_id)
        out.append(Reply(node, r, r.metadata.src_node_id != node))
    return out


__all__ = ["Reply", "exchange", "message_bytes"]
