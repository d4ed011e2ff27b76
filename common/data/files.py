"""A data owner's own labelled (or plain) text: a CSV, JSONL, Parquet or .txt file as a :class:`Corpus`.

``--dataset path/to/file.csv`` (or ``.jsonl``, ``.parquet``) with ``--text-column`` and
``--label-column`` naming the columns: the label space is read from the data (the distinct values,
sorted; any number of classes). A file without the default ``label`` column, when no label column
is named, is language modelling; a label column the user named (or that ``--labels`` needs) must
exist. ``--partition-by COLUMN`` keeps each row's value of that column as its user, so that
``--partition natural`` makes one client per user.

Rows are checked, each error one line naming the file and line: a CSV row must have as many fields
as the header and well-formed quoting (an unterminated quote would swallow every row after it), a
labelled row needs a label, and with ``--labels a,b,c`` declared, one of those. ``--skip-bad-rows``
skips such rows instead, and counts them (a warning and :attr:`Corpus.skipped`).

``--dataset path/to/DIR``, a directory holding one ``train.<ext>`` and one ``test.<ext>`` file (each
a CSV, JSONL, Parquet or plain-text file; the two may differ), gives its own test split: the corpus is the train
rows then the test rows, the latter marked in :attr:`Corpus.given_test`. The column options apply to
both files (a test file may lack the ``--partition-by`` column), and the classes are the union of
both files' labels.

Instruction and chat data (issue 76): a file whose columns are one of the forms of
common/data/instructions.py (``messages``; ``instruction``/``output``; ``prompt``/``completion``, or
the columns ``--prompt-column``/``--response-column`` name), picked by ``--instruction-format``
(``auto``: by the columns; ``none``: read as above), is a corpus of conversations (task
:data:`~common.data.conversation.TASK`, each text a conversation's canonical JSON, labels 0). A row
that is not a conversation is a bad row like those above; a dataset directory's two files are both
instruction data or neither.
"""

from __future__ import annotations

import csv
import io
import logging
import multiprocessing
import os
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

from common.data import conversation, instructions
from common.data.corpora import DATASETS, Corpus
from common.data.owner import json_lines, read_text
from common.errors import FedloraError

SUFFIXES = (".csv", ".jsonl", ".parquet", ".txt")  # .txt: one text per non-blank line (language modelling)
SPLITS = ("train", "test")  # the file names (without suffix) of a dataset directory
DIRECTORY_FORM = "one train.<{0}> and one test.<{0}> file".format("|".join(s[1:] for s in SUFFIXES))
DEFAULT_LABEL = "label"  # the label column when none is named; a file without it is language modelling
SKIP_HINT = "fix the row, or pass --skip-bad-rows to skip (and count) such rows"
SHOWN = 5  # skipped rows the warning names one by one

log = logging.getLogger("fedlora.data")


@dataclass(frozen=True)
class Columns:
    """How to read a user file: which columns hold the text, the label and the user (``""``: none),
    the declared label set (``()``: any label), whether bad rows are skipped (and counted) rather
    than refused, and how instruction data is recognised: ``instruction_format`` (one of
    common/data/instructions.py ``CHOICES``) and the prompt and response columns of a
    prompt-completion file (``""``: ``prompt``, ``completion``)."""

    text: str = "text"
    label: str = DEFAULT_LABEL
    user: str = ""
    labels: tuple[str, ...] = ()
    skip_bad_rows: bool = False
    instruction_format: str = instructions.AUTO
    prompt: str = ""
    response: str = ""

    @property
    def label_required(self) -> bool:
        """Whether the label column must exist: one the user named (not the default ``label``) or
        that a declared label set needs. Only the unnamed default may be absent (language modelling)."""
        return self.label != DEFAULT_LABEL or bool(self.labels)


DEFAULT_COLUMNS = Columns()


@dataclass
class _Rows:
    """The rows of one file, each with its ``file:line`` (a Parquet row: ``file:row N``), the
    ``(file:line, problem)`` of each row skipped so far, and how many of those never became a row
    (a malformed CSV record)."""

    rows: list[tuple[str, dict]]
    skipped: list[tuple[str, str]] = field(default_factory=list)
    unread: int = 0

    @property
    def records(self) -> int:
        """The file's data records, good and bad."""
        return len(self.rows) + self.unread


