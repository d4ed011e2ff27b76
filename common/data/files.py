"""A data owner's own labelled (or plain) text: a CSV, JSONL or Parquet file as a :class:`Corpus`.

``--dataset path/to/file.csv`` (or ``.jsonl``, ``.parquet``) with ``--text-column`` and
``--label-column`` naming the columns: the label space is read from the data (the distinct values,
sorted; any number of classes). Without a label column in the file the corpus is language modelling.
``--partition-by COLUMN`` keeps each row's value of that column as its user, so that ``--partition
natural`` makes one client per user.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from common.data.corpora import Corpus
from common.data.owner import json_lines
from common.errors import FedloraError

SUFFIXES = (".csv", ".jsonl", ".parquet")


@dataclass(frozen=True)
class Columns:
    """Which columns of a user file hold the text, the label and the user (``""``: none)."""

    text: str = "text"
    label: str = "label"
    user: str = ""


DEFAULT_COLUMNS = Columns()


def is_file_dataset(name: str) -> bool:
    """``name`` names a data file (by its suffix) rather than a packaged dataset."""
    return Path(name).suffix.lower() in SUFFIXES


def load_file_corpus(path: str, columns: Columns = DEFAULT_COLUMNS) -> Corpus:
    """The corpus of ``path``; its name is the path as given. Errors are one line."""
    file = Path(path)
    if not file.is_file():
        raise FedloraError(f"--dataset {path}: no such file")
    return _load(str(file.resolve()), file.stat().st_mtime_ns, columns, path)


@lru_cache(maxsize=8)
def _load(resolved: str, _mtime: int, columns: Columns, name: str) -> Corpus:
    rows = _rows(Path(resolved))
    if not rows:
        raise FedloraError(f"--dataset {name}: no rows")
    found = list(rows[0])
    if columns.text not in found:
        raise FedloraError(f"--dataset {name}: no text column '{columns.text}' (columns: {', '.join(found)})")
    if columns.user and columns.user not in found:
        raise FedloraError(
            f"--dataset {name}: no --partition-by column '{columns.user}' (columns: {', '.join(found)})"
        )
    kept = [r for r in rows if str(r.get(columns.text) or "").strip()]
    if not kept:
        raise FedloraError(f"--dataset {name}: every row's '{columns.text}' is empty")
    texts = tuple(str(r[columns.text]).strip() for r in kept)
    users = tuple(str(r.get(columns.user, "")) for r in kept) if columns.user else ()
    if columns.label not in found:
        return Corpus(name, texts, (0,) * len(texts), (), "lm", users=users)
    values = [r.get(columns.label) for r in kept]
    if any(v is None or str(v).strip() == "" for v in values):
        raise FedloraError(f"--dataset {name}: a row has no '{columns.label}'")
    names = tuple(sorted({str(v).strip() for v in values}))
    if len(names) < 2:
        raise FedloraError(
            f"--dataset {name}: '{columns.label}' has one value ({names[0]}); a task needs two"
        )
    index = {n: i for i, n in enumerate(names)}
    labels = tuple(index[str(v).strip()] for v in values)
    return Corpus(name, texts, labels, names, "classification", users=users)


def _rows(path: Path) -> list[dict]:
    suffix = path.suffix.lower()
    if suffix == ".csv":
        with open(path, encoding="utf-8", newline="") as fh:
            return list(csv.DictReader(fh))
    if suffix == ".jsonl":
        rows = []
        for where, row in json_lines(path):
            if not isinstance(row, dict):
                raise FedloraError(f"{where}: not a JSON object")
            rows.append(row)
        return rows
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise FedloraError(f"{path.name}: reading Parquet needs pyarrow (pip install pyarrow)") from None
    return pq.read_table(path).to_pylist()


__all__ = ["DEFAULT_COLUMNS", "SUFFIXES", "Columns", "is_file_dataset", "load_file_corpus"]
