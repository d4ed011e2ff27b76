"""A federation under secure aggregation (``--threat-model secure-aggregation``): the real ServerApp
and ClientApp over the in-process grid. The server never holds a client's update, only the
survivors' sum; nodes that vanish mid-protocol drop out and the round still completes; the ledger
charges each client for the rounds its input was summed in, at the noise those survivors' shares
carried; the statement names the RDP accountant and the server as an observer."""

from __future__ import annotations

import json
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from flwr.app import ConfigRecord, Message

from client import app as app_module
from client import secure
from common.config import to_flat
from common.lazy import load_component
from common.presets import preset
from common.privacy.accounting.accountants import RdpAccountant, SkellamEvent
from common.privacy.accounting.ledger import Ledger
from common.privacy.participation import participation
from common.secagg import wire as sw
from server.inprocess import InProcessGrid
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
        min_replies=4,  # a majority of the 6 (the survivor set's signatures)
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
        "(rdp, the worst client's" in summary["privacy"]
        and "deviates from the protocol" in summary["privacy"]
    )
    assert summary["client_privacy"]["relation"] == "zero-out"
    # each node charged its own release, as Skellam noise at p = 1, in its own ledger
    node_ledger = Ledger.open(
        Path(cfg.out_dir).parent / "nodes" / "node-0" / "client-ledger.sqlite", "client-level"
    )
    assert [type(e) for e in node_ledger.events()] == [SkellamEvent, SkellamEvent]
    # the nodes that answered the unmask request keep no secrets (the killed ones never got that far)
    assert [n for n, c in grid.contexts.items() if secure.STATE in c.state] == [1002, 1003]


def test_a_round_with_fewer_masked_inputs_than_min_replies_is_not_unmasked(tmp_path):
    """Four of six nodes die before their masked upload: 2 < min-replies 4 masked inputs would carry
    less noise than planned, so the sum is never unmasked; the round is withheld, its charge stands."""
    cfg = _cfg(tmp_path / "run", rounds=1)
    _federate(cfg, {(1, "train.secagg_mask"): {1001, 1002, 1003, 1004}})
    rec = records(tmp_path / "run")[1]
    assert not rec["applied"] and rec["secure"]["masked"] == 2 and rec["replied"] == 2
    assert rec["dropouts"] == [1001, 1002, 1003, 1004]
    assert "2 masked inputs < min-replies 4" in rec["secure"]["failure"]
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


@pytest.mark.parametrize("idle_training", ["train", "skip"])
def test_hidden_participation_asks_every_client_and_charges_each_round_at_the_sample_rate(
    tmp_path, monkeypatch, idle_training
):
    """``secure-aggregation-hidden``: every node takes part in every round's protocol, trains, and its
    own coin decides whether it contributes (else a zero update with its Skellam share). The
    server's records are the same whatever the coins say: every node in every round, the same reply
    records; the ledgers (server and node) charge every client every round as Poisson-sampled at p,
    which amplifies against the server too, so ε is below the same noise at p = 1. Constant work: a
    node whose coin did not come up encodes its zero update with the full clip, rotation, rounding
    and share, like any other update. A simulation with ``--idle-training skip`` differs in one thing
    only: the nodes whose coin did not come up run no local step."""
    from common.privacy.mechanisms import discrete

    coins = iter([True, False, False, True, False, False] * 2)
    monkeypatch.setattr(participation, "contributes", lambda rate: rate == 0.5 and next(coins))
    trained, loaded, zeros = [], [], []
    real_steps, real_shard, real_encode = app_module._train_steps, app_module._shard, discrete.encode
    monkeypatch.setattr(discrete, "encode", lambda x, *a: zeros.append(not x.any()) or real_encode(x, *a))
    monkeypatch.setattr(
        app_module,
        "_train_steps",
        lambda a, context: trained.append(context.node_id) or real_steps(a, context),
    )
    monkeypatch.setattr(
        app_module, "_shard", lambda context, *a: loaded.append(context.node_id) or real_shard(context, *a)
    )
    cfg = _cfg(
        tmp_path / "run",
        threat_model="secure-aggregation-hidden",
        sample_rate=0.5,
        max_participations=0,
        idle_training=idle_training,
    )
    _federate(cfg)
    recs = records(tmp_path / "run")[1:]
    assert [(r["sampled"], r["replied"], r["applied"]) for r in recs] == [(NODES, NODES, True)] * 2
    assert len(loaded) == 2 * NODES  # every node loads its data and the global adapter every round...
    if idle_training == "train":
        assert trained == loaded  # ...and trains, whatever its coin
    else:
        assert trained == [1001, 1004] * 2  # ...and only those whose coin came up train
    assert sorted(zeros) == [False] * 4 + [True] * 8  # two contributors a round; the rest sent zero
    ledger = Ledger.open(tmp_path / "run" / "ledger.sqlite", "client-level")
    assert ledger.participations() == {n: 2 for n in range(1001, 1001 + NODES)}
    events = ledger.events()
    assert all(isinstance(e, SkellamEvent) and e.p == 0.5 for e in events)
    spent = ledger.spent()["eps_tight"]
    assert spent == pytest.approx(_rdp(*events)) and spent <= 8.0
    assert spent < _rdp(*(replace(e, p=1.0) for e in events))  # the hidden coin amplifies
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert "at p = 0.5" in summary["privacy"] and "deviates from the protocol" in summary["privacy"]
    assert "who was contacted" in summary["not_covered"][-1]  # not "who was sampled": the coins are hidden
    node_ledger = Ledger.open(
        Path(cfg.out_dir).parent / "nodes" / "node-0" / "client-ledger.sqlite", "client-level"
    )
    assert [e.p for e in node_ledger.events()] == [0.5, 0.5]  # charged whether or not its coin came up