def is_file_dataset(name: str) -> bool:
    """``name`` names a data file (by its suffix) or a directory (that :func:`load_file_corpus` then
    requires to hold a train and a test file), or is a path, rather than a packaged dataset."""
    if Path(name).suffix.lower() in SUFFIXES:
        return True
    return name not in DATASETS and (Path(name).is_dir() or "/" in name or os.sep in name)


def load_file_corpus(path: str, columns: Columns = DEFAULT_COLUMNS) -> Corpus:
    """The corpus of the file or dataset directory ``path``; its name is the path as given. Errors
    are one line (a bad row's error names its file and line). Checked: the declared label set, then each
    file's rows (:func:`_csv_rows`) and columns (:func:`_table`). Cached until a file changes (by
    modification time)."""
    _check_declared(columns)
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


def _check_declared(columns: Columns) -> None:
    """A declared label set (``--labels``) names at least two labels, each once."""
    if not columns.labels:
        return
    seen: set[str] = set()
    for label in columns.labels:
        if label in seen:
            raise FedloraError(f"--labels names '{label}' twice")
        seen.add(label)
    if len(seen) < 2:
        raise FedloraError(f"--labels declares one label ({columns.labels[0]}); a task needs two")


@lru_cache(maxsize=8)
def _load(resolved: str, _mtime: int, columns: Columns, name: str) -> Corpus:
    read = _read(Path(resolved), name, columns.skip_bad_rows)
    if (chat := _conversations(name, [(read, name)], columns)) is not None:
        return chat
    texts, values, users = _table(read, columns, name)
    skipped = _report_skipped(name, [read])
    if values is None:
        return Corpus(name, texts, (0,) * len(texts), (), "lm", users=users, skipped=skipped)
    names = _label_names(values, columns, name)
    index = {n: i for i, n in enumerate(names)}
    labels = tuple(index[v] for v in values)
    return Corpus(name, texts, labels, names, "classification", users=users, skipped=skipped)


@lru_cache(maxsize=8)
def _load_dir(stamp: tuple, columns: Columns, name: str) -> Corpus:
    train_path, test_path = Path(stamp[0]), Path(stamp[2])
    train_read = _read(train_path, f"{name}/{train_path.name}", columns.skip_bad_rows)
    test_read = _read(test_path, f"{name}/{test_path.name}", columns.skip_bad_rows)
    reads = [(train_read, f"{name}/{train_path.name}"), (test_read, f"{name}/{test_path.name}")]
    if (chat := _conversations(name, reads, columns)) is not None:
        return chat
    train = _table(train_read, columns, f"{name}/{train_path.name}")
    # a test file without the label column: the check below names both files
    test = _table(test_read, columns, f"{name}/{test_path.name}", need_user=False, need_label=False)
    skipped = _report_skipped(name, [train_read, test_read])
    texts = train[0] + test[0]
    users = (train[2] + (test[2] or ("",) * len(test[0]))) if columns.user else ()
    given = tuple(range(len(train[0]), len(texts)))
    if (train[1] is None) != (test[1] is None):
        has, lacks = (train_path, test_path) if test[1] is None else (test_path, train_path)
        raise FedloraError(
            f"--dataset {name}: {has.name} has a '{columns.label}' column but {lacks.name} has not"
        )
    if train[1] is None:
        return Corpus(
            name, texts, (0,) * len(texts), (), "lm", users=users, given_test=given, skipped=skipped
        )
    values = train[1] + test[1]
    names = _label_names(values, columns, name)
    index = {n: i for i, n in enumerate(names)}
    labels = tuple(index[v] for v in values)
    return Corpus(
        name, texts, labels, names, "classification", users=users, given_test=given, skipped=skipped
    )


def _bad_row(read: _Rows, where: str, problem: str, skip: bool) -> None:
    """Count the bad row at ``where`` as skipped when ``skip``; else refuse it (one line)."""
    if not skip:
        raise FedloraError(f"{where}: {problem}; {SKIP_HINT}")
    read.skipped.append((where, problem))


