"""A data owner's own labelled file as the federation's dataset (common/data/files.py): any number
of classes read from the data, natural clients by a user column, one-line errors."""

from __future__ import annotations

import csv
import json

import pytest

from client.node import sdk
from common.data.federated import SplitSettings, federated_split
from common.data.files import Columns, load_file_corpus
from common.data.owner import read_jsonl
from common.errors import FedloraError
from tests.conftest import run_cli

MOODS = ("calm", "angry", "sad")
WORDS = {"calm": "quiet gentle peaceful", "angry": "furious shouting rage", "sad": "tears grief lonely"}


def _csv(path, rows=200, users=20):
    with open(path, "w", newline="", encoding="utf-8") as fh:
        out = csv.writer(fh)
        out.writerow(["review", "mood", "user"])
        for i in range(rows):
            mood = MOODS[i % 3]
            out.writerow([f"note {i}: {WORDS[mood]} day number {i}", mood, f"u{i % users}"])
    return path


def test_a_three_class_csv_reads_its_labels_and_users(tmp_path):
    path = _csv(tmp_path / "own.csv")
    corpus = load_file_corpus(str(path), Columns("review", "mood", "user"))
    assert corpus.label_names == ("angry", "calm", "sad") and corpus.task == "classification"
    assert len(corpus) == 200 and corpus.labels[:3] == (1, 0, 2) and len(set(corpus.users)) == 20
    split = federated_split(
        str(path), 10, SplitSettings(method="natural", seed=1, columns=Columns("review", "mood", "user"))
    )
    owners = [{corpus.users[i] for i in c} for c in split.clients]
    assert len(split.clients) == 10 and all(len(o) == 1 for o in owners)  # one user per client
    assert len(set().union(*owners)) == 10


@pytest.mark.integration
def test_a_three_class_csv_federates_and_the_card_names_the_file(tmp_path):
    path = _csv(tmp_path / "own.csv")
    out = tmp_path / "run"
    args = ["--preset", "small", "--dataset", str(path), "--text-column", "review", "--label-column", "mood"]
    args += ["--partition", "natural", "--partition-by", "user", "--num-clients", "6", "--sample-rate", "1"]
    args += ["--rounds", "1", "--local-steps", "2", "--eval-examples", "30", "--workers", "1"]
    assert run_cli(["simulate", *args, "--out", str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["dataset"] == str(path) and summary["num_clients"] == 6
    card = (out / "adapter" / "README.md").read_text()
    assert "natural partition of own.csv, one client per value of user" in card  # its base name only
    assert "The dataset is the file own.csv (200 rows, 3 classes)." in card
    assert str(tmp_path) not in card  # the card travels with the adapter: no path of this machine


@pytest.mark.parametrize(
    ("content", "columns", "message"),
    [
        ("review,mood\nfine,a\n", Columns("text", "mood"), "no text column 'text' (columns: review, mood)"),
        ("review,mood\nfine,a\nok,a\n", Columns("review", "mood"), "'mood' has one value (a)"),
        ("review,mood\nfine,\nok,b\n", Columns("review", "mood"), "a row has no 'mood'"),
        ("review,mood\n", Columns("review", "mood"), "no rows"),
    ],
)
def test_bad_own_files_are_one_line(tmp_path, content, columns, message):
    path = tmp_path / "bad.csv"
    path.write_text(content)
    with pytest.raises(FedloraError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load_file_corpus(str(path), columns)


def test_partition_by_needs_the_natural_partition(tmp_path, capsys):
    path = _csv(tmp_path / "own.csv")
    args = ["simulate", "--preset", "small", "--dataset", str(path), "--partition-by", "user"]
    assert run_cli([*args, "--out", str(tmp_path / "r")]) == 2
    assert "--partition-by needs --partition natural" in capsys.readouterr().err


def test_a_text_file_of_lines_is_a_language_modelling_dataset_here_and_through_the_sdk(tmp_path):
    """A node's own plain text (issue 33): one text per non-blank line, no labels; the SDK writes
    the node's JSONL with label 0, which a language-modelling run (shakespeare) accepts."""
    lines = tmp_path / "lines.txt"
    lines.write_text("To be, or not to be.\n\n  That is the question.  \n", encoding="utf-8")
    corpus = load_file_corpus(str(lines))
    assert (corpus.task, corpus.texts, corpus.label_names) == (
        "lm",
        ("To be, or not to be.", "That is the question."),
        (),
    )
    out = sdk.prepare_data(lines, tmp_path / "node" / "data.jsonl", dataset="shakespeare")
    assert read_jsonl(out).texts == corpus.texts and set(read_jsonl(out).labels) == {0}
    (tmp_path / "blank.txt").write_text("\n \n", encoding="utf-8")
    with pytest.raises(FedloraError, match="no rows"):
        sdk.load_data(tmp_path / "blank.txt")
