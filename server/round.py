"""One federated round: send the instructions, collect what comes back, release, apply.

The release (server/releases) decides what the round asks and how replies become the increment; the
transport (:class:`Transport`, server/transport.py) how they travel: the plain exchange here, or
SecAgg+ (server/secure_round.py), which hands the server only the sum. :func:`run_round` is the same
for every release and transport and returns a :class:`RoundRecord`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Protocol

import numpy as np
from flwr.app import Message
from flwr.serverapp import Grid

from common.config import RunConfig
from common.models import AdapterState
from common.privacy.accounting.accountants import Event
from common.timing import phase
from common.wire import InvalidReply, TrainInstruction, data_source, parse_train_reply
from server.aggregate import apply_increment
from server.exchange import exchange, message_bytes
from server.optimizers import ServerOptimizer
from server.releases import Release

log = logging.getLogger("fedlora.server")


@dataclass
class RoundRecord:
    """A round's line in metrics.jsonl. ``applied``: the aggregate was applied (enough usable
    replies); ``sigma_released``: the noise multiplier the applied aggregate carried;
    ``rejected``: each rejected reply's one-line reason, ``rejected_nodes`` the node it came from
    (same order; a node's error reply, e.g. a node-policy refusal, is one); ``data_sources``: the
    nodes of the usable replies by where their examples came from (``own``, ``partition``, or
    ``unstated``: the reply did not say; common.wire.data_source)."""

    round: int
    phase: str = "train"
    sampled: int = 0
    replied: int = 0
    rejected: list[str] = field(default_factory=list)
    rejected_nodes: list[int] = field(default_factory=list)
    data_sources: dict[str, list[int]] = field(default_factory=dict)
    dropouts: list[int] = field(default_factory=list)
    applied: bool = False
    train_loss: float | None = None
    bytes_down: int = 0
    bytes_up: int = 0
    sigma_released: float | None = None
    secure: dict | None = None  # secure aggregation: nodes per protocol stage, b, k, t, why not unmasked

    @classmethod
    def skipped(cls, rnd: int) -> RoundRecord:
        return cls(rnd, phase="skipped")

    def reject(self, node: int, why: str) -> None:
        """Record that ``node``'s reply (at some stage) was not used, and why."""
        self.rejected.append(why)
        self.rejected_nodes.append(node)

    def used(self, node: int, reply: Message) -> None:
        """Record ``node``'s usable reply under where its examples came from."""
        self.data_sources.setdefault(data_source(reply) or "unstated", []).append(node)

    def to_json(self) -> dict:
        """The metrics line's fields (a skipped round has only round, phase, sampled, replied)."""
        values = asdict(self)
        if self.phase == "skipped":
            return {k: values[k] for k in ("round", "phase", "sampled", "replied")}
        for key in ("sigma_released", "secure"):
            if values[key] is None:
                del values[key]
        return values


#: what a round's transport hands back: the released mean and the noise multiplier it carries
#: (None: no client-level noise), or None when the round may not be released (the record says why)
Released = tuple[AdapterState, float | None]


class Transport(Protocol):
    """How a round's instructions reach the sampled nodes and their replies become the released
    mean: ``transport(ctx, rnd, sampled, state, record) -> Released | None``. It fills ``record``
    (bytes, replies, rejections, dropouts). Registered by name in server/transport.py: the plain
    exchange below, or SecAgg+ (server/secure_round.py), where the server learns only the sum."""

    def __call__(
        self, ctx: RoundContext, rnd: int, sampled: Sequence[int], state: AdapterState, record: RoundRecord
    ) -> Released | None: ...


@dataclass(frozen=True)
class RoundContext:
    """What every round of a run goes through (server/federation.py builds it from its
    :class:`~server.federation.FederationRun`).

    grid: the Flower grid the instructions and replies go through.
    release: the run's client-level release (what a round asks, checks and sums).
    cfg: the run's configuration (round timeout, min replies, server lr, whether private).
    shapes: name -> shape of the adapter's tensors (the release maps them to the replies' shapes).
    optimizer: the server optimizer; None: ``state + server-lr · mean``.
    post: applied to the released mean before the optimizer (the public-subspace projection:
        post-processing, free of privacy cost); None: nothing.
    gate: ``gate(round, survivors, event)`` charges the survivors' realised noise ``event`` before a
        transport that releases only a sum unmasks it, and returns why it must not (empty: unmask).
    transport: how the round's replies become the released mean (:class:`Transport`).
    """

    grid: Grid
    release: Release
    cfg: RunConfig
    shapes: dict[str, tuple[int, ...]]
    optimizer: ServerOptimizer | None = None
    post: Callable[[AdapterState], AdapterState] | None = None
    gate: Callable[[int, list[int], Event], str] | None = None
    transport: Transport = field(default_factory=lambda: exchange_replies)

    def step(self, state: AdapterState, mean: AdapterState) -> AdapterState:
        """The global adapter after ``mean``: ``optimizer``'s step, or ``state + server-lr · mean``."""
        if self.optimizer is None:
            return apply_increment(state, mean, self.cfg.server_lr)
        return self.optimizer.step(state, mean)


def run_round(
    ctx: RoundContext, rnd: int, sampled: Sequence[int], state: AdapterState
) -> tuple[AdapterState, RoundRecord]:
    """Round ``rnd`` for the ``sampled`` nodes through ``ctx.transport``; the released mean, when
    there is one, goes through ``ctx.post`` (e.g. the public-subspace projection) and then
    ``ctx.optimizer`` (None: ``state + server-lr · mean``); ``state`` is never changed in place."""
    record = RoundRecord(rnd, sampled=len(sampled))
    released = ctx.transport(ctx, rnd, sampled, state, record)
    if record.dropouts:
        log.warning("round %d: no reply from sampled node(s) %s", rnd, record.dropouts)
    if released is not None:
        mean, record.sigma_released = released
        state = ctx.step(state, mean if ctx.post is None else ctx.post(mean))
        record.applied = True
    return state, record


def exchange_replies(
    ctx: RoundContext, rnd: int, sampled: Sequence[int], state: AdapterState, record: RoundRecord
) -> Released | None:
    """The plain exchange (:class:`Transport`): each sampled node gets the release's instruction, each
    reply is validated (:func:`accept_reply`) and the usable ones are added to the release's round sum,
    released when there are at least ``cfg.min_replies``."""
    release, cfg = ctx.release, ctx.cfg
    k = len(sampled)
    messages = [
        Message(
            TrainInstruction(
                rnd,
                state,
                release.noise_std(k),
                release.codec,
                release.records_for(node),
                release.instruction_clip(),
            ).to_record(),
            dst_node_id=node,
            message_type="train",
            group_id=str(rnd),
        )
        for node in sampled
    ]
    record.bytes_down = sum(message_bytes(m) for m in messages)
    expected, reply_shapes = release.expected(k), release.reply_shapes(ctx.shapes)
    total, losses, answered = release.round_sum(k), [], set()
    for node, reply, relayed in exchange(ctx.grid, messages, cfg.round_timeout):
        if relayed:  # the SuperLink answered for a node it lost: a dropout, not a reply
            log.warning(
                "round %d: node %s unreachable: %s",
                rnd,
                node,
                reply.error.reason if reply.has_error() else "",
            )
            continue
        if reply.metadata.group_id == str(rnd):
            answered.add(node)
        try:
            inc, weight, extra = accept_reply(reply, rnd, reply_shapes, expected, release, not cfg.private)
        except InvalidReply as exc:
            record.reject(node, str(exc))
            log.warning("round %d: rejected reply from node %s: %s", rnd, node, exc)
            release.answered(node, False)
            continue
        release.answered(node, True)
        record.used(node, reply)
        record.bytes_up += reply.content["increment"].count_bytes()
        total.add(inc, weight)
        record.replied += 1
        losses.append(extra.get("train-loss", float("nan")))
    record.dropouts = sorted(set(sampled) - answered)
    finite = [x for x in losses if np.isfinite(x)]
    record.train_loss = float(np.mean(finite)) if finite else None
    if record.replied < cfg.min_replies:
        if record.replied:
            log.warning(
                "round %d: %d usable replies < min-replies %d: withheld", rnd, record.replied, cfg.min_replies
            )
        return None
    with phase("decode-aggregate"):
        return total.release()


def accept_reply(
    reply: Message,
    rnd: int,
    shapes: dict,
    expected: dict,
    release: Release | None = None,
    counts: bool = True,
) -> tuple[AdapterState, int | None, dict[str, float]]:
    """One train reply, validated for round ``rnd`` (common.wire.parse_train_reply, plus: not late,
    and the release's own check, e.g. within the clip under central noise); :class:`InvalidReply`
    says why it must not be used. ``counts`` False (a private run): no example count or metric may
    come with it."""
    if reply.metadata.group_id != str(rnd):
        raise InvalidReply(f"late reply from round {reply.metadata.group_id!r}")
    inc, weight, extra = parse_train_reply(reply, rnd, shapes, expected, counts)
    if release is not None:
        release.check(inc)
    return inc, weight, extra


__all__ = [
    "Released",
    "RoundContext",
    "RoundRecord",
    "Transport",
    "accept_reply",
    "exchange_replies",
    "run_round",
]
