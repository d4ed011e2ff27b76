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
        ("review,mood\nfine,\nok,b\n", Columns("review", "mood"), "bad.csv:2: no 'mood'"),
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


# -- issue 53: a data owner's first hour (a misspelled column, malformed rows)

TICKETS = "text,category\nmy card was charged twice,billing\nthe parcel never came,shipping\n"
TICKETS += "cannot log in since monday,account\nrefund for the double charge,billing\n"
TICKETS += "where is my order,shipping\npassword reset mail never arrives,account\n"
REFUSED = ["--rounds", "1", "--eval-examples", "8", "--workers", "1", "--num-clients", "2"]


def _refused(tmp_path, capsys, args: list[str]) -> str:
    """``fedlora simulate`` with ``args``: exit 2, one line on stderr (returned), no run directory."""
    out = tmp_path / "run"
    code = run_cli(["simulate", *REFUSED, *args, "--out", str(out)])
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert not out.exists()
    return err


@pytest.mark.parametrize("preset", ["minilm-rt", "smollm2-rt"])
def test_a_misspelled_label_column_names_the_file_s_columns_whatever_the_model(tmp_path, capsys, preset):
    """A label column the user named must exist: a typo is one line listing the columns, for a
    classifier and a causal LM alike (not 'needs a causal LM', not a language-modelling run)."""
    path = tmp_path / "tickets.csv"
    path.write_text(TICKETS, encoding="utf-8")
    err = _refused(
        tmp_path, capsys, ["--preset", preset, "--dataset", str(path), "--label-column", "categroy"]
    )
    assert "tickets.csv: no --label-column 'categroy' (columns: text, category)" in err


def test_an_unnamed_label_column_absent_from_the_file_is_still_language_modelling(tmp_path):
    """The documented default: without --label-column, a file without a 'label' column is LM."""
    path = tmp_path / "notes.csv"
    path.write_text("text,author\nfirst note,ann\nsecond note,bob\n", encoding="utf-8")
    assert load_file_corpus(str(path)).task == "lm"


@pytest.mark.parametrize(
    ("content", "extra", "where"),
    [
        # a row with too many fields (an unquoted comma): not a row labelled "fields"
        (TICKETS + "extra,fields,in,this,row\n", [], "tickets.csv:8: 5 fields, the header has 2"),
        # too few fields
        (TICKETS.replace("where is my order,shipping", "where is my order"), [], "tickets.csv:6: 1 field,"),
        # an unterminated quote: it would swallow every row after it
        (TICKETS.replace("the parcel", '"the parcel'), [], "tickets.csv:3: a quoted field"),
        # a label outside the declared label set
        (
            TICKETS + "hello there,smalltalk\n",
            ["--labels", "billing,shipping,account"],
            "tickets.csv:8: label 'smalltalk' is not one of --labels billing, shipping, account",
        ),
    ],
    ids=["extra-fields", "missing-field", "unterminated-quote", "undeclared-label"],
)
def test_malformed_csv_rows_are_refused_with_the_line_number(tmp_path, capsys, content, extra, where):
    path = tmp_path / "tickets.csv"
    path.write_text(content, encoding="utf-8")
    args = ["--preset", "minilm-rt", "--dataset", str(path), "--label-column", "category", *extra]
    err = _refused(tmp_path, capsys, args)
    assert where in err and "--skip-bad-rows" in err


def test_skip_bad_rows_skips_only_the_bad_rows_and_counts_them(tmp_path, caplog):
    """Asked (--skip-bad-rows), malformed rows are left out and counted: the rows after an
    unterminated quote are read, and a row with extra fields adds no class."""
    bad = TICKETS.replace("the parcel", '"the parcel') + "extra,fields,in,this,row\nhello there,smalltalk\n"
    path = tmp_path / "tickets.csv"
    path.write_text(bad, encoding="utf-8")
    columns = Columns("text", "category", labels=("billing", "shipping", "account"), skip_bad_rows=True)
    with caplog.at_level("WARNING"):
        corpus = load_file_corpus(str(path), columns)
    assert corpus.label_names == ("account", "billing", "shipping")  # no 4th class "fields"
    assert len(corpus) == 5 and "cannot log in since monday" in corpus.texts
    assert corpus.skipped == tuple(f"{path}:{line}" for line in (3, 8, 9))
    assert f"skipped 3 bad rows of 8 (--skip-bad-rows): {path}:3: a quoted field" in caplog.text


