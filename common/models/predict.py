"""``fedlora predict``: label texts with a saved classifier adapter on its base model.

The adapter directory is the one a run saves (``runs/<run>/adapter``, common/models/portable.py);
its class names come from its ``fedlora.json`` (``id2label``), its base model from the Hub id it
names (packaged models offline). Texts come from ``--text`` (repeatable) or a data file (CSV, JSONL,
Parquet or .txt, read as training files are: common/data/files.py). Each prediction is one line,
``LABEL<TAB>TEXT``; with ``--json``, one JSON object a line with every class's probability.
Prediction is post-processing of the released adapter: it costs no privacy budget.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

from common.errors import FedloraError
from common.progress import bar


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--adapter", required=True, help="a saved classifier adapter (runs/<run>/adapter)")
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--text", action="append", help="a text to label (repeat for more)")
    source.add_argument("--file", help="a CSV, JSONL, Parquet or .txt file of texts to label")
    parser.add_argument("--text-column", default="text", help="--file's text column (text)")
    parser.add_argument(
        "--skip-bad-rows", action="store_true", help="skip (and count) malformed rows of --file"
    )
    parser.add_argument(
        "--json", action="store_true", help="one JSON object a line: text, label and each class's probability"
    )
    parser.add_argument("--batch-size", type=int, default=32, help="texts a forward pass (32)")
    parser.add_argument("--max-length", type=int, default=256, help="tokens kept of each text (256)")


def texts_of(args: argparse.Namespace) -> list[str]:
    """The texts to label: ``--text`` values, or ``--file``'s ``--text-column`` (one-line errors)."""
    if args.text is not None:
        return list(args.text)
    from common.data.files import read_rows

    rows = read_rows(args.file, skip_bad_rows=args.skip_bad_rows)
    if not rows:
        raise FedloraError(f"--file {args.file}: no rows")
    if args.text_column not in rows[0]:
        raise FedloraError(
            f"--file {args.file}: no --text-column '{args.text_column}' (columns: {', '.join(rows[0])})"
        )
    return [str(row.get(args.text_column) or "") for row in rows]


def predict(model, tokenizer, texts: Sequence[str], batch_size: int = 32, max_length: int = 256) -> Iterator:
    """``(class index, probabilities (num_labels,))`` of each text, in order, ``batch_size`` texts a
    forward pass, each truncated to ``max_length`` tokens."""
    import torch

    device = next(model.parameters()).device
    with torch.no_grad(), bar(len(texts), "predicting", "text") as progress:
        for start in range(0, len(texts), batch_size):
            part = list(texts[start : start + batch_size])
            batch = tokenizer(part, return_tensors="pt", padding=True, truncation=True, max_length=max_length)
            probs = model(**batch.to(device)).logits.float().softmax(-1).cpu()
            yield from ((int(p.argmax()), p) for p in probs)
            progress.update(len(part))


def _check(args: argparse.Namespace) -> None:
    if args.batch_size < 1 or args.max_length < 1:
        raise FedloraError("--batch-size and --max-length must be >= 1")
    sidecar = Path(args.adapter) / "fedlora.json"
    kind = json.loads(sidecar.read_text(encoding="utf-8")).get("kind") if sidecar.is_file() else None
    if kind == "causal-lm":
        raise FedloraError(
            f"{args.adapter} is a causal LM adapter: it has no classes to predict; use fedlora generate"
        )


def run(args: argparse.Namespace) -> int:
    _check(args)
    texts = texts_of(args)  # a bad file fails before the model loads
    from common.models.portable import load_adapter

    model, tokenizer = load_adapter(args.adapter)
    names = model.config.id2label  # the run's class names; "LABEL_k" where the adapter has none
    predictions = predict(model, tokenizer, texts, args.batch_size, args.max_length)
    for text, (index, probs) in zip(texts, predictions, strict=True):
        label = names.get(index, str(index))
        if args.json:
            scores = {names.get(k, str(k)): round(float(p), 6) for k, p in enumerate(probs)}
            print(json.dumps({"text": text, "label": label, "scores": scores}, ensure_ascii=False))
        else:
            print(f"{label}\t{' '.join(text.split())}")
    sys.stdout.flush()
    return 0
