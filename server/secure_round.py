"""The server's side of a secure-aggregation round (SecAgg+, common/secagg/protocol.py) on the
Message API: after the round's ``train`` exchange has collected each node's public keys (stage 0),
three more exchanges share the mask seeds, collect the masked inputs and unmask their sum.

A node that does not answer a stage, or answers with an error or a malformed record, drops out at
that stage; the protocol removes the masks of nodes that shared keys and then vanished (Bonawitz et
al. 2017 §4). The server never holds an unmasked individual input: only
Σ_{u ∈ survivors} x_u mod 2^b comes out, or a one-line reason why the round cannot be unmasked.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
from flwr.app import Message
from flwr.serverapp import Grid

from common.models import AdapterState
from common.privacy.mechanisms.skellam_mechanism import SkellamMechanism
from common.privacy.planning.secure_plan import round_graph
from common.secagg import protocol
from common.secagg import wire as sw
from common.secagg.errors import SecAggError
from common.secagg.protocol import Params, PublicKeys
from common.timing import phase
from common.wire import InvalidReply, TrainInstruction, check_meta
from server.exchange import exchange, message_bytes
from server.round import Released, RoundContext, RoundRecord

log = logging.getLogger("fedlora.server")


#: message type -> the name of the set of nodes that answered it (Bonawitz et al.'s U_2, U_3, U_4, U_5)
_STAGE_SET = {
    "train.secagg_share": "shared",
    "train.secagg_mask": "masked",
    "train.secagg_check": "signed",
    "train.secagg_unmask": "unmasked",
}


@dataclass
class SecureSum:
    """One round's outcome. ``total``: Σ x_u mod 2^b over ``survivors`` (uint64 (d,)), None when the
    round could not be unmasked (``failure`` says why); ``stages``: the nodes each stage heard from
    (``keys``: U_1, ``shared``: U_2, ``masked``: U_3, ``unmasked``: the unmask replies);
    ``rejected``: node -> the one-line reason its reply at some stage was not used; ``bytes_up`` /
    ``bytes_down``: the protocol's own traffic after stage 0 (keys, shares, masked vectors)."""

    total: np.ndarray | None
    survivors: list[int]
    stages: dict[str, list[int]] = field(default_factory=dict)
    rejected: dict[int, str] = field(default_factory=dict)
    failure: str = ""
    bytes_up: int = 0
    bytes_down: int = 0


def _stage(
    grid: Grid,
    stage: str,
    params: Params,
    outgoing: Mapping[int, dict[str, object]],
    parse: Callable[[int, dict], object],
    result: SecureSum,
    timeout: float,
) -> dict[int, object]:
    """Send ``outgoing[node]`` as ``stage`` to each node; node -> ``parse(node, values)`` of the usable replies."""
    rnd = params.round_number
    messages = [sw.stage_message(stage, node, rnd, values) for node, values in outgoing.items()]
    result.bytes_down += sum(message_bytes(m) for m in messages)
    got: dict[int, object] = {}
    for node, reply, relayed in exchange(grid, messages, timeout):
        if relayed or node not in outgoing:
            continue
        try:
            got[node] = parse(node, sw.fields(reply, rnd))
        except (InvalidReply, SecAggError) as exc:
            result.rejected[node] = f"{stage}: {exc}"
            log.warning("round %d: %s from node %s not used: %s", rnd, stage, node, exc)
            continue
        result.bytes_up += message_bytes(reply)
    result.stages[_STAGE_SET[stage]] = sorted(got)
    return got


def secure_sum(
    grid: Grid,
    params: Params,
    advertised: Mapping[int, PublicKeys],
    timeout: float,
    gate: Callable[[list[int]], str] | None = None,
) -> SecureSum:
    """Stages 1-4 of round ``params.round_number``, given the signed keys the train replies
    advertised (node -> :class:`PublicKeys`, U_1). Returns the unmasked sum of the survivors' inputs.
    ``gate(survivors)``, called once the masked inputs are in and before any unmask request goes
    out, returns why the sum must not be unmasked (empty: go on), e.g. a charge over the budget.
    The survivors then sign the survivor set (consistency check) and the unmask request carries
    their signatures: a node unmasks only for a set that a majority of the round signed, each
    signature bound to the round's transcript (every advertised node's signed keys), which the share
    stage sends to every node."""
    result = SecureSum(None, [], {"keys": sorted(advertised)})
    try:
        routed = protocol.route_keys(params, advertised)
        transcript = sw.transcript_values(protocol.transcript(advertised))
        peers = {node: {**sw.peers_values(routed[node]), **transcript} for node in advertised}
        outboxes = _stage(
            grid, "train.secagg_share", params, peers, lambda n, v: sw.tokens_from(v), result, timeout
        )
        inboxes = protocol.route_shares(params, outboxes)
        tokens = {node: sw.tokens_values(inboxes.get(node, {})) for node in outboxes}
        masked = _stage(
            grid, "train.secagg_mask", params, tokens, lambda n, v: sw.vector_from(v, params), result, timeout
        )
        if gate is not None and (why := gate(sorted(masked))):
            raise SecAggError(why)
        survivors = frozenset(masked)
        check = sw.survivors_values(survivors)
        signed = _stage(
            grid,
            "train.secagg_check",
            params,
            {node: check for node in masked},
            lambda n, v: (advertised[n], sw.signature_from(v, n)),
            result,
            timeout,
        )
        request = sw.request_values(protocol.unmask_request(survivors, signed))
        replies = _stage(
            grid,
            "train.secagg_unmask",
            params,
            {node: request for node in masked},
            lambda n, v: sw.unmask_from(v, n),
            result,
            timeout,
        )
        shared = {u: set(out) for u, out in outboxes.items()}
        result.total = protocol.unmask_sum(params, advertised, shared, masked, list(replies.values()))
        result.survivors = sorted(masked)
    except SecAggError as exc:
        result.failure = str(exc)
        log.warning("round %d: secure aggregation failed: %s", params.round_number, exc)
    return result