def _report_skipped(name: str, reads: list[_Rows]) -> tuple[str, ...]:
    """The locations of the rows skipped in ``reads``, each ``file:line``; a warning counts them
    (once per process: not again in each client worker process, which reads the same file)."""
    skipped = [s for read in reads for s in read.skipped]
    if skipped and multiprocessing.parent_process() is None:
        total = sum(read.records for read in reads)
        shown = "; ".join(f"{where}: {problem}" for where, problem in skipped[:SHOWN])
        more = f"; and {len(skipped) - SHOWN} more" if len(skipped) > SHOWN else ""
        log.warning(
            "%s: skipped %s of %d (--skip-bad-rows): %s%s",
            name,
            _bad_rows(len(skipped)),
            total,
            shown,
            more,
        )
    return tuple(where for where, _ in skipped)


def _bad_rows(count: int) -> str:
    """``count`` bad row(s), in words."""
    return f"{count} bad row{'s' if count != 1 else ''}"


def _table(
    read: _Rows, columns: Columns, name: str, need_user: bool = True, need_label: bool = True
) -> tuple[tuple[str, ...], tuple[str, ...] | None, tuple[str, ...]]:
    """``(texts, label values or None without a label column, users)`` of the rows with a text.
    Checks that the text column (and the user column, when ``need_user``) exists, that a label
    column the user named or a declared label set needs exists (when ``need_label``), and that
    each labelled row has a label (in the declared set, if any): a bad row is refused or, with
    ``skip_bad_rows``, dropped and recorded in ``read.skipped``."""
    rows = read.rows
    found = _columns_found(read, name)
    columns_found = f"(columns: {', '.join(found)})"
    if columns.text not in found:
        raise FedloraError(f"--dataset {name}: no text column '{columns.text}' {columns_found}")
    if need_user:
        _check_user(found, columns, name)
    if columns.label not in found and columns.label_required and need_label:
        raise FedloraError(f"--dataset {name}: no --label-column '{columns.label}' {columns_found}")
    kept = [(w, r) for w, r in rows if str(r.get(columns.text) or "").strip()]
    if not kept:
        raise FedloraError(f"--dataset {name}: every row's '{columns.text}' is empty")
    labelled = columns.label in found
    if labelled:
        declared = set(columns.labels)
        good = []
        for where, row in kept:
            value = row.get(columns.label)
            value = "" if value is None else str(value).strip()
            if not value:
                _bad_row(read, where, f"no '{columns.label}'", columns.skip_bad_rows)
            elif declared and value not in declared:
                listed = ", ".join(columns.labels)
                _bad_row(
                    read, where, f"label '{value}' is not one of --labels {listed}", columns.skip_bad_rows
                )
            else:
                good.append((where, row))
        kept = good
    if not kept:
        raise FedloraError(f"--dataset {name}: every row was skipped ({_bad_rows(len(read.skipped))})")
    texts = tuple(str(r[columns.text]).strip() for _, r in kept)
    users = tuple(str(r.get(columns.user, "")) for _, r in kept) if columns.user in found else ()
    if not labelled:
        return texts, None, users
    return texts, tuple(str(r[columns.label]).strip() for _, r in kept), users


def _columns_found(read: _Rows, name: str) -> list[str]:
    """The columns of the file ``name`` (its first row's); a one-line error when it has no rows."""
    if not read.rows:
        skipped = f" ({_bad_rows(len(read.skipped))} skipped)" if read.skipped else ""
        raise FedloraError(f"--dataset {name}: no rows{skipped}")
    return list(read.rows[0][1])


def _check_user(found: list[str], columns: Columns, name: str) -> None:
    """The ``--partition-by`` column, if any, is one of the columns ``found`` in the file ``name``."""
    if columns.user and columns.user not in found:
        raise FedloraError(
            f"--dataset {name}: no --partition-by column '{columns.user}' (columns: {', '.join(found)})"
        )


