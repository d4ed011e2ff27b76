"""Sentence pooling for encoder classifiers: the head reads the mean of the token states over the real
tokens (what sentence-transformers models such as all-MiniLM-L6-v2 were trained to produce) instead
of BERT's [CLS] pooler, a dense + tanh layer those models never trained for a task."""

from __future__ import annotations

from torch import Tensor, nn

from common.errors import FedloraError

POOLINGS = ("cls", "mean")


class MaskedMeanPooler(nn.Module):
    """``(b, T, d) -> (b, d)``: the mean over positions where the encoder's ``attention_mask`` is 1
    (stashed by a forward pre-hook on the encoder; all positions when it got none)."""

    def __init__(self) -> None:
        super().__init__()
        self.mask: Tensor | None = None

    def forward(self, hidden_states: Tensor) -> Tensor:
        if self.mask is None:
            return hidden_states.mean(1)
        mask = self.mask.to(hidden_states.dtype).unsqueeze(-1)
        return (hidden_states * mask).sum(1) / mask.sum(1).clamp(min=1.0)


def use_mean_pooling(model: nn.Module) -> None:
    """Replace the pooler of a BERT-style sequence classifier (before LoRA is attached) in place."""
    encoder = getattr(model, getattr(model, "base_model_prefix", ""), None)
    if encoder is None or getattr(encoder, "pooler", None) is None:
        raise FedloraError("--pooling mean needs a BERT-style encoder classifier (a [CLS] pooler to replace)")
    pooler = MaskedMeanPooler()
    encoder.pooler = pooler

    def stash_mask(_module, args, kwargs):
        pooler.mask = kwargs.get("attention_mask")

    encoder.register_forward_pre_hook(stash_mask, with_kwargs=True)


__all__ = ["POOLINGS", "MaskedMeanPooler", "use_mean_pooling"]
