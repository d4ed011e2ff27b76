"""A secure-aggregation round on the Message API (server/secure_round.py, client/secure.py): real
ClientApp handlers behind the in-process grid, the node's state kept in ``context.state``."""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Callable

import numpy as np
import pytest
import torch
from flwr.app import Context, Message
from flwr.clientapp import ClientApp

from client import secure
from common.privacy.accounting.skellam import rounding_norm_bound
from common.privacy.mechanisms import discrete
from common.secagg import identity, keys, protocol
from common.secagg import wire as sw
from common.secagg.protocol import Params, PublicKeys
from server.exchange import exchange
from server.inprocess import InProcessGrid
from server.secure_round import secure_sum

BITS, LENGTH = 20, 300


def _input(node: int) -> np.ndarray:
    return (np.arange(LENGTH, dtype=np.int64) * node) % (1 << BITS)


def _app(
    drop_at: dict[int, str] | None = None, inputs: Callable[[int], np.ndarray] = _input, least: int = 0
) -> ClientApp:
    """Nodes whose train handler encodes ``inputs(node)``; ``drop_at``: node -> the stage it dies at;
    ``least``: the fewest survivors each node unmasks for (its plan's min-replies)."""
    app, drop_at = ClientApp(), drop_at or {}

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        rnd = int(msg.metadata.group_id)
        values = secure.begin(
            context, sw.fields(msg, rnd), rnd, context.node_id, inputs(context.node_id), least
        )
        return Message(sw.record(rnd, **values), reply_to=msg)

    for stage, handler in secure.HANDLERS.items():

        def staged(msg: Message, context: Context, stage=stage, handler=handler) -> Message:
            if drop_at.get(context.node_id) == stage:
                raise RuntimeError("node died")
            return handler(msg, context)

        app.train(stage.removeprefix("train."))(staged)
    return app


def _round(grid: InProcessGrid, rnd: int = 1, k: int = 4, t: int = 3, bits: int = BITS, length: int = LENGTH):
    nodes = tuple(sorted(grid.get_node_ids()))
    params = Params(rnd, nodes, k, t, bits, length, os.urandom(16), grid.run.run_id).validate()
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
    bad = Params(
        rnd, nodes, 4, 2, BITS, LENGTH, os.urandom(16), grid.run.run_id
    )  # t = k/2: two disjoint share groups
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
    (common/privacy/mechanisms/discrete.py), the protocol sums mod 2^b, the server decodes; a node dying after
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


class ActiveServer:
    """A server that deviates from the protocol, driving the real handlers stage by stage through the
    in-process grid (the audit's probes): it can rewrite what each node is sent at every stage."""

    def __init__(self, grid: InProcessGrid, k: int = 4, t: int = 3, seed: bytes | None = None):
        self.grid, self.rnd = grid, 1
        nodes = tuple(sorted(grid.get_node_ids()))
        seed = seed or os.urandom(16)
        self.params = Params(self.rnd, nodes, k, t, BITS, LENGTH, seed, grid.run.run_id).validate()
        replies = self.send("train", {n: sw.params_record(self.params) for n in nodes})
        self.keys = {node: sw.keys_from(v, node) for node, v in replies.items() if isinstance(v, dict)}
        self.refused = {node: v for node, v in replies.items() if isinstance(v, str)}

    def send(self, stage: str, outgoing: dict[int, dict]) -> dict[int, dict | str]:
        """``outgoing[node]`` as ``stage`` to each node -> node -> its reply's values, or its refusal."""
        make = (
            (
                lambda n, v: Message(
                    sw.record(self.rnd, **v), dst_node_id=n, message_type="train", group_id="1"
                )
            )
            if stage == "train"
            else (lambda n, v: sw.stage_message(stage, n, self.rnd, v))
        )
        got = {}
        for node, reply, _ in exchange(self.grid, [make(n, v) for n, v in outgoing.items()], 60):
            got[node] = reply.error.reason if reply.has_error() else sw.fields(reply, self.rnd)
        return got

    def share(self, keys: dict[int, PublicKeys]) -> dict[int, dict | str]:
        routed, transcript = (
            protocol.route_keys(self.params, keys),
            sw.transcript_values(protocol.transcript(keys)),
        )
        return self.send(
            "train.secagg_share", {n: {**sw.peers_values(routed[n]), **transcript} for n in keys}
        )

    def mask(self, shared: dict[int, dict]) -> dict[int, dict | str]:
        inboxes = protocol.route_shares(self.params, {n: sw.tokens_from(v) for n, v in shared.items()})
        return self.send("train.secagg_mask", {n: sw.tokens_values(inboxes.get(n, {})) for n in shared})

    def sign(self, survivors: frozenset[int], nodes) -> dict[int, tuple[bytes, bytes]]:
        replies = self.send("train.secagg_check", {n: sw.survivors_values(survivors) for n in nodes})
        return {n: (self.keys[n], sw.signature_from(v, n)) for n, v in replies.items()}


