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
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import numpy as np
from flwr.serverapp import Grid

from common.secagg import protocol
from common.secagg import wire as sw
from common.secagg.errors import SecAggError
from common.secagg.protocol import Params, PublicKeys
from common.wire import InvalidReply
from server.exchange import exchange, message_bytes

log = logging.getLogger("fedlora.server")


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
    result.stages[stage.removeprefix("train.secagg_")] = sorted(got)
    return got


def secure_sum(grid: Grid, params: Params, advertised: Mapping[int, PublicKeys], timeout: float) -> SecureSum:
    """Stages 1-3 of round ``params.round_number``, given the keys the train replies advertised
    (node -> :class:`PublicKeys`, U_1). Returns the unmasked sum of the survivors' inputs."""
    result = SecureSum(None, [], {"keys": sorted(advertised)})
    try:
        routed = protocol.route_keys(params, advertised)
        peers = {node: sw.peers_values(routed[node]) for node in advertised}
        outboxes = _stage(
            grid, "train.secagg_share", params, peers, lambda n, v: sw.tokens_from(v), result, timeout
        )
        inboxes = protocol.route_shares(params, outboxes)
        tokens = {node: sw.tokens_values(inboxes.get(node, {})) for node in outboxes}
        masked = _stage(
            grid, "train.secagg_mask", params, tokens, lambda n, v: sw.vector_from(v, params), result, timeout
        )
        request = sw.request_values(protocol.unmask_request(outboxes, masked))
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


__all__ = ["SecureSum", "secure_sum"]
