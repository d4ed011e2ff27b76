"""Cross-device client-level DP (issue 16): server optimizers in the run loop, adaptive clipping,
the clip-only diagnostic, what-if noise cohorts and zero-shot heads; their bad input."""

import argparse
import json
import math
import re
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import load_file

from client.node.policy import NodePolicy
from common.config import SERVER_OPTIMIZERS
from common.errors import FedloraError
from common.models.head_init import descriptions, head_features
from common.presets import PRESETS, preset
from common.privacy.accounting.accountants import Event
from common.privacy.accounting.calibration import events_epsilon
from common.privacy.accounting.ledger import Ledger
from common.privacy.accounting.report import title
from common.privacy.mechanisms.adaptive_clip import combined_noise_multiplier
from common.privacy.mechanisms.mechanism import private_mean
from common.privacy.participation.threat import THREATS
from common.privacy.planning.plan import plan_noise
from common.wire import CLIP_BIT
from server import optimizers
from server.bench.suite.sections import privacy
from server.checkpoint import CHECKPOINT_FILE
from server.evaluation import Evaluator
from server.federation import _round_line
from tests.conftest import run_cli
from tests.harness import TINY, federate, records

DP = dict(mechanism="dp-fedavg", threat_model="central", sample_rate=0.5, num_clients=4)


@pytest.mark.parametrize(
    "changes, message",
    [
        (dict(target_quantile=-0.1), "target-quantile must be in (0, 1)"),
        (dict(server_lr=-1.0), "server-lr must be > 0"),
        (dict(clip_lr=-0.2), "clip-lr must be > 0"),
        (dict(mechanism="fedavg", adaptive_clip=True), "--adaptive-clip needs a client-level release"),
        (dict(mechanism="fedavg", clip_only=True), "--clip-only needs a client-level release"),
        (dict(**DP, noise_multiplier=1.0, noise_cohort=1), "--noise-cohort 1 is below the simulated cohort"),
        (dict(**DP, noise_multiplier=1.0, clip_only=True), "--clip-only adds no noise"),
        (
            dict(**{**DP, "threat_model": "local"}, noise_multiplier=1.0, adaptive_clip=True),
            "--adaptive-clip needs --threat-model central or distributed",
        ),
        (dict(server_optimizer="lamb"), "unknown server-optimizer 'lamb'"),
        (dict(server_beta2=1.0), "server-beta2 must be in [0, 1)"),
    ],
)
def test_bad_cross_device_options_fail_in_one_line(changes, message):
    with pytest.raises(FedloraError, match=re.escape(message)) as err:
        preset("minilm-rt", **changes).check()
    assert "\n" not in str(err.value)


def test_adaptive_clipping_charges_one_gaussian_mechanism():
    """The ledger's σ is the pair's: z_Δ on the update and σ_b on the count compose back to it
    (Andrew et al. 2021 Thm 1), and the default σ_b is K/20 for the expected cohort K."""
    cfg = preset("minilm-rt", **{**DP, "num_clients": 100}, noise_multiplier=0.9, adaptive_clip=True).check()
    plan = plan_noise(cfg)
    assert plan.sigma == 0.9 and plan.count_std == pytest.approx(cfg.expected_cohort / 20)
    assert combined_noise_multiplier(plan.update_sigma, plan.count_std) == pytest.approx(0.9)
    assert plan.update_sigma > plan.sigma
    with pytest.raises(FedloraError, match="count"):  # 2σ_b <= σ: no z_Δ exists
        plan_noise(cfg.replace(noise_multiplier=5.0))


def test_noise_cohort_gives_the_mean_the_noise_of_the_larger_cohort():
    """Central noise in a what-if run: the mean over the K simulated clients carries std σC/K'
    (what a K'-client round with the same σ carries), measured on zero increments."""
    cfg = preset("minilm-rt", **DP, noise_multiplier=0.8, noise_cohort=50, clip=0.5).check()
    plan = plan_noise(cfg)
    assert plan.cohort_scale == pytest.approx(2 / 50) and plan.simulated_sigma == pytest.approx(0.8 * 2 / 50)
    zeros = [{"x": torch.zeros(200_000)} for _ in range(2)]
    mean = private_mean(
        zeros, THREATS["central"], plan.update_sigma * plan.cohort_scale, 0.5, cfg.expected_cohort
    )
    assert float(mean["x"].std()) == pytest.approx(0.8 * 0.5 / 50, rel=0.01)
    # local noise: each client's std scales by sqrt(K/K'), so the mean of K carries σC/sqrt(K')
    local = plan_noise(cfg.replace(threat_model="local"))
    assert local.client_std(2) / math.sqrt(2) == pytest.approx(0.8 * 0.5 / math.sqrt(50))


