"""A data owner's instruction data written in each of the three forms (docs/instruction-tuning.md):
the same ``(prompt, answer, user)`` rows as alpaca JSONL, a prompt/completion CSV or chat JSONL."""

from __future__ import annotations

import csv
import json
from collections.abc import Sequence
from pathlib import Path

#: form -> the file name its rows are written to
FILES = {"alpaca": "sft.jsonl", "prompt-completion": "sft.csv", "chat": "chat.jsonl"}
FORMS = tuple(FILES)

Row = tuple[str, str, str]  # (prompt, answer, user)


def write_form(directory: Path, form: str, rows: Sequence[Row]) -> Path:
    """``rows`` in ``form`` under ``directory`` (a ``user`` column or field beside each row)."""
    path = directory / FILES[form]
    if form == "prompt-completion":
        with path.open("w", newline="") as fh:
            csv.writer(fh).writerows([("prompt", "completion", "user"), *rows])
        return path
    records = [
        {"instruction": q, "output": a, "user": u}
        if form == "alpaca"
        else {"messages": [{"role": "user", "content": q}, {"role": "assistant", "content": a}], "user": u}
        for q, a, u in rows
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path
