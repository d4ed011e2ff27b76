"""SPARTA on LoRA rows (client/dp/optimizers/sparta.py): the selection against an independent
per-example autograd computation, mask-then-clip, noise confined to the kept rows, a frozen head
while selecting, the plan's arithmetic, train-local and a federation end to end, and bad input."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from client.dp.engine import DenseUpdate, DpSteps, dp_train
from client.dp.grad_sample import GradSampler
from client.dp.optimizers.sparta import SpartaDp
from common.config import RunConfig
from common.errors import FedloraError
from common.models.lora import lora_layers
from common.models.lora_init import apply_lora_init
from common.presets import preset
from common.privacy.accounting.ledger import Ledger
from common.sparta import kept_rows, selection_steps
from common.tasks.training import Trainee
from server.simulate import simulate
from tests.client.dp.test_local_dp import FAST_LOCAL, _examples
from tests.conftest import run_cli
from tests.harness import TINY, LmTask, records

CPU = torch.device("cpu")


def _peft_weights(model):
    return {
        k: (v.lora_B["default"].weight, v.lora_A["default"].weight) for k, v in lora_layers(model).items()
    }


def _clipped_sum_by_autograd(model, task, examples, clip):
    """``Σ_i min(1, C/‖g_i‖) g_i`` over the PEFT LoRA weights, one backward per example (no hooks)."""
    weights = _peft_weights(model)
    flat = [w for pair in weights.values() for w in pair]
    total = [torch.zeros_like(w) for w in flat]
    for ex in examples:
        loss = task.per_example_loss(model, task.collate([ex], CPU)).sum()
        grads = torch.autograd.grad(loss, flat)
        norm = torch.sqrt(sum(g.square().sum() for g in grads))
        for acc, g in zip(total, grads, strict=True):
            acc += min(1.0, clip / float(norm)) * g
    it = iter(total)
    return {k: (next(it), next(it)) for k in weights}


def test_selection_keeps_the_rows_with_most_clipped_gradient_mass(tiny_llama):
    """Noise 0, rate 1: every selection step releases |clipped sum| / N, so the kept rows are the
    top rows of that matrix (lora_B rows, lora_A columns), and nothing moves while selecting."""
    apply_lora_init(tiny_llama, "balanced", seed=0, scale=0.3)
    task, data, clip = LmTask(), _examples(10), 0.05
    before = {k: (b.detach().clone(), a.detach().clone()) for k, (b, a) in _peft_weights(tiny_llama).items()}
    expected = _clipped_sum_by_autograd(tiny_llama, task, data, clip)
    opt = SpartaDp(lora_layers(tiny_llama), 1e-2, keep=3, selection=2)
    plan = DpSteps(steps=2, sample_rate=1.0, clip=clip, noise_multiplier=0.0)
    stats = dp_train(
        Trainee(tiny_llama, task, data, CPU),
        opt,
        plan,
        DenseUpdate(1e-2),
        rngs=(np.random.default_rng(0), None),
    )
    assert opt.masks is not None and stats["selection_steps"] == 2
    for name, (b, a) in _peft_weights(tiny_llama).items():
        assert torch.equal(b, before[name][0]) and torch.equal(a, before[name][1])  # selection moves nothing
        sum_b, sum_a = expected[name]
        mask_b, mask_a = opt.masks[name]
        assert set(torch.topk(sum_b.abs().sum(1), 3).indices.tolist()) == set(
            mask_b[:, 0].nonzero()[:, 0].tolist()
        )
        assert set(torch.topk(sum_a.abs().sum(0), 3).indices.tolist()) == set(
            mask_a[0].nonzero()[:, 0].tolist()
        )
        torch.testing.assert_close(opt.released[name][0], 2 * sum_b.abs() / len(data), rtol=1e-4, atol=1e-8)


def test_training_clips_and_noises_the_kept_rows_only(tiny_llama):
    apply_lora_init(tiny_llama, "balanced", seed=0, scale=0.3)
    task, data = LmTask(), _examples(12)
    opt = SpartaDp(lora_layers(tiny_llama), 1e-2, keep=0.25, selection=1)
    rngs = (np.random.default_rng(1), torch.Generator().manual_seed(1))
    dp_train(
        Trainee(tiny_llama, task, data, CPU), opt, DpSteps(1, 0.5, 1.0, 1.0), DenseUpdate(1e-2), rngs=rngs
    )
    before = {k: (b.detach().clone(), a.detach().clone()) for k, (b, a) in _peft_weights(tiny_llama).items()}
    # mask-then-clip: the clipped norms are those of the kept coordinates only
    opt.begin()
    with GradSampler(tiny_llama) as sampler:
        task.per_example_loss(tiny_llama, task.collate(data, CPU)).sum().backward()
        grads = sampler.factor_grads()
    tiny_llama.zero_grad(set_to_none=True)
    masked, full = 0.0, 0.0
    for name, (g_a, g_b) in grads.items():
        peft_b, peft_a = opt.roots[name] * g_a, opt.roots[name] * g_b.mT  # ∂lora_B, ∂lora_A
        mask_b, mask_a = opt.masks[name]
        masked = masked + (peft_b * mask_b).square().sum((1, 2)) + (peft_a * mask_a).square().sum((1, 2))
        full = full + peft_b.square().sum((1, 2)) + peft_a.square().sum((1, 2))
    torch.testing.assert_close(opt.sq_norms(grads), masked)
    assert bool((masked < full).all())
    # noise 5: everything kept moves, nothing else does
    dp_train(
        Trainee(tiny_llama, task, data, CPU), opt, DpSteps(2, 0.5, 1.0, 5.0), DenseUpdate(1e-2), rngs=rngs
    )
    for name, (b, a) in _peft_weights(tiny_llama).items():
        mask_b, mask_a = (m.bool() for m in opt.masks[name])
        moved_b = (b != before[name][0]).any(1)
        moved_a = (a != before[name][1]).any(0)
        assert torch.equal(moved_b, mask_b[:, 0]) and torch.equal(moved_a, mask_a[0])
    summary = opt.summary()
    assert summary["kept_coordinates"] < summary["lora_coordinates"]


def test_selection_freezes_a_dense_head(tiny_llama):
    apply_lora_init(tiny_llama, "balanced", seed=0)
    head = tiny_llama.get_output_embeddings()
    head.weight.requires_grad_(True)
    before = head.weight.detach().clone()
    opt = SpartaDp(lora_layers(tiny_llama), 1e-2, keep=0.5, selection=2)
    rngs = (np.random.default_rng(0), torch.Generator().manual_seed(0))
    trainee = Trainee(tiny_llama, LmTask(), _examples(6), CPU)
    dp_train(trainee, opt, DpSteps(2, 0.5, 1.0, 1.0), DenseUpdate(1e-2), rngs=rngs)
    assert torch.equal(head.weight, before)
    dp_train(
        Trainee(tiny_llama, LmTask(), _examples(6), CPU),
        opt,
        DpSteps(1, 0.5, 1.0, 1.0),
        DenseUpdate(1e-2),
        rngs=rngs,
    )
    assert not torch.equal(head.weight, before)  # trained in full after selection, as SPARTA's head


def test_plan_arithmetic_follows_the_official_code():
    assert kept_rows(0.2, 384) == 384 - int(384 * 0.8) == 77  # rows - int(rows·(1 - keep))
    assert kept_rows(5, 384) == 5 and kept_rows(1.0, 7) == 1
    assert selection_steps(0.1, 100) == 10 and selection_steps(0.1, 3) == 1
    with pytest.raises(FedloraError, match="only 16 rows"):
        kept_rows(17, 16)
    with pytest.raises(FedloraError, match="must be whole"):
        kept_rows(2.5, 16)
    with pytest.raises(FedloraError, match="at least 2 local steps"):
        selection_steps(0.5, 1)
    with pytest.raises(FedloraError, match="must be whole"):
        RunConfig(mechanism="sparta", sample_epsilon=3, sparta_keep=1.5).check()
    with pytest.raises(FedloraError, match="sparta-selection must be in"):
        RunConfig(mechanism="sparta", sample_epsilon=3, sparta_selection=1.0).check()


@pytest.mark.heavy
def test_train_local_sparta_charges_every_step_and_reports_the_kept_rows(tmp_path, capsys):
    out = tmp_path / "run"
    code = run_cli(["train-local", "--mechanism", "sparta", *FAST_LOCAL, "--out", str(out), "--json"])
    assert code == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    sparta = result["sparta"]
    assert sparta["selection_steps"] == 1 and sparta["keep"] == 0.2
    assert 0.19 < sparta["kept_coordinates"] / sparta["lora_coordinates"] < 0.21
    rows = Ledger.open(out / "sample-ledger.sqlite", "sample-level").rows()
    assert sum(r["count"] for r in rows) == 3 and {r["mechanism"] for r in rows} == {"sparta"}
    assert result["privacy"]["epsilon"] == pytest.approx(3.0, abs=1e-3)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--sparta-keep", "5000"], "only 384 rows"),
        (["--sparta-keep", "2.5"], "must be whole"),
        (["--local-steps", "1"], "at least 2 local steps"),
    ],
)
def test_train_local_sparta_bad_input_is_one_line_and_writes_nothing(args, message, tmp_path, capsys):
    out = tmp_path / "run"
    code = run_cli(["train-local", "--mechanism", "sparta", *FAST_LOCAL, *args, "--out", str(out)])
    err = capsys.readouterr().err.strip()
    assert code == 2 and message in err and len(err.splitlines()) == 1
    assert not out.exists()


@pytest.mark.slow  # ≈ 70 s: a 2-round federation
def test_sparta_federates_with_a_sample_level_ledger_per_node(tmp_path):
    cfg = preset(
        "minilm-rt", **{**TINY, "rounds": 2, "local_steps": 3}, mechanism="sparta", sample_epsilon=8.0
    )
    run_dir = simulate(cfg.check(), tmp_path / "r")
    assert [r["replied"] for r in records(run_dir)[1:]] == [2, 2]
    rows = Ledger.open(run_dir / "nodes" / "node-0" / "sample-ledger.sqlite", "sample-level").rows()
    assert [(r["round"], r["count"], r["mechanism"]) for r in rows] == [(1, 3, "sparta"), (2, 3, "sparta")]