@pytest.mark.integration
def test_clip_only_diagnostic_is_labelled_not_private_and_keeps_no_ledger(tmp_path):
    out = tmp_path / "r"
    cfg = preset("minilm-rt", **TINY, mechanism="dp-fedavg", clip_only=True, clip=1e-3, out_dir=str(out))
    federate(cfg.check())
    summary = json.loads((out / "summary.json").read_text())
    assert summary["privacy"].startswith("NOT PRIVATE: clip-only diagnostic")
    assert not (out / "ledger.sqlite").exists() and "client_privacy" not in summary
    delta = {k: v for k, v in load_file(out / CHECKPOINT_FILE).items()}
    start = Evaluator(cfg).initial_state()
    moved = math.sqrt(sum(float((delta[k] - start[k]).pow(2).sum()) for k in start))
    assert 0 < moved <= 1e-3 * 1.0001  # the mean of two increments clipped to 1e-3


@pytest.mark.integration
def test_what_if_run_is_labelled_everywhere(tmp_path, capsys):
    out = tmp_path / "r"
    cfg = preset(
        "minilm-rt",
        **{**TINY, "num_clients": 2},
        mechanism="dp-fedavg",
        threat_model="central",
        noise_multiplier=1.0,
        noise_cohort=200,
        out_dir=str(out),
    ).check()
    federate(cfg)
    whom = f"a population of {200 / cfg.sample_rate:,.0f} clients sampled at rate {cfg.sample_rate:g} (200 per round)"
    summary = json.loads((out / "summary.json").read_text())
    assert summary["privacy"].startswith(f"WHAT-IF, valid for {whom}, not for this simulation")
    assert summary["client_privacy"]["what_if"].startswith(f"WHAT-IF, valid for {whom}")
    report = Ledger.open(out / "ledger.sqlite", "client-level").report()
    assert report["validity"].startswith(f"valid for {whom}") and "sigma 0.01" in report["validity"]
    assert json.loads((out / "privacy.json").read_text())["validity"] == report["validity"]
    assert title(report).startswith("WHAT-IF, ") and title(report).endswith(f"for {whom}")  # privacy.png
    capsys.readouterr()
    assert run_cli(["privacy", "ledger", str(out / "ledger.sqlite")]) == 0
    assert capsys.readouterr().out.startswith(f"WHAT-IF, valid for {whom}")
    row = json.loads((out / "metrics.jsonl").read_text().splitlines()[-1])
    ledger = Ledger.open(out / "ledger.sqlite")
    lead = "pld" if row["eps_tight"] >= row["eps_gdp"] else "gdp"  # the larger leads (issue 53 item 9)
    assert f"client-level eps (WHAT-IF: for {whom}) {lead} " in _round_line(row, "accuracy", ledger)
    ledger.close()
    # the bench suite's privacy table: the unit starts with WHAT-IF
    run = SimpleNamespace(
        section="client-level", seed=0, arm=SimpleNamespace(label="what-if", target_epsilon=0)
    )
    table = privacy([{"run": run, "output": summary, "dir": str(out)}])
    assert table["rows"][0]["unit"].startswith(f"WHAT-IF, valid for {whom}")
    # the ledger charges the deployment's sigma; this run's own epsilon is far larger
    assert report["rounds"][0]["sigma"] == 1.0
    own = events_epsilon("pld", [Event(plan_noise(cfg).simulated_sigma, 1.0, 1)], cfg.delta)
    assert own > 10 * report["eps_tight"]


def _crash_at(rnd):
    def wrap(client, msg, ctx):
        if msg.metadata.message_type == "train" and msg.content["config"]["round"] == rnd:
            raise RuntimeError("server machine lost")
        return client(msg, ctx)

    return wrap


