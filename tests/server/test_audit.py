"""``fedlora audit client`` end to end: canary clients in a real federation (server/audit/), each
canary node admitted and released as any node is (client/audit/canary.py)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from tests.conftest import run_cli
from tests.harness import audit_json, records


@pytest.mark.integration
def test_audit_client_without_noise_separates_the_canaries(tmp_path, capsys):
    """Canaries in a real federation, clipped but not noised: the cosine attack wins outright."""
    out = tmp_path / "audit"
    argv = ["--rounds", "1", "--canaries", "12", "--arms", "no noise (clip only)", "--out", str(out)]
    (free,) = audit_json(argv, capsys)
    assert free["epsilon"] is None and free["threat_model"] is None and free["auc"] == 1.0
    assert free["canaries"] == 12 and free["eps_lower_bound"] > 0
    assert free["relation"] == "zero-out"  # the run's threat model (local) though nothing is claimed
    assert json.loads((out / "audit.json").read_text())[0]["arm"] == "no noise (clip only)"
    # an audit never writes into an earlier one; too few canaries is a one-line error
    assert run_cli(["audit", "client", "--out", str(out)]) == 2
    assert "never writes into an earlier one" in capsys.readouterr().err
    assert run_cli(["audit", "client", "--canaries", "5", "--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err.strip()
    assert "at least 10 canaries" in err and len(err.splitlines()) == 1


@pytest.mark.integration
def test_audit_client_bound_stays_below_the_claim(tmp_path, capsys):
    """``fedlora audit client`` with every arm (the default), each a real federation of 2 real
    clients and 16 canary slots for 2 rounds, the secure ones included (min-replies 16 of the 18
    nodes, every one asked and summed): the no-noise arm wins outright, every private arm's lower
    bound stays below its claim."""
    from server.audit.cli import CLIENT_ARMS

    results = audit_json(["--rounds", "2", "--canaries", "16", "--out", str(tmp_path / "a")], capsys)
    assert [r["arm"] for r in results] == list(CLIENT_ARMS)
    free, *private = results
    assert free["auc"] == 1.0 and free["epsilon"] is None and free["eps_lower_bound"] > 0
    assert [r["threat_model"] for r in private] == [
        "central",
        "distributed",
        "secure-aggregation",
        "secure-aggregation-hidden",
    ]
    assert private[0]["unit"] == "client-level (add/remove one client)"
    for r in private:
        assert r["canaries"] == 16 and r["real_clients"] == 2 and r["rounds"] == 2
        assert 0 < r["epsilon"] <= 8.0 + 1e-6 and r["eps_lower_bound"] < r["epsilon"], r["arm"]
    for r in private[2:]:
        trains = [x for x in records(Path(r["run_dir"])) if x["phase"] == "train"]
        assert [(x["applied"], x["sampled"], x["secure"]["unmasked"]) for x in trains] == [(True, 18, 18)] * 2


@pytest.mark.parametrize(
    ("argv", "sizes"),
    [
        (["--quick"], {"secure-aggregation": (120, 108), "secure-aggregation-hidden": (120, 108)}),
        ([], {"secure-aggregation": (110, 99), "secure-aggregation-hidden": (1100, 990)}),
    ],
    ids=["quick", "full"],
)
def test_audit_client_checks_every_arm_as_the_federation_it_runs(tmp_path, capsys, monkeypatch, argv, sizes):
    """``fedlora audit client [--quick]`` with every arm (the default) and 100 canaries passes the
    config check, each arm checked as the federation it runs: the real clients and the canary slots
    (20 + 100 with --quick, 1,000 + 100 in the preset), the secure arms' min-replies 9/10 of the
    cohort the plan counts over all of them (every node under hidden participation, p·N otherwise).
    The federations themselves are stubbed out here (test_audit_client_bound_stays_below_the_claim runs
    them)."""
    import server.audit.client
    from common.privacy.planning.secure_plan import cohort_bound
    from server.audit.cli import CLIENT_ARMS

    ran = []

    def audit_run(cfg, canaries, out, seed, confidence):
        out.mkdir(parents=True)
        ran.append((cfg, server.audit.client.federation(cfg, canaries).check()))
        return {"canaries": canaries}

    monkeypatch.setattr(server.audit.client, "audit_run", audit_run)
    assert run_cli(["audit", "client", *argv, "--json", "--out", str(tmp_path / "a")]) == 0
    results = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")]
    assert [r["arm"] for r in results] == list(CLIENT_ARMS) and len(ran) == len(CLIENT_ARMS)
    for cfg, fed in ran:
        assert fed.num_clients == cfg.num_clients + 100
        if cfg.threat_model in sizes:
            assert (cohort_bound(fed), fed.min_replies) == sizes[cfg.threat_model]
            assert cfg.min_replies == fed.min_replies <= fed.num_clients


def _audit_federation(tmp_path, monkeypatch, **run) -> tuple[dict, dict, dict, list]:
    """``audit_run`` on 2 real clients + 10 canaries (seed 0: 3 included, 7 excluded), 1 round, every
    node sampled, with ``run`` overrides. Returns the result, canary j -> included, node id ->
    [accepted reply or InvalidReply], and the partitions the real ClientApp was asked to train."""
    import client.app
    import server.round
    from common.presets import preset
    from common.wire import InvalidReply
    from server.audit.client import audit_run
    from tests.harness import TINY

    trained, replies = [], {}
    real_app, real_accept = client.app.app, server.round.accept_reply

    def app(msg, ctx):
        if msg.metadata.message_type == "train":
            trained.append(int(ctx.node_config["partition-id"]))
        return real_app(msg, ctx)

    def accept(reply, *args, **kwargs):
        try:
            out = real_accept(reply, *args, **kwargs)
        except InvalidReply as exc:
            replies.setdefault(reply.metadata.src_node_id, []).append(exc)
            raise
        replies.setdefault(reply.metadata.src_node_id, []).append(out[0])
        return out

    monkeypatch.setattr(client.app, "app", app)
    monkeypatch.setattr(server.round, "accept_reply", accept)
    cfg = preset("minilm-rt", **TINY, mechanism="dp-fedavg", clip=0.5, noise_multiplier=1.0, **run).check()
    result = audit_run(cfg, 10, tmp_path / "audit", seed=0, confidence=0.95)
    included = json.loads((tmp_path / "audit" / "canaries.json").read_text())["included"]
    assert 0 < sum(included) < 10
    return result, dict(enumerate(included)), replies, trained


@pytest.mark.integration
def test_audit_client_excluded_canary_releases_a_zero_increment_under_zero_out(tmp_path, monkeypatch):
    """Local noise is accounted for zero-out: an excluded canary's node, sampled, sends the release
    of an all-zero increment (noise switched off here, so the reply is exactly zero) through the
    client's release, accepted like any reply, and never its trained update."""
    import common.privacy.mechanisms.mechanism
    from client.node.state import CLIENT_LEDGER_FILE
    from common.privacy.accounting.ledger import Ledger
    from server.inprocess import FIRST_NODE_ID

    # the pre-noise release (the mechanism's client half draws its noise here)
    monkeypatch.setattr(common.privacy.mechanisms.mechanism, "add_noise", lambda state, std: state)
    result, included, replies, trained = _audit_federation(tmp_path, monkeypatch, threat_model="local")
    assert result["relation"] == "zero-out" and result["unit"] == "client-level (zero-out one client)"
    assert sorted(trained) == [0, 1]  # only the real clients trained
    for j, member in included.items():
        (inc,) = replies[FIRST_NODE_ID + 2 + j]
        assert isinstance(inc, dict)  # accepted: the same release, meta and noise std as any reply
        norm = math.sqrt(sum(float(v.square().sum()) for v in inc.values()))
        assert norm == (pytest.approx(0.5, rel=1e-4) if member else 0.0)
    # admitted and released as any node: every node, canary or real, charged its own release ledger
    nodes = tmp_path / "audit" / "nodes"
    for k in range(12):
        ledger = Ledger.open(nodes / f"node-{k}" / CLIENT_LEDGER_FILE, "client-level")
        assert len(ledger.events()) == 1, k