def _conversations(name: str, reads: list[tuple[_Rows, str]], columns: Columns) -> Corpus | None:
    """The corpus ``name`` of conversations (common/data/conversation.py) of ``reads`` (each a
    file's rows and its name in errors; a dataset directory's train file then its test file, whose
    rows become the given test split), or None when no file is instruction data (by
    ``columns.instruction_format`` and each file's columns: common/data/instructions.py). Checks as
    :func:`_table` does (the user column in the first file, no file left without rows); a row that
    is not a conversation is refused or, with ``skip_bad_rows``, dropped and recorded. A file of
    instruction data beside one that is not, or with a label column named or a label set declared,
    is a one-line error."""
    found = [_columns_found(read, shown) for read, shown in reads]
    forms = [
        instructions.reading(cols, columns.instruction_format, columns.prompt, columns.response, shown)
        for cols, (_, shown) in zip(found, reads, strict=True)
    ]
    if all(form is None for form in forms):
        return None
    if None in forms:  # a dataset directory: one file is instruction data, the other is not
        lacks = forms.index(None)
        has = 1 - lacks
        raise FedloraError(
            f"--dataset {name}: {reads[has][1]} holds instruction data but {reads[lacks][1]} does not"
        )
    if columns.label_required:
        raise FedloraError(
            f"--dataset {name}: instruction data has no labels: drop --label-column/--labels, or read "
            "the file as before with --instruction-format none"
        )
    _check_user(found[0], columns, reads[0][1])
    texts: list[str] = []
    users: list[str] = []
    starts = []  # the index of each file's first text
    for (read, shown), form in zip(reads, forms, strict=True):
        starts.append(len(texts))
        for where, row in read.rows:
            turns = form.conversation(row)
            if isinstance(turns, str):
                _bad_row(read, where, turns, columns.skip_bad_rows)
                continue
            texts.append(conversation.dumps(turns))
            users.append(str(row.get(columns.user, "")))
        if len(texts) == starts[-1]:
            raise FedloraError(f"--dataset {shown}: every row was skipped ({_bad_rows(len(read.skipped))})")
    skipped = _report_skipped(name, [read for read, _ in reads])
    return Corpus(
        name,
        tuple(texts),
        (0,) * len(texts),
        (),
        conversation.TASK,
        users=tuple(users) if columns.user else (),
        given_test=tuple(range(starts[1], len(texts))) if len(reads) > 1 else (),
        skipped=skipped,
    )


def _label_names(values: tuple[str, ...], columns: Columns, name: str) -> tuple[str, ...]:
    names = tuple(sorted(set(values)))
    if len(names) < 2:
        raise FedloraError(
            f"--dataset {name}: '{columns.label}' has one value ({names[0]}); a task needs two"
        )
    if not columns.labels and (doubts := suspect_labels(values)) and multiprocessing.parent_process() is None:
        log.warning(
            "--dataset %s: %s; each value of '%s' is its own class (declare the classes with --labels "
            "A,B,C to refuse any other)",
            name,
            "; ".join(doubts),
            columns.label,
        )
    return names


def suspect_labels(values: Sequence[str]) -> list[str]:
    """What looks like a mistake in undeclared labels: a label with one example, and labels that
    differ only in case or surrounding spaces (``Billing`` beside ``billing``)."""
    counts = Counter(values)
    folded: dict[str, list[str]] = {}
    for value in sorted(counts):
        folded.setdefault(value.strip().casefold(), []).append(value)
    doubts = [f"label '{v}' has a single example" for v in sorted(counts) if counts[v] == 1]
    doubts += [
        f"labels {' and '.join(repr(v) for v in same)} differ only in case or spaces"
        for same in folded.values()
        if len(same) > 1
    ]
    return doubts


def read_rows(path: str | Path, skip_bad_rows: bool = False) -> list[dict]:
    """The rows of the CSV, JSONL, Parquet or plain-text file ``path`` (by its suffix) as dicts of
    column values (CSV values are strings; a ``.txt`` line is ``{"text": line}``). An unreadable
    file, a JSONL line that is not an object, or a CSV row with the wrong number of fields or
    broken quoting is a one-line error naming the file and line; with ``skip_bad_rows`` such a CSV
    row is skipped instead, and a warning counts the skipped rows."""
    read = _read(Path(path), str(path), skip=skip_bad_rows)
    _report_skipped(str(path), [read])
    return [row for _, row in read.rows]


def first_columns(path: str | Path, skip_bad_rows: bool = False) -> list[str]:
    """The columns of the first row :func:`read_rows` gives for ``path`` (none for a file without
    rows), read to tell the file's form: the skipped rows are not reported here, the reading that
    follows reports them."""
    rows = _read(Path(path), str(path), skip=skip_bad_rows).rows
    return list(rows[0][1]) if rows else []


