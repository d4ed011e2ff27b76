"""Join a fedlora federation as a data owner, from Python.

You keep your data and your model; the federation's server sees only the LoRA adapter increments
your node sends back, released under the privacy mechanism *you* choose. Three calls::

    from client.node import sdk

    data = sdk.prepare_data(my_examples, "my-node/data.jsonl", dataset="rotten-tomatoes")
    sdk.command(superlink="fl.example.org:8000", data=data, mechanism="dp-adamw", epsilon=8.0,
                root_certificates="ca.crt")   # the flower-supernode command line, not run
    sdk.join(superlink="fl.example.org:8000", data=data, mechanism="dp-adamw", epsilon=8.0,
             root_certificates="ca.crt")      # runs the node until you stop it (Ctrl-C)

**Data.** :func:`prepare_data` takes a list of ``(text, label)`` pairs, a list of texts with
``labels=``, a list of ``{"text": ..., "label": ...}`` dicts, a Hugging Face ``datasets.Dataset``
(columns ``text`` and ``label``), or a JSONL, CSV or Parquet file (columns ``text_column`` and
``label_column``), and writes the canonical JSONL file the node reads. A label is a class index of
the federation's dataset, or its name (``"positive"``) when you name the dataset (a packaged one)
or the federation's label names (``label_names=["billing", "bug", "other"]``: a federation on its
own data file, which your node does not need; the class indices are the names sorted, as that
file's classes are numbered).

**Privacy policy.** ``mechanism`` is the one mechanism your node takes part in (``fedavg``: no
privacy; ``prism``, ``dp-adamw``, ``ffa``, ``sparta``: sample-level DP of your examples; ``dp-fedavg``,
``dr-encoder``: client-level DP of your whole contribution) and ``epsilon`` is your budget for
its guarantee at ``delta``. Your node refuses a run with another mechanism, a larger δ, another
dataset than ``dataset``, or a plan that would take you over budget: for sample-level mechanisms
the budget covers your node's whole history, kept in the sample-level privacy ledger in
``state_dir`` (so a restart, or a second federation, adds to it rather than starting afresh).

**State.** ``state_dir`` (default ``~/.fedlora/node``) holds that ledger, the encoders a
DR-Encoder run sends, and Flower's own node files; keep it across restarts.

**Identity (secure aggregation).** Make your own identity key (:func:`keygen`, or ``ssh-keygen -t
ed25519``) and send only its public line to the operator, who assembles the roster; compare the
roster's SHA-256 and key count with the other owners. With ``trust="aggregate"`` a node refuses to
start without a roster that lists its identity.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from common.config import MECHANISMS
from common.data.owner import (
    LABEL,
    TEXT,
    OwnerData,
    check_labels,
    is_conversation_jsonl,
    owner_data,
    read_conversations,
    read_jsonl,
    write_conversations,
    write_jsonl,
)
from common.errors import FedloraError
from common.flower_processes import ANSI, FLOWER_EXIT, flower_env, flower_executable, free_port, toml_pairs
from common.privacy.participation.threat import TRUST
from common.secagg import identity
from common.signals import handlers_while

#: mechanisms whose guarantee is per example (sample-level) and per node (client-level)
SAMPLE_LEVEL = tuple(m for m, (opt, _) in MECHANISMS.items() if opt != "none")
CLIENT_LEVEL = tuple(m for m, (_, rel) in MECHANISMS.items() if rel != "none")
DEFAULT_STATE_DIR = Path("~/.fedlora/node")
# keygen's default: outside the state directory, so clearing that keeps the identity on the roster
DEFAULT_IDENTITY = Path("~/.fedlora/identity")
DATA_FILE = "data.jsonl"  # where join() writes in-memory data, inside the state directory
PORT_FILE = "node-port"  # the ClientApp port chosen for this state directory (command() and join() agree)
LABELS = "labels"  # node config: the federation's class names, comma-separated (client/node/shard.py)
SUPERNODE = "flower-supernode"
RUN_EPSILON = "run-epsilon"  # node config: the most one run may spend (client/node/policy.py)
GIVE_UP_AFTER = 120.0  # seconds a node keeps trying an unreachable SuperLink before it stops

Data = str | os.PathLike | Sequence | Mapping | object


# --- data ----------------------------------------------------------------------------------------
def prepare_data(
    data: Data,
    out_path: str | os.PathLike,
    *,
    labels: Sequence[object] | None = None,
    dataset: str | None = None,
    text_column: str = TEXT,
    label_column: str = LABEL,
    label_names: Sequence[str] | str | None = None,
    instructions: Instructions | None = None,
    skip_bad_rows: bool = False,
) -> Path:
    """Validate your examples and write them to ``out_path`` as JSONL (one ``{"text", "label"}``
    object per line), the file a node reads. Returns the absolute path.

    An instruction or chat data file (docs/instruction-tuning.md: found from its columns, or as
    ``instructions`` says: :class:`Instructions`) is written as one ``{"messages": [...]}``
    conversation a line instead, with no labels.

    ``data`` is one of: a list of ``(text, label)`` pairs; a list of texts, with ``labels=`` the
    list of their labels; a list of ``{"text": ..., "label": ...}`` dicts; a dict of columns; a
    Hugging Face ``datasets.Dataset`` (or any table with ``text_column`` and ``label_column``
    columns); or the path of a JSONL, CSV or Parquet file with those columns. With ``dataset``
    (e.g. ``"rotten-tomatoes"``, or the federation's own ``"own.csv"`` or dataset directory, read
    with the same columns) labels are checked against that dataset's classes and may be given by
    name (``"positive"``). A CSV label that is not a class name but a whole number is a class index.
    With ``label_names`` (e.g. ``["billing", "bug", "other"]``: the federation's label names) labels
    are those names, and the class indices follow them sorted, as the federation's own file
    dataset numbers its classes: no copy of the federation's file is needed.

    A malformed row of a file (a CSV row with broken quoting or the wrong number of fields, an
    instruction row with a missing or empty field) is a one-line error naming its line; with
    ``skip_bad_rows`` it is skipped, and a warning counts the rows skipped.

    An existing ``out_path`` is never overwritten: the same content is accepted (running your
    script twice is fine), anything else is an error.
    """
    columns = _columns_of(text_column, label_column, instructions or Instructions(), skip_bad_rows)
    if (conversations := _conversations(data, columns)) is not None:
        if labels is not None or label_names:
            raise FedloraError(f"{data} is instruction data (conversations): it has no labels to name")
        return write_conversations(conversations, out_path).resolve()
    examples = load_data(
        data,
        labels=labels,
        dataset=dataset,
        text_column=text_column,
        label_column=label_column,
        label_names=label_names,
        skip_bad_rows=skip_bad_rows,
    )
    return write_jsonl(examples, out_path).resolve()


@dataclass(frozen=True)
class Instructions:
    """How an instruction file is read (docs/instruction-tuning.md), as ``fedlora simulate``'s
    options of the same names: ``format`` (``auto``: from the columns, ``alpaca``,
    ``prompt-completion``, ``chat``, or ``none``: labelled or plain text), a prompt/completion
    file's ``prompt_column`` and ``response_column`` (``""``: ``prompt``, ``completion``)."""

    format: str = "auto"
    prompt_column: str = ""
    response_column: str = ""


def _columns_of(
    text_column: str = TEXT,
    label_column: str = LABEL,
    instructions: Instructions = Instructions(),
    skip_bad_rows: bool = False,
):
    """The :class:`common.data.files.Columns` a data file is read with."""
    from common.data.files import Columns

    return Columns(
        text_column,
        label_column,
        skip_bad_rows=skip_bad_rows,
        instruction_format=instructions.format,
        prompt=instructions.prompt_column,
        response=instructions.response_column,
    )


def _conversations(data: Data, columns) -> tuple[str, ...] | None:
    """The conversations of an instruction or chat data file read with ``columns`` (the forms of
    common/data/instructions.py, found from its columns or named; docs/instruction-tuning.md), as
    their canonical JSON, or None for any other data."""
    if not isinstance(data, str | os.PathLike) or not Path(data).is_file():
        return None
    if is_conversation_jsonl(data) and columns.instruction_format in ("auto", "chat"):
        return read_conversations(data)
    from common.data.federated import open_corpus
    from common.data.files import first_columns
    from common.data.instructions import reading

    found = first_columns(data, columns.skip_bad_rows)
    if reading(found, columns.instruction_format, columns.prompt, columns.response, str(data)) is None:
        return None
    return open_corpus(str(data), columns).texts


def load_data(
    data: Data,
    *,
    labels: Sequence[object] | None = None,
    dataset: str | None = None,
    text_column: str = TEXT,
    label_column: str = LABEL,
    label_names: Sequence[str] | str | None = None,
    skip_bad_rows: bool = False,
) -> OwnerData:
    """:func:`prepare_data` without writing: the validated examples."""
    names, corpus = _label_space(dataset, text_column, label_column, label_names)
    if isinstance(data, str | os.PathLike):
        if labels is not None:
            raise FedloraError("labels= goes with a list of texts, not with a file")
        if is_canonical_jsonl(data, text_column, label_column):
            examples = read_jsonl(data, names)
        else:
            texts, raw_labels = _file_columns(data, names, text_column, label_column, skip_bad_rows)
            examples = owner_data(texts, raw_labels, names, source=str(data))
    else:
        texts, raw_labels = _columns(data, labels, text_column, label_column)
        examples = owner_data(texts, raw_labels, names)
    if corpus is not None:
        check_labels(examples, corpus)
    return examples


def is_canonical_jsonl(data: object, text_column: str = TEXT, label_column: str = LABEL) -> bool:
    """Whether ``data`` is a JSONL file to read as the node's canonical ``{"text", "label"}`` records:
    with the default columns, or one whose first record has ``text`` and ``label`` but not the named
    columns (the file :func:`prepare_data` wrote from a file with those columns)."""
    if not isinstance(data, str | os.PathLike) or not str(data).lower().endswith(".jsonl"):
        return False
    if (text_column, label_column) == (TEXT, LABEL):
        return True
    from common.data.owner import json_lines

    try:
        first = next((record for _, record in json_lines(data)), None)
    except FedloraError:
        return False  # unreadable: the column reader says why
    return (
        isinstance(first, dict)
        and TEXT in first
        and LABEL in first
        and not (text_column in first and label_column in first)
    )


def declared_labels(label_names: Sequence[str] | str | None) -> tuple[str, ...]:
    """The class names a node declares (a list, or a comma-separated string), in class-index order:
    sorted, as the federation's own file dataset numbers its classes (common/data/files.py)."""
    if not label_names:
        return ()
    raw = label_names.split(",") if isinstance(label_names, str) else list(label_names)
    names = [str(name).strip() for name in raw]
    if any(not name for name in names):
        raise FedloraError(f"label names must not be empty, got {','.join(names)!r}")
    for name in names:
        if names.count(name) > 1:
            raise FedloraError(f"label names name '{name}' twice")
    if len(names) < 2:
        raise FedloraError(f"label names declare {len(names)} label(s); a classification task needs two")
    return tuple(sorted(names))


def _label_space(
    dataset: str | None,
    text_column: str = TEXT,
    label_column: str = LABEL,
    label_names: Sequence[str] | str | None = None,
):
    """``(label names, corpus)``: the declared ``label_names`` (sorted), else those of ``dataset``
    (a packaged dataset, or a data file or dataset directory on this machine, read with the given
    columns), or ``((), None)``. A packaged ``dataset`` must have the declared names."""
    from common.data.corpora import Corpus
    from common.data.federated import open_corpus
    from common.data.files import Columns, is_file_dataset

    declared = declared_labels(label_names)
    if declared:
        if dataset is not None and not is_file_dataset(str(dataset)):
            corpus = open_corpus(str(dataset))
            if sorted(corpus.label_names) != list(declared):
                known = ", ".join(corpus.label_names) or "none (language modelling)"
                raise FedloraError(f"label names {', '.join(declared)} are not those of {dataset}: {known}")
            return corpus.label_names, corpus
        return declared, Corpus(str(dataset or "your labels"), (), (), declared, "classification")
    if dataset is None:
        return (), None
    if is_file_dataset(str(dataset)) and not Path(dataset).exists():
        raise FedloraError(
            f"dataset {dataset} is not on this machine, and a node does not need it: name the "
            "federation's label names instead (label_names=[...], fedlora node --labels a,b,c)"
        )
    corpus = open_corpus(str(dataset), Columns(text_column, label_column))
    return corpus.label_names, corpus


def _file_columns(
    path: str | os.PathLike,
    names: Sequence[str],
    text_column: str,
    label_column: str,
    skip_bad_rows: bool = False,
) -> tuple[list, list]:
    """``(texts, labels)`` of a CSV, Parquet or JSONL file with named columns, or of a ``.txt`` file
    (one text per non-blank line, label 0: a language-modelling dataset); a CSV label (always a
    string) that is not one of ``names`` but a whole number becomes that class index; a malformed
    CSV row is skipped with ``skip_bad_rows`` (:func:`common.data.files.read_rows`)."""
    from common.data.files import read_rows

    if not Path(path).is_file():
        raise FedloraError(f"data file not found: {path}")
    rows = read_rows(path, skip_bad_rows)
    if not rows:
        raise FedloraError(f"{path}: no rows")
    if str(path).lower().endswith(".txt"):  # plain text, one text per line: language modelling (label 0)
        return [r["text"] for r in rows], [0] * len(rows)
    for i, row in enumerate(rows, start=1):
        for column in (text_column, label_column):
            if column not in row:
                found = ", ".join(map(str, row))
                raise FedloraError(f"{path}: row {i} has no column '{column}' (columns: {found})")
    texts = [r[text_column] for r in rows]
    labels = [r[label_column] for r in rows]
    if str(path).lower().endswith(".csv"):
        labels = [_csv_label(v, names) for v in labels]
    return texts, labels


def _csv_label(value: str, names: Sequence[str]) -> str | int:
    value = (value or "").strip()
    return int(value) if value not in names and value.isascii() and value.isdigit() else value


def _columns(
    data: object, labels: Sequence[object] | None, text_column: str, label_column: str
) -> tuple[list, list]:
    """``(texts, labels)`` from any in-memory form :func:`prepare_data` accepts."""
    if labels is not None:
        return _as_list(data, "texts"), _as_list(labels, "labels")
    if isinstance(data, Mapping) or hasattr(data, "column_names") or hasattr(data, "columns"):
        return _table_columns(data, text_column, label_column)
    rows = _as_list(data, "data")
    if rows and all(isinstance(r, Mapping) for r in rows):
        return _record_columns(rows, text_column, label_column)
    if rows and all(isinstance(r, Sequence) and not isinstance(r, str) and len(r) == 2 for r in rows):
        return [r[0] for r in rows], [r[1] for r in rows]
    if rows and all(isinstance(r, str) for r in rows):
        raise FedloraError("data is a list of texts: give their labels too, labels=[...]")
    if not rows:
        raise FedloraError("data: no examples")
    raise FedloraError("data must be (text, label) pairs, {'text', 'label'} dicts, a table or a JSONL path")


def _table_columns(data, text_column: str, label_column: str) -> tuple[list, list]:
    if hasattr(data, "column_names"):  # datasets.Dataset
        present = list(data.column_names)
    elif hasattr(data, "columns"):  # a pandas DataFrame
        present = list(data.columns)
    else:
        present = list(data.keys())
    for column in (text_column, label_column):
        if column not in present:
            raise FedloraError(f"data has no column '{column}' (columns: {', '.join(map(str, present))})")
    return _as_list(data[text_column], "texts"), _as_list(data[label_column], "labels")


def _record_columns(rows: list[Mapping], text_column: str, label_column: str) -> tuple[list, list]:
    for i, row in enumerate(rows, start=1):
        if text_column not in row or label_column not in row:
            raise FedloraError(f"data: record {i} lacks '{text_column}' or '{label_column}'")
    return [r[text_column] for r in rows], [r[label_column] for r in rows]


def _as_list(values: object, what: str) -> list:
    if isinstance(values, str | bytes) or not isinstance(values, Iterable):
        raise FedloraError(f"{what} must be a list, got {type(values).__name__}")
    out = list(values)
    return [v.item() if hasattr(v, "item") and not isinstance(v, str) else v for v in out]  # numpy scalars


# --- the node ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class NodeConfig:
    """Everything a data owner's node needs. See :func:`join` for the meaning of each field."""

    superlink: str
    data: str | os.PathLike
    mechanism: str
    epsilon: float | None = None
    delta: float = 1e-5
    dataset: str | None = None
    model: str | None = None
    state_dir: str | os.PathLike = DEFAULT_STATE_DIR
    root_certificates: str | os.PathLike | None = None
    auth_key: str | os.PathLike | None = None
    insecure: bool = False
    port: int | None = None
    clear_statistics: bool = False
    trust: str = "none"
    identity_key: str | os.PathLike | None = None  # default: auth_key (the registered SuperNode key)
    roster: str | os.PathLike | None = None
    text_column: str = TEXT  # the columns of a file ``dataset`` (own.csv); ``data`` is the node's JSONL
    label_column: str = LABEL
    label_names: tuple[str, ...] | str | None = None  # the federation's class names (sorted: indices)
    run_epsilon: float | None = None  # the most one run may spend of ``epsilon`` (None: all of it)
    give_up_after: float = GIVE_UP_AFTER  # seconds without the SuperLink before the node stops (0: never)

    def checked(self) -> NodeConfig:
        """Validated, with absolute paths and a runtime port; raises :class:`FedloraError`."""
        _check_address(self.superlink)
        _check_policy(self.mechanism, self.epsilon, self.delta)
        _check_run_share(self.epsilon, self.run_epsilon)
        if not self.give_up_after >= 0:
            raise FedloraError(f"give-up-after must be seconds >= 0 (0: never), got {self.give_up_after}")
        if self.trust not in TRUST:
            raise FedloraError(f"trust must be one of {', '.join(TRUST)}, got '{self.trust}'")
        _check_transport(self.insecure, self.root_certificates, self.auth_key)
        identity_key = _existing(self.identity_key or self.auth_key, "identity key")
        roster = _existing(self.roster, "roster")
        _check_roster(self.trust, identity_key, roster)
        if self.model is not None:
            from common.models import resolve_model

            resolve_model(self.model)  # a registry name, local model directory or Hugging Face id
        data = Path(self.data).expanduser().resolve()
        if data.suffix.lower() != ".jsonl":
            raise FedloraError(
                f"{data}: a node reads a JSONL file of text/label records; write it with prepare_data"
            )
        declared = declared_labels(self.label_names)
        if is_conversation_jsonl(data):  # instruction / chat data: conversations, no labels
            if declared:
                raise FedloraError(f"{data} holds conversations: it has no labels to name")
            read_conversations(data)  # fail here, not in the first round
        else:
            names, corpus = _label_space(self.dataset, self.text_column, self.label_column, declared)
            examples = read_jsonl(data, names)  # fail here, not in the first round
            if corpus is not None:
                check_labels(examples, corpus)
        state_dir = Path(self.state_dir).expanduser().resolve()
        return replace(
            self,
            data=data,
            label_names=declared or None,
            state_dir=state_dir,
            root_certificates=_existing(self.root_certificates, "root certificates"),
            auth_key=_existing(self.auth_key, "authentication key"),
            identity_key=identity_key,
            roster=roster,
            model=_model_ref(self.model),
            port=self.port if self.port is not None else node_port(state_dir),
        )

    def node_config(self) -> dict[str, str | float]:
        """The ``--node-config`` keys the ClientApp reads (client/node/policy.py, client/node/shard.py)."""
        values: dict[str, str | float] = {
            "data-path": str(self.data),
            "state-dir": str(self.state_dir),
            "mechanism": self.mechanism,
            "delta": float(self.delta),
            "trust": self.trust,
        }
        if self.epsilon is not None:
            key = "sample-epsilon" if self.mechanism in SAMPLE_LEVEL else "client-epsilon"
            values[key] = float(self.epsilon)
        if self.run_epsilon is not None:
            values[RUN_EPSILON] = float(self.run_epsilon)
        if self.dataset:
            values["dataset"] = self.dataset
        if self.label_names:
            values[LABELS] = ",".join(declared_labels(self.label_names))
        if self.model:
            values["model-path"] = self.model
        if self.clear_statistics:
            values["clear-statistics"] = True
        if self.identity_key:
            values[identity.IDENTITY_KEY] = str(self.identity_key)
        if self.roster:
            values[identity.ROSTER] = str(self.roster)
        return values

    def command(self) -> list[str]:
        """The ``flower-supernode`` argv for this (checked) configuration."""
        argv = [flower_executable(SUPERNODE), "--superlink", self.superlink]
        if self.insecure:
            argv.append("--insecure")
        if self.root_certificates:
            argv += ["--root-certificates", str(self.root_certificates)]
        if self.auth_key:
            argv += ["--auth-supernode-private-key", str(self.auth_key)]
        argv += ["--host", "127.0.0.1", "--port", str(self.port)]
        if self.give_up_after:
            argv += ["--max-wait-time", f"{self.give_up_after:g}"]
        return [*argv, "--node-config", toml_pairs(self.node_config())]

    def budget_lines(self) -> list[str]:
        """What a private node says before it starts: its budget, whom it covers, and how much of it
        one run may spend; a warning when one run may spend all of it (issue 75 item 6)."""
        if self.epsilon is None:
            return []
        unit = "sample-level" if self.mechanism in SAMPLE_LEVEL else "client-level"
        whole = float(self.epsilon)
        lines = [
            f"privacy budget: {unit} epsilon {whole:g} (delta {self.delta:g}) for every {self.mechanism} "
            f"run this node joins, kept in the ledger under {self.state_dir}"
        ]
        share = whole if self.run_epsilon is None else float(self.run_epsilon)
        lines.append(f"one run may spend up to epsilon {share:g} ({share / whole:.0%} of it)")
        if share >= whole:
            lines.append(
                "warning: one run may spend your whole budget, leaving nothing for later runs "
                "(--run-epsilon caps what one run may spend)"
            )
        return lines

    def identity_lines(self) -> list[str]:
        """What a (checked) node with a roster says before it starts: its identity's fingerprint and
        the roster's SHA-256 and key count, the numbers its owner compares with the other owners."""
        if self.roster is None:
            return []
        me = identity.load_identity(str(self.identity_key))
        digest, count = identity.roster_digest(str(self.roster))
        return [
            f"node identity {identity.fingerprint(me.public)} ({self.identity_key}): on the roster",
            f"roster {self.roster}: {count} keys, sha256 {digest} (compare both with the other data "
            "owners, out of band, before the first round)",
        ]

    def environment(self, base: Mapping[str, str] | None = None) -> dict[str, str]:
        """The node's environment: Flower's files under the state directory, and this Python's
        scripts first on ``PATH`` (the SuperNode starts ``flower-superexec`` from ``PATH``)."""
        env = flower_env(Path(self.state_dir) / "flower", base)
        env.setdefault("HF_HUB_OFFLINE", "1")
        return env


def command(
    superlink: str,
    data: Data,
    mechanism: str,
    epsilon: float | None = None,
    **options: object,
) -> list[str]:
    """The ``flower-supernode`` command line that :func:`join` would run (nothing is started).
    Same arguments as :func:`join`; in-memory data is written to ``<state_dir>/data.jsonl``."""
    return configure(superlink, data, mechanism, epsilon, **options).command()


def join(
    superlink: str,
    data: Data,
    mechanism: str,
    epsilon: float | None = None,
    **options: object,
) -> int:
    """Run your node: a ``flower-supernode`` serving the federation at ``superlink`` with your data,
    until it stops or you press Ctrl-C (returns its exit code).

    Args:
        superlink: the federation's SuperLink, ``HOST:PORT`` (no ``https://``).
        data: a JSONL file written by :func:`prepare_data`, or anything :func:`prepare_data`
            accepts, a CSV or Parquet file included (then written to ``<state_dir>/data.jsonl``).
        mechanism: the only mechanism your node takes part in: ``fedavg`` (no DP), ``prism``,
            ``dp-adamw``, ``ffa``, ``sparta`` (sample-level DP), ``dp-fedavg``, ``dr-encoder`` (client-level DP).
        epsilon: your privacy budget for that mechanism's guarantee (required unless ``fedavg``):
            the whole sample-level history of your data, or the run's client-level plan.

    Keyword options:
        delta: the largest δ you accept (default 1e-5).
        run_epsilon: the most one run may spend of ``epsilon`` (default: all of it, and the node
            warns so at start): a run whose plan would spend more is refused.
        give_up_after: seconds the node keeps trying a SuperLink that does not answer before it
            stops with a one-line error (default 120; 0: forever).
        dataset: the federation dataset your labels belong to (``rotten-tomatoes``, ..., or a data
            file such as ``own.csv``): labels may then be names, and your node refuses runs on
            another dataset.
        text_column, label_column: the columns of your data file (default ``text`` and ``label``).
        label_names: the federation's class names (e.g. ``["billing", "bug", "other"]``): your
            labels are those names, numbered as the federation numbers them (sorted). With a
            federation on its own data file, this, not the file, is what your node needs; ``dataset``
            then names that file only for the check that a run is on it.
        model: where your node loads the base model from (a local directory or Hugging Face id);
            it must be the federation model's architecture. Default: the run's model name.
        state_dir: your node's persistent directory (default ``~/.fedlora/node``).
        root_certificates: the CA certificate (PEM) that signed the SuperLink's TLS certificate.
        auth_key: your node's private key, registered by the federation operator with
            ``flwr supernode register`` (SuperNode authentication; needs TLS).
        insecure: plain HTTP, without TLS: only for a SuperLink on your own machine or network.
        port: the local port for the node's own ClientApp process (default: a free one).
        clear_statistics: take part in ``dr-encoder`` runs whose statistics round goes out in the
            clear, outside every guarantee (default False: your node refuses them).
        trust: whom your node trusts with less than its own noise (client/node/policy.py ``TRUST``):
            ``none`` (default: only local noise, your ε holds against the server too), ``aggregate``
            (also distributed noise summed by secure aggregation: your ε holds against a server
            that may deviate from the protocol, as long as no roster identity is the server's or
            colludes with it; with node keys the operator made, only against parties other than
            the operator; needs ``roster``) or ``server`` (also central noise, distributed noise
            and ``--encode-at server``: your ε then holds against everyone but the server).
        identity_key: the private key your node signs its secure-aggregation keys with (default:
            ``auth_key``; Ed25519 or Flower's P-384 SuperNode key). Make it yourself
            (:func:`keygen`) and keep it on your machine: whoever holds it can sign as your node.
        roster: the federation's identity public keys, one OpenSSH line per node, assembled by its
            operator from the lines the owners sent; compare its SHA-256 and key count with the
            other owners. It must list your identity (checked before the node starts, which then
            prints both numbers and your key's fingerprint on stderr).
    """
    port_given = options.get("port") is not None
    return start(configure(superlink, data, mechanism, epsilon, **options), port_given=port_given)


def start(cfg: NodeConfig, *, print_command: bool = False, port_given: bool = False) -> int:
    """Run a node from :func:`configure` in the foreground (what :func:`join` does), or with
    ``print_command`` print its ``flower-supernode`` command line and run nothing. Either way a node
    with a roster first says, on stderr, its identity's fingerprint and the roster's SHA-256 and
    key count (:meth:`NodeConfig.identity_lines`)."""
    sys.stdout.flush()  # what the caller printed first comes first in a shared log
    for line in (*cfg.budget_lines(), *cfg.identity_lines()):
        print(line, file=sys.stderr, flush=True)
    if print_command:
        import shlex

        print(shlex.join(cfg.command()), flush=True)
        return 0
    cfg.state_dir.mkdir(parents=True, exist_ok=True)
    if not port_given and not _bindable(cfg.port):  # the remembered port is taken now
        (cfg.state_dir / PORT_FILE).unlink(missing_ok=True)
        cfg = replace(cfg, port=node_port(cfg.state_dir))
    return run_supernode(cfg.command(), cfg.environment(), cfg.give_up_after)


def keygen(path: str | os.PathLike = DEFAULT_IDENTITY) -> tuple[Path, bytes]:
    """Make this node's identity key: a fresh Ed25519 key (OS CSPRNG) written to ``path`` as an
    unencrypted OpenSSH private key (mode 0600), its public line to ``path.pub``. Returns the key's
    absolute path and its public line (``ssh-ed25519 AAAA...``), what its owner sends the operator
    for the roster. An existing key or ``.pub`` is never overwritten (the roster may list it): a
    one-line error. ``ssh-keygen -t ed25519 -N '' -f PATH`` makes an equivalent key."""
    key = Path(path).expanduser().absolute()
    public = key.with_name(key.name + ".pub")
    for existing in (key, public):
        if existing.exists() or existing.is_symlink():
            raise FedloraError(
                f"{existing} exists: an identity key is never overwritten; choose another path"
            )
    try:
        key.parent.mkdir(parents=True, exist_ok=True)
        os.close(os.open(key, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))  # private from the start
    except OSError as exc:
        raise FedloraError(f"identity key {key}: {exc.strerror or exc}") from None
    me = identity.new_identity()
    try:
        identity.save_identity(me, key)
    except BaseException:
        key.unlink(missing_ok=True)
        raise
    return key, me.public


def configure(
    superlink: str, data: Data, mechanism: str, epsilon: float | None = None, **options
) -> NodeConfig:
    """The checked :class:`NodeConfig` that :func:`command` prints and :func:`join` runs (same
    arguments; in-memory data is written to ``<state_dir>/data.jsonl``)."""
    unknown = (
        set(options)
        - set(NodeConfig.__dataclass_fields__)
        - {"superlink", "data", "mechanism", "epsilon", "instructions", "skip_bad_rows"}
    )
    if unknown:
        raise FedloraError(f"unknown option(s) {', '.join(sorted(unknown))}")
    state_dir = Path(options.get("state_dir") or DEFAULT_STATE_DIR).expanduser().resolve()
    columns = {k: options.pop(k) for k in ("text_column", "label_column") if k in options}
    label_names = declared_labels(options.pop("label_names", None)) or None
    instructions = options.pop("instructions", None)
    skip_bad_rows = bool(options.pop("skip_bad_rows", False))
    read_with = _columns_of(
        **columns, instructions=instructions or Instructions(), skip_bad_rows=skip_bad_rows
    )
    canonical = (is_conversation_jsonl(data) and instructions is None) or (
        is_canonical_jsonl(data, read_with.text, read_with.label) and _conversations(data, read_with) is None
    )
    if not canonical:
        # in-memory data, a CSV/Parquet/JSONL of other columns, or instruction data: the node's JSONL
        data = prepare_data(
            data,
            state_dir / DATA_FILE,
            dataset=options.get("dataset"),
            label_names=label_names,
            instructions=instructions,
            skip_bad_rows=skip_bad_rows,
            **columns,
        )
    options = {**options, "state_dir": state_dir, "label_names": label_names, **columns}
    return NodeConfig(superlink, data, mechanism, epsilon, **options).checked()


def node_port(state_dir: Path) -> int:
    """The local ClientApp port of the node with this state directory: the one chosen before (kept
    in ``<state_dir>/node-port``, so that the command :func:`command` prints is the one :func:`join`
    runs), else a free one, remembered."""
    path = Path(state_dir) / PORT_FILE
    with contextlib.suppress(OSError, ValueError):
        port = int(path.read_text().strip())
        if 0 < port < 65536:
            return port
    port = free_port()
    with contextlib.suppress(OSError):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"{port}\n")
    return port


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