def test_an_active_server_cannot_substitute_a_nodes_keys():
    """The audit's probe (b): the server replaces node v's advertised keys by its own (which would let
    it open the shares sent to v and agree v's pair masks). Every neighbour of v refuses the share
    stage; no share leaves any of them, and the refusal reaches the server as an error."""
    grid = InProcessGrid(_app(), 8, {}, raise_errors=False)
    server = ActiveServer(grid)
    victim = min(server.params.node_ids)
    (_, cipher), (_, mask) = keys.new_key_pair(), keys.new_key_pair()
    forged = dataclasses.replace(server.keys[victim], cipher=cipher, mask=mask)
    replies = server.share({**server.keys, victim: forged})
    refusing = server.params.neighbours[victim] | {victim}  # the victim: not its keys in the transcript
    for node in refusing:
        assert isinstance(replies[node], str) and "refuses to share" in replies[node], replies[node]
    assert all(isinstance(replies[n], dict) for n in set(replies) - refusing)


def test_an_active_server_cannot_split_the_survivor_set():
    """The audit's probe (a): the server shows half the nodes a survivor set with the victim in it
    (to collect shares of its self-mask b_u) and the other half one without it (to collect its
    neighbours' mask keys), with each half's signatures. Every honest node refuses to unmask: no
    share of anything is revealed."""
    grid = InProcessGrid(_app(), 10, {}, raise_errors=False)
    server = ActiveServer(grid)
    shared = server.share(server.keys)
    masked = server.mask(shared)
    assert all(isinstance(v, dict) for v in masked.values())
    nodes = list(server.params.node_ids)
    victim, half_a, half_b = nodes[0], nodes[:5], nodes[5:]
    alive, dropped = frozenset(nodes), frozenset(nodes[1:])
    stories = {alive: server.sign(alive, half_a), dropped: server.sign(dropped, half_b)}
    for story, signatures in stories.items():
        request = sw.request_values(protocol.unmask_request(story, signatures))
        believers = half_a if story == alive else half_b
        replies = server.send("train.secagg_unmask", {n: request for n in believers})
        assert all(
            isinstance(r, str) and "valid signatures of the survivor set" in r for r in replies.values()
        ), replies
    assert victim in half_a


def test_a_node_does_not_sign_or_unmask_for_fewer_survivors_than_its_min_replies():
    """The client checks the plan: a node whose own plan needs m = 8 survivors refuses to sign (hence
    to unmask for) a set of 7, even though 7 is a majority of 10 and above t."""
    grid = InProcessGrid(_app(least=8), 10, {}, raise_errors=False)
    server = ActiveServer(grid)
    server.mask(server.share(server.keys))
    seven = frozenset(sorted(server.params.node_ids)[:7])
    replies = server.send("train.secagg_check", {n: sw.survivors_values(seven) for n in seven})
    assert all(isinstance(r, str) and "7 survivors < 8" in r for r in replies.values()), replies


def test_a_node_refuses_a_second_share_or_mask_request():
    grid = InProcessGrid(_app(), 8, {}, raise_errors=False)
    server = ActiveServer(grid)
    shared = server.share(server.keys)
    again = server.share(server.keys)
    assert all(isinstance(r, str) and "refuses the share request" in r for r in again.values())
    server.mask(shared)
    again = server.mask(shared)
    assert all(isinstance(r, str) and "refuses the mask request" in r for r in again.values())


def _unmask_refusals(server: ActiveServer, story: frozenset[int], signatures: dict, nodes) -> dict:
    """The unmask stage for ``nodes``, told ``story`` with ``signatures``: node -> reply or refusal."""
    request = sw.request_values(protocol.unmask_request(story, signatures))
    return server.send("train.secagg_unmask", {n: request for n in nodes})


