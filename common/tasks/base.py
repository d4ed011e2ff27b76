"""What every task provides: tokenised examples, batches, per-example loss, evaluation.

Per-example losses (shape ``(b,)``) are the unit the DP optimisers clip; the non-private
optimiser just takes their mean.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Sequence
from typing import Protocol

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from common.progress import bar

Batch = dict[str, Tensor | list]  # tensors, plus token lists where a task needs them


class Task(Protocol):
    """``metric`` is ``accuracy`` (higher is better) or ``perplexity`` (lower is better)."""

    metric: str

    def encode(self, texts: Sequence[str], labels: Sequence[int]) -> list[dict]: ...

    def collate(self, examples: Sequence[dict], device: torch.device) -> Batch: ...

    def per_example_loss(self, model: nn.Module, batch: Batch) -> Tensor: ...

    def evaluate(
        self, model: nn.Module, examples: Sequence[dict], device: torch.device, batch_size: int
    ) -> dict[str, float]: ...


def evaluation(evaluate: Callable) -> Callable:
    """Decorates a task's ``evaluate(self, model, ...)``: no gradients, and the model in eval mode (no
    dropout) for the call, its training flag restored after, so a score never depends on the mode
    the caller left the model in."""

    @functools.wraps(evaluate)
    def wrapper(self, model: nn.Module, *args, **kwargs):
        was_training = model.training
        model.eval()
        try:
            with torch.no_grad():
                return evaluate(self, model, *args, **kwargs)
        finally:
            model.train(was_training)

    return wrapper


def pad(seqs: Sequence[Sequence[int]], value: int) -> tuple[Tensor, Tensor]:
    """Right-pad token lists -> ``ids: (b, T)`` and ``mask: (b, T)``."""
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), value, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, : len(s)] = torch.as_tensor(s, dtype=torch.long)
        mask[i, : len(s)] = 1
    return ids, mask


def token_batch(seqs: Sequence[Sequence[int]], pad_id: int, device: torch.device, **extra: Tensor) -> Batch:
    """Right-padded ``input_ids``/``attention_mask`` plus ``extra`` tensors, all on ``device``."""
    ids, mask = pad(seqs, pad_id)
    return {k: v.to(device) for k, v in {"input_ids": ids, "attention_mask": mask, **extra}.items()}


def by_length(idx: Sequence[int], examples: Sequence[dict]) -> list[int]:
    """``idx`` ordered by token count, so that consecutive micro-batches pad little (a sum over the
    batch does not depend on the order)."""
    return sorted(idx, key=lambda i: example_length(examples[i]))


def example_length(example: dict) -> int:
    """An encoded example's token count (its ``ids``, or a verbalizer task's ``prompt``)."""
    return len(example.get("ids") or example.get("prompt") or ())


def logits_of(model: nn.Module, batch: Batch) -> Tensor:
    """Model output logits for a :func:`token_batch`, in fp32 (also under a bf16 base)."""
    return model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits.float()


def target_nll(model: nn.Module, batch: Batch) -> Tensor:
    """Per-example mean next-token NLL over the positions where ``batch["target"]`` is not -100,
    ``(b,)``: :func:`~common.tasks.verbalizer.token_nll` of :func:`logits_of`, with the LM head applied
    only at those positions. An evaluation of chat data scores a few answer tokens of a few hundred:
    the full logits (b x t x vocabulary, 1.2 GB in fp32 for 16 x 384 x 49,152) cost most of it."""
    causal = model.get_base_model() if hasattr(model, "get_base_model") else model
    hidden = causal.get_decoder()(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
    target = batch["target"][:, 1:]
    keep = target != -100
    logits = causal.get_output_embeddings()(hidden.last_hidden_state[:, :-1][keep]).float()
    nll = F.cross_entropy(logits, target[keep], reduction="none")
    rows = keep.nonzero()[:, 0]
    return torch.zeros(len(target), device=nll.device).index_add_(0, rows, nll) / keep.sum(1).clamp(min=1)


def sample_batches(n: int, batch_size: int, steps: int, rng: np.random.Generator) -> Iterator[np.ndarray]:
    """``steps`` index batches drawn by reshuffled passes over ``range(n)`` (no DP sampling)."""
    order: list[int] = []
    for _ in range(steps):
        while len(order) < batch_size:
            order.extend(rng.permutation(n).tolist())
        yield np.asarray(order[:batch_size])
        order = order[batch_size:]


def chunks(items: Sequence, size: int) -> Iterator[Sequence]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


def eval_batches(examples: Sequence, size: int) -> Iterator[Sequence]:
    """:func:`chunks` of the held-out ``examples``, counted on the terminal's "evaluating" bar."""
    with bar(len(examples), "evaluating", "example") as progress:
        for part in chunks(examples, size):
            yield part
            progress.update(len(part))


def classification_metrics(preds: Tensor, gold: Tensor, nll: float, classes: int) -> dict[str, float]:
    """``accuracy``, mean ``loss`` (``nll`` summed), ``top_class_share`` (the most predicted class's
    share of predictions: 1.0 is a one-class predictor) and, for two classes, ``positive_rate``
    (share predicted as class 1). ``preds``, ``gold``: ``(n,)`` class ids."""
    n = len(gold)
    counts = torch.bincount(preds.cpu(), minlength=classes)
    metrics = {
        "accuracy": int((preds == gold).sum()) / n,
        "loss": nll / n,
        "top_class_share": int(counts.max()) / n,
    }
    if classes == 2:
        metrics["positive_rate"] = int(counts[1]) / n
    return metrics
