"""The ``wishart`` local optimizer (M2: a fresh Gaussian A per step, noise on the full clipped gradient
before the projection): its norms and sums against per-example autograd of the base weights, the law
of its projected noise, the dense update and its undo, σ for the amplified ε, and where it may run."""

from __future__ import annotations

import json
import math

import pytest
import torch
from safetensors.torch import load_file

from client.dp.grad_sample import GradSampler
from client.dp.optimizers.wishart import WishartDp, projected_noise, projection_shape
from client.dp.prism import clip_coefficients
from client.dp.sample_plan import SamplePlan
from client.train_local import _wishart_privacy
from common.config import RunConfig
from common.errors import FedloraError
from common.models.dense_delta import dense_deltas, restore_base
from common.models.lora import lora_layers
from common.privacy.mechanisms.wishart import wishart_epsilon, wishart_sigma
from common.tasks.language_model import LanguageModelTask
from tests.conftest import per_example_base_grads, run_cli

TEXTS = [
    "a gorgeous, witty film",
    "dull.",
    "it never quite finds its footing, sadly, and then it ends",
    "ok then, fine",
]


def test_ghost_norms_and_projected_sum_match_per_example_autograd(tiny_llama, smollm2_tokenizer):
    """One padded batch through the engine's hooks: ``‖G_i‖²`` summed over layers and
    ``Σ_i c_i G_i A_tᵀ`` equal what per-example autograd of the base weights gives."""
    model = tiny_llama.to(torch.float64).train()
    task = LanguageModelTask(smollm2_tokenizer, 32)
    examples = task.encode(TEXTS, [0] * len(TEXTS))
    assert len({len(ex["ids"]) for ex in examples}) >= 3  # padding is exercised
    opt = WishartDp(lora_layers(model), lr=1e-2)
    opt.begin()
    with GradSampler(model, layer_io=True) as sampler:
        batch = task.collate(examples, torch.device("cpu"))
        task.per_example_loss(model, batch).sum().backward()
        io = sampler.layer_io()
    model.zero_grad(set_to_none=True)
    full = per_example_base_grads(model, task, examples)
    want_sq = torch.tensor(
        [sum(float(g.square().sum()) for g in gi.values()) for gi in full], dtype=torch.float64
    )
    got_sq = opt.sq_norms(io)
    assert torch.allclose(got_sq.double(), want_sq, rtol=1e-5)
    clip = float(want_sq.sqrt().median())
    alpha = clip_coefficients([got_sq], clip)
    assert (alpha < 1).any() and (alpha == 1).any()
    opt.accumulate(io, alpha)
    for k, a in opt.a.items():
        want = sum(float(c) * gi[k] for c, gi in zip(alpha, full, strict=True)) @ a.double().T
        assert torch.allclose(opt.sums[k].double(), want, rtol=1e-4, atol=1e-6 * float(want.abs().max()))


def test_projected_noise_has_the_law_of_full_noise_projected():
    """``std·ε Lᵀ`` has rows ``N(0, std² A Aᵀ)``, the law of ``std·E Aᵀ`` with ``E`` (rows, in)."""
    gen = torch.Generator().manual_seed(0)
    r, n, rows, std = 3, 12, 40_000, 0.7
    a = torch.randn((r, n), generator=gen, dtype=torch.float64) / r**0.5
    noise = projected_noise(a, rows, std, gen)
    direct = std * torch.randn((rows, n), generator=gen, dtype=torch.float64) @ a.T
    want = std**2 * a @ a.T
    for sample in (noise, direct):
        cov = sample.T @ sample / rows
        assert torch.allclose(cov, want, atol=4 * float(want.diag().max()) / rows**0.5)
    assert abs(float(noise.mean())) < 0.02


def test_each_step_draws_a_fresh_gaussian_a_and_merges_a_dense_update(tiny_llama):
    layers = lora_layers(tiny_llama)
    loaded = {k: layer.get_base_layer().weight.detach().clone() for k, layer in layers.items()}
    opt = WishartDp(layers, lr=1e-2)
    draws = []
    for _ in range(2):
        opt.begin()
        draws.append({k: a.clone() for k, a in opt.a.items()})
        for k in opt.sums:
            opt.sums[k] = torch.randn_like(opt.sums[k])
        opt.step(noise_std=0.0, denom=4.0, generator=torch.Generator().manual_seed(1))
    for k, a in draws[0].items():
        r = a.shape[0]
        assert not torch.equal(a, draws[1][k])
        # N(0, 1/r), drawn from OS entropy: the sample variance of m entries has relative standard
        # error sqrt(2 / (m - 1)); 5 of them (a fixed 0.35 failed on a 64-entry module)
        assert abs(float(a.var()) * r - 1) < 5 * math.sqrt(2 / (a.numel() - 1))
    deltas = dense_deltas(tiny_llama)
    assert set(deltas) == set(layers)
    for k, layer in layers.items():
        assert not bool(layer.lora_B["default"].weight.any())  # B stays 0: the next A is data-free
        assert torch.allclose(deltas[k], opt.deltas[k].detach())
        assert float(deltas[k].abs().max()) > 0
    assert opt.summary()["assumptions"]["a_redrawn_each_step"]
    restore_base(tiny_llama)
    assert dense_deltas(tiny_llama) == {}
    for k, layer in layers.items():
        assert torch.equal(layer.get_base_layer().weight, loaded[k])


