"""A data owner's own examples, in their canonical on-disk form: a JSONL file with one
``{"text": "...", "label": 0}`` object per line, or, for instruction and chat data, one
``{"messages": [{"role": ..., "content": ...}, ...]}`` object per line (a conversation,
common/data/conversation.py).

``label`` is an integer class index of the run's dataset (its ``label_names``), or a label name when
the names are known; a language-modelling dataset uses label 0. Extra keys in a record are ignored.
Every check fails with a one-line :class:`FedloraError`, and :func:`write_jsonl` never overwrites.
"""

from __future__ import annotations

import json
import numbers
import os
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from common.data.corpora import Corpus
from common.errors import FedloraError

TEXT, LABEL = "text", "label"
MESSAGES = "messages"  # a conversation record's key


@dataclass(frozen=True)
class OwnerData:
    """Validated texts (non-blank strings) with integer labels (>= 0), same length, non-empty."""

    texts: tuple[str, ...]
    labels: tuple[int, ...]

    def __len__(self) -> int:
        return len(self.texts)


def owner_data(
    texts: Sequence[object], labels: Sequence[object], label_names: Sequence[str] = (), source: str = "data"
) -> OwnerData:
    """Validate ``texts`` and ``labels``; label names are mapped to indices with ``label_names``."""
    texts, labels = list(texts), list(labels)
    if len(texts) != len(labels):
        raise FedloraError(f"{source}: {len(texts)} texts but {len(labels)} labels")
    if not texts:
        raise FedloraError(f"{source}: no examples")
    names = {name: i for i, name in enumerate(label_names)}
    out_texts, out_labels = [], []
    for i, (text, label) in enumerate(zip(texts, labels, strict=True), start=1):
        if not isinstance(text, str) or not text.strip():
            raise FedloraError(f"{source}: example {i}: text must be a non-empty string, got {text!r:.60}")
        out_texts.append(text)
        out_labels.append(_label(label, names, f"{source}: example {i}"))
    return OwnerData(tuple(out_texts), tuple(out_labels))


def _label(value: object, names: dict[str, int], where: str) -> int:
    if isinstance(value, str):
        if value in names:
            return names[value]
        known = f"; known names: {', '.join(names)}" if names else " (give the dataset to use label names)"
        raise FedloraError(f"{where}: unknown label name {value!r}{known}")
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise FedloraError(f"{where}: label must be an integer class index or a label name, got {value!r}")
    if int(value) < 0:
        raise FedloraError(f"{where}: label must be >= 0, got {value}")
    return int(value)


def check_labels(data: OwnerData, corpus: Corpus, source: str = "data") -> None:
    """Every label is a class of ``corpus`` (label 0 only, for a language-modelling corpus)."""
    classes = len(corpus.label_names) if corpus.task == "classification" else 1
    for i, label in enumerate(data.labels, start=1):
        if label >= classes:
            valid = f"0..{classes - 1} ({', '.join(corpus.label_names)})" if corpus.label_names else "0"
            raise FedloraError(
                f"{source}: example {i}: label {label} is not a class of {corpus.name}; valid labels: {valid}"
            )


def owner_corpus(data: OwnerData, base: Corpus) -> Corpus:
    """``data`` as a corpus with ``base``'s name, label names and task (checked against them)."""
    check_labels(data, base)
    return Corpus(base.name, data.texts, data.labels, base.label_names, base.task)


def read_jsonl(path: str | os.PathLike, label_names: Sequence[str] = ()) -> OwnerData:
    """Read and validate a JSONL file of ``{"text": ..., "label": ...}`` records (blank lines skipped)."""
    texts, labels = [], []
    for where, record in json_lines(path):
        if not isinstance(record, dict) or TEXT not in record or LABEL not in record:
            raise FedloraError(f'{where}: expected an object with "{TEXT}" and "{LABEL}" keys')
        texts.append(record[TEXT])
        labels.append(record[LABEL])
    return owner_data(texts, labels, label_names, source=str(path))


