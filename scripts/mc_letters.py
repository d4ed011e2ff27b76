"""Which option letter does the model prefer? (docs/instruction-tuning.md, "Why accuracy did not rise")

Scores a fixed 8 held-out items of each multiple-choice set (``sample(held_out, 8)``: 104 items) by
the log-likelihood of each option, as the benchmark's accuracy does, for the base model and each
adapter given, and prints one JSON line each: how often each letter is the model's choice, and its
accuracy; then the gold letters' counts. Usage: ``python scripts/mc_letters.py RUN/adapter ...``
(the base model is the first adapter's with the adapter disabled; about 3 minutes a model on one CPU
core; offline, from the packaged assets).
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from contextlib import nullcontext

import torch

from common.data.multiple_choice import SETS, load_set, sample
from common.models.portable import load_adapter
from common.tasks.multiple_choice import option_loglikelihoods

PER_SET = 8


def picks(model, tokenizer, items) -> list[str]:
    """The letter of each item's option of highest log-likelihood."""
    with torch.no_grad():
        lls = option_loglikelihoods(model, tokenizer, items, 4096, 384)
    return [
        item.options[max(range(len(ll)), key=ll.__getitem__)][0] for item, ll in zip(items, lls, strict=True)
    ]


def main(adapters: list[str]) -> None:
    items = [item for name in SETS for item in sample(load_set(name).split()[1], PER_SET)]
    for k, path in enumerate(adapters):
        model, tokenizer = load_adapter(path)
        if tokenizer.pad_token_id is None:
            tokenizer.pad_token = tokenizer.eos_token
        for label, context in ([("base", model.disable_adapter())] if k == 0 else []) + [
            (path, nullcontext())
        ]:
            with context:
                chosen = picks(model, tokenizer, items)
            right = sum(c == item.answer for c, item in zip(chosen, items, strict=True))
            print(
                json.dumps(
                    {
                        "model": label,
                        "picked": dict(sorted(Counter(chosen).items())),
                        "accuracy": right / len(items),
                    }
                )
            )
    print(
        json.dumps(
            {"items": len(items), "gold": dict(sorted(Counter(item.answer for item in items).items()))}
        )
    )


if __name__ == "__main__":
    main(sys.argv[1:])
