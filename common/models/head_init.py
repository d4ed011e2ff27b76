"""Zero-shot classification heads: each class's weight row points at the frozen encoder's feature
of a public description of the class ("a positive movie review"), so a private run does not start by
learning a head from noise. Only the label names and a template are used: no client data, no
privacy cost.

For a head ``logits = W x + b`` over the head's input features ``x: (d,)`` (BERT: the pooled [CLS]),
row ``c`` of ``W: (C, d)`` is ``s · (f_c − f̄) / ‖f_c − f̄‖`` with ``f_c`` the feature of class c's
description and ``f̄`` their mean (centred: only what tells the classes apart), ``b = 0``, and ``s``
the mean row norm of the head as the model initialised it (the same logit scale as a random head).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn

from common.errors import FedloraError

#: description template per corpus ("{}" is the label name); other corpora use the name itself
TEMPLATES = {
    "rotten-tomatoes": "a {} movie review",
    "bbc-news": "a news article about {}",
    "boolq": "the answer is {}",
}


def descriptions(dataset: str, label_names: Sequence[str]) -> list[str]:
    """The public text that describes each label of ``dataset``."""
    template = TEMPLATES.get(dataset, "{}")
    return [template.format(name) for name in label_names]


def classifier_head(model: nn.Module) -> nn.Linear:
    """The trainable linear head of a sequence classifier (PEFT keeps it in ``modules_to_save``)."""
    heads = [
        m
        for name, m in model.named_modules()
        if isinstance(m, nn.Linear) and name.endswith("classifier.modules_to_save.default")
    ]
    if len(heads) != 1:
        raise FedloraError("--head-init zero-shot needs an encoder classifier with one linear head")
    return heads[0]


@torch.no_grad()
def head_features(model: nn.Module, tokenizer, texts: Sequence[str], device: torch.device) -> Tensor:
    """``(len(texts), d)``: the head's input for each text (captured by a forward hook)."""
    head = classifier_head(model)
    seen: list[Tensor] = []
    hook = head.register_forward_hook(lambda _m, args, _out: seen.append(args[0].detach()))
    try:
        was_training = model.training
        model.eval()
        enc = tokenizer(list(texts), padding=True, truncation=True, return_tensors="pt").to(device)
        model(**enc)
        model.train(was_training)
    finally:
        hook.remove()
    return seen[0].float()


@torch.no_grad()
def apply_zero_shot_head(model: nn.Module, tokenizer, texts: Sequence[str], device: torch.device) -> None:
    """Set the head of ``model`` from the features of ``texts`` (one description per class)."""
    head = classifier_head(model)
    if len(texts) != head.out_features:
        raise FedloraError(f"{len(texts)} label descriptions for a head of {head.out_features} classes")
    feats = head_features(model, tokenizer, texts, device)
    centred = feats - feats.mean(0, keepdim=True)
    norms = centred.norm(dim=1, keepdim=True)
    if not bool((norms > 0).all()):
        raise FedloraError("two label descriptions give the same feature; the head cannot tell them apart")
    scale = head.weight.norm(dim=1).mean()
    head.weight.copy_((scale * centred / norms).to(head.weight.dtype))
    if head.bias is not None:
        head.bias.zero_()


__all__ = ["TEMPLATES", "apply_zero_shot_head", "classifier_head", "descriptions", "head_features"]
