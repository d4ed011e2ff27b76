"""A data owner's own labelled (or plain) text: a CSV, JSONL, Parquet or .txt file as a :class:`Corpus`.

``--dataset path/to/file.csv`` (or ``.jsonl``, ``.parquet``) with ``--text-column`` and
``--label-column`` naming the columns: the label space is read from the data (the distinct values,
sorted; any number of classes). Without a label column in the file the corpus is language modelling.
``--partition-by COLUMN`` keeps each row's value of that column as its user, so that ``--partition
natural`` makes one client per user.

``--dataset path/to/DIR``, a directory holding one ``train.<ext>`` and one ``test.<ext>`` file (each
a CSV, JSONL, Parquet or plain-text file; the two may differ), gives its own test split: the corpus is the train
rows then the test rows, the latter marked in :attr:`Corpus.given_test`. The column options apply to
both files (a test file may lack the ``--partition-by`` column), and the classes are the union of
both files' labels.
"""

from __future__ import annotations

import csv
import os
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from common.data.corpora import DATASETS, Corpus
from common.data.owner import json_lines
from common.errors import FedloraError

SUFFIXES = (".csv", ".jsonl", ".parquet", ".txt")  # .txt: one text per non-blank line (language modelling)
SPLITS = ("train", "test")  # the file names (without suffix) of a dataset directory
DIRECTORY_FORM = "one train.<{0}> and one test.<{0}> file".format("|".join(s[1:] for s in SUFFIXES))


@dataclass(frozen=True)
class Columns:
    """Which columns of a user file hold the text, the label and the user (``""``: none)."""

    text: str = "text"
    label: str = "label"
    user: str = ""


DEFAULT_COLUMNS = Columns()


def is_file_dataset(name: str) -> bool:
    """``name`` names a data file (by its suffix) or a directory (that :func:`load_file_corpus` then
    requires to hold a train and a test file), or is a path, rather than a packaged dataset."""
    if Path(name).suffix.lower() in SUFFIXES:
        return True
    return name not in DATASETS and (Path(name).is_dir() or "/" in name or os.sep in name)


def load_file_corpus(path: str, columns: Columns = DEFAULT_COLUMNS) -> Corpus:
    """The corpus of the file or dataset directory ``path``; its name is the path as given. Errors
    are one line. Cached until a file changes (by modification time)."""
    file = Path(path)
    if file.is_dir():
        train, test = split_files(path)
        stamp = (str(train.resolve()), train.stat().st_mtime_ns, str(test.resolve()), test.stat().st_mtime_ns)
        return _load_dir(stamp, columns, path)
    if not file.is_file():
        raise FedloraError(f"--dataset {path}: no such file or directory")
    return _load(str(file.resolve()), file.stat().st_mtime_ns, columns, path)


def split_files(path: str) -> tuple[Path, Path]:
    """``(train file, test file)`` of the dataset directory ``path``; a one-line error naming what
    was found unless it holds exactly one of each."""
    found = {split: [] for split in SPLITS}
    for entry in sorted(Path(path).iterdir()):
        if entry.is_file() and entry.suffix.lower() in SUFFIXES and entry.stem.lower() in found:
            found[entry.stem.lower()].append(entry)
    if all(len(files) == 1 for files in found.values()):
        return found["train"][0], found["test"][0]
    names = [f.name for files in found.values() for f in files]
    seen = f"found {', '.join(names)}" if names else "found no train or test file"
    raise FedloraError(f"--dataset {path}: a dataset directory must hold {DIRECTORY_FORM}; {seen}")


@lru_cache(maxsize=8)
def _load(resolved: str, _mtime: int, columns: Columns, name: str) -> Corpus:
    texts, values, users = _table(read_rows(Path(resolved)), columns, name)
    if values is None:
        return Corpus(name, texts, (0,) * len(texts), (), "lm", users=users)
    names = _label_names(values, columns, name)
    index = {n: i for i, n in enumerate(names)}
    return Corpus(name, texts, tuple(index[v] for v in values), names, "classification", users=users)