def test_skip_bad_rows_and_labels_reach_the_reader_from_the_command_line():
    """``--labels`` and ``--skip-bad-rows`` are run options (default: any label, refuse bad rows)."""
    import argparse

    from common.runtime import columns_of
    from server.simulate_cli import add_config_arguments, config_from_args

    parser = argparse.ArgumentParser()
    add_config_arguments(parser)
    args = ["--label-column", "category", "--labels", "billing, shipping,account", "--skip-bad-rows"]
    cfg = config_from_args(parser.parse_args(args))
    assert columns_of(cfg) == Columns("text", "category", "", ("billing", "shipping", "account"), True)
    assert columns_of(config_from_args(parser.parse_args([]))) == Columns()


@pytest.mark.parametrize(
    ("content", "columns", "message"),
    [
        # a declared label set needs a label column (the default name included)
        (
            "text,kind\na,x\nb,y\n",
            Columns(labels=("x", "y")),
            "no --label-column 'label' (columns: text, kind)",
        ),
        ("text,label\na,x\nb,y\n", Columns(labels=("x", "x")), "--labels names 'x' twice"),
        ("text,label\na,x\nb,,\n", Columns(), "bad.csv:3: 3 fields"),
        ("text,label\na,x\nb,\n", Columns(), "bad.csv:3: no 'label'"),
        ('text,label\n"a" b,x\nb,y\n', Columns(), "bad.csv:2: a quoted field"),
    ],
)
def test_more_bad_own_files_are_one_line_with_the_line(tmp_path, content, columns, message):
    path = tmp_path / "bad.csv"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(FedloraError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load_file_corpus(str(path), columns)


def test_well_formed_csv_details_are_read_as_before(tmp_path):
    """Blank lines, a quoted text over several lines and a spreadsheet's byte-order mark are fine."""
    path = tmp_path / "ok.csv"
    content = '\ufefftext,label\n"two\nlines, quoted",a\n\nplain,b\n'
    path.write_text(content, encoding="utf-8")
    corpus = load_file_corpus(str(path))
    assert corpus.texts == ("two\nlines, quoted", "plain") and corpus.label_names == ("a", "b")
    assert corpus.skipped == ()


@pytest.mark.parametrize("suffix", [".csv", ".jsonl", ".txt"])
def test_a_file_that_is_not_utf8_says_where_and_to_re_save_it_as_utf8(tmp_path, capsys, suffix):
    """A spreadsheet's Latin-1 export (é as byte 0xe9): one line naming the byte and the fix."""
    rows = {".csv": "text,label\nun café,a\nno,b\n", ".jsonl": '{"text": "café", "label": "a"}\n'}
    path = tmp_path / f"latin1{suffix}"
    path.write_bytes(rows.get(suffix, "un café\n").encode("latin-1"))
    err = _refused(tmp_path, capsys, ["--dataset", str(path)])
    assert "is not UTF-8 text (byte" in err and "\\xe9" in err and "re-save it as UTF-8" in err


def test_a_lone_label_or_a_label_in_another_case_is_warned_of_unless_the_classes_are_declared(
    tmp_path, caplog
):
    """Issue 75 item 4: a rare class or ``Billing`` beside ``billing`` used to become a class silently."""
    path = tmp_path / "tickets.csv"
    rows = [
        ("printer broken", "it"),
        ("login fails", "it"),
        ("refund me", "billing"),
        ("charged twice", "billing"),
    ]
    rows += [("invoice wrong", "Billing"), ("cannot print", "it")]
    with path.open("w", newline="") as fh:
        csv.writer(fh).writerows([("text", "label"), *rows])
    with caplog.at_level("WARNING", logger="fedlora.data"):
        corpus = load_file_corpus(str(path), Columns())
    assert corpus.label_names == ("Billing", "billing", "it")  # still its own class: a warning, not a refusal
    assert (
        "label 'Billing' has a single example; labels 'Billing' and 'billing' differ only in case or spaces"
        in caplog.text
    )
    assert "--labels" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING", logger="fedlora.data"):
        load_file_corpus(str(path), Columns(labels=("billing", "it"), skip_bad_rows=True))
    assert "single example" not in caplog.text  # declared classes: the reader refuses (or skips) the rest
