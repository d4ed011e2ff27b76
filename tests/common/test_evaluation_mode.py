"""Every task scores in eval mode whatever mode the caller left the model in (MiniLM has dropout 0.1:
a score taken in train mode changes from call to call), and leaves that mode as it found it."""

from __future__ import annotations

import pytest
import torch

from common.tasks.classifier import ClassifierTask

TEXTS = ["a gorgeous, witty film", "dull.", "it never quite finds its footing", "ok then, fine"] * 8


@pytest.mark.heavy
def test_classifier_scores_are_deterministic_in_train_mode(minilm):
    model, tokenizer = minilm.model, minilm.tokenizer
    task = ClassifierTask(tokenizer, 32)
    examples = task.encode(TEXTS, [0, 1] * 16)
    model.train()
    assert any(isinstance(m, torch.nn.Dropout) and m.p > 0 for m in model.modules())
    first, again = (task.evaluate(model, examples, torch.device("cpu"), batch_size=8) for _ in range(2))
    assert model.training  # restored
    model.eval()
    assert first == again == task.evaluate(model, examples, torch.device("cpu"), batch_size=8)
    assert not model.training