def _advertised(
    grid: Grid,
    messages: list[Message],
    rnd: int,
    expected: Mapping[str, object],
    record: RoundRecord,
    timeout: float,
) -> dict[int, PublicKeys]:
    """The round's train exchange (stage 0): node -> the public keys its reply advertised; a reply
    without them, or whose meta is not what the round asked, is rejected (recorded in ``record``)."""
    advertised = {}
    for node, reply, relayed in exchange(grid, messages, timeout):
        if relayed:
            continue
        try:
            values = sw.fields(reply, rnd)
            check_meta(reply.content.get("meta"), expected)
            advertised[node] = sw.keys_from(values, node)
        except InvalidReply as exc:
            record.reject(node, str(exc))
            log.warning("round %d: rejected reply from node %s: %s", rnd, node, exc)
            continue
        record.used(node, reply)
        record.bytes_up += message_bytes(reply)
    return advertised


def round_params(
    mechanism: SkellamMechanism, rnd: int, sampled: tuple[int, ...], seed: bytes, run: int
) -> Params:
    """Round ``rnd`` of run ``run``'s protocol parameters for the ``sampled`` nodes: words of the
    release's bits and length (its :class:`~common.privacy.mechanisms.skellam_mechanism.IntegerFormat`), the
    neighbour graph of :func:`round_graph`, the round's public ``seed``."""
    words = mechanism.words
    k, t = round_graph(words, len(sampled))
    return Params(rnd, tuple(sorted(sampled)), k, t, words.bits, words.length, seed, run).validate()


def train_messages(noise_std: float, params: Params, state: AdapterState) -> list[Message]:
    """The round's train instruction to each of its nodes (``params.node_ids``): the global adapter
    ``state``, the noise share std the release asks of each node and the protocol's parameters (whose
    public seed fixes the neighbour graph and the rotation). One content for every node (the grid
    copies or serializes each message's)."""
    rnd = params.round_number
    setup = dict(sw.record(rnd, **sw.params_record(params)))
    content = TrainInstruction(rnd, state, noise_std, {}, setup).to_record()
    return [
        Message(content, dst_node_id=node, message_type="train", group_id=str(rnd))
        for node in params.node_ids
    ]


def secagg_round(
    ctx: RoundContext, rnd: int, sampled: Sequence[int], state: AdapterState, record: RoundRecord
) -> Released | None:
    """The SecAgg+ transport (:class:`server.round.Transport`): the train instruction carries the
    protocol's parameters (a fresh public seed from ``os.urandom`` fixes the neighbour graph and the
    rotation); each node trains, releases its update as the run's integer-valued mechanism does (the
    Skellam mechanism, common/privacy/mechanisms/skellam_mechanism.py: words mod 2^b) and answers with its
    signed public keys; :func:`secure_sum` then unmasks only the survivors' sum, which the
    mechanism's round sum decodes into the mean (the transport sums words and knows no noise).

    The sum is unmasked only when at least ``min-replies`` (m) masked inputs came in, so it carries at
    least the planned noise, and after ``ctx.gate(rnd, survivors, event)`` (the ledger narrowed to the
    survivors and their realised noise) allowed it."""
    seed = os.urandom(32)
    release = ctx.release.mechanism.for_round(seed, ctx.shapes)  # the run's Skellam mechanism
    params = round_params(release, rnd, tuple(sampled), seed, ctx.grid.run.run_id)
    messages = train_messages(release.noise_std(len(sampled)), params, state)
    record.bytes_down = sum(message_bytes(m) for m in messages)
    expected = ctx.release.expected(len(sampled))  # its noise-std: the release's Skellam share
    advertised = _advertised(ctx.grid, messages, rnd, expected, record, ctx.cfg.round_timeout)
    least = release.words.min_survivors

    def gate(survivors: list[int]) -> str:
        if len(survivors) < least:
            return (
                f"{len(survivors)} masked inputs < min-replies {least}: the sum would carry less noise "
                "than planned; not unmasked"
            )
        return ctx.gate(rnd, survivors, release.released_event(len(survivors))) if ctx.gate else ""

    with phase("secure-aggregation"):
        result = secure_sum(ctx.grid, params, advertised, ctx.cfg.round_timeout, gate)
    record.bytes_down += result.bytes_down
    record.bytes_up += result.bytes_up
    for node, why in result.rejected.items():
        record.reject(node, why)
    record.secure = {
        **{k: len(v) for k, v in result.stages.items()},
        "bits": params.bits,
        "k": params.k,
        "threshold": params.threshold,
        "failure": result.failure,
    }
    masked = result.survivors or result.stages.get("masked", [])  # (not unmasked: who sent a masked input)
    record.replied = len(masked)
    record.dropouts = sorted(set(sampled) - set(masked))
    if result.total is None:
        return None
    total = release.round_sum(len(sampled))
    total.add_sum(result.total, record.replied)
    try:
        with phase("decode-aggregate"):
            return total.release()
    except OverflowError as exc:
        record.secure["failure"] = f"overflow: {exc}"
        log.warning("round %d: the unmasked sum is not decodable: %s", rnd, exc)
        return None


__all__ = ["SecureSum", "round_params", "secagg_round", "secure_sum", "train_messages"]