#: rounds of the timing probe: the classifier's threshold is fitted on the even rounds, scored on the odd
PROBE_ROUNDS = 60


def test_a_simulated_idle_node_hands_its_transport_the_zero_update_training_would_have_made(
    tmp_path, monkeypatch
):
    """``--idle-training skip`` changes no reply: a node whose coin did not come up hands its
    transport the same increment whether it trained or skipped its steps, byte for byte (names,
    shapes, dtypes, +0.0 everywhere), and empty metrics either way; so the released sum is the same
    function of the coins, and only the work differs. Without the simulation's :data:`SKIP_IDLE` in
    the node's ``context.state`` (every deployed node) the node trains."""
    monkeypatch.setattr(participation, "contributes", lambda rate: False)
    _, grid, train_message = _hidden_node(tmp_path, 1)
    context = grid.contexts[min(grid.contexts)]
    assert context.state[participation.SIMULATION][participation.SKIP_IDLE] is False
    admitted = app_module.admit(train_message(1), context)
    assert not admitted.contributes and not app_module.idle(admitted, context)
    steps, real_steps = [], app_module._train_steps
    monkeypatch.setattr(app_module, "_train_steps", lambda *a: steps.append(1) or real_steps(*a))
    worked, worked_metrics = app_module.train_admitted(admitted, context)
    assert steps == [1]
    context.state[participation.SIMULATION] = ConfigRecord({participation.SKIP_IDLE: True})
    skipped, skipped_metrics = app_module.train_admitted(admitted, context)
    assert steps == [1]  # no local step
    assert worked_metrics == skipped_metrics == {}
    assert list(worked) == list(skipped)
    for name, value in worked.items():
        assert (value.shape, value.dtype) == (skipped[name].shape, skipped[name].dtype)
        assert value.numpy().tobytes() == skipped[name].numpy().tobytes() == bytes(value.nbytes)


