"""A federation under secure aggregation (``--threat-model secure-aggregation``): the real ServerApp
and ClientApp over the in-process grid. The server never holds a client's update, only the
survivors' sum; nodes that vanish mid-protocol drop out and the round still completes; the ledger
charges each client for the rounds its input was summed in, at the noise those survivors' shares
carried; the statement names the RDP accountant and the server as an observer."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from flwr.app import Message

from client import app as app_module
from client import secure
from common.config import to_flat
from common.presets import preset
from common.privacy.accountants import RdpAccountant, SkellamEvent
from common.privacy.ledger import Ledger
from common.secagg import wire as sw
from server.inprocess import InProcessGrid, load_component
from server.simulate import CLIENT_APP
from tests.harness import TINY, records, serve

pytestmark = pytest.mark.integration

NODES = 6


def _cfg(out: Path, **change):
    values = dict(
        **{**TINY, "num_clients": NODES, "rounds": 2},
        mechanism="dp-fedavg",
        threat_model="secure-aggregation",
        target_epsilon=8.0,
        clip=0.5,
        sample_rate=1.0,
        min_replies=3,
        secagg_neighbours=5,  # every other node (k = n - 1), t = 3: two losses leave 3 shares
        max_participations=2,
        out_dir=str(out),
    )
    return preset("minilm-rt", **{**values, **change}).check()


def _federate(cfg, die: dict[tuple[int, str], set[int]] | None = None) -> InProcessGrid:
    """The federation; ``die``: (round, message type) -> the nodes that raise on it."""
    client, die = load_component(CLIENT_APP), die or {}

    def app(msg: Message, ctx):
        if ctx.node_id in die.get((int(msg.metadata.group_id), msg.metadata.message_type), ()):
            raise RuntimeError("node killed mid-protocol")
        return client(msg, ctx)

    grid = InProcessGrid(
        app, cfg.num_clients, to_flat(cfg), raise_errors=False, state_root=Path(cfg.out_dir).parent / "nodes"
    )
    serve(grid, cfg)
    return grid


def _rdp(*events) -> float:
    acc = RdpAccountant()
    for e in events:
        acc.compose(e)
    return acc.epsilon(1e-5)


def test_dropouts_mid_protocol_complete_the_round_and_degrade_only_their_own_charge(tmp_path):
    """Round 2: node 1002 dies after its masked upload (its input is summed, its self-mask recovered
    from shares), node 1003 before it (dropped: its pairwise masks are removed). The round unmasks
    the sum of 5, the ledger charges those 5 at the noise of 5 shares, and node 1003 only for round 1."""
    cfg = _cfg(tmp_path / "run")
    grid = _federate(cfg, {(2, "train.secagg_unmask"): {1002}, (2, "train.secagg_mask"): {1003}})
    recs = records(tmp_path / "run")
    first, second = recs[1], recs[2]
    assert (first["replied"], first["applied"], first["dropouts"]) == (NODES, True, [])
    assert (second["replied"], second["applied"], second["dropouts"]) == (NODES - 1, True, [1003])
    assert second["secure"]["keys"] == NODES and second["secure"]["masked"] == NODES - 1
    assert second["secure"]["unmasked"] == NODES - 2 and not second["secure"]["failure"]
    assert sorted(second["rejected_nodes"]) == [1002, 1003]
    assert (
        second["loss"] != first["loss"]
    )  # the decoded mean moved the adapter (40 examples: accuracy may tie)

    ledger = Ledger.open(tmp_path / "run" / "ledger.sqlite", "client-level")
    assert ledger.participations() == {n: 2 for n in range(1001, 1007) if n != 1003} | {1003: 1}
    events = ledger.events()
    assert all(isinstance(e, SkellamEvent) and e.p == 1.0 for e in events)
    assert events[0].mu > events[1].mu  # 6 shares, then 5: less noise, a larger charge
    assert ledger.spent()["eps_tight"] == pytest.approx(_rdp(*events))  # the worst client took part twice
    assert ledger.spent()["eps_tight"] <= 8.0
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert (
        "(rdp, the worst client's)" in summary["privacy"]
        and "honest-but-curious server" in summary["privacy"]
    )
    assert summary["client_privacy"]["relation"] == "zero-out"
    # each node charged its own release, as Skellam noise at p = 1, in its own ledger
    node_ledger = Ledger.open(
        Path(cfg.out_dir).parent / "nodes" / "node-0" / "client-ledger.sqlite", "client-level"
    )
    assert [type(e) for e in node_ledger.events()] == [SkellamEvent, SkellamEvent]
    # the nodes that answered the unmask request keep no secrets (the killed ones never got that far)
    assert [n for n, c in grid.contexts.items() if c.state] == [1002, 1003]


def test_a_round_with_fewer_masked_inputs_than_min_replies_is_not_unmasked(tmp_path):
    """Four of six nodes die before their masked upload: 2 < min-replies 3 masked inputs would carry
    less noise than planned, so the sum is never unmasked; the round is withheld, its charge stands."""
    cfg = _cfg(tmp_path / "run", rounds=1)
    _federate(cfg, {(1, "train.secagg_mask"): {1001, 1002, 1003, 1004}})
    rec = records(tmp_path / "run")[1]
    assert not rec["applied"] and rec["secure"]["masked"] == 2 and rec["replied"] == 2
    assert rec["dropouts"] == [1001, 1002, 1003, 1004]
    assert "2 masked inputs < min-replies 3" in rec["secure"]["failure"]
    assert rec["secure"].get("unmasked", 0) == 0  # no unmask request ever went out
    rows = Ledger.open(tmp_path / "run" / "ledger.sqlite", "client-level").rows()
    assert [(r["round"], r["status"]) for r in rows] == [(1, "withheld")]


#: chi-square, 15 degrees of freedom, upper 1e-9 quantile (tests/common/secagg/test_protocol.py)
CHI2_15 = 73.63


def _top_bits_chi_square(words: np.ndarray, bits: int) -> float:
    """χ² of the top 4 bits of b-bit words against the uniform distribution over 16 values."""
    counts = np.bincount((words.astype(np.int64) >> (bits - 4)).astype(np.int64), minlength=16)
    expected = words.size / 16
    return float(((counts - expected) ** 2 / expected).sum())


def test_the_server_holds_no_update_only_a_uniform_word_per_client(tmp_path):
    """What reaches the server from a node under secure aggregation: its public keys at train time,
    then a masked vector that is uniform mod 2^b (χ² over its words), while the node's own encoded
    update (its clipped, rotated, rounded increment plus its Skellam share, kept in its state) is
    far from uniform; the train reply carries no increment record at all."""
    cfg = _cfg(tmp_path / "run", rounds=1)
    seen, params, views = [], {}, {}
    client = load_component(CLIENT_APP)

    def app(msg: Message, ctx):
        reply = client(msg, ctx)
        kind, rnd = msg.metadata.message_type, int(msg.metadata.group_id)
        seen.append((kind, set(reply.content.keys())))
        if kind == "train":
            params[ctx.node_id] = sw.params_from(sw.fields(msg.content, rnd), rnd)
        if kind == "train.secagg_mask":
            p = params[ctx.node_id]
            x = np.frombuffer(ctx.state[secure.STATE]["x"], dtype="<u4")  # its words, b <= 32
            views[ctx.node_id] = (sw.vector_from(sw.fields(reply, rnd), p), x, p.bits)
        return reply

    grid = InProcessGrid(app, cfg.num_clients, to_flat(cfg), state_root=Path(cfg.out_dir).parent / "nodes")
    serve(grid, cfg)
    train = [keys for kind, keys in seen if kind == "train"]
    assert len(train) == NODES and all(keys == {"secagg", "meta"} for keys in train)
    masked = [keys for kind, keys in seen if kind == "train.secagg_mask"]
    assert len(masked) == NODES and all(keys == {"secagg"} for keys in masked)
    for y, x, bits in views.values():
        assert _top_bits_chi_square(y, bits) < CHI2_15  # what the server holds: uniform
        assert _top_bits_chi_square(x, bits) > 50 * CHI2_15  # what the node encoded: not


def test_clients_at_the_participation_cap_are_not_sampled_and_the_run_stops_when_too_few_are_left(tmp_path):
    """Each secure round draws a fixed cohort from the clients under the cap, those who took part
    least first. With a cap of 2 and cohorts of 3 of 6 clients, every client takes part exactly
    twice in 4 rounds, and the run stops before round 5 (nobody left under the cap)."""
    cfg = _cfg(tmp_path / "run", rounds=5, sample_rate=0.5, min_replies=3, secagg_neighbours=2)
    _federate(cfg)
    recs = records(tmp_path / "run")[1:]
    ledger = Ledger.open(tmp_path / "run" / "ledger.sqlite", "client-level")
    rounds = [r["round"] for r in ledger.rows()]
    assert rounds == [1, 2, 3, 4]
    assert all(r["sampled"] == 3 for r in ledger.rows())
    taken = ledger.participations()
    assert taken == {n: 2 for n in range(1001, 1001 + NODES)}  # every cap used, none exceeded
    assert recs[-1]["phase"] == "stopped" and "participation cap" in recs[-1]["reason"]
    assert recs[-1]["round"] == len(rounds) + 1
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["rounds_completed"] == len(rounds) and "participation cap" in summary["stopped"]


def test_hidden_participation_asks_every_client_and_charges_each_round_at_the_sample_rate(
    tmp_path, monkeypatch
):
    """``secure-aggregation-hidden``: every node takes part in every round's protocol and its own coin
    decides whether it trains and contributes (else a zero update with its Skellam share). The
    server's records are the same whatever the coins say: every node in every round, the same reply
    records; the ledgers (server and node) charge every client every round as Poisson-sampled at p,
    which amplifies against the server too, so ε is below the same noise at p = 1."""
    coins = iter([True, False, False, True, False, False] * 2)
    monkeypatch.setattr(secure, "contributes", lambda rate: rate == 0.5 and next(coins))
    trained, loaded = [], []
    real_steps, real_shard = app_module._train_steps, app_module._shard
    monkeypatch.setattr(
        app_module,
        "_train_steps",
        lambda context, *a: trained.append(context.node_id) or real_steps(context, *a),
    )
    monkeypatch.setattr(
        app_module, "_shard", lambda context, *a: loaded.append(context.node_id) or real_shard(context, *a)
    )
    cfg = _cfg(
        tmp_path / "run", threat_model="secure-aggregation-hidden", sample_rate=0.5, max_participations=0
    )
    _federate(cfg)
    recs = records(tmp_path / "run")[1:]
    assert [(r["sampled"], r["replied"], r["applied"]) for r in recs] == [(NODES, NODES, True)] * 2
    assert len(trained) == 4  # two coins of six came up in each round: only those nodes trained...
    assert loaded == trained  # ...and only those loaded their data and the global adapter
    ledger = Ledger.open(tmp_path / "run" / "ledger.sqlite", "client-level")
    assert ledger.participations() == {n: 2 for n in range(1001, 1001 + NODES)}
    events = ledger.events()
    assert all(isinstance(e, SkellamEvent) and e.p == 0.5 for e in events)
    spent = ledger.spent()["eps_tight"]
    assert spent == pytest.approx(_rdp(*events)) and spent <= 8.0
    assert spent < _rdp(*(replace(e, p=1.0) for e in events))  # the hidden coin amplifies
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert "at p = 0.5" in summary["privacy"] and "honest-but-curious server" in summary["privacy"]
    assert "who was contacted" in summary["not_covered"][-1]  # not "who was sampled": the coins are hidden
    node_ledger = Ledger.open(
        Path(cfg.out_dir).parent / "nodes" / "node-0" / "client-ledger.sqlite", "client-level"
    )
    assert [e.p for e in node_ledger.events()] == [0.5, 0.5]  # charged whether or not its coin came up


def test_with_train_always_every_node_trains_and_encodes_a_zero_with_full_work(tmp_path, monkeypatch):
    """``--secagg-train-always``: every node trains every round whatever its coin (so reply timing
    does not show the coin), a node whose coin did not come up still sends a zero update, and it
    encodes that zero with the full rotation and rounding (never the shortcut)."""
    from common.privacy import discrete

    coins = iter([True, False, False, True, False, False] * 2)
    monkeypatch.setattr(secure, "contributes", lambda rate: rate == 0.5 and next(coins))
    trained, zeros = [], []
    real_steps, real_encode = app_module._train_steps, discrete.encode
    monkeypatch.setattr(
        app_module,
        "_train_steps",
        lambda context, *a: trained.append(context.node_id) or real_steps(context, *a),
    )
    monkeypatch.setattr(discrete, "encode", lambda x, *a: zeros.append(not x.any()) or real_encode(x, *a))
    monkeypatch.setattr(discrete, "encode_zero", lambda *a: pytest.fail("the shortcut shows a zero update"))
    cfg = _cfg(
        tmp_path / "run",
        threat_model="secure-aggregation-hidden",
        sample_rate=0.5,
        max_participations=0,
        secagg_train_always=True,
    )
    _federate(cfg)
    recs = records(tmp_path / "run")[1:]
    assert [(r["sampled"], r["replied"], r["applied"]) for r in recs] == [(NODES, NODES, True)] * 2
    assert len(trained) == 2 * NODES  # every node, every round
    assert sorted(zeros) == [False] * 4 + [True] * 8  # two contributors a round; the rest sent zero