def test_signatures_replayed_from_another_run_with_the_same_seed_are_refused(tmp_path):
    """The audit's replay through the real handlers: run 1 is honest (fixed seed) and the server keeps
    every node's signature of "everyone survived"; run 2, same nodes, parameters and seed, tells the
    victim and its share holders that everyone survived, topped up with run 1's signatures (the
    audit's 0-refusal route to the victim's self-mask), while the rest sign a set without them.
    Every holder refuses: no share of the victim's self-mask leaves any node."""
    seed = os.urandom(16)
    first = ActiveServer(InProcessGrid(_app(), 12, {}, run_id=1, state_root=tmp_path), seed=seed)
    first.mask(first.share(first.keys))
    everyone = frozenset(first.params.node_ids)
    replayed = first.sign(everyone, everyone)
    grid = InProcessGrid(_app(), 12, {}, run_id=2, state_root=tmp_path, raise_errors=False)
    second = ActiveServer(grid, seed=seed)  # the same identities (state_root), another run
    second.mask(second.share(second.keys))
    victim = second.params.node_ids[0]
    holders = sorted(second.params.neighbours[victim] | {victim})
    rest = frozenset(everyone - set(holders))
    fresh = second.sign(everyone, holders)
    assert second.sign(rest, rest)  # the others sign the set without the victim's side: a majority
    # run 1's signatures, each presented with its signer's keys of this run (those the transcript lists)
    signatures = {**{n: (second.keys[n], replayed[n][1]) for n in rest}, **fresh}
    replies = _unmask_refusals(second, everyone, signatures, holders)
    assert all(
        isinstance(r, str) and f"{len(holders)} valid signatures of the survivor set" in r
        for r in replies.values()
    ), replies


def test_two_supernodes_under_one_node_id_cannot_lend_each_other_signatures(tmp_path):
    """The audit's aliasing route: a SuperLink gives two real SuperNodes every node id (two grids over
    the same ids, run and seed; a roster of twice the cohort). The server tells the victim's side of
    one federation that everyone survived, topped up with the other federation's signatures of the
    same set under the same ids. They are bound to the other transcript: every node refuses."""
    seed = os.urandom(16)
    grids = [
        InProcessGrid(_app(), 10, {}, run_id=1, state_root=tmp_path / name, raise_errors=False)
        for name in ("a", "b")
    ]
    roster = tmp_path / "roster.pub"
    for grid in grids:
        grid.provision()
    roster.write_bytes(b"".join((tmp_path / name / "roster.pub").read_bytes() for name in ("a", "b")))
    for grid in grids:
        for context in grid.contexts.values():
            context.node_config[identity.ROSTER] = str(roster)
    real, alias = (ActiveServer(grid, seed=seed) for grid in grids)
    assert real.params == alias.params
    for server in (real, alias):
        server.mask(server.share(server.keys))
    everyone = frozenset(real.params.node_ids)
    victim = real.params.node_ids[0]
    side = sorted(real.params.neighbours[victim] | {victim})
    lent = alias.sign(everyone, everyone - set(side))  # the aliases sign for the other ids
    replies = _unmask_refusals(real, everyone, {**real.sign(everyone, side), **lent}, side)
    assert all(
        isinstance(r, str) and f"{len(side)} valid signatures of the survivor set" in r
        for r in replies.values()
    ), replies


def test_a_restarted_node_refuses_a_round_it_already_signed(tmp_path):
    """A node keeps what it signed in its state directory: after a restart (its round secrets gone)
    the same (run, round) is refused at the keys stage by every node, while another run is answered."""
    first = ActiveServer(InProcessGrid(_app(), 6, {}, run_id=5, state_root=tmp_path), seed=b"s" * 16)
    assert len(first.keys) == 6 and len(list(tmp_path.glob("node-*/secagg-signed.sqlite"))) == 6
    grid = InProcessGrid(_app(), 6, {}, run_id=5, state_root=tmp_path, raise_errors=False)
    restarted = ActiveServer(grid, seed=b"s" * 16)
    assert not restarted.keys and len(restarted.refused) == 6
    assert all("already signed its keys for round 1 of run 5" in r for r in restarted.refused.values())
    assert all(secure.STATE not in c.state for c in grid.contexts.values())  # nothing kept, nothing sent
    other = ActiveServer(InProcessGrid(_app(), 6, {}, run_id=6, state_root=tmp_path), seed=b"s" * 16)
    assert len(other.keys) == 6
