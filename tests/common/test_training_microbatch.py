"""Non-private local steps compute a batch in length-sorted micro-batches: the gradient must be the
one padded batch's (dropout off), on the encoder classifier and on the causal LM."""

from __future__ import annotations

import copy

import pytest
import torch

from common.tasks.classifier import ClassifierTask
from common.tasks.language_model import LanguageModelTask
from common.tasks.training import mean_loss_backward
from tests.conftest import randomize_lora

TEXTS = [
    "a gorgeous, witty, seductive movie that never lets up and keeps surprising you to the end",
    "dull.",
    "it never quite finds its footing",
    "ok",
    "the performances are strong but the script wanders off into a dozen directions at once",
    "fine",
    "an utterly charming, small film about growing up",
    "bad",
]


def _grads(model, task, examples, microbatch):
    model.zero_grad(set_to_none=True)
    loss = mean_loss_backward(model, task, examples, range(len(examples)), torch.device("cpu"), microbatch)
    return loss, {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}


@pytest.mark.parametrize("kind", ["classifier", "language-model"])
@pytest.mark.heavy
def test_micro_batched_gradient_is_the_whole_batch_gradient(kind, minilm, tiny_llama, smollm2_tokenizer):
    if kind == "classifier":
        model, task = copy.deepcopy(minilm.model), ClassifierTask(minilm.tokenizer, 32)  # fixture untouched
    else:
        model, task = tiny_llama, LanguageModelTask(smollm2_tokenizer, 32)
    randomize_lora(model)
    model.eval()  # no dropout: the two orders must agree exactly up to float error
    examples = task.encode(TEXTS, [1, 0, 0, 1, 1, 1, 1, 0])
    whole_loss, whole = _grads(model, task, examples, len(examples))
    with torch.no_grad():  # the reference: the plain padded batch's mean loss
        ref = task.per_example_loss(model, task.collate(examples, torch.device("cpu"))).mean()
    parts_loss, parts = _grads(model, task, examples, 3)
    assert whole_loss == pytest.approx(float(ref), rel=1e-5) and parts_loss == pytest.approx(
        float(ref), rel=1e-5
    )
    assert whole.keys() == parts.keys() and whole
    for name in whole:
        torch.testing.assert_close(parts[name], whole[name], rtol=1e-4, atol=1e-6)
    assert any(g.abs().sum() > 0 for g in whole.values())


def test_non_private_steps_take_microbatch_from_the_config():
    """``--microbatch`` sizes the pieces of non-private local steps too (0 keeps their default 32)."""
    from common.presets import preset
    from common.tasks.training import StepSchedule

    assert StepSchedule.of(preset("minilm-rt-xdev", microbatch=4), 0).microbatch == 4
    assert StepSchedule.of(preset("minilm-rt-xdev"), 0).microbatch == 32