def _hidden_node(tmp_path: Path, rounds: int):
    """A hidden-participation run's real ClientApp, its in-process nodes, and ``train_message(rnd)``:
    the server's own train instruction of round ``rnd`` to the first node (server/secure_round.py)."""
    from common.models import adapter_size
    from common.privacy.mechanisms.mechanism import run_mechanism
    from server.evaluation import Evaluator
    from server.secure_round import round_params, train_messages

    cfg = _cfg(
        tmp_path / "run",
        threat_model="secure-aggregation-hidden",
        sample_rate=0.5,
        max_participations=0,
        rounds=rounds,
    )
    state = Evaluator(cfg).initial_state()
    shapes = {k: tuple(v.shape) for k, v in state.items()}
    release = run_mechanism(cfg, adapter_size(shapes)).for_round(bytes(32), shapes)
    client = load_component(CLIENT_APP)
    grid = InProcessGrid(client, NODES, to_flat(cfg), state_root=tmp_path / "nodes")
    grid.provision()  # (the messages below go to the ClientApp directly, not through the grid)
    nodes = sorted(grid.contexts)
    return (
        client,
        grid,
        lambda rnd: train_messages(
            release.noise_std(len(nodes)),
            round_params(release, rnd, tuple(nodes), bytes(32), grid.run.run_id),
            state,
        )[0],
    )


def test_a_node_without_its_identity_or_the_roster_refuses_a_secure_round_before_training(
    tmp_path, monkeypatch
):
    """A node that cannot check signatures cannot hold its guarantee against a server that deviates
    from the protocol: it refuses the round in one line, before it loads data or trains."""
    from common.secagg import identity

    client, grid, train_message = _hidden_node(tmp_path, 1)
    monkeypatch.setattr(app_module, "_shard", lambda *a: pytest.fail("loaded its data"))
    node = min(grid.contexts)
    for key in (identity.ROSTER, identity.IDENTITY_KEY):
        del grid.contexts[node].node_config[key]
        with pytest.raises(
            Exception, match="secure aggregation needs this node's identity key and the federation's roster"
        ):
            client(train_message(1), grid.contexts[node])
    other = sorted(grid.contexts)[1]
    grid.contexts[node].node_config[identity.IDENTITY_KEY] = grid.contexts[other].node_config[
        identity.IDENTITY_KEY
    ]
    grid.contexts[node].node_config[identity.ROSTER] = str(tmp_path / "elsewhere.pub")
    identity.provision([tmp_path / "stranger"], tmp_path / "elsewhere.pub")  # a roster without this key
    with pytest.raises(Exception, match="is not on the roster"):
        client(train_message(1), grid.contexts[node])


def test_a_classifier_of_reply_time_and_size_guesses_the_hidden_coin_no_better_than_chance(
    tmp_path, monkeypatch
):
    """The audit's probe, through the real ClientApp train handler and the server's own train
    instruction: one node answers PROBE_ROUNDS hidden-participation rounds with a known, balanced
    coin sequence; the server-side observables are the reply's size (bytes) and the handler's wall
    time. Every reply has the same size. A threshold on the time (the best cut and direction on the
    even rounds) then guesses the coin of the odd rounds: under constant work it does no better
    than chance. Threshold: at most 23 of 30 right (P[Binomial(30, 1/2) >= 24] = 7e-4); a node that
    trains only when its coin comes up is guessed 30 of 30 (the audit: 17 of 18)."""
    from server.exchange import message_bytes

    rng = np.random.default_rng(0)
    coins = [bool(c) for c in rng.permutation([0, 1] * (PROBE_ROUNDS // 2))]
    feed = iter(coins)
    monkeypatch.setattr(participation, "contributes", lambda rate: next(feed))
    client, grid, train_message = _hidden_node(tmp_path, PROBE_ROUNDS)
    node = min(grid.contexts)
    times, sizes = [], set()
    for rnd in range(1, PROBE_ROUNDS + 1):
        msg = train_message(rnd)
        start = time.perf_counter()
        reply = client(msg, grid.contexts[node])
        times.append(time.perf_counter() - start)
        sizes.add(message_bytes(reply))
    assert len(sizes) == 1  # the size says nothing
    t, c = np.asarray(times), np.asarray(coins)
    fit, score = slice(0, None, 2), slice(1, None, 2)

    def accuracy(cut: float, slow_trained: bool, part: slice) -> float:
        return float(np.mean((t[part] > cut) == (c[part] if slow_trained else ~c[part])))

    cut, slow = max(((x, d) for x in t[fit] for d in (True, False)), key=lambda g: accuracy(*g, fit))
    right = round(accuracy(cut, slow, score) * len(t[score]))
    assert right <= 23, f"the reply time gives the coin away: {right} of {len(t[score])} guessed"
