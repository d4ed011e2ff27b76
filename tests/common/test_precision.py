"""``--precision bf16`` (common/models/precision.py): the frozen base in bf16, everything that decides
privacy or learning in fp32, and every contribution clipped in fp32 before it is summed."""

from __future__ import annotations

import json
import math

import pytest
import torch
from flwr.app import Context, Message, RecordDict

from client.dp import engine
from client.dp.engine import DenseUpdate, DpSteps, dp_train
from client.dp.optimizers import make_dp_optimizer
from client.node.shard import node_shard
from common.config import to_flat
from common.errors import FedloraError
from common.lazy import load_component
from common.models.lora import lora_layers
from common.models.precision import resolve_precision
from common.presets import preset
from common.privacy.mechanisms.release import global_norm
from common.wire import TrainInstruction
from server.simulate import simulate
from tests.harness import TINY, message_identity

CLIP = 0.05  # client-level: below one client's increment
SAMPLE_CLIP = 1e-3  # sample-level: below one example's gradient
#: TINY with less data: bf16 products are emulated, several times slower than fp32, on a CPU
#: without native bf16, and these tests check dtypes and clipping, not learning
BF16 = {**TINY, "precision": "bf16", "max_train_examples": 32, "eval_examples": 16}


def _bf16_shard(**kw):
    cfg = preset("minilm-rt", **{**BF16, **kw}).check()
    node = {"partition-id": 0, "num-partitions": cfg.num_clients}
    return cfg, node, node_shard(node, cfg)[2]


def test_the_frozen_base_is_bf16_and_every_trainable_fp32():
    _, _, shard = _bf16_shard()
    params = dict(shard.bundle.model.named_parameters())
    frozen = {p.dtype for p in params.values() if not p.requires_grad}
    trainable = {n: p.dtype for n, p in params.items() if p.requires_grad}
    assert frozen == {torch.bfloat16}
    assert set(trainable.values()) == {torch.float32}
    assert any("lora_A" in n for n in trainable) and any("classifier" in n for n in trainable)
    assert resolve_precision("fp32", "cpu") == "fp32"
    # CPU bf16 attention runs the eager path (faster there); an fp32 base keeps the fused one
    assert shard.bundle.model.get_base_model().config._attn_implementation == "eager"
    fp32 = node_shard(
        {"partition-id": 0, "num-partitions": 2}, preset("minilm-rt", **TINY, precision="fp32").check()
    )[2]
    assert fp32.bundle.model.get_base_model().config._attn_implementation == "sdpa"
    with pytest.raises(FedloraError, match="needs --precision fp32"):
        preset("minilm-rt", **BF16, mechanism="dp-adamw", local_optimizer="wishart").check()


@pytest.mark.heavy
def test_per_example_contributions_are_clipped_in_fp32_under_bf16(monkeypatch):
    """Sample-level: each example's joint gradient (LoRA factors and head) reaches the clip in fp32,
    and its clip coefficient brings exactly that vector, the one summed, to norm ≤ C."""
    _, _, shard = _bf16_shard()
    model = shard.bundle.model
    opt = make_dp_optimizer("dp-adamw", lora_layers(model), 1e-3)
    seen, dtypes = [], set()
    clip_coefficients = engine.clip_coefficients

    def spy_clip(sqs, clip):
        alpha = clip_coefficients(sqs, clip)
        seen.append(float((torch.sqrt(sqs[0]) * alpha).max()))
        dtypes.update({sqs[0].dtype, alpha.dtype})
        return alpha

    accumulate = opt.accumulate

    def spy_accumulate(grads, alpha):
        dtypes.update(g.dtype for pair in grads.values() for g in pair)
        return accumulate(grads, alpha)

    monkeypatch.setattr(engine, "clip_coefficients", spy_clip)
    opt.accumulate = spy_accumulate
    plan = DpSteps(steps=1, sample_rate=0.5, clip=SAMPLE_CLIP, noise_multiplier=1.0)
    dp_train(shard.trainee, opt, plan, DenseUpdate(1e-3))
    assert seen and dtypes == {torch.float32}
    assert SAMPLE_CLIP * 0.5 < max(seen) <= SAMPLE_CLIP * (1 + 1e-5)


@pytest.mark.heavy
def test_a_client_level_release_is_clipped_in_fp32_under_bf16(tmp_path):
    """Client-level: the reply of a bf16 client (central noise: the client adds none) is fp32 and
    within C."""
    cfg, node, shard = _bf16_shard(
        mechanism="dp-fedavg", threat_model="central", noise_multiplier=1.0, clip=CLIP, lr=0.05, batch_size=4
    )
    node["state-dir"] = str(tmp_path)
    message_identity()
    msg = Message(
        TrainInstruction(1, shard.bundle.initial).to_record(), dst_node_id=1001, message_type="train"
    )
    ctx = Context(run_id=7, node_id=1001, node_config=node, state=RecordDict(), run_config=to_flat(cfg))
    reply = load_component("client.app:app")(msg, ctx)
    sent = reply.content["increment"].to_torch_state_dict()
    assert {v.dtype for v in sent.values()} == {torch.float32}
    assert CLIP * 0.5 < global_norm(sent) <= CLIP * (1 + 1e-6)


@pytest.mark.slow  # make test-all: two bf16 federations; make test keeps the bf16 dtype and clipping tests
@pytest.mark.integration
def test_bf16_runs_are_reproducible(tmp_path):
    def run(name):
        cfg = preset(
            "minilm-rt",
            **{**BF16, "local_steps": 1, "batch_size": 2, "workers": 1, "out_dir": str(tmp_path / name)},
        )
        simulate(cfg.check())
        assert json.loads((tmp_path / name / "summary.json").read_text())["precision"] == "bf16"
        lines = [json.loads(x) for x in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]
        return [(r.get("train_loss"), r.get("accuracy"), r.get("loss")) for r in lines]

    first, second = run("a"), run("b")
    assert first == second and all(math.isfinite(v) for r in first[1:] for v in r if v is not None)
