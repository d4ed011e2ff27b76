"""A node enforces its client-level guarantee itself (client/node/release_ledger.py, client/node/policy.py):
each (run, round) released once and only within the run's plan, the node's budget across runs, and a
trust setting that refuses releases the server would see with less than the node's own noise."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from flwr.app import Context, Message, RecordDict

import client.app as client_app
from client.node import sdk
from client.node.policy import NodePolicy
from client.node.shard import node_shard
from client.node.state import client_ledger
from common.config import to_flat
from common.errors import FedloraError
from common.lazy import load_component
from common.presets import preset
from common.wire import TrainInstruction
from tests.conftest import run_cli
from tests.harness import TINY, federate, message_identity

PAIRS = [("A warm, funny film.", 1), ("Tedious and far too long.", 0)] * 6
RUN = dict(max_train_examples=200, eval_examples=40, local_steps=1, batch_size=8, num_clients=1)
OWNER = "rotten-tomatoes/0-of-1"


@pytest.fixture(scope="module")
def own_data(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("owner") / "reviews.jsonl"
    path.write_text("".join(json.dumps({"text": t, "label": y}) + "\n" for t, y in PAIRS))
    return path


def _local(**kw):
    """dp-fedavg with local noise: σ 1, C 0.5, so each release carries std 0.5."""
    settings = {**RUN, "mechanism": "dp-fedavg", "noise_multiplier": 1.0, "clip": 0.5, **kw}
    return preset("minilm-rt", **settings).check()


def _ask(app, cfg, node: dict, rnd: int, state, run_id: int = 42) -> Message:
    message_identity()
    content = TrainInstruction(rnd, state, noise_std=0.5).to_record()
    msg = Message(content, dst_node_id=1001, message_type="train", group_id=str(rnd))
    ctx = Context(run_id=run_id, node_id=1001, node_config=node, state=RecordDict(), run_config=to_flat(cfg))
    return app(msg, ctx)


@pytest.mark.heavy
def test_a_replayed_or_unplanned_round_is_refused_never_noised_again(tmp_path, own_data):
    """The audit's sequence against a 2-round plan: rounds 1, 1, 1, 2, 3, 50 give one release for
    round 1 and one for round 2; the repeats and the rounds past the plan are refused."""
    cfg = _local(rounds=2)
    node = {"data-path": str(own_data), "state-dir": str(tmp_path / "st")}
    state = node_shard(node, cfg)[2].bundle.initial
    app = load_component("client.app:app")
    released, refused = [], []
    for rnd in (1, 1, 1, 2, 3, 50):
        try:
            reply = _ask(app, cfg, node, rnd, state)
        except FedloraError as exc:
            refused.append((rnd, str(exc)))
            continue
        assert not reply.has_error()
        released.append(rnd)
    assert released == [1, 2]
    assert [r for r, _ in refused] == [1, 1, 3, 50]
    assert all("already answered" in why for r, why in refused if r == 1)
    assert all("outside the run's plan of 2 rounds" in why for r, why in refused if r > 2)
    rows = client_ledger(tmp_path / "st", OWNER, cfg.delta).rows()
    assert [(r["run"], r["round"], r["sigma"], r["p"]) for r in rows] == [
        ("42", 1, 1.0, 1.0),
        ("42", 2, 1.0, 1.0),
    ]


def test_the_client_budget_holds_across_runs_and_restarts(tmp_path, own_data):
    """Local noise σ 1, one round: the run's plan fits a budget of 7, two such runs do not; the
    second run is refused before training, from the ledger the first left on disk."""
    cfg = _local(rounds=1)
    node = {"data-path": str(own_data), "state-dir": str(tmp_path / "st"), "client-epsilon": 7.0}
    state = node_shard(node, cfg)[2].bundle.initial
    app = load_component("client.app:app")
    assert not _ask(app, cfg, node, 1, state, run_id=1).has_error()
    with pytest.raises(
        FedloraError, match=r"node policy: client-level budget 7 exceeded: .* spent before it"
    ):
        _ask(app, cfg, node, 1, state, run_id=2)
    assert [r["run"] for r in client_ledger(tmp_path / "st", OWNER, cfg.delta).rows()] == ["1"]


@pytest.mark.parametrize(
    ("change", "seen"),
    [
        (dict(threat_model="central"), "the clipped update with no noise (central noise"),
        (dict(threat_model="distributed", min_replies=1), "each reply with noise std sigma*C/sqrt(m)"),
        (
            dict(
                mechanism="dr-encoder",
                threat_model="central",
                encode_at="server",
                codec="identity",
                stats_noise_multiplier=2.0,
            ),
            "the raw, unclipped update (--encode-at server)",
        ),
    ],
)
def test_a_node_that_trusts_no_one_refuses_before_training(tmp_path, own_data, monkeypatch, change, seen):
    cfg = _local(rounds=1, **change)
    trained = []
    monkeypatch.setattr(client_app, "local_update", lambda *a, **k: trained.append(1))
    node = {"data-path": str(own_data), "state-dir": str(tmp_path / "st"), "trust": "none"}
    state = node_shard(node, cfg)[2].bundle.initial
    with pytest.raises(FedloraError) as err:
        _ask(load_component("client.app:app"), cfg, node, 1, state)
    message = str(err.value)
    assert "\n" not in message and message.startswith("node policy: this node trusts no one")
    assert seen in message and "--trust server" in message
    assert not trained and not (tmp_path / "st" / "client-ledger.sqlite").exists()
    NodePolicy(trust="server").check_run(cfg)  # a node that trusts the server takes part
    if cfg.threat_model == "distributed":
        with pytest.raises(
            FedloraError, match="trusts a secure aggregate only; the server would see each reply"
        ):
            NodePolicy(trust="aggregate").check_run(cfg)


def test_trust_defaults_and_bad_values():
    local = _local(rounds=1)
    central = local.replace(threat_model="central").check()
    assert NodePolicy().trusts == "server"  # a simulation node: no policy
    assert NodePolicy(client_epsilon=8.0).trusts == "none"  # a data owner's policy
    NodePolicy(client_epsilon=8.0).check_run(local)
    with pytest.raises(FedloraError, match="trusts no one"):
        NodePolicy(client_epsilon=100.0).check_run(central)
    with pytest.raises(FedloraError, match="trust must be one of none, aggregate, server"):
        NodePolicy.from_node_config({"trust": "everyone"})
    assert sdk.NodeConfig("h:1", "d", "dp-fedavg", 8.0).node_config()["trust"] == "none"
    assert sdk.NodeConfig("h:1", "d", "dp-fedavg", 8.0, trust="server").node_config()["trust"] == "server"


def test_fedlora_node_takes_trust(tmp_path, own_data, capsys):
    base = ["node", "--superlink", "127.0.0.1:9092", "--data", str(own_data), "--mechanism", "dp-fedavg"]
    argv = [*base, "--epsilon", "8", "--trust", "server", "--insecure", "--state-dir", str(tmp_path)]
    assert run_cli([*argv, "--print-command"]) == 0
    assert re.search(r'trust *= *"server"', capsys.readouterr().out)
    assert run_cli([*base, "--trust", "maybe", "--print-command"]) != 0
    assert "invalid choice" in capsys.readouterr().err


@pytest.mark.integration
def test_simulation_nodes_keep_a_release_ledger(tmp_path):
    cfg = preset("minilm-rt", **{**TINY, "rounds": 2}, mechanism="dp-fedavg", noise_multiplier=1.0)
    cfg = cfg.replace(sample_rate=1.0, out_dir=str(tmp_path / "run")).check()
    federate(cfg)
    for k in range(cfg.num_clients):
        rows = client_ledger(tmp_path / "nodes" / f"node-{k}", f"rotten-tomatoes/{k}-of-2", cfg.delta).rows()
        assert [r["round"] for r in rows] == [1, 2] and {r["threat_model"] for r in rows} == {"local"}


def _ftrl(**kw):
    """dp-ftrl (central noise, planned for epsilon 8) over 6 rounds, bands 2 at p 0.5."""
    settings = {**RUN, "mechanism": "dp-ftrl", "threat_model": "central", "target_epsilon": 8.0, "clip": 0.5}
    return preset("minilm-rt", **{**settings, "rounds": 6, "sample_rate": 0.5, **kw}).check()


def _central(app, cfg, node: dict, rnd: int, state) -> Message:
    message_identity()
    content = TrainInstruction(rnd, state, noise_std=0.0).to_record()
    msg = Message(content, dst_node_id=1001, message_type="train", group_id=str(rnd))
    ctx = Context(run_id=42, node_id=1001, node_config=node, state=RecordDict(), run_config=to_flat(cfg))
    return app(msg, ctx)


def _released(app, cfg, node, state, rounds) -> tuple[list[int], list[str]]:
    released, refused = [], []
    for rnd in rounds:
        try:
            assert not _central(app, cfg, node, rnd, state).has_error()
            released.append(rnd)
        except FedloraError as exc:
            refused.append(str(exc))
    return released, refused


@pytest.mark.heavy
def test_a_node_refuses_a_round_that_breaks_the_min_separation(tmp_path, own_data):
    """Correlated noise under min-sep 2: a server asking rounds 1-5 of one node gets 1, 3 and 5; the
    node's own ledger refuses 2 and 4 (the run's epsilon assumes every two rounds at least 2 apart)."""
    cfg = _ftrl()
    node = {"data-path": str(own_data), "state-dir": str(tmp_path / "st"), "trust": "server"}
    state = node_shard(node, cfg)[2].bundle.initial
    released, refused = _released(load_component("client.app:app"), cfg, node, state, range(1, 6))
    assert released == [1, 3, 5]
    assert len(refused) == 2 and all("less than the run's min-separation 2" in why for why in refused)
    rows = client_ledger(tmp_path / "st", OWNER, cfg.delta).rows()
    assert [r["round"] for r in rows] == [1, 3, 5] and {r["p"] for r in rows} == {1.0}


@pytest.mark.heavy
def test_a_node_takes_part_only_in_its_cyclic_groups_rounds(tmp_path, own_data):
    from common.privacy.participation.participation import group_of

    cfg = _ftrl(participation="cyclic-poisson")
    node = {"data-path": str(own_data), "state-dir": str(tmp_path / "st"), "trust": "server"}
    state = node_shard(node, cfg)[2].bundle.initial
    released, refused = _released(load_component("client.app:app"), cfg, node, state, range(1, 7))
    group = group_of(1001, 2)
    assert released == [r for r in range(1, 7) if (r - 1) % 2 == group]
    assert len(refused) == 3 and all(f"this node is in cyclic group {group} of 2" in why for why in refused)