@pytest.mark.parametrize(
    "run",
    [
        dict(mechanism="fedavg", server_optimizer="adam", server_lr=0.01),
        pytest.param(  # the same state machinery as adam (make test-all)
            dict(mechanism="fedavg", server_optimizer="momentum", server_lr=0.5), marks=pytest.mark.slow
        ),
        dict(
            mechanism="dp-fedavg",
            clip_only=True,
            adaptive_clip=True,
            clip=0.05,
            clip_lr=0.5,
            threat_model="central",
        ),
    ],
    ids=["adam", "momentum", "adaptive-clip"],
)
@pytest.mark.integration
def test_a_resumed_run_continues_the_optimizer_and_clip_state_exactly(tmp_path, run):
    """Uninterrupted 2 rounds vs crashed in round 2 and resumed: the same adapter and clips (every
    node sampled, seeded local steps, no noise: the runs are deterministic)."""
    base = dict(**{**TINY, "rounds": 2, "local_steps": 1}, **run)
    whole = preset("minilm-rt", **base, out_dir=str(tmp_path / "whole")).check()
    federate(whole)
    cut = whole.replace(out_dir=str(tmp_path / "cut"))
    with pytest.raises(RuntimeError, match="server machine lost"):
        federate(cut, _crash_at(2))
    federate(cut.replace(resume=True))
    a, b = load_file(tmp_path / "whole" / CHECKPOINT_FILE), load_file(tmp_path / "cut" / CHECKPOINT_FILE)
    assert a.keys() == b.keys() and all(torch.allclose(a[k], b[k], rtol=0, atol=1e-7) for k in a)
    if run.get("server_optimizer", "sgd") != "sgd":
        assert any(k.startswith("server-optimizer/") for k in a)
    clips = [
        [r.get("clip") for r in records(tmp_path / d) if r["phase"] == "train"] for d in ("whole", "cut")
    ]
    assert clips[0] == clips[1]
    if run.get("adaptive_clip"):
        assert len(set(clips[0])) == 2  # the clip moved every round


@pytest.mark.integration
def test_adaptive_clipping_moves_the_clip_from_the_clients_bits(tmp_path):
    """C far below every increment: all bits are 0, so without count noise (the clip-only
    diagnostic) C grows by exactly exp(η γ) per round; with noise the ledger charges the pair's σ
    and each round clips to the C the last one chose."""
    seen = []

    def spy(client, msg, ctx):
        reply = client(msg, ctx)
        seen.append(float(reply.content["increment"][CLIP_BIT].numpy()[0]))
        return reply

    run = dict(**{**TINY, "rounds": 2}, mechanism="dp-fedavg", threat_model="central", adaptive_clip=True)
    exact = preset(
        "minilm-rt", **run, clip_only=True, clip=1e-4, eval_every=2, out_dir=str(tmp_path / "a")
    ).check()
    federate(exact, spy)
    recs = [r for r in records(tmp_path / "a") if r["phase"] == "train"]
    assert seen == [0.0] * 4 and recs[0]["clip"] == 1e-4
    assert "accuracy" not in recs[0] and "accuracy" in recs[1]  # --eval-every 2
    assert recs[1]["clip"] == pytest.approx(1e-4 * math.exp(0.2 * 0.5), rel=1e-9)
    noisy = preset("minilm-rt", **run, noise_multiplier=0.5, clip_count_std=1.0, out_dir=str(tmp_path / "b"))
    federate(noisy.check())
    recs = [r for r in records(tmp_path / "b") if r["phase"] == "train"]
    assert recs[1]["clip"] == recs[0]["next_clip"] != recs[0]["clip"]
    rows = Ledger.open(tmp_path / "b" / "ledger.sqlite", "client-level").rows()
    assert [r["sigma"] for r in rows] == [0.5, 0.5] and rows[1]["clip"] == pytest.approx(recs[1]["clip"])


@pytest.mark.heavy
def test_zero_shot_head_points_at_the_label_descriptions():
    cfg = preset("minilm-rt", **TINY, head_init="zero-shot").check()
    ev = Evaluator(cfg)
    random_rows = ev.initial_state()  # zero-shot; compare with the model's own init below
    head = next(k for k in random_rows if "classifier" in k and k.endswith("weight"))
    texts = descriptions("rotten-tomatoes", ev.split.corpus.label_names)
    assert texts == ["a negative movie review", "a positive movie review"]
    feats = head_features(ev.bundle.model, ev.bundle.tokenizer, texts, ev.bundle.device)
    centred = feats - feats.mean(0)
    cos = torch.nn.functional.cosine_similarity(random_rows[head], centred, dim=1)
    assert torch.allclose(cos, torch.ones(2), atol=1e-5)
    init_norm = ev.bundle.initial[head].norm(dim=1).mean()
    assert random_rows[head].norm(dim=1) == pytest.approx(init_norm.expand(2), rel=1e-5)
    with pytest.raises(FedloraError, match="scores label words"):
        Evaluator(preset("smollm2-rt", **TINY, head_init="zero-shot").check()).initial_state()


def test_cross_device_presets_have_about_a_hundred_clients_per_round():
    for name in ("minilm-rt-xdev", "minilm-bbc-xdev", "smollm2-rt-xdev"):
        cfg = preset(name).check()
        assert 90 <= cfg.expected_cohort <= 110, name
    assert PRESETS["minilm-rt-xdev"]["num_clients"] == 1000