class SuperLinkUnreachable(FedloraError):
    """The node's SuperNode could not reach the SuperLink in time and stopped (exit code 1)."""

    exit_code = 1


GAVE_UP = "305"  # Flower's SUPERNODE_CONNECTION_ERROR exit code, after --max-wait-time / --max-retries


def run_supernode(argv: list[str], env: Mapping[str, str], give_up_after: float = 0.0) -> int:
    """Run ``argv`` in the foreground; SIGTERM and Ctrl-C stop it cleanly. Returns its exit code.
    Its output is relayed line by line, without Flower's colour codes where ours is not a terminal
    (a log file). A SuperNode that gave up on an unreachable SuperLink (Flower's exit code 305,
    after ``--max-wait-time``, which ``give_up_after`` states) ends in one line (exit code 1)."""
    proc = subprocess.Popen(
        argv, env=dict(env), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, errors="replace"
    )
    gave_up = threading.Event()
    relays = [
        threading.Thread(target=_relay, args=(stream, out, gave_up), daemon=True)
        for stream, out in ((proc.stdout, sys.stdout), (proc.stderr, sys.stderr))
    ]
    for relay in relays:
        relay.start()
    # off the main thread nothing is installed: the caller handles signals
    with handlers_while({signal.SIGTERM: lambda *_: proc.terminate()}):
        try:
            code = proc.wait()
        except KeyboardInterrupt:  # the SuperNode got the Ctrl-C too (same process group)
            try:
                code = proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                code = proc.wait()
    for relay in relays:
        relay.join(timeout=5)
    if gave_up.is_set():
        raise SuperLinkUnreachable(
            f"gave up on the SuperLink after {give_up_after:g} s without an answer (--give-up-after): "
            "check its HOST:PORT, that it runs, and its TLS settings"
        )
    return code