def _read(path: Path, shown: str, skip: bool) -> _Rows:
    """:func:`read_rows` of ``path``, each row with its location (``shown`` is the file's name in
    them); with ``skip``, malformed CSV rows are skipped and recorded instead of refused."""
    suffix = path.suffix.lower()
    if suffix not in SUFFIXES:
        raise FedloraError(f"{path}: not a {', '.join(s[1:] for s in SUFFIXES)} file")
    if suffix == ".csv":
        return _csv_rows(path, shown, skip)
    if suffix == ".txt":  # plain text: each non-blank line is a text of the column "text", no label
        lines = read_text(path).splitlines()
        return _Rows([(f"{shown}:{n}", {"text": t.strip()}) for n, t in enumerate(lines, 1) if t.strip()])
    if suffix == ".jsonl":
        rows = []
        for where, row in json_lines(path):
            where = f"{shown}:{where.rsplit(':', 1)[1]}"
            if not isinstance(row, dict):
                raise FedloraError(f"{where}: not a JSON object")
            rows.append((where, row))
        return _Rows(rows)
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise FedloraError(f"{path.name}: reading Parquet needs pyarrow (pip install pyarrow)") from None
    try:
        table = pq.read_table(path).to_pylist()
    except (OSError, ValueError) as exc:  # pyarrow's ArrowInvalid is a ValueError
        raise FedloraError(f"cannot read data file {path}: {str(exc).splitlines()[0]}") from None
    return _Rows([(f"{shown}:row {n}", row) for n, row in enumerate(table, 1)])


def _csv_rows(path: Path, shown: str, skip: bool) -> _Rows:
    """The rows of a CSV file (a spreadsheet's byte-order mark ignored, blank lines skipped). The
    header must name each column once; a row must have as many fields as the header and
    well-formed quoting (Python's ``csv`` in strict mode: an unterminated quote is an error, not a
    field that runs to the end of the file). A bad row is refused with its line, or with ``skip``
    recorded, and reading resumes at the line after the one it starts on."""
    text = read_text(path, "utf-8-sig")
    lines = io.StringIO(text, newline="").readlines()  # the lines csv sees (\n, \r\n or \r)
    read, header = _Rows([]), None
    position = 0  # lines consumed

    def feed() -> Iterator[str]:
        nonlocal position
        while position < len(lines):
            position += 1
            yield lines[position - 1]

    reader = csv.reader(feed(), strict=True)
    while True:
        start = position + 1  # the line the next record starts on
        try:
            fields = next(reader)
        except StopIteration:
            break
        except csv.Error as exc:
            if header is None:
                raise FedloraError(f"{shown}:{start}: the header is not valid CSV ({exc})") from None
            _bad_row(read, f"{shown}:{start}", _quoting_problem(str(exc), start, position), skip)
            read.unread += 1
            position = start  # the rest of the file is read again from the next line
            reader = csv.reader(feed(), strict=True)
            continue
        if not any(f.strip() for f in fields):  # a blank line
            continue
        if header is None:
            header = _header(fields, f"{shown}:{start}")
        elif len(fields) != len(header):
            _bad_row(read, f"{shown}:{start}", _count_problem(len(fields), len(header)), skip)
            read.unread += 1
        else:
            read.rows.append((f"{shown}:{start}", dict(zip(header, fields, strict=True))))
    return read


def _header(fields: list[str], where: str) -> list[str]:
    """The column names of a CSV header (stripped), each of which must be there once."""
    names = [f.strip() for f in fields]
    for name in names:
        if names.count(name) > 1:
            raise FedloraError(f"{where}: the header names the column '{name}' twice")
    return names


def _count_problem(count: int, expected: int) -> str:
    """A row of ``count`` fields under a header of ``expected``, in words."""
    text = f"{count} field{'s' if count != 1 else ''}, the header has {expected}"
    if count > expected:
        text += ' (a text with a comma in it must be quoted: "a, b")'
    return text


def _quoting_problem(error: str, start: int, end: int) -> str:
    """What the csv module's ``error`` for a record from line ``start`` to ``end`` means."""
    if "unexpected end of data" in error:
        return "a quoted field opens on this line and is never closed (it would swallow every row after it)"
    if "expected after" not in error:
        return f"not valid CSV ({error})"
    if end > start:
        return f"a quoted field opens on this line and runs to line {end}, where it is malformed ({error})"
    return f'a quoted field is malformed ({error}; a quote in a text is written "")'


__all__ = [
    "DEFAULT_COLUMNS",
    "DEFAULT_LABEL",
    "SUFFIXES",
    "Columns",
    "first_columns",
    "is_file_dataset",
    "load_file_corpus",
    "read_rows",
    "split_files",
    "suspect_labels",
]