def read_text(path: Path, encoding: str = "utf-8") -> str:
    """The text of data file ``path``; one line when it cannot be read, and when it is not UTF-8,
    where and what to do (a spreadsheet's "CSV UTF-8" export, or any editor's save as UTF-8)."""
    try:
        return path.read_text(encoding=encoding)
    except UnicodeDecodeError as exc:
        raise FedloraError(
            f"{path} is not UTF-8 text (byte {exc.start}: {exc.object[exc.start : exc.start + 1]!r}): re-save it "
            'as UTF-8 (a spreadsheet: "CSV UTF-8"; an editor: encoding UTF-8)'
        ) from None
    except OSError as exc:
        raise FedloraError(f"cannot read data file {path}: {exc}") from None


def json_lines(path: str | os.PathLike) -> Iterator[tuple[str, object]]:
    """``(where, value)`` for each non-blank line of the JSONL file ``path``, ``where`` being
    ``path:line``; an unreadable file or a line that is not JSON is a one-line error."""
    path = Path(path)
    for number, line in enumerate(read_text(path).splitlines(), start=1):
        if not line.strip():
            continue
        try:
            yield f"{path}:{number}", json.loads(line)
        except json.JSONDecodeError as exc:
            raise FedloraError(f"{path}:{number}: not a JSON object ({exc.msg})") from None


def to_jsonl(data: OwnerData) -> bytes:
    """The canonical JSONL bytes of ``data``."""
    lines = (
        json.dumps({TEXT: t, LABEL: y}, ensure_ascii=False)
        for t, y in zip(data.texts, data.labels, strict=True)
    )
    return ("\n".join(lines) + "\n").encode("utf-8")


def write_jsonl(data: OwnerData, path: str | os.PathLike) -> Path:
    """Write ``data`` to ``path`` (parents created). A file already there is left as it is: the same
    data is accepted (writing twice is harmless), other content is an error."""
    return _write_once(to_jsonl(data), Path(path))


def is_conversation_jsonl(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a JSONL file whose first record is a conversation (``{"messages": ...}``)."""
    if not str(path).lower().endswith(".jsonl") or not Path(path).is_file():
        return False
    first = next((record for _, record in json_lines(path)), None)
    return isinstance(first, dict) and MESSAGES in first


def read_conversations(path: str | os.PathLike) -> tuple[str, ...]:
    """The conversations of a JSONL file of ``{"messages": [...]}`` records, as their canonical JSON
    (:func:`common.data.conversation.dumps`); a record that is not one is a one-line error naming its
    line."""
    from common.data.conversation import dumps, problem

    texts = []
    for where, record in json_lines(path):
        if not isinstance(record, dict) or MESSAGES not in record:
            raise FedloraError(f'{where}: expected an object with a "{MESSAGES}" list')
        if why := problem(record[MESSAGES]):
            raise FedloraError(f"{where}: {why}")
        texts.append(dumps(tuple((t["role"], t["content"]) for t in record[MESSAGES])))
    if not texts:
        raise FedloraError(f"{path}: no conversations")
    return tuple(texts)


def write_conversations(texts: Sequence[str], path: str | os.PathLike) -> Path:
    """Write conversations (their canonical JSON) to ``path`` as ``{"messages": [...]}`` records,
    never overwriting (as :func:`write_jsonl`)."""
    lines = (json.dumps({MESSAGES: json.loads(text)}, ensure_ascii=False) for text in texts)
    return _write_once(("\n".join(lines) + "\n").encode("utf-8"), Path(path))


def _write_once(content: bytes, path: Path) -> Path:
    """``content`` at ``path`` (parents created), or the file already there when it holds the same
    bytes; other content there is an error: nothing is ever overwritten."""
    if path.exists():
        if path.is_file() and path.read_bytes() == content:
            return path
        raise FedloraError(f"{path} already exists with other content; it is never overwritten")
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(content)
        os.link(tmp, path)  # fails if the path appeared meanwhile: still nothing overwritten
    except FileExistsError:
        raise FedloraError(f"{path} already exists; it is never overwritten") from None
    finally:
        os.unlink(tmp)
    return path


__all__ = [
    "LABEL",
    "MESSAGES",
    "TEXT",
    "OwnerData",
    "check_labels",
    "is_conversation_jsonl",
    "owner_corpus",
    "owner_data",
    "read_conversations",
    "read_jsonl",
    "write_conversations",
    "write_jsonl",
]