def _relay(stream, out, gave_up: threading.Event) -> None:
    """Copy ``stream``'s lines to ``out`` (colour codes removed unless ``out`` is a terminal);
    set ``gave_up`` on Flower's connection-error exit line."""
    keep_colour = out.isatty()
    for line in stream:
        plain = ANSI.sub("", line)
        if (code := FLOWER_EXIT.search(plain)) and code.group(1) == GAVE_UP:
            gave_up.set()
        out.write(line if keep_colour else plain)
        out.flush()


# --- checks ----------------------------------------------------------------------------------------
_ADDRESS = re.compile(r"^(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.-]+):(\d{1,5})$")


def _check_address(address: str) -> None:
    if "://" in str(address):
        raise FedloraError(f"superlink '{address}': give HOST:PORT without a URL prefix")
    match = _ADDRESS.match(str(address))
    if not match or not 0 < int(match.group(2)) < 65536:
        raise FedloraError(f"superlink must be HOST:PORT (e.g. 127.0.0.1:8000), got '{address}'")


def _check_policy(mechanism: str, epsilon: float | None, delta: float) -> None:
    if mechanism not in MECHANISMS:
        raise FedloraError(f"unknown mechanism '{mechanism}'; available: {', '.join(MECHANISMS)}")
    if mechanism == "fedavg" and epsilon is not None:
        raise FedloraError("mechanism fedavg has no privacy guarantee: epsilon does not apply to it")
    if mechanism != "fedavg" and (
        epsilon is None or not float(epsilon) > 0 or float(epsilon) == float("inf")
    ):
        raise FedloraError(f"mechanism {mechanism} needs your privacy budget: a finite epsilon > 0")
    if not 0 < float(delta) < 1:
        raise FedloraError(f"delta must be in (0, 1), got {delta}")


