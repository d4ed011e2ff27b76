"""Causal language modelling on a plain-text corpus; evaluated by perplexity."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor, nn

from common.tasks.base import Batch, eval_batches, evaluation, logits_of, target_nll, token_batch
from common.tasks.verbalizer import token_nll


class LanguageModelTask:
    """Each document is cut into blocks of ``max_length`` tokens, its first ``max_blocks_per_doc`` of
    them (0: all; a document shorter than one block is one example); an example is one block."""

    metric = "perplexity"

    def __init__(self, tokenizer, max_length: int, max_blocks_per_doc: int = 4) -> None:
        self.tokenizer = tokenizer
        self.max_length = max_length
        self.max_blocks = max_blocks_per_doc

    def encode(self, texts: Sequence[str], labels: Sequence[int]) -> list[dict]:
        blocks = []
        for ids in self.tokenizer(list(texts), add_special_tokens=False)["input_ids"]:
            whole = len(ids) // self.max_length
            for b in range(min(self.max_blocks, whole) if self.max_blocks else whole):
                blocks.append({"ids": ids[b * self.max_length : (b + 1) * self.max_length]})
            if len(ids) < self.max_length and len(ids) > 1:
                blocks.append({"ids": ids})
        return blocks

    def collate(self, examples: Sequence[dict], device: torch.device) -> Batch:
        batch = token_batch([ex["ids"] for ex in examples], self.tokenizer.pad_token_id, device)
        batch["target"] = batch["input_ids"].masked_fill(batch["attention_mask"] == 0, -100)
        return batch

    def per_example_loss(self, model: nn.Module, batch: Batch) -> Tensor:
        logits = logits_of(model, batch)
        return token_nll(logits, batch["target"])

    @evaluation
    def evaluate(
        self, model: nn.Module, examples: Sequence[dict], device: torch.device, batch_size: int
    ) -> dict[str, float]:
        total, tokens = 0.0, 0
        for part in eval_batches(examples, batch_size):
            batch = self.collate(part, device)
            n_tok = (batch["target"][:, 1:] != -100).sum(1)
            total += float((target_nll(model, batch) * n_tok).sum())
            tokens += int(n_tok.sum())
        loss = total / max(tokens, 1)
        return {"perplexity": math.exp(loss), "loss": loss}