@lru_cache(maxsize=8)
def _load_dir(stamp: tuple, columns: Columns, name: str) -> Corpus:
    train_path, test_path = Path(stamp[0]), Path(stamp[2])
    train = _table(read_rows(train_path), columns, f"{name}/{train_path.name}")
    test = _table(read_rows(test_path), columns, f"{name}/{test_path.name}", need_user=False)
    texts = train[0] + test[0]
    users = (train[2] + (test[2] or ("",) * len(test[0]))) if columns.user else ()
    given = tuple(range(len(train[0]), len(texts)))
    if (train[1] is None) != (test[1] is None):
        has, lacks = (train_path, test_path) if test[1] is None else (test_path, train_path)
        raise FedloraError(
            f"--dataset {name}: {has.name} has a '{columns.label}' column but {lacks.name} has not"
        )
    if train[1] is None:
        return Corpus(name, texts, (0,) * len(texts), (), "lm", users=users, given_test=given)
    values = train[1] + test[1]
    names = _label_names(values, columns, name)
    index = {n: i for i, n in enumerate(names)}
    labels = tuple(index[v] for v in values)
    return Corpus(name, texts, labels, names, "classification", users=users, given_test=given)


def _table(
    rows: list[dict], columns: Columns, name: str, need_user: bool = True
) -> tuple[tuple[str, ...], tuple[str, ...] | None, tuple[str, ...]]:
    """``(texts, label values or None without a label column, users)`` of the rows with a text."""
    if not rows:
        raise FedloraError(f"--dataset {name}: no rows")
    found = list(rows[0])
    if columns.text not in found:
        raise FedloraError(f"--dataset {name}: no text column '{columns.text}' (columns: {', '.join(found)})")
    if need_user and columns.user and columns.user not in found:
        raise FedloraError(
            f"--dataset {name}: no --partition-by column '{columns.user}' (columns: {', '.join(found)})"
        )
    kept = [r for r in rows if str(r.get(columns.text) or "").strip()]
    if not kept:
        raise FedloraError(f"--dataset {name}: every row's '{columns.text}' is empty")
    texts = tuple(str(r[columns.text]).strip() for r in kept)
    users = tuple(str(r.get(columns.user, "")) for r in kept) if columns.user in found else ()
    if columns.label not in found:
        return texts, None, users
    values = [r.get(columns.label) for r in kept]
    if any(v is None or str(v).strip() == "" for v in values):
        raise FedloraError(f"--dataset {name}: a row has no '{columns.label}'")
    return texts, tuple(str(v).strip() for v in values), users


def _label_names(values: tuple[str, ...], columns: Columns, name: str) -> tuple[str, ...]:
    names = tuple(sorted(set(values)))
    if len(names) < 2:
        raise FedloraError(
            f"--dataset {name}: '{columns.label}' has one value ({names[0]}); a task needs two"
        )
    return names


def read_rows(path: str | Path) -> list[dict]:
    """The rows of the CSV, JSONL, Parquet or plain-text file ``path`` (by its suffix) as dicts of
    column values (CSV values are strings; a ``.txt`` line is ``{"text": line}``). An unreadable file or a JSONL line that is not an object is a one-line
    error."""
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix not in SUFFIXES:
        raise FedloraError(f"{path}: not a {', '.join(s[1:] for s in SUFFIXES)} file")
    if suffix == ".csv":
        try:
            with open(path, encoding="utf-8", newline="") as fh:
                return list(csv.DictReader(fh))
        except (OSError, UnicodeDecodeError, csv.Error) as exc:
            raise FedloraError(f"cannot read data file {path}: {exc}") from None
    if suffix == ".txt":  # plain text: each non-blank line is a text of the column "text", no label
        try:
            lines = path.read_text(encoding="utf-8").splitlines()
        except (OSError, UnicodeDecodeError) as exc:
            raise FedloraError(f"cannot read data file {path}: {exc}") from None
        return [{"text": line.strip()} for line in lines if line.strip()]
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
    try:
        return pq.read_table(path).to_pylist()
    except (OSError, ValueError) as exc:  # pyarrow's ArrowInvalid is a ValueError
        raise FedloraError(f"cannot read data file {path}: {str(exc).splitlines()[0]}") from None


__all__ = [
    "DEFAULT_COLUMNS",
    "SUFFIXES",
    "Columns",
    "is_file_dataset",
    "load_file_corpus",
    "read_rows",
    "split_files",
]
