"""Sequence classification with an encoder and a classification head."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from common.tasks.base import (
    Batch,
    classification_metrics,
    eval_batches,
    evaluation,
    logits_of,
    token_batch,
)


class ClassifierTask:
    metric = "accuracy"

    def __init__(self, tokenizer, max_length: int) -> None:
        self.tokenizer = tokenizer
        self.max_length = max_length

    def encode(self, texts: Sequence[str], labels: Sequence[int]) -> list[dict]:
        enc = self.tokenizer(list(texts), truncation=True, max_length=self.max_length)
        return [{"ids": ids, "label": int(y)} for ids, y in zip(enc["input_ids"], labels, strict=True)]

    def collate(self, examples: Sequence[dict], device: torch.device) -> Batch:
        labels = torch.tensor([ex["label"] for ex in examples])
        return token_batch([ex["ids"] for ex in examples], self.tokenizer.pad_token_id, device, labels=labels)

    def per_example_loss(self, model: nn.Module, batch: Batch) -> Tensor:
        logits = logits_of(model, batch)
        return F.cross_entropy(logits, batch["labels"], reduction="none")

    @evaluation
    def evaluate(
        self, model: nn.Module, examples: Sequence[dict], device: torch.device, batch_size: int
    ) -> dict[str, float]:
        preds, gold, nll = [], [], 0.0
        for part in eval_batches(examples, batch_size):
            batch = self.collate(part, device)
            logits = logits_of(model, batch)
            preds.append(logits.argmax(1))
            gold.append(batch["labels"])
            nll += float(F.cross_entropy(logits, batch["labels"], reduction="sum"))
        classes = int(logits.shape[1])
        return classification_metrics(torch.cat(preds), torch.cat(gold), nll, classes)
