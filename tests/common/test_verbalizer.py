"""Causal-LM classification by verbalizer: scores are label-word log-likelihoods after the prompt."""

import pytest
import torch

from common.data.prompts import Prompt
from common.tasks.verbalizer import VerbalizerTask, token_nll

TEXTS = ["a gorgeous, witty film", "dull and far too long", "x " * 200]


def _brute_force_logprob(model, ids: list[int], word: list[int]) -> float:
    """log p(word | ids) by an unbatched, unpadded forward pass: independent of the task code."""
    seq = torch.tensor([ids + word])
    with torch.no_grad():
        logp = model(input_ids=seq).logits[0].log_softmax(-1)
    return sum(float(logp[len(ids) - 1 + j, tok]) for j, tok in enumerate(word))


def test_single_token_scores_match_brute_force(tiny_llama, smollm2_tokenizer):
    task = VerbalizerTask(
        smollm2_tokenizer, Prompt("Review: {text}\nSentiment:", (" negative", " positive")), 48
    )
    assert all(len(w) == 1 for w in task.words)
    examples = task.encode(TEXTS, [1, 0, 1])
    scores = task.label_scores(tiny_llama, examples, torch.device("cpu"))
    for i, ex in enumerate(examples):
        for c, word in enumerate(task.words):
            assert abs(float(scores[i, c]) - _brute_force_logprob(tiny_llama, ex["prompt"], word)) < 1e-4


def test_multi_token_scores_match_brute_force(tiny_llama, smollm2_tokenizer):
    prompt = Prompt("Text: {text}\nAnswer:", (" absolutely wonderful", " terrible"))
    task = VerbalizerTask(smollm2_tokenizer, prompt, 48)
    assert any(len(w) > 1 for w in task.words)
    examples = task.encode(TEXTS, [0, 1, 0])
    scores = task.label_scores(tiny_llama, examples, torch.device("cpu"))
    for i, ex in enumerate(examples):
        for c, word in enumerate(task.words):
            assert abs(float(scores[i, c]) - _brute_force_logprob(tiny_llama, ex["prompt"], word)) < 1e-4


def test_truncation_keeps_prompt_tail_and_length(smollm2_tokenizer):
    task = VerbalizerTask(
        smollm2_tokenizer, Prompt("Review: {text}\nSentiment:", (" negative", " positive")), 32
    )
    ex = task.encode(TEXTS, [1, 0, 1])[2]
    assert len(ex["prompt"]) + 1 <= 32
    assert ex["prompt"][-len(task.tail) :] == task.tail
    assert ex["prompt"][: len(task.head)] == task.head


def test_training_loss_is_cross_entropy_over_label_words(tiny_llama, smollm2_tokenizer):
    task = VerbalizerTask(
        smollm2_tokenizer, Prompt("Review: {text}\nSentiment:", (" negative", " positive")), 48
    )
    examples = task.encode(TEXTS[:2], [1, 0])
    losses = task.per_example_loss(tiny_llama, task.collate(examples, torch.device("cpu")))
    for i, ex in enumerate(examples):
        scores = torch.tensor([_brute_force_logprob(tiny_llama, ex["prompt"], w) for w in task.words])
        expected = -float(scores.log_softmax(0)[ex["label"]])
        assert abs(float(losses[i].detach()) - expected) < 1e-4


def test_accuracy_is_argmax_of_scores(tiny_llama, smollm2_tokenizer):
    task = VerbalizerTask(
        smollm2_tokenizer, Prompt("Review: {text}\nSentiment:", (" negative", " positive")), 48
    )
    examples = task.encode(TEXTS, [0, 1, 1])
    scores = task.label_scores(tiny_llama, examples, torch.device("cpu"))
    expected = float((scores.argmax(1) == torch.tensor([0, 1, 1])).float().mean())
    assert task.evaluate(tiny_llama, examples, torch.device("cpu"), batch_size=2)[
        "accuracy"
    ] == pytest.approx(expected)


def test_token_nll_masks_and_shifts():
    logits = torch.log_softmax(torch.randn(1, 4, 5), -1)
    target = torch.tensor([[-100, -100, 3, 1]])
    expected = -(logits[0, 1, 3] + logits[0, 2, 1]) / 2
    torch.testing.assert_close(token_nll(logits, target)[0], expected)
