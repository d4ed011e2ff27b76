"""The transports a node's train reply travels by, client side: the node half the run's threat model
declares (common/privacy/participation/threat.py ``TransportSpec.client``; its ``server`` names the
server half): the plain exchange, in which the node sends its client-level release
(client/releases.py), and SecAgg+ (client/secure.py), in which it sends only its signed public keys
and keeps its encoded update for the protocol's later stages.

A transport is checked before any training (:meth:`ClientTransport.prepare`: a one-line refusal of a
round this node's plan does not allow) and builds the reply once the increment exists
(:meth:`ClientTransport.reply`). client/app.py is the same for every transport.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import torch
from flwr.app import Context, Message, RecordDict

from client import secure as client_secure
from client.releases import client_release
from common.config import RunConfig
from common.lazy import load_component
from common.models import AdapterState
from common.privacy.participation.threat import THREATS, TransportSpec
from common.wire import TrainInstruction, train_reply

#: a handler of one of a transport's further message types
Handler = Callable[[Message, Context], Message]


@dataclass(frozen=True)
class Reply:
    """What a train reply is built from: the node's ``increment`` (adapter state minus the round's
    global state), the ``meta`` it states (client/app.py ``_reply_meta``), the example ``count``
    (None in a private run: a clear count is not private), the local ``metrics`` and where the node's
    codec cache lives (``encoder_cache``) on ``device``."""

    increment: AdapterState
    meta: dict[str, object]
    count: int | None
    metrics: dict
    device: torch.device
    encoder_cache: Path


class ClientTransport(Protocol):
    """A node's side of a transport. ``stages``: further message types it answers in a round
    (``train.<stage>`` -> handler), registered on the ClientApp."""

    stages: dict[str, Handler]

    def prepare(self, ins: TrainInstruction, cfg: RunConfig, context: Context) -> object:
        """Check round ``ins`` against this node's own plan before any training (a one-line
        :class:`~common.errors.FedloraError`); returns what :meth:`reply` needs of the round."""
        ...

    def reply(
        self, prepared: object, ins: TrainInstruction, cfg: RunConfig, context: Context, out: Reply
    ) -> RecordDict:
        """The train reply carrying ``out`` (``prepared``: :meth:`prepare`'s result for this round)."""
        ...


@dataclass(frozen=True)
class Exchange:
    """The plain exchange: the reply is the run's client-level release of the increment."""

    stages: dict[str, Handler] = field(default_factory=dict)

    def prepare(self, ins: TrainInstruction, cfg: RunConfig, context: Context) -> object:
        return None

    def reply(
        self, prepared: object, ins: TrainInstruction, cfg: RunConfig, context: Context, out: Reply
    ) -> RecordDict:
        sent, extra = client_release(cfg.release_kind)(out.increment, ins, cfg, out.device, out.encoder_cache)
        return train_reply(sent, ins.round, out.count, out.metrics, {**out.meta, **extra})


@dataclass(frozen=True)
class SecAggPlus:
    """SecAgg+ (client/secure.py): the round's protocol values checked against the node's own plan,
    its identity and the roster loaded, before any training; the reply carries its signed keys."""

    stages: dict[str, Handler] = field(default_factory=lambda: dict(client_secure.HANDLERS))

    def prepare(self, ins: TrainInstruction, cfg: RunConfig, context: Context) -> object:
        return client_secure.prepare(ins, cfg, context)

    def reply(
        self, prepared: object, ins: TrainInstruction, cfg: RunConfig, context: Context, out: Reply
    ) -> RecordDict:
        release, values = prepared
        return client_secure.train_reply(context, release, values, ins.round, out.increment, out.meta)


#: the node halves of the built-in transports (common/privacy/participation/threat.py names them)
PLAIN = Exchange()
SECAGG_PLUS = SecAggPlus()


def client_half(spec: TransportSpec) -> ClientTransport:
    """The node half of the transport ``spec`` (its component reference)."""
    return load_component(spec.client)


def client_transport(cfg: RunConfig) -> ClientTransport:
    """The node half of the transport ``cfg``'s threat model declares."""
    return client_half(THREATS[cfg.threat_model].transport)


__all__ = ["PLAIN", "SECAGG_PLUS", "ClientTransport", "Reply", "client_half", "client_transport"]
