"""A canary node of ``fedlora audit client`` (the attack and the canaries' slots: server/audit/client.py).

Its train message goes the way every node's does (client/app.py): admitted (the instruction and the
run config checked, the round against the node's own plan and transport, its participation coin
drawn, its release ledger checked), then released (the ledger charged before the release leaves,
then clip, its noise share and encoding through the run's transport). Only the local steps are
replaced: the increment is the canary's direction (an included canary) or zero (an excluded one
under the zero-out relation), multiplied by the node's coin as a trained update is."""

from __future__ import annotations

from collections.abc import Callable

import torch
from flwr.app import Context, Message

from client.app import admit, contribution, release_admitted
from client.increment import increment as local_increment
from common.models import AdapterState

#: template -> the canary's increment over the template's tensors (names and shapes)
Direction = Callable[[AdapterState], AdapterState]


def canary_reply(msg: Message, context: Context, direction: Direction | None) -> Message:
    """The reply of a canary node to a train message: ``direction`` of the round's increment template
    (an included canary: its ``c_j`` of norm C), or zero when None (an excluded zero-out canary),
    through the node's :func:`~client.app.admit` and :func:`~client.app.release_admitted`."""
    a = admit(msg, context)
    template = local_increment(a.ins.global_state, a.ins.global_state, a.cfg.increment_form)
    if direction is None:
        sent = {k: torch.zeros(v.shape, dtype=torch.float32) for k, v in sorted(template.items())}
    else:
        sent = direction(template)
    return Message(release_admitted(a, context, contribution(sent, a.contributes), {}), reply_to=msg)