def test_a_budgeted_node_refuses_clip_only_and_what_if_runs():
    base = dict(**DP, noise_multiplier=5.0)
    NodePolicy(client_epsilon=8.0, trust="server").check_run(preset("minilm-rt", **base).check())
    with pytest.raises(FedloraError, match="clip-only diagnostic"):
        NodePolicy(client_epsilon=8.0, trust="server").check_run(
            preset("minilm-rt", **DP, clip_only=True).check()
        )
    with pytest.raises(FedloraError, match="what-if run whose epsilon holds for a cohort of 100"):
        NodePolicy(client_epsilon=8.0, trust="server").check_run(
            preset("minilm-rt", **base, noise_cohort=100).check()
        )


def test_option_lists_agree_with_their_implementations():
    assert SERVER_OPTIMIZERS == optimizers.SERVER_OPTIMIZERS


@pytest.mark.slow  # ≈ 50 s: three in-process populations (make test-all)
@pytest.mark.process
def test_bench_scale_reports_time_and_memory_per_population(capsys):
    from server.bench import scale

    args = argparse.Namespace(
        preset="minilm-rt", populations="2,4", cohort=4, rounds=2, backend="inprocess", json=True
    )
    assert scale.run(args) == 0
    result = json.loads(capsys.readouterr().out)
    rows = result["rows"]
    assert [r["population"] for r in rows] == [2, 4] and rows[0]["client_s_ratio"] == 1.0
    assert all(r["client_s"] > 0 and r["peak_rss_mb"] > 100 and r["replies"] >= 1 for r in rows)
    with pytest.raises(FedloraError, match="--rounds >= 2"):
        scale.run(
            argparse.Namespace(
                preset="minilm-rt", populations="2", cohort=2, rounds=1, backend="inprocess", json=True
            )
        )


def test_bench_scale_on_ray_keeps_node_state_beside_its_run(tmp_path, monkeypatch):
    """The ray backend's nodes keep their state under the run's work folder, not in ~/.fedlora."""
    import subprocess

    from server.bench import scale

    seen = []
    monkeypatch.setattr(
        scale.subprocess,
        "run",
        lambda cmd, **kw: seen.append(kw.get("env")) or subprocess.CompletedProcess(cmd, 0, "", ""),
    )
    scale._ray({"num-clients": 2}, tmp_path / "ray-n2")
    assert seen[0]["FEDLORA_NODE_STATE_ROOT"] == str(tmp_path / "ray-n2-nodes")


def test_mean_pooling_reads_the_real_tokens_only():
    """With --pooling mean the head's input is the mean token state over the attention mask: a text
    scores the same alone and padded in a batch, and equals the masked mean of the encoder output."""
    cfg = preset("minilm-rt", **TINY, pooling="mean", precision="fp32").check()  # the pooling, exactly
    ev = Evaluator(cfg)
    model, tok = ev.bundle.model, ev.bundle.tokenizer
    texts = ["a fine film", "an overlong, tedious and thoroughly forgettable exercise in style"]
    batch = head_features(model, tok, texts, ev.bundle.device)
    alone = head_features(model, tok, texts[:1], ev.bundle.device)
    assert torch.allclose(batch[0], alone[0], atol=1e-5)
    enc = tok(texts, padding=True, return_tensors="pt")
    model.eval()
    with torch.no_grad():
        states = model.base_model.model.bert(**enc).last_hidden_state
    mask = enc["attention_mask"].unsqueeze(-1).float()
    assert torch.allclose(batch, (states * mask).sum(1) / mask.sum(1), atol=1e-5)
    with pytest.raises(FedloraError, match="--pooling mean is for encoder classifiers"):
        Evaluator(preset("smollm2-rt", **TINY, pooling="mean").check())


def test_bench_scale_speedup_is_against_the_sequential_fp32_row_of_the_same_population():
    """Issue 50: 2.5x at equal population read 3.5x when divided by the 10-node row. Every speedup
    divides by the in-process, sequential, fp32, one-worker row of its own N; without that row, none."""
    from server.bench.scale import speedup

    def row(n, precision, workers, client_s, engine="sequential"):
        return dict(
            population=n,
            backend="inprocess",
            engine=engine,
            precision=precision,
            workers=workers,
            client_s=client_s,
        )

    rows = [
        row(10, "fp32", 1, 0.100),
        row(100, "fp32", 1, 0.140),
        row(100, "bf16", 2, 0.056),
        row(200, "bf16", 2, 0.05),
        row(200, "fp32", 1, 0.05, engine="batched"),  # not the reference: another engine
    ]
    assert [speedup(r, rows) for r in rows] == [1.0, 1.0, 2.5, None, None]
