"""Factor-space DP-SGD (``dp-adamw``, ``ffa``) and the dense-head DP against Opacus 1.6 as an
independent implementation: per-example gradients, the global per-example clip, the clipped sum, the
division by the expected batch size, and the noise scale.

Opacus's clip factor is ``min(1, C / (‖g_i‖ + 1e-6))``; ours (client.dp.prism.clip_coefficients) is
``min(1, C / sqrt(‖g_i‖² + 1e-12))``. The two differ by a relative ``≈ 1e-6 / ‖g_i‖`` on clipped
examples. The float64 tests check both ways: exactly with Opacus's own factors fed to our
accumulation, and with our factors within the bound that difference implies (nothing looser).
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from opacus import GradSampleModule
from opacus.optimizers import DPOptimizer
from torch import Tensor, nn

import client.dp.engine as dp_train_module
from client.dp.engine import DenseUpdate, DpSteps, _DenseDp, dp_train
from client.dp.grad_sample import GradSampler
from client.dp.optimizers.factor import FactorDp
from client.dp.prism import clip_coefficients
from common.models.lora import dense_trainables, lora_layers
from common.tasks.classifier import ClassifierTask
from common.tasks.language_model import LanguageModelTask
from common.tasks.training import Trainee
from tests.conftest import randomize_lora

# Opacus's full backward hooks on LoRA Linears whose inputs need no gradient: expected and harmless.
pytestmark = pytest.mark.filterwarnings("ignore:Full backward hook is firing:UserWarning")

TEXTS = [
    "a gorgeous, witty film",
    "dull.",
    "it never quite finds its footing, sadly, and then it simply ends",
    "ok fine",
    "the plot twists are predictable but the cast sells every scene",
    "meh",
]
OPACUS_EPS = 1e-6  # opacus/optimizers/optimizer.py: clip_and_accumulate, ``norm + 1e-6``


def _opacus_alpha(sq: Tensor, clip: float) -> Tensor:
    """Opacus 1.6's per-example clip factors, from squared norms."""
    return (clip / (sq.sqrt() + OPACUS_EPS)).clamp(max=1.0)


def _lm_batch(tokenizer):
    task = LanguageModelTask(tokenizer, 32)
    examples = task.encode(TEXTS, [0] * len(TEXTS))
    lengths = {len(ex["ids"]) for ex in examples}
    assert len(examples) == len(TEXTS) and len(lengths) > 3, "want sequences of different lengths (padding)"
    return task, examples


def _lora_names(layer_name: str) -> tuple[str, str]:
    return f"{layer_name}.lora_B.default.weight", f"{layer_name}.lora_A.default.weight"


def _freeze_lora_a(model: nn.Module) -> None:
    for name, p in model.named_parameters():
        if ".lora_A." in name:
            p.requires_grad_(False)


def _opacus_pre_step(
    model: nn.Module, loss_fn, clip: float, expected_batch_size: float, reduction: str
) -> tuple[dict, dict]:
    """Opacus's released gradient with noise 0 (``loss_reduction=reduction``: ``"sum"`` gives the
    clipped per-sample sum, ``"mean"`` divides it by ``expected_batch_size``).

    Returns ``({name: p.grad}, {name: p.grad_sample})``.
    """
    gsm = GradSampleModule(model, loss_reduction=reduction)
    named = {n: p for n, p in model.named_parameters() if p.requires_grad}
    dpo = DPOptimizer(
        torch.optim.SGD(list(named.values()), lr=0.0),
        noise_multiplier=0.0,
        max_grad_norm=clip,
        expected_batch_size=expected_batch_size,
        loss_reduction=reduction,
    )
    dpo.zero_grad()
    losses = loss_fn(gsm)
    (losses.sum() if reduction == "sum" else losses.mean()).backward()
    assert dpo.pre_step(), "Opacus skipped the step"
    grads = {n: p.grad.detach().clone() for n, p in named.items()}
    samples = {n: p.grad_sample.detach().clone() for n, p in named.items()}
    gsm.remove_hooks()
    return grads, samples


