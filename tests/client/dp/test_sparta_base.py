"""``sparta-base``: SPARTA's row selection and sparse DP-AdamW on rows of the base weights, against
per-example autograd of those weights, and where it may run."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from client.dp.grad_sample import GradSampler
from client.dp.optimizers.sparta_base import SpartaBaseDp
from client.dp.prism import clip_coefficients
from common.config import RunConfig
from common.errors import FedloraError
from common.models.dense_delta import dense_deltas
from common.models.lora import lora_layers
from common.tasks.language_model import LanguageModelTask
from tests.conftest import per_example_base_grads, run_cli

TEXTS = [
    "a gorgeous, witty film",
    "dull.",
    "it never quite finds its footing, sadly, and then it ends",
    "ok then, fine",
]


def _io(model, task, examples):
    with GradSampler(model, layer_io=True) as sampler:
        task.per_example_loss(model, task.collate(examples, torch.device("cpu"))).sum().backward()
        io = sampler.layer_io()
    model.zero_grad(set_to_none=True)
    return io


def test_selection_then_masked_steps_match_per_example_autograd(tiny_llama, smollm2_tokenizer):
    """Selection releases |Σ clipped G_i| (noise 0 here); then norms and sums cover the kept rows
    only; only kept rows of the base weights move."""
    model = tiny_llama.to(torch.float64).train()
    task = LanguageModelTask(smollm2_tokenizer, 32)
    examples = task.encode(TEXTS, [0] * len(TEXTS))
    layers = lora_layers(model)
    loaded = {k: layer.get_base_layer().weight.detach().clone() for k, layer in layers.items()}
    opt = SpartaBaseDp(layers, lr=1e-2, keep=0.25, selection=1)
    full = per_example_base_grads(model, task, examples)

    opt.begin()
    io = _io(model, task, examples)
    sq = opt.sq_norms(io)
    want_sq = torch.tensor(
        [sum(float(g.square().sum()) for g in gi.values()) for gi in full], dtype=torch.float64
    )
    assert torch.allclose(sq.double(), want_sq, rtol=1e-5)
    alpha = clip_coefficients([sq], float(want_sq.sqrt().median()))
    opt.accumulate(io, alpha)
    opt.step(noise_std=0.0, denom=2.0, generator=torch.Generator().manual_seed(0))
    assert not opt.selecting and dense_deltas(model) == {}  # selection moves nothing
    for k in layers:
        clipped_sum = sum(float(a) * gi[k] for a, gi in zip(alpha, full, strict=True))
        diff = (opt.released[k].double() - clipped_sum.abs() / 2.0).abs()
        assert float(diff.max()) <= 1e-4 * float(clipped_sum.abs().max()), (
            k,
            float(diff.max()),
            diff.argmax(),
        )
        want_rows = torch.topk(opt.released[k].sum(1), len(opt.rows[k])).indices
        assert set(opt.rows[k].tolist()) == set(want_rows.tolist())
        assert len(opt.rows[k]) == round(0.25 * loaded[k].shape[0])

    opt.begin()
    io = _io(model, task, examples)
    sq = opt.sq_norms(io)
    want_sq = torch.tensor(
        [sum(float(gi[k][opt.rows[k]].square().sum()) for k in layers) for gi in full], dtype=torch.float64
    )
    assert torch.allclose(sq.double(), want_sq, rtol=1e-5)
    opt.accumulate(io, torch.ones(len(examples)))
    for k in layers:
        assert torch.allclose(
            opt.sums[k].double(), sum(gi[k][opt.rows[k]] for gi in full), rtol=1e-4, atol=1e-9
        )
    opt.step(noise_std=1.0, denom=2.0, generator=torch.Generator().manual_seed(0))
    for k, delta in dense_deltas(model).items():
        moved = (delta.abs().sum(1) > 0).nonzero().flatten()
        assert set(moved.tolist()) == set(opt.rows[k].tolist())  # noise and update on kept rows only
        assert not bool(layers[k].lora_B["default"].weight.any())
    assert opt.summary()["kept_coordinates"] == sum(len(opt.rows[k]) * loaded[k].shape[1] for k in layers)


def test_sparta_base_bad_input_and_federation_refusal(tiny_llama):
    with pytest.raises(FedloraError, match="rows"):
        SpartaBaseDp(lora_layers(tiny_llama), lr=1e-2, keep=33)  # v_proj has 16 rows, q_proj 32
    with pytest.raises(FedloraError, match="run it with fedlora train-local"):
        RunConfig(mechanism="sparta-base", sample_epsilon=3).check_federated()
    with pytest.raises(FedloraError, match="lora-init peft"):
        RunConfig(mechanism="sparta-base", sample_epsilon=3, lora_init="balanced").check()


@pytest.mark.slow  # ≈ 15 s; the optimizer is tested above, the dense-update wiring by wishart's e2e
def test_train_local_sparta_base_reports_rows_and_saves_the_dense_update(tmp_path, capsys):
    out = tmp_path / "run"
    args = ["--local-steps", "4", "--batch-size", "8", "--max-train-examples", "64", "--eval-examples", "16"]
    assert run_cli(["train-local", "--mechanism", "sparta-base", *args, "--out", str(out), "--json"]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    s = result["sparta"]
    assert s["rows_of"] == "base" and 0 < s["kept_coordinates"] < s["base_coordinates"]
    assert result["privacy"]["epsilon"] <= 3.0
    deltas = {k: v for k, v in load_file(str(out / "adapter.safetensors")).items() if k.endswith(".delta")}
    assert deltas and all(v.abs().max() > 0 for v in deltas.values())