@pytest.mark.integration
@pytest.mark.parametrize("coin", [True, False])
def test_audit_client_hidden_canaries_flip_the_coin_real_clients_flip(tmp_path, monkeypatch, coin):
    """Under hidden participation an included canary contributes only when its own coin comes up, as a
    real client does (client/app.py takes_part); an excluded one always sends zero. With every
    coin up, the nonzero encodings are the 2 real clients' and the included canaries'; with every
    coin down, all 12 are zero."""
    from common.presets import preset
    from common.privacy.mechanisms import discrete
    from common.privacy.participation import participation
    from server.audit.client import audit_run
    from tests.harness import TINY

    monkeypatch.setattr(participation, "contributes", lambda rate: coin)
    sent = []
    real_encode = discrete.encode
    monkeypatch.setattr(discrete, "encode", lambda x, *a: sent.append(bool(x.any())) or real_encode(x, *a))
    cfg = preset(
        "minilm-rt",
        **{**TINY, "num_clients": 2, "rounds": 1},
        mechanism="dp-fedavg",
        threat_model="secure-aggregation-hidden",
        target_epsilon=8.0,
        clip=0.5,
        sample_rate=0.5,
        min_replies=7,  # a majority of the 12 nodes every round asks (audit_run checks the federation)
        secagg_neighbours=2,
    )
    audit_run(cfg, 10, tmp_path / "audit", seed=0, confidence=0.95)
    included = json.loads((tmp_path / "audit" / "canaries.json").read_text())["included"]
    assert len(sent) == 12 and sum(sent) == ((2 + sum(included)) if coin else 0)


@pytest.mark.integration
def test_audit_client_excluded_canary_is_absent_under_central_noise(tmp_path, monkeypatch):
    """Central noise is accounted for add/remove: an excluded canary's node, sampled, answers at once
    with an error reply, which the round rejects: the aggregate sums the real clients' and the
    included canaries' replies only, over the constant p·N."""
    from common.privacy.mechanisms.mechanism import GaussianSum
    from server.inprocess import FIRST_NODE_ID

    summed = []
    real_mean = GaussianSum.mean

    def mean(self):
        summed.append((self.count, self.expected))
        return real_mean(self)

    monkeypatch.setattr(GaussianSum, "mean", mean)
    result, included, replies, trained = _audit_federation(tmp_path, monkeypatch, threat_model="central")
    assert result["relation"] == "add/remove" and result["unit"] == "client-level (add/remove one client)"
    assert sorted(trained) == [0, 1]
    members = sum(included.values())
    assert summed == [(2 + members, 12.0)]  # p·N = 1 x 12 whatever replied
    for j, member in included.items():
        (reply,) = replies[FIRST_NODE_ID + 2 + j]
        assert isinstance(reply, dict) if member else "audit canary excluded" in str(reply)
    (line,) = [r for r in records(Path(result["run_dir"])) if r["phase"] == "train"]
    assert line["replied"] == 2 + members and len(line["rejected"]) == 10 - members
    assert line["dropouts"] == []  # answered, not waited for
