"""Causal-LM classification: prompt + label word; predict the most likely label word."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from common.data.prompts import Prompt
from common.tasks.base import (
    Batch,
    classification_metrics,
    eval_batches,
    evaluation,
    logits_of,
    pad,
    token_batch,
)


class VerbalizerTask:
    """Examples hold ``prompt`` token ids and the gold ``label``; ``words[c]`` are label ids."""

    metric = "accuracy"

    def __init__(self, tokenizer, prompt: Prompt, max_length: int) -> None:
        self.tokenizer = tokenizer
        self.pad_id = tokenizer.pad_token_id
        self.words = [self._ids(w) for w in prompt.words]
        self.head, self.tail = self._ids(prompt.head), self._ids(prompt.tail)
        longest = max(len(w) for w in self.words)
        self.text_budget = max_length - len(self.head) - len(self.tail) - longest
        if self.text_budget < 1:
            raise ValueError(f"max_length {max_length} leaves no room for text in the prompt")

    def _ids(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def encode(self, texts: Sequence[str], labels: Sequence[int]) -> list[dict]:
        bodies = self.tokenizer(list(texts), add_special_tokens=False)["input_ids"]
        return [
            {"prompt": self.head + body[: self.text_budget] + self.tail, "label": int(y)}
            for body, y in zip(bodies, labels, strict=True)
        ]

    def collate(self, examples: Sequence[dict], device: torch.device) -> Batch:
        """Prompts only: ``prompts`` keeps the token lists for :meth:`label_scores`."""
        prompts = [ex["prompt"] for ex in examples]
        labels = torch.tensor([ex["label"] for ex in examples])
        return {**token_batch(prompts, self.pad_id, device, labels=labels), "prompts": prompts}

    def per_example_loss(self, model: nn.Module, batch: Batch) -> Tensor:
        """Cross-entropy of the gold label over the label-word scores (PET-style): ``(b,)``.

        Training and evaluation then optimise and measure the same decision rule.
        """
        scores = self._scores(model, batch["prompts"], batch["input_ids"].device)
        return F.cross_entropy(scores, batch["labels"], reduction="none")

    @torch.no_grad()
    def label_scores(self, model: nn.Module, examples: Sequence[dict], device: torch.device) -> Tensor:
        """``(b, C)`` log-likelihood of each label word after each prompt."""
        return self._scores(model, [ex["prompt"] for ex in examples], device)

    def _scores(self, model: nn.Module, prompts: Sequence[list[int]], device: torch.device) -> Tensor:
        if all(len(w) == 1 for w in self.words):  # one forward pass: read the next-token logits
            batch = token_batch(prompts, self.pad_id, device)
            last = batch["attention_mask"].sum(1) - 1
            logp = _logits_at(model, batch, last).log_softmax(-1)
            return logp[:, [w[0] for w in self.words]]
        scores = []
        for word in self.words:  # multi-token words: one pass per label, summed token log-probs
            target, _ = pad([[-100] * len(p) + word for p in prompts], -100)
            batch = token_batch([p + word for p in prompts], self.pad_id, device, target=target)
            scores.append(-token_nll(logits_of(model, batch), batch["target"]) * len(word))
        return torch.stack(scores, dim=1)

    @evaluation
    def evaluate(
        self, model: nn.Module, examples: Sequence[dict], device: torch.device, batch_size: int
    ) -> dict[str, float]:
        preds, golds, nll = [], [], 0.0
        for part in eval_batches(examples, batch_size):
            scores = self.label_scores(model, part, device)
            gold = torch.tensor([ex["label"] for ex in part], device=device)
            preds.append(scores.argmax(1))
            golds.append(gold)
            nll += float(F.cross_entropy(scores, gold, reduction="sum"))
        return classification_metrics(torch.cat(preds), torch.cat(golds), nll, len(self.words))


def _logits_at(model: nn.Module, batch: Batch, positions: Tensor) -> Tensor:
    """``(b, V)`` logits at one position per example; the LM head runs only there where the model
    supports ``logits_to_keep`` (transformers' causal LMs), which skips a (b, T, V) projection."""
    try:
        out = model(
            input_ids=batch["input_ids"],
            attention_mask=batch["attention_mask"],
            logits_to_keep=positions[:, None],
        )
        return out.logits[:, 0].float()
    except TypeError:  # a model without logits_to_keep
        return logits_of(model, batch)[torch.arange(len(positions), device=positions.device), positions]


def token_nll(logits: Tensor, target: Tensor) -> Tensor:
    """Per-example mean NLL over tokens where ``target != -100``; next-token shifted. ``(b,)``

    The targets shift left (the last position predicts nothing) rather than the logits: a slice of
    ``logits`` would copy them, and its backward zero-fill a gradient of their full size (a cohort
    forward's logits are 2,048 x 49,152 fp32 for SmolLM2: that copy and fill cost more than the
    loss)."""
    b, t, v = logits.shape
    shifted = torch.cat([target[:, 1:], target.new_full((b, 1), -100)], 1)
    nll = F.cross_entropy(logits.reshape(b * t, v), shifted.reshape(-1), ignore_index=-100, reduction="none")
    keep = shifted != -100
    return nll.view(b, t).sum(1) / keep.sum(1).clamp(min=1)