def test_wishart_refuses_nonzero_b_and_a_claim_without_fresh_draws(tiny_llama):
    layers = lora_layers(tiny_llama)
    opt = WishartDp(layers, lr=1e-2)
    opt.begin()
    opt.begin()  # two draws, no step: not one fresh A per released step
    assert not opt.summary()["assumptions"]["a_redrawn_each_step"]
    plan = SamplePlan(1000, 0.05, 100, 1.0, 0.5, 1e-5, 0.0, projection=(4, 32, 8))
    amplified = plan.amplified
    report = {"eps_tight": amplified.baseline, "eps_gdp": 1.0, "mu": 1.0}
    refused = _wishart_privacy(plan, report, opt.summary()["assumptions"])
    assert refused["epsilon"] == pytest.approx(amplified.baseline) and refused["claim"].startswith("baseline")
    assert "redrawn independently at every step" in refused["claim"]
    assert plan.claimed_epsilon(None)[0] == pytest.approx(amplified.baseline)  # nothing reported: no claim
    held = {name: True for name in opt.summary()["assumptions"]}
    assert plan.claimed_epsilon(held)[0] == amplified.amplified < amplified.baseline
    with torch.no_grad():
        next(iter(layers.values())).lora_B["default"].weight.fill_(0.1)
    with pytest.raises(FedloraError, match="needs lora_B = 0"):
        WishartDp(layers, lr=1e-2)


def test_projection_shape_bounds_the_gradient_rank_by_tokens(tiny_llama):
    rank, dim, grad_rank = projection_shape(lora_layers(tiny_llama), tokens=8)
    # 2 layers x (q_proj 32x32, v_proj 16x32): min(8, out, in) each
    assert (rank, dim, grad_rank) == (4, 32, 4 * 8)
    assert projection_shape(lora_layers(tiny_llama), tokens=64)[2] == 2 * (32 + 16)


def test_wishart_sigma_meets_the_amplified_target_and_falls_back_to_the_baseline():
    sigma = wishart_sigma(3.0, 0.0125, 100, 1e-5, rank=8, dim=384, grad_rank=768)
    claim = wishart_epsilon(sigma, 0.0125, 100, 1e-5, rank=8, dim=384, grad_rank=768)
    assert claim.claimed == "amplified" and 2.99 <= claim.epsilon <= 3.0 and claim.baseline > 3.5
    near = wishart_sigma(3.0, 0.0125, 100, 1e-5, rank=60, dim=64, grad_rank=64)
    assert wishart_epsilon(near, 0.0125, 100, 1e-5, rank=60, dim=64, grad_rank=64).epsilon <= 3.0


def test_wishart_needs_peft_init_and_never_runs_in_a_federation(capsys):
    with pytest.raises(FedloraError, match="lora-init peft"):
        RunConfig(mechanism="wishart", sample_epsilon=3, lora_init="balanced").check()
    cfg = RunConfig(mechanism="wishart", sample_epsilon=3).check()
    assert cfg.init_kind == "peft"
    with pytest.raises(FedloraError, match="run it with fedlora train-local"):
        cfg.check_federated()
    assert run_cli(["simulate", "--preset", "small", "--mechanism", "wishart", "--sample-epsilon", "3"]) == 2
    err = capsys.readouterr().err.strip()
    assert "federations exchange LoRA factors" in err and len(err.splitlines()) == 1


@pytest.mark.heavy
def test_train_local_wishart_claims_the_amplified_epsilon_and_saves_the_dense_update(tmp_path, capsys):
    out = tmp_path / "run"
    args = ["--local-steps", "3", "--batch-size", "8", "--max-train-examples", "64", "--eval-examples", "16"]
    code = run_cli(["train-local", "--mechanism", "wishart", *args, "--out", str(out), "--json"])
    assert code == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    p = result["privacy"]
    assert p["claim"].startswith("amplified") and p["epsilon"] <= 3.0 < p["epsilon_baseline"]
    assert p["wishart"]["noise_multiplier"] == pytest.approx(result["noise_multiplier"])
    saved = load_file(str(out / "adapter.safetensors"))
    deltas = {k: v for k, v in saved.items() if k.endswith(".delta")}
    assert deltas and all(v.abs().max() > 0 for v in deltas.values())
    assert result["dense_norm"] == pytest.approx(float(sum(v.square().sum() for v in deltas.values()) ** 0.5))
    # the next run in this process starts from the base weights as loaded (the shared model was restored)
    code = run_cli(["train-local", "--mechanism", "fedavg", *args, "--out", str(tmp_path / "next"), "--json"])
    assert code == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["before"] == result["before"]
