"""Per-example LoRA factor gradients from activations equal autograd on each example alone."""

import math

import pytest
import torch

from client.dp.grad_sample import GradSampler, stacked
from common.data.prompts import prompt_for
from common.models.lora import dense_trainables, lora_layers
from common.tasks.classifier import ClassifierTask
from common.tasks.verbalizer import VerbalizerTask
from tests.conftest import randomize_lora


def _one_by_one(model, losses_of, n):
    """Reference: backward on each example's loss separately; paper-factor grads per module."""
    factors, dense = [], []
    for i in range(n):
        model.zero_grad(set_to_none=True)
        losses_of(i).backward()
        per = {}
        for name, layer in lora_layers(model).items():
            root = math.sqrt(layer.scaling["default"])
            per[name] = (
                layer.lora_B["default"].weight.grad / root,
                layer.lora_A["default"].weight.grad.T / root,
            )
        factors.append(per)
        dense.append({k: p.grad.clone() for k, p in dense_trainables(model).items()})
    return factors, dense


def _check(model, batch_losses, n):
    model.zero_grad(set_to_none=True)
    with GradSampler(model) as sampler:
        batch_losses(None).sum().backward()
        got, got_dense = sampler.factor_grads(), sampler.dense_grads()
    want, want_dense = _one_by_one(model, batch_losses, n)
    assert got, "no LoRA modules found"
    for name, (g_a, g_b) in got.items():
        for i in range(n):
            torch.testing.assert_close(g_a[i], want[i][name][0], rtol=1e-4, atol=1e-6)
            torch.testing.assert_close(g_b[i], want[i][name][1], rtol=1e-4, atol=1e-6)
    for name, g in got_dense.items():
        for i in range(n):
            torch.testing.assert_close(g[i], want_dense[i][name], rtol=1e-4, atol=1e-6)
    return got, got_dense


def test_causal_lm_sequences_with_padding(tiny_llama, smollm2_tokenizer):
    randomize_lora(tiny_llama)
    task = VerbalizerTask(smollm2_tokenizer, prompt_for("rotten-tomatoes", ("negative", "positive")), 48)
    texts = ["a gorgeous, witty film", "dull.", "it never quite finds its footing, sadly"]
    batch = task.collate(task.encode(texts, [1, 0, 0]), torch.device("cpu"))

    def losses(i):
        if i is None:
            return task.per_example_loss(tiny_llama, batch)
        sub = task.collate(task.encode([texts[i]], [[1, 0, 0][i]]), torch.device("cpu"))
        return task.per_example_loss(tiny_llama, sub).sum()

    got, _ = _check(tiny_llama, losses, 3)
    name, (g_a, g_b) = next(iter(got.items()))
    layer = lora_layers(tiny_llama)[name]
    m, r = layer.lora_B["default"].weight.shape
    assert g_a.shape == (3, m, r) and g_b.shape == (3, layer.lora_A["default"].weight.shape[1], r)


@pytest.mark.heavy
def test_classifier_head_and_lora(minilm):
    model = minilm.model
    randomize_lora(model)
    task = ClassifierTask(minilm.tokenizer, 32)
    texts = ["great", "terrible acting and a worse script", "fine"]
    examples = task.encode(texts, [1, 0, 1])
    model.eval()  # dropout off: per-example and one-by-one passes see the same network

    def losses(i):
        if i is None:
            return task.per_example_loss(model, task.collate(examples, torch.device("cpu")))
        return task.per_example_loss(model, task.collate([examples[i]], torch.device("cpu"))).sum()

    _, dense = _check(model, losses, 3)
    assert dense and all(g.shape[0] == 3 for g in dense.values())


def test_hooks_are_removed(tiny_llama):
    layer = next(iter(lora_layers(tiny_llama).values()))
    before = len(layer.lora_A["default"]._forward_hooks)
    with GradSampler(tiny_llama):
        assert len(layer.lora_A["default"]._forward_hooks) == before + 1
    assert len(layer.lora_A["default"]._forward_hooks) == before


def test_gradients_without_a_pass_are_an_error(tiny_llama):
    with GradSampler(tiny_llama) as sampler, pytest.raises(RuntimeError, match="no activations"):
        sampler.factor_grads()


def _lm_pass(model, tokenizer, sampler_opts):
    task = VerbalizerTask(tokenizer, prompt_for("rotten-tomatoes", ("negative", "positive")), 48)
    texts = ["a gorgeous, witty film", "dull.", "it never quite finds its footing, sadly"]
    batch = task.collate(task.encode(texts, [1, 0, 0]), torch.device("cpu"))
    model.zero_grad(set_to_none=True)
    with GradSampler(model, **sampler_opts) as sampler:
        task.per_example_loss(model, batch).sum().backward()
        taps = list(sampler._taps.values())
        held = [t.x is not None or t.h is not None or t.delta is not None for t in taps]
        return sampler.factor_grads(), held, sampler.groups


def test_reduced_in_the_backward_equals_kept_layer_io_and_holds_nothing(tiny_llama, smollm2_tokenizer):
    randomize_lora(tiny_llama)
    reduced, held, groups = _lm_pass(tiny_llama, smollm2_tokenizer, {})
    kept, held_io, _ = _lm_pass(tiny_llama, smollm2_tokenizer, {"layer_io": True})
    assert not any(held), "a layer's input or output gradient outlived its backward"
    assert all(held_io)
    assert [list(g.names) for g in reduced.groups] == groups and len(groups) == 2  # q and v shapes
    for name in reduced:
        for got, want in zip(reduced[name], kept[name], strict=True):
            torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_stacked_reads_the_engines_groups_in_place_and_restacks_anything_else(tiny_llama, smollm2_tokenizer):
    randomize_lora(tiny_llama)
    grads, _, groups = _lm_pass(tiny_llama, smollm2_tokenizer, {})
    same = stacked(grads, groups)
    assert all(a.g_a is b.g_a and a.g_b is b.g_b for a, b in zip(same, grads.groups, strict=True))
    plain = {name: grads[name] for name in reversed(list(grads))}  # a dict, in another order
    again = stacked(plain, groups)
    for a, b in zip(again, grads.groups, strict=True):
        assert a.names == b.names
        torch.testing.assert_close(a.g_a, b.g_a, rtol=0, atol=0)
        torch.testing.assert_close(a.g_b, b.g_b, rtol=0, atol=0)
    merged = stacked(grads, [[n for g in groups for n in g][:1]])  # a grouping of its own
    assert merged[0].g_a.shape[0] == 1 and merged[0].names == (groups[0][0],)


def test_layer_io_needs_the_sampler_opened_for_it(tiny_llama):
    with GradSampler(tiny_llama) as sampler, pytest.raises(RuntimeError, match="layer_io=True"):
        sampler.layer_io()
