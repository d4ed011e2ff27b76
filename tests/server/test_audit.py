"""Empirical audits: the one-run bound against scipy's binomial and a simulated ε-DP randomized
response, the AUC against scipy's Mann-Whitney U, the one-shot estimate on Gaussian scores of known
μ, the K-models threshold bound against scipy's exact binomial interval and a Gaussian mechanism of
known ε, ``fedlora audit client`` end to end (canaries in a real federation) and ``fedlora audit mia``
(canary examples in a local run, or one canary in K runs)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from common.errors import FedloraError
from common.privacy.audit import (
    auc,
    clopper_pearson_upper,
    one_run_bound,
    one_run_epsilon,
    one_run_p_value,
    one_shot_mu,
    summarize,
    threshold_bound,
)
from common.privacy.gdp import eps_for_delta
from tests.conftest import run_cli
from tests.harness import records


def test_p_value_without_delta_is_the_binomial_tail():
    for m, r, v, eps in ((100, 40, 30, 1.0), (1000, 200, 150, 0.5), (50, 50, 50, 3.0)):
        q = math.exp(eps) / (1 + math.exp(eps))
        assert one_run_p_value(m, r, v, eps, 0.0) == pytest.approx(stats.binom.sf(v - 1, r, q), rel=1e-12)
    # δ > 0: the paper's Algorithm 2, transcribed literally (one term at a time)
    for m, r, v, eps, delta in ((100, 40, 30, 1.0, 1e-3), (1000, 300, 200, 0.7, 1e-5)):
        q = 1 / (1 + math.exp(-eps))
        alpha, mass = 0.0, 0.0
        for i in range(1, v + 1):
            mass += stats.binom.pmf(v - i, r, q)
            alpha = max(alpha, mass / i)
        expected = min(stats.binom.sf(v - 1, r, q) + alpha * delta * 2 * m, 1.0)
        assert one_run_p_value(m, r, v, eps, delta) == pytest.approx(expected, rel=1e-10)
    # δ only adds: the p-value grows with δ and so the bound shrinks
    assert one_run_p_value(100, 40, 30, 1.0, 1e-3) > one_run_p_value(100, 40, 30, 1.0, 0.0)
    assert one_run_epsilon(1000, 200, 180, 1e-3) < one_run_epsilon(1000, 200, 180, 0.0)


def test_bound_is_valid_and_tight_for_randomized_response():
    """Guesses that are ε0-randomized response: the 95 % bound stays below ε0 in ≥ 95 % of trials
    (up to sampling error) and comes close to it with many guesses."""
    rng = np.random.default_rng(0)
    eps0, m, trials = 2.0, 2000, 200
    q = math.exp(eps0) / (1 + math.exp(eps0))
    bounds = [one_run_epsilon(m, m, int(rng.binomial(m, q)), 0.0, 0.95) for _ in range(trials)]
    assert np.mean(np.asarray(bounds) > eps0) <= 0.05 + 3 * math.sqrt(0.05 * 0.95 / trials)
    assert np.median(bounds) > 0.8 * eps0


def test_bonferroni_bound_over_guess_counts_and_canary_minimum():
    rng = np.random.default_rng(1)
    included = rng.random(400) < 0.5
    scores = included + rng.normal(0, 0.3, 400)  # a strong attack
    best = one_run_bound(scores, included, 1e-5)
    assert best["eps_lower_bound"] > 1 and best["correct"] <= best["guesses"] <= 400
    null = one_run_bound(rng.normal(size=400), included, 1e-5)  # scores independent of membership
    assert null["eps_lower_bound"] < 0.5
    with pytest.raises(FedloraError, match="at least 10 canaries"):
        one_run_bound(scores[:9], included[:9], 1e-5)


def test_auc_is_the_mann_whitney_statistic():
    rng = np.random.default_rng(2)
    a, b = rng.normal(0.5, 1, 70), np.concatenate([rng.normal(0, 1, 50), [0.5, 0.5]])
    u = stats.mannwhitneyu(a, b, alternative="two-sided").statistic
    assert auc(a, b) == pytest.approx(u / (len(a) * len(b)), rel=1e-12)
    assert auc([1, 2, 3], [0, -1]) == 1.0 and auc([0], [0]) == 0.5


@pytest.mark.parametrize("mu", [0.5, 1.5])
def test_one_shot_estimate_recovers_the_gdp_mu_of_gaussian_scores(mu):
    """Scores of a μ-GDP Gaussian mechanism: N(μs, s²) included, N(0, s²) excluded."""
    rng = np.random.default_rng(4)
    s = 0.003
    inc = rng.random(20000) < 0.5
    scores = rng.normal(0, s, 20000) + inc * mu * s
    out = summarize(scores, inc, 1e-6)
    assert out["mu_estimate"] == pytest.approx(mu, abs=0.05)
    assert out["eps_estimate"] == pytest.approx(eps_for_delta(out["mu_estimate"], 1e-6), rel=1e-12)
    assert one_shot_mu(np.zeros(3) - 1, rng.normal(size=50)) == 0.0  # a negative shift is no leak


def test_summary_reports_auc_bound_and_estimate():
    rng = np.random.default_rng(3)
    included = rng.random(200) < 0.5
    scores = np.where(included, 1.0, 0.0) + rng.normal(0, 1, 200)
    out = summarize(scores, included, 1e-5)
    assert 0.6 < out["auc"] < 0.9 and 0 < out["eps_estimate"] < 10 and out["included"] == included.sum()
    assert json.dumps(out, allow_nan=False)


def _audit(argv: list[str], capsys, kind: str = "client") -> list[dict]:
    """``fedlora audit KIND --quick --json`` on a tiny federation (client) or client data (mia)."""
    tiny = ["--clients", "2"] if kind == "client" else ["--examples", "20"]
    assert run_cli(["audit", kind, "--quick", *tiny, "--json", *argv]) == 0
    return [json.loads(line) for line in capsys.readouterr().out.strip().splitlines() if line.startswith("{")]


@pytest.mark.integration
def test_audit_client_without_noise_separates_the_canaries(tmp_path, capsys):
    """Canaries in a real federation, clipped but not noised: the cosine attack wins outright."""
    out = tmp_path / "audit"
    argv = ["--rounds", "1", "--canaries", "12", "--arms", "no noise (clip only)", "--out", str(out)]
    (free,) = _audit(argv, capsys)
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

    results = _audit(["--rounds", "2", "--canaries", "16", "--out", str(tmp_path / "a")], capsys)
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
    from common.privacy.secure_plan import cohort_bound
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
    import common.privacy.mechanism
    from server.inprocess import FIRST_NODE_ID

    # the pre-noise release (the mechanism's client half draws its noise here)
    monkeypatch.setattr(common.privacy.mechanism, "add_noise", lambda state, std: state)
    result, included, replies, trained = _audit_federation(tmp_path, monkeypatch, threat_model="local")
    assert result["relation"] == "zero-out" and result["unit"] == "client-level (zero-out one client)"
    assert sorted(trained) == [0, 1]  # only the real clients trained
    for j, member in included.items():
        (inc,) = replies[FIRST_NODE_ID + 2 + j]
        assert isinstance(inc, dict)  # accepted: the same release, meta and noise std as any reply
        norm = math.sqrt(sum(float(v.square().sum()) for v in inc.values()))
        assert norm == (pytest.approx(0.5, rel=1e-4) if member else 0.0)


@pytest.mark.integration
@pytest.mark.parametrize("coin", [True, False])
def test_audit_client_hidden_canaries_flip_the_coin_real_clients_flip(tmp_path, monkeypatch, coin):
    """Under hidden participation an included canary contributes only when its own coin comes up, as a
    real client does (client/app.py takes_part); an excluded one always sends zero. With every
    coin up, the nonzero encodings are the 2 real clients' and the included canaries'; with every
    coin down, all 12 are zero."""
    from common.presets import preset
    from common.privacy import discrete, participation
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
    from common.privacy.mechanism import GaussianSum
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


def test_mia_canaries_are_seeded_random_vocabulary_texts():
    from transformers import AutoTokenizer

    from common.models.registry import resolve_model
    from server.audit.mia import CANARY_TOKENS, canary_texts

    tok = AutoTokenizer.from_pretrained(str(resolve_model("minilm-l6").locate()))
    texts, labels = canary_texts(tok, 40, 3, seed=1)
    assert (texts, labels) == canary_texts(tok, 40, 3, seed=1) and texts != canary_texts(tok, 40, 3, seed=2)[
        0
    ]
    assert len(set(texts)) == 40 and set(labels) == {0, 1, 2}
    ids = tok(texts, add_special_tokens=False)["input_ids"]
    assert all(abs(len(i) - CANARY_TOKENS) <= 4 for i in ids)  # re-tokenising merges a few word pieces
    assert not set().union(*map(set, ids)) & set(tok.all_special_ids)


def test_audit_mia_rejects_bad_input_in_one_line(tmp_path, capsys):
    for argv, message in (
        (["--canaries", "9"], "at least 10 canaries"),
        (["--arms", "dp-sgd"], "unknown arm 'dp-sgd'"),
        (["--confidence", "1.5"], "--confidence must be in"),
    ):
        assert run_cli(["audit", "mia", *argv, "--out", str(tmp_path / "a")]) == 2
        err = capsys.readouterr().err.strip()
        assert message in err and len(err.splitlines()) == 1
    assert not (tmp_path / "a").exists()


@pytest.mark.heavy
def test_audit_mia_without_noise_finds_the_memorised_canaries(tmp_path, capsys):
    """Random-sequence canaries in a small non-private local run: the loss attack wins outright."""
    out = tmp_path / "mia"
    argv = ["--steps", "20", "--canaries", "20", "--arms", "no noise (non-private AdamW)", "--out", str(out)]
    (free,) = _audit(argv, capsys, "mia")
    assert free["epsilon"] is None and free["mechanism"] == "none" and free["dataset"] == "bbc-news"
    assert free["auc"] >= 0.9 and free["eps_lower_bound"] > 0 and free["canaries"] == 20
    kept = json.loads((out / "arm-0" / "canaries.json").read_text())
    assert len(kept["scores"]) == 20 and sum(kept["included"]) == free["included"]
    assert run_cli(["audit", "mia", "--out", str(out)]) == 2  # never into an earlier audit
    assert "never writes into an earlier one" in capsys.readouterr().err


@pytest.mark.heavy
def test_audit_mia_plan_is_independent_of_the_inclusion_vector(tmp_path, monkeypatch):
    """The noise plan (N, hence q and σ) is made for the real examples + every canary: the same for
    two seeds whose inclusion vectors differ in size (9 and 3 of 10 canaries included)."""
    import server.audit.mia as mia
    from client.train_local_cli import local_defaults
    from common.config import RunConfig

    planned, real_plan = [], mia.local_plan

    def plan(cfg, model, examples):
        planned.append(examples)
        return real_plan(cfg, model, examples)

    monkeypatch.setattr(mia, "local_plan", plan)
    monkeypatch.setattr(mia, "train_one", lambda *args, **kwargs: {})  # the plan is all this test needs
    base = {k: v for k, v in local_defaults().items() if v is not None}
    cfg = RunConfig(
        **{
            **base,
            "dataset": "bbc-news",
            "max_train_examples": 20,
            "batch_size": 8,
            "mechanism": "dp-adamw",
            "sample_epsilon": 3.0,
        }
    ).check()
    a, b = (mia.audit_run(cfg.replace(seed=s), 10, tmp_path / str(s), s, 0.95) for s in (0, 2))
    assert (a["included"], b["included"]) == (9, 3) and a["examples"] != b["examples"]
    assert planned == [a["plan_examples"]] * 2 == [b["plan_examples"]] * 2 == [a["examples"] + 1] * 2
    assert a["sample_rate"] == b["sample_rate"] and a["noise_multiplier"] == b["noise_multiplier"]


@pytest.mark.slow  # ≈ 2 minutes: a non-private and a dp-adamw run
def test_audit_mia_bound_stays_below_the_claim(tmp_path, capsys):
    arms = "no noise (non-private AdamW),dp-adamw ε=3"
    free, private = _audit(
        ["--steps", "30", "--canaries", "40", "--arms", arms, "--out", str(tmp_path / "a")], capsys, "mia"
    )
    assert free["auc"] >= 0.9
    assert (
        private["epsilon"] == pytest.approx(3.0, abs=1e-3) and private["eps_lower_bound"] < private["epsilon"]
    )
    assert private["unit"].startswith("sample-level") and private["noise_multiplier"] > 0


def test_clopper_pearson_upper_matches_scipys_exact_interval():
    """One-sided (1 − α) upper = the upper end of scipy's two-sided exact interval at 1 − 2α."""
    for k, n, alpha in ((0, 10, 0.05), (3, 10, 0.01), (9, 10, 0.001), (17, 400, 0.025)):
        want = stats.binomtest(k, n).proportion_ci(confidence_level=1 - 2 * alpha, method="exact").high
        assert clopper_pearson_upper(k, n, alpha) == pytest.approx(want, rel=1e-9)
    assert clopper_pearson_upper(10, 10, 0.05) == 1.0
    assert clopper_pearson_upper(0, 20, 0.05) == pytest.approx(1 - 0.05 ** (1 / 20))  # closed form