@pytest.mark.parametrize("freeze_a", [False, True], ids=["dp-adamw", "ffa"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_factor_dp_clipped_sum_matches_opacus(tiny_llama, smollm2_tokenizer, freeze_a, dtype):
    model = tiny_llama
    randomize_lora(model)
    model.to(dtype).train()  # Opacus records activations only in training mode; Llama has no dropout here
    ref = copy.deepcopy(model)
    task, examples = _lm_batch(smollm2_tokenizer)
    batch = task.collate(examples, torch.device("cpu"))
    b = len(examples)

    opt = FactorDp(lora_layers(model), lr=0.0, freeze_a=freeze_a)
    if freeze_a:
        _freeze_lora_a(ref)
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable == {n for n, p in ref.named_parameters() if p.requires_grad}
    assert all(".lora_B." in n or (".lora_A." in n and not freeze_a) for n in trainable)

    with GradSampler(model) as sampler:
        task.per_example_loss(model, batch).sum().backward()
        grads = sampler.factor_grads()
    model.zero_grad(set_to_none=True)
    sq = opt.sq_norms(grads)
    clip = float(sq.sqrt().median())
    alpha = clip_coefficients([sq], clip)
    assert int((alpha < 1).sum()) >= b // 2 - 1 and bool((alpha < 1).any())
    opt.begin()
    opt.accumulate(grads, alpha)

    want, samples = _opacus_pre_step(ref, lambda m: task.per_example_loss(m, batch), clip, b, "sum")
    assert set(want) == trainable

    tight = dict(rtol=1e-10, atol=1e-13) if dtype == torch.float64 else dict(rtol=1e-4, atol=1e-7)
    # Per-example PEFT-weight gradients and their global squared norms.
    ours_per_example = {}
    for name, (g_a, g_b) in grads.items():
        root = opt.roots[name]  # paper factors -> PEFT weights (common/models/lora.py)
        key_b, key_a = _lora_names(name)
        ours_per_example[key_b] = root * g_a
        if freeze_a:
            assert opt.module_sums()[name][1] is None  # no ∂lora_A is summed, let alone released
        else:
            ours_per_example[key_a] = root * g_b.mT
    assert set(ours_per_example) == set(samples)
    for key, g in ours_per_example.items():
        torch.testing.assert_close(g, samples[key], **tight)
    opacus_sq = sum(s.flatten(1).square().sum(1) for s in samples.values())
    torch.testing.assert_close(sq, opacus_sq, **tight)

    # The clipped sums: ours (with our clip factors) vs Opacus's p.grad.
    ours = {}
    for name in grads:
        key_b, key_a = _lora_names(name)
        acc_b, acc_a = opt.module_sums()[name]
        ours[key_b] = acc_b
        if freeze_a:
            assert acc_a is None
        else:
            ours[key_a] = acc_a
    assert set(ours) == set(want)
    if dtype == torch.float32:
        for key in want:
            torch.testing.assert_close(ours[key], want[key], rtol=1e-5, atol=1e-6)
        return

    # float64: with Opacus's own clip factors our accumulation is exact ...
    opacus_alpha = _opacus_alpha(opacus_sq, clip)
    opt.begin()
    opt.accumulate(grads, opacus_alpha)
    for name in grads:
        key_b, key_a = _lora_names(name)
        torch.testing.assert_close(opt.module_sums()[name][0], want[key_b], **tight)
        if not freeze_a:
            torch.testing.assert_close(opt.module_sums()[name][1], want[key_a], **tight)
    # ... and with ours the only difference is the stabilizer: |Δα_i| ≈ α_i·1e-6/‖g_i‖, so the joint
    # difference of the sums is at most Σ_i |Δα_i|·‖g_i‖ (triangle inequality).
    norms = sq.sqrt()
    d_alpha = (alpha - opacus_alpha).abs()
    torch.testing.assert_close(
        d_alpha, opacus_alpha * OPACUS_EPS / norms * (alpha < 1), rtol=1e-3, atol=1e-15
    )
    diff = torch.sqrt(sum((ours[k] - want[k]).square().sum() for k in want))
    assert float(diff) <= float((d_alpha * norms).sum()) * (1 + 1e-6) + 1e-13


def _recording(opt: torch.optim.Optimizer, names: dict[int, str], log: list[dict]) -> None:
    """Replace ``opt.step`` by a recorder of the ``.grad`` it would consume."""

    def step(*args, **kwargs):
        log.append({names[id(p)]: p.grad.detach().clone() for g in opt.param_groups for p in g["params"]})

    opt.step = step


def _norms_and_clip(model: nn.Module, loss_fn, freeze_a: bool = False) -> tuple[Tensor, float]:
    """Per-example global norms (LoRA factors as clipped, plus dense trainables) and their median."""
    with GradSampler(model) as sampler:
        loss_fn(model).sum().backward()
        f, d = sampler.factor_grads(), sampler.dense_grads()
    model.zero_grad(set_to_none=True)
    sq = FactorDp(lora_layers(model), lr=0.0, freeze_a=freeze_a).sq_norms(f)
    for g in d.values():
        sq = sq + g.flatten(1).square().sum(1)
    if freeze_a:  # FactorDp(freeze_a=True) froze lora_A; the caller's own FactorDp does it again
        _freeze_lora_a(model)
    norms = sq.sqrt()
    return norms, float(norms.median())


def _assert_release_matches(got: dict, want: dict, norms: Tensor, clip: float, denom: float) -> None:
    """``got == want`` up to the clip stabilizer only: jointly over all parameters,
    ``‖got − want‖ ≤ Σ_i |α_i − α'_i|·‖g_i‖ / denom`` (α ours, α' Opacus's)."""
    assert set(got) == set(want)
    d_alpha = (clip_coefficients([norms.square()], clip) - _opacus_alpha(norms.square(), clip)).abs()
    bound = float((d_alpha * norms).sum()) / denom
    diff = float(torch.sqrt(sum((got[k] - want[k]).square().sum() for k in want)))
    scale = float(torch.sqrt(sum(w.square().sum() for w in want.values())))
    assert diff <= bound * (1 + 1e-6) + 1e-12 * scale, (diff, bound, scale)
    assert bound < 1e-5 * scale  # the stabilizer is a ~1e-6 relative effect, not a loophole


@pytest.mark.parametrize("freeze_a", [False, True], ids=["dp-adamw", "ffa"])
def test_dp_train_step_matches_opacus_mean_mode(tiny_llama, smollm2_tokenizer, freeze_a):
    """One whole engine step (sampling rate 1, micro-batches of 4 with their own padding, noise 0):
    the gradient handed to AdamW equals Opacus's ``mean``-mode release ``Σ clipped / (qN)``."""
    model = tiny_llama
    randomize_lora(model)
    model.to(torch.float64).train()
    ref = copy.deepcopy(model)
    task, examples = _lm_batch(smollm2_tokenizer)
    full = task.collate(examples, torch.device("cpu"))
    norms, clip = _norms_and_clip(model, lambda m: task.per_example_loss(m, full), freeze_a)

    opt = FactorDp(lora_layers(model), lr=1.0, freeze_a=freeze_a)
    if freeze_a:
        _freeze_lora_a(ref)
    log: list[dict] = []
    _recording(opt.opt, {id(p): n for n, p in model.named_parameters()}, log)
    plan = DpSteps(steps=1, sample_rate=1.0, clip=clip, noise_multiplier=0.0, microbatch=4)
    rngs = (np.random.default_rng(0), torch.Generator().manual_seed(0))
    stats = dp_train(
        Trainee(model, task, examples, torch.device("cpu")), opt, plan, DenseUpdate(1.0), rngs=rngs
    )
    assert stats == {"steps": 1, "examples-used": len(examples), "empty-batches": 0}
    (got,) = log

    want, _ = _opacus_pre_step(ref, lambda m: task.per_example_loss(m, full), clip, len(examples), "mean")
    _assert_release_matches(got, want, norms, clip, plan.sample_rate * len(examples))


@pytest.mark.parametrize("freeze_a", [False, True], ids=["dp-adamw", "ffa"])
def test_sgd_rule_steps_like_opacus_dp_sgd(tiny_llama, smollm2_tokenizer, freeze_a):
    """``--client-optimizer sgd`` (update rule ``sgd``): one engine step moves the factors by
    ``-lr`` times Opacus's ``mean``-mode release, i.e. what Opacus's DPOptimizer(SGD) would do."""
    model, lr = tiny_llama, 0.5
    randomize_lora(model)
    model.to(torch.float64).train()
    ref = copy.deepcopy(model)
    task, examples = _lm_batch(smollm2_tokenizer)
    full = task.collate(examples, torch.device("cpu"))
    norms, clip = _norms_and_clip(model, lambda m: task.per_example_loss(m, full), freeze_a)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    opt = FactorDp(lora_layers(model), lr=lr, freeze_a=freeze_a, rule="sgd")
    if freeze_a:
        _freeze_lora_a(ref)
    plan = DpSteps(steps=1, sample_rate=1.0, clip=clip, noise_multiplier=0.0, microbatch=4)
    rngs = (np.random.default_rng(0), torch.Generator().manual_seed(0))
    dp_train(
        Trainee(model, task, examples, torch.device("cpu")), opt, plan, DenseUpdate(lr, "sgd"), rngs=rngs
    )
    want, _ = _opacus_pre_step(ref, lambda m: task.per_example_loss(m, full), clip, len(examples), "mean")
    after = dict(model.named_parameters())
    got = {k: (before[k] - after[k].detach()) / lr for k in want}
    _assert_release_matches(got, want, norms, clip, plan.sample_rate * len(examples))
    assert all(torch.equal(before[k], after[k]) for k in before if k not in want)  # nothing else moved


@pytest.mark.heavy
def test_classifier_head_global_clip_matches_opacus(minilm, monkeypatch):
    """LoRA factors and a dense classifier head clipped together, one norm per example."""
    model = copy.deepcopy(minilm.model).to(torch.float64)
    randomize_lora(model)
    for m in model.modules():  # dropout off, yet modules in training mode (Opacus records only then)
        if isinstance(m, nn.Dropout):
            m.p = 0.0
    model.train()
    ref = copy.deepcopy(model)
    task = ClassifierTask(minilm.tokenizer, 32)
    examples = task.encode(TEXTS, [1, 0, 0, 1, 1, 0])
    full = task.collate(examples, torch.device("cpu"))
    dense_names = set(dense_trainables(model))
    assert dense_names, "the classifier head should be a dense trainable"
    norms, clip = _norms_and_clip(model, lambda m: task.per_example_loss(m, full))

    names = {id(p): n for n, p in model.named_parameters()}
    log: list[dict] = []
    dense_log: list[dict] = []

    class RecordingDense(_DenseDp):
        def __init__(self, model, lr, rule):
            super().__init__(model, lr, rule)
            _recording(self.opt, names, dense_log)

    monkeypatch.setattr(dp_train_module, "_DenseDp", RecordingDense)
    opt = FactorDp(lora_layers(model), lr=1.0)
    _recording(opt.opt, names, log)
    plan = DpSteps(steps=1, sample_rate=1.0, clip=clip, noise_multiplier=0.0, microbatch=4)
    rngs = (np.random.default_rng(0), torch.Generator().manual_seed(0))
    dp_train(Trainee(model, task, examples, torch.device("cpu")), opt, plan, DenseUpdate(1.0), rngs=rngs)
    (got,), (got_dense,) = log, dense_log
    assert set(got_dense) == dense_names
    got = {**got, **got_dense}

    want, _ = _opacus_pre_step(ref, lambda m: task.per_example_loss(m, full), clip, len(examples), "mean")
    _assert_release_matches(got, want, norms, clip, plan.sample_rate * len(examples))


def _noise_draws(step, params: dict[str, nn.Parameter], opt, repeats: int) -> dict[str, Tensor]:
    log: list[dict] = []
    _recording(opt, {id(p): n for n, p in params.items()}, log)
    gen = torch.Generator().manual_seed(0)
    for _ in range(repeats):
        step(gen)
    assert len(log) == repeats
    return {k: torch.stack([entry[k] for entry in log]) for k in log[0]}


def _check_gaussian(draws: Tensor, std: float) -> None:
    flat = draws.flatten().double()
    n = flat.numel()
    assert n > 20_000
    # Standard errors: mean std/√n, std ≈ std/√(2n); both bounds are > 6 standard errors.
    assert abs(float(flat.mean())) < 6 * std / n**0.5
    assert abs(float(flat.std()) / std - 1) < 0.03
    # A Gaussian's fourth standardized moment is 3 (SE ≈ √(96/n)).
    z = (flat - flat.mean()) / flat.std()
    assert abs(float(z.pow(4).mean()) - 3) < 0.25


@pytest.mark.parametrize("freeze_a", [False, True], ids=["dp-adamw", "ffa"])
def test_factor_dp_noise_std(tiny_llama, freeze_a):
    """With zero sums, ``step(noise_std=2, denom=4)`` releases N(0, 0.5²) on every trained coordinate."""
    opt = FactorDp(lora_layers(tiny_llama), lr=0.0, freeze_a=freeze_a)
    params = dict(tiny_llama.named_parameters())

    def step(gen):
        opt.begin()
        opt.step(noise_std=2.0, denom=4.0, generator=gen)

    draws = _noise_draws(step, params, opt.opt, repeats=60)
    expected = {n for n in params if ".lora_B." in n or (".lora_A." in n and not freeze_a)}
    assert set(draws) == expected
    _check_gaussian(torch.cat([d.flatten() for d in draws.values()]), 0.5)
    # Independent across coordinates and steps: no two draws of a coordinate repeat.
    first = next(iter(draws.values())).flatten(1)
    assert torch.unique(first, dim=0).shape[0] == first.shape[0]


def test_dense_dp_noise_std():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 32))
    dense = _DenseDp(model, lr=0.0)
    assert set(dense.params) == {"0.weight", "0.bias"}

    def step(gen):
        dense.begin()
        dense.step(noise_std=2.0, denom=4.0, generator=gen)

    draws = _noise_draws(step, dense.params, dense.opt, repeats=20)
    assert set(draws) == {"0.weight", "0.bias"}
    _check_gaussian(torch.cat([d.flatten() for d in draws.values()]), 0.5)
