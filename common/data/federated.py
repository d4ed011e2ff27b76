"""The federation's view of a corpus: held-out test set and one training shard per client."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from common.data.corpora import Corpus, load_corpus
from common.data.dedup import keep_together, text_groups
from common.data.files import DEFAULT_COLUMNS, Columns, is_file_dataset, load_file_corpus
from common.data.split import partition, train_test_split
from common.errors import FedloraError


@dataclass(frozen=True)
class FederatedSplit:
    """Index arrays into ``corpus``: ``test`` (server evaluation), ``clients[k]`` (client k) and
    ``public`` (the server's public data, split off before partitioning; empty unless asked for).
    No text occurs in two of test, public and the clients' union (copies compared by
    :func:`~common.data.dedup.text_key`); copies within one of them, or on two clients, may remain."""

    corpus: Corpus
    test: np.ndarray
    clients: tuple[np.ndarray, ...]
    public: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))

    def texts(self, idx: np.ndarray) -> list[str]:
        return [self.corpus.texts[i] for i in idx]

    def labels(self, idx: np.ndarray) -> list[int]:
        return [self.corpus.labels[i] for i in idx]


@dataclass(frozen=True)
class SplitSettings:
    """How :func:`federated_split` splits a corpus (hashable: a process computes each split once).

    method: how the training pool is partitioned over the clients (common/data/split.py:
        ``iid``, ``dirichlet`` over labels, ``natural`` by user).
    alpha: the Dirichlet concentration of ``dirichlet`` (smaller: more skewed label mixes).
    test_fraction: share of the corpus held out as the test set, in [0, 1) (ignored when the
        corpus has its own test split).
    max_train: cap on the training pool's examples, 0 = none.
    max_test: cap on the test set's examples, 0 = none.
    seed: seeds the test split, the public share, the caps and the partition.
    public_fraction: share of the training pool that becomes the server's public data, 0 = none.
    columns: the text, label and user columns of a data owner's file (and ``--partition-by``).
    users_per_client: whole users (units) each client holds under ``natural``.
    """

    method: str = "dirichlet"
    alpha: float = 1.0
    test_fraction: float = 0.2
    max_train: int = 0
    max_test: int = 0
    seed: int = 0
    public_fraction: float = 0.0
    columns: Columns = DEFAULT_COLUMNS
    users_per_client: int = 1


def federated_split(
    dataset: str, num_clients: int, settings: SplitSettings = SplitSettings()
) -> FederatedSplit:
    """Seeded split (the fields named below are ``settings``'): ``public_fraction`` of the training
    pool becomes the server's public data (for a corpus that names ``public_groups``, e.g.
    shakespeare's held-out plays: exactly those units, which are then never client or test data
    whatever the fraction), then
    the test set is capped at ``max_test`` and the rest of the pool at ``max_train`` (0 = no cap)
    before partitioning it over ``num_clients``. All copies of a text (equal ``text_key``) go
    where its first occurrence in the corpus goes, so test, public and client data share no text;
    the fractions hold up to those copies, and a corpus without copies splits as it always has.
    A corpus with its own test split (:attr:`Corpus.given_test`, a dataset directory's test file)
    keeps exactly those rows as the test set (``test_fraction`` is ignored; ``max_test`` still caps
    it) and the other rows, less any copy of a test text, as the training pool."""
    method, alpha, seed, columns = settings.method, settings.alpha, settings.seed, settings.columns
    test_fraction, public_fraction = settings.test_fraction, settings.public_fraction
    max_train, max_test = settings.max_train, settings.max_test
    corpus = open_corpus(dataset, columns)
    groups = corpus_groups(corpus)
    public = np.zeros(0, dtype=np.int64)
    if corpus.given_test:  # the dataset's own test split: exactly its rows, whatever test_fraction
        test = np.asarray(corpus.given_test, dtype=np.int64)
        train = np.setdiff1d(np.arange(len(corpus)), test)
        train = train[~np.isin(groups[train], groups[test])]  # no copy of a test text in training
        if not len(train):
            raise FedloraError(f"{dataset}: every training text is also a test text")
        if public_fraction > 0:
            train, public = split_off(train, public_fraction, seed, groups)
    elif corpus.public_groups:  # whole units (plays) held out: never client or test data
        held = np.isin(np.asarray(corpus.groups), corpus.public_groups)
        pool = np.flatnonzero(~held)
        train, test = train_test_split(len(pool), test_fraction, seed)
        train, test = keep_together((pool[train], pool[test]), groups)
        if public_fraction > 0:
            public = np.flatnonzero(held)
    else:
        train, test = train_test_split(len(corpus), test_fraction, seed, groups)
        if public_fraction > 0:
            train, public = split_off(train, public_fraction, seed, groups)
    if not len(test):
        raise FedloraError(f"{dataset}: no test example left once copies of a text are kept together")
    rng = np.random.default_rng([seed, 0xCA9])
    if max_train and len(train) > max_train:
        train = np.sort(rng.choice(train, max_train, replace=False))
    if max_test and len(test) > max_test:
        test = np.sort(rng.choice(test, max_test, replace=False))
    labels = np.asarray(corpus.labels)[train]
    units = _users(corpus, columns, dataset)
    users = [units[i] for i in train] if units else None
    parts = partition(labels, num_clients, method, alpha, seed, users, settings.users_per_client)
    return FederatedSplit(corpus, test, tuple(train[p] for p in parts), public)


def _users(corpus: Corpus, columns: Columns, dataset: str) -> tuple[str, ...]:
    """Each text's user for ``--partition natural``: the corpus's users, or its groups when
    ``--partition-by`` names them (a data owner's file read its user column when it was opened)."""
    if not columns.user or is_file_dataset(dataset):
        return corpus.users
    if columns.user != corpus.group_name:
        can = f"'{corpus.group_name}' or nothing" if corpus.group_name else "nothing (one client per user)"
        raise FedloraError(f"--partition-by {columns.user}: dataset {dataset} can be partitioned by {can}")
    return corpus.groups


def open_corpus(dataset: str, columns: Columns = DEFAULT_COLUMNS) -> Corpus:
    """A packaged dataset by name, or a data owner's file or dataset directory (common/data/files.py)
    with ``columns``."""
    return load_file_corpus(dataset, columns) if is_file_dataset(dataset) else load_corpus(dataset)


_GROUPS: dict[int, tuple[Corpus, np.ndarray]] = {}  # id(corpus) -> (corpus, its text groups)


def corpus_groups(corpus: Corpus) -> np.ndarray:
    """:func:`text_groups` of ``corpus``, once per corpus object and process (every client's split
    needs it; load_corpus returns the same object each time). Read-only."""
    held = _GROUPS.get(id(corpus))
    if held is None or held[0] is not corpus:
        groups = text_groups(corpus.texts)
        groups.setflags(write=False)
        held = _GROUPS[id(corpus)] = (corpus, groups)
    return held[1]


def split_off(
    pool: np.ndarray, fraction: float, seed: int, groups: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """``pool`` as disjoint ``(rest, part)`` with ``part`` a seeded ``fraction`` of it; with
    ``groups`` (:func:`text_groups` of the corpus that ``pool`` indexes) every copy of a text then
    follows the copy with the lowest index, as in :func:`train_test_split`."""
    rest, part = train_test_split(len(pool), fraction, seed + 0x9B1)
    rest, part = pool[rest], pool[part]
    if groups is not None:
        rest, part = keep_together((rest, part), groups)
    return rest, part