def test_threshold_bound_closed_form_and_validity():
    # perfectly separated K/2 + K/2 models: both rates 0 at the cut; 2n distinct cuts share the 5 %
    n = 20
    bound = threshold_bound(np.arange(n) + 100.0, np.arange(n), delta=0.0)
    u = 1 - (0.05 / (2 * 2 * n)) ** (1 / n)
    assert (
        bound["eps_lower_bound"] == pytest.approx(math.log((1 - u) / u)) and bound["fpr"] == 0 == bound["fnr"]
    )
    assert threshold_bound(np.zeros(10), np.zeros(10), 1e-5)["eps_lower_bound"] == 0.0
    # the Gaussian mechanism at μ = 1 (ε at δ = 1e-5 known in closed form): the 95 % bound stays
    # below it in ≥ 95 % of trials and is positive with 2,000 models
    rng = np.random.default_rng(4)
    true_eps = eps_for_delta(1.0, 1e-5)
    bounds = [
        threshold_bound(rng.normal(1, 1, 1000), rng.normal(0, 1, 1000), 1e-5)["eps_lower_bound"]
        for _ in range(40)
    ]
    assert np.mean(np.asarray(bounds) > true_eps) <= 0.05 and min(bounds) > 0
    with pytest.raises(FedloraError, match="finite scores"):
        threshold_bound([1.0], [], 1e-5)


@pytest.mark.slow  # ≈ 40 s (10 trainings); the bound's statistics are tested above
def test_audit_mia_k_models_without_noise(tmp_path, capsys):
    """One canary, 10 tiny non-private runs: every file and field is there and the canary separates
    (AUC; 10 models are too few for a positive 95 % bound)."""
    out = tmp_path / "k"
    argv = ["--examples", "10", "--steps", "5", "--models", "10", "--arms", "no noise (non-private AdamW)"]
    argv += ["--out", str(out)]
    (free,) = _audit(argv, capsys, "mia")
    kept = json.loads((out / "arm-0" / "models.json").read_text())
    assert free["models"] == 10 == len(kept["scores"]) and free["models_in"] == sum(kept["included"])
    assert free["epsilon"] is None and 0 < free["models_in"] < 10 and free["auc"] >= 0.9
    assert run_cli(["audit", "mia", "--models", "5", "--out", str(tmp_path / "x")]) == 2
    assert "--models must be 0 (one run) or >= 10" in capsys.readouterr().err