def _check_run_share(epsilon: float | None, run_epsilon: float | None) -> None:
    if run_epsilon is None:
        return
    if epsilon is None:
        raise FedloraError("run epsilon caps a share of your budget: it needs a mechanism with epsilon")
    if not 0 < float(run_epsilon) <= float(epsilon):
        raise FedloraError(f"run epsilon must be in (0, epsilon {epsilon:g}], got {run_epsilon:g}")


def _check_transport(insecure: bool, root_certificates: object, auth_key: object) -> None:
    if insecure and root_certificates:
        raise FedloraError("choose either insecure (plain HTTP) or root certificates (TLS), not both")
    if insecure and auth_key:
        raise FedloraError("SuperNode authentication needs TLS: give root certificates instead of insecure")


def _check_roster(trust: str, key: Path | None, roster: Path | None) -> None:
    """A node that may take part in secure aggregation has a roster; a roster holds this node's own
    identity (which must load): refused at start, in one line, not in the first secure round."""
    if roster is None:
        if trust == "aggregate":
            raise FedloraError(
                "trust aggregate is secure aggregation, which needs the federation's roster (fedlora node "
                "--roster FILE, roster=): the identity public keys the data owners checked; nothing started"
            )
        return
    if key is None:
        raise FedloraError("a roster needs this node's identity key: --identity-key KEY (or --auth-key)")
    identity.member(str(key), str(roster), "send its public line to the operator; nothing started")


def _existing(path: str | os.PathLike | None, what: str) -> Path | None:
    if path is None:
        return None
    resolved = Path(path).expanduser().resolve()
    if not resolved.is_file():
        raise FedloraError(f"{what} file not found: {path}")
    return resolved


def _model_ref(model: str | None) -> str | None:
    """A local model directory as an absolute path (the ClientApp runs elsewhere); names and ids as given."""
    if model is None:
        return None
    path = Path(model).expanduser()
    return str(path.resolve()) if path.is_dir() else model


__all__ = [
    "Instructions",
    "NodeConfig",
    "SuperLinkUnreachable",
    "command",
    "configure",
    "declared_labels",
    "free_port",
    "join",
    "keygen",
    "load_data",
    "node_port",
    "prepare_data",
    "start",
    "toml_pairs",
]
