"""A dataset directory with its own test split (``--dataset DIR`` holding train.<ext> and
test.<ext>, common/data/files.py): the test set is exactly the test file's rows, training never
holds a copy of a test text, the classes are both files' labels, and bad directories are one line."""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest

from common.config import RunConfig
from common.data.dedup import text_key
from common.data.federated import SplitSettings, federated_split, open_corpus
from common.data.files import Columns, is_file_dataset, load_file_corpus
from common.errors import FedloraError
from tests.conftest import run_cli

WORDS = {"calm": "quiet gentle peaceful", "angry": "furious shouting rage", "sad": "tears grief lonely"}
COLUMNS = Columns("review", "mood", "user")


def _train_csv(path, rows=120):
    with open(path, "w", newline="", encoding="utf-8") as fh:
        out = csv.writer(fh)
        out.writerow(["review", "mood", "user"])
        for i in range(rows):
            mood = ("calm", "angry", "sad")[i % 3]
            out.writerow([f"note {i}: {WORDS[mood]} day number {i}", mood, f"u{i % 12}"])
        out.writerow(["  Test Note 1: EXTRA ", "sad", "u0"])  # a copy of a test text (case, spaces)
    return path


def _test_jsonl(path, rows=30):
    records = [
        {"review": f"test note {i}: extra", "mood": "joyful" if i == 5 else "calm"} for i in range(rows)
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


@pytest.fixture
def data_dir(tmp_path):
    folder = tmp_path / "own"
    folder.mkdir()
    _train_csv(folder / "train.csv")
    _test_jsonl(folder / "test.jsonl")
    return folder


def test_the_test_file_is_the_test_set_and_training_holds_none_of_its_texts(data_dir):
    assert is_file_dataset(str(data_dir))
    corpus = load_file_corpus(str(data_dir), COLUMNS)
    assert corpus.label_names == ("angry", "calm", "joyful", "sad")  # joyful: only in test
    assert len(corpus) == 151 and corpus.given_test == tuple(range(121, 151))
    assert corpus.texts[121] == "test note 0: extra" and corpus.labels[126] == 2
    for seed, fraction in ((0, 0.2), (3, 0.9)):
        split = federated_split(
            str(data_dir), 4, SplitSettings(method="iid", seed=seed, test_fraction=fraction, columns=COLUMNS)
        )
        assert split.test.tolist() == list(range(121, 151))  # the test file's rows, whatever the fraction
        train = np.concatenate(split.clients)
        assert sorted(train.tolist()) == list(range(120))  # row 120 copies a test text: dropped
        test_keys = {text_key(t) for t in split.texts(split.test)}
        assert not test_keys & {text_key(t) for t in split.texts(train)}
    split = federated_split(
        str(data_dir), 4, SplitSettings(method="iid", public_fraction=0.25, columns=COLUMNS)
    )
    assert len(split.public) == 30 and len(np.concatenate(split.clients)) == 90
    assert split.test.tolist() == list(range(121, 151))


def test_the_sdk_maps_label_names_to_a_directory_datasets_classes(data_dir):
    from client.node import sdk

    columns = {"dataset": str(data_dir), "text_column": "review", "label_column": "mood"}
    assert sdk.load_data([("a good day", "joyful"), ("a bad day", "angry")], **columns).labels == (2, 0)


def test_an_edited_file_is_read_again(data_dir):
    before = load_file_corpus(str(data_dir), COLUMNS)
    _test_jsonl(data_dir / "test.jsonl", rows=10)
    after = load_file_corpus(str(data_dir), COLUMNS)
    assert len(before) == 151 and len(after) == 131 and after is not before


@pytest.mark.parametrize(
    ("files", "message"),
    [
        (
            {},
            "must hold one train.<csv|jsonl|parquet|txt> and one test.<csv|jsonl|parquet|txt> file; found no ",
        ),
        ({"notes.csv": "x"}, "found no train or test file"),
        ({"train.csv": "x", "train.jsonl": "x", "test.csv": "x"}, "found train.csv, train.jsonl, test.csv"),
        ({"train.csv": "review,mood\na,x\nb,y\n"}, "; found train.csv$"),
        (
            {"train.csv": "review,mood\na,x\nb,y\n", "test.csv": "review\nc\n"},
            "train.csv has a 'mood' column but test.csv has not",
        ),
        (
            {"train.csv": "review,mood\na,x\nb,x\n", "test.csv": "text,mood\nc,x\n"},
            r"own/test.csv: no text column 'review' \(columns: text, mood\)",
        ),
        ({"train.csv": "review,mood\na,x\n", "test.csv": "review,mood\nc,x\n"}, "'mood' has one value"),
    ],
)
def test_bad_directories_are_one_line(tmp_path, files, message):
    folder = tmp_path / "own"
    folder.mkdir()
    for name, content in files.items():
        (folder / name).write_text(content)
    with pytest.raises(FedloraError, match=message.replace("|", r"\|")) as info:
        open_corpus(str(folder), Columns("review", "mood"))
    assert "\n" not in str(info.value) and str(folder) in str(info.value)


def test_a_training_pool_of_test_copies_only_is_refused(tmp_path):
    folder = tmp_path / "own"
    folder.mkdir()
    (folder / "train.csv").write_text("review,mood\nSame,x\nother,y\n")
    (folder / "test.csv").write_text("review,mood\nsame,x\nOTHER,y\n")
    with pytest.raises(FedloraError, match="every training text is also a test text"):
        federated_split(str(folder), 1, SplitSettings(columns=Columns("review", "mood")))


def test_the_help_says_what_a_directory_holds():
    help_ = {f.name: f.metadata.get("help", "") for f in RunConfig.__dataclass_fields__.values()}
    assert "train.<ext> and test.<ext>" in help_["dataset"]
    assert "directory" in help_["test_fraction"]


@pytest.mark.integration
def test_a_directory_dataset_federates(data_dir, tmp_path):
    out = tmp_path / "run"
    args = [
        "--preset",
        "small",
        "--dataset",
        str(data_dir),
        "--text-column",
        "review",
        "--label-column",
        "mood",
    ]
    args += ["--num-clients", "3", "--sample-rate", "1", "--partition", "iid"]
    args += ["--rounds", "1", "--local-steps", "2", "--eval-examples", "30", "--workers", "1"]
    assert run_cli(["simulate", *args, "--out", str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["dataset"] == str(data_dir) and summary["num_clients"] == 3
