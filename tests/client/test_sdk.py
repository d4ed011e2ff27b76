"""The client SDK (client/node/sdk.py), the node's policy (client/node/policy.py), a node's own data and model
(client/node/shard.py), and the README's SDK example run as a new user would, against a real
flower-superlink (slow)."""

from __future__ import annotations

import contextlib
import csv
import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from flwr.app import Context, Message, RecordDict

from client.node import sdk
from client.node.policy import NodePolicy, planned_client_epsilon
from client.node.shard import load_own_shard, node_shard
from client.node.state import sample_ledger
from common.data.owner import read_jsonl
from common.errors import FedloraError
from common.flower_processes import free_port
from common.lazy import load_component
from common.models import adapter_state
from common.presets import preset
from common.privacy.accounting.ledger import Charge
from common.wire import TrainInstruction
from tests.conftest import run_cli
from tests.harness import message_identity

ROOT = Path(__file__).resolve().parents[2]
PAIRS = [("A warm, funny film.", 1), ("Tedious and far too long.", 0)] * 6
RUN = dict(max_train_examples=200, eval_examples=40, local_steps=2, batch_size=8, rounds=1, num_clients=1)


def _jsonl(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


class FakeDataset:
    """What the SDK uses of a Hugging Face ``datasets.Dataset``: ``column_names`` and column access."""

    def __init__(self, columns: dict[str, list]) -> None:
        self._columns = columns
        self.column_names = list(columns)

    def __getitem__(self, key: str) -> list:
        return self._columns[key]


class _Index(list):
    def __bool__(self) -> bool:  # like a pandas Index: no truth value
        raise ValueError("ambiguous")


class FakeFrame(FakeDataset):
    """A pandas-like table: ``columns`` instead of ``column_names``."""

    def __init__(self, columns: dict[str, list]) -> None:
        super().__init__(columns)
        del self.column_names
        self.columns = _Index(columns)


# --- data preparation ----------------------------------------------------------------------------
@pytest.mark.parametrize(
    "data, kwargs",
    [
        (PAIRS, {}),
        ([t for t, _ in PAIRS], {"labels": [y for _, y in PAIRS]}),
        ([{"text": t, "label": y, "id": i} for i, (t, y) in enumerate(PAIRS)], {}),
        ({"text": [t for t, _ in PAIRS], "label": [y for _, y in PAIRS]}, {}),
        (FakeDataset({"text": [t for t, _ in PAIRS], "label": [y for _, y in PAIRS]}), {}),
        (
            FakeDataset({"review": [t for t, _ in PAIRS], "y": [y for _, y in PAIRS]}),
            {"text_column": "review", "label_column": "y"},
        ),
        ([(t, ("negative", "positive")[y]) for t, y in PAIRS], {"dataset": "rotten-tomatoes"}),
        (FakeFrame({"text": [t for t, _ in PAIRS], "label": [y for _, y in PAIRS]}), {}),
    ],
    ids=["pairs", "two-lists", "records", "columns", "dataset", "dataset-columns", "label-names", "frame"],
)
def test_prepare_data_accepts_every_form(tmp_path, data, kwargs):
    out = sdk.prepare_data(data, tmp_path / "sub" / "data.jsonl", **kwargs)
    assert out.is_absolute() and out.parent.name == "sub"
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert lines == [{"text": t, "label": y} for t, y in PAIRS]
    again = sdk.prepare_data(out, tmp_path / "copy.jsonl")  # a JSONL file is an input too
    assert again.read_bytes() == out.read_bytes()
    assert sdk.prepare_data(data, out, **kwargs) == out  # the same content again: accepted


@pytest.mark.parametrize(
    "data, kwargs, message",
    [
        ([], {}, "no examples"),
        ([("fine", 2)], {"dataset": "rotten-tomatoes"}, "label 2 is not a class of rotten-tomatoes"),
        ([("fine", -1)], {}, "label must be >= 0"),
        ([("fine", 1.5)], {}, "integer class index"),
        ([("fine", "great")], {"dataset": "rotten-tomatoes"}, "unknown label name 'great'"),
        ([("fine", "positive")], {}, "give the dataset"),
        ([("  ", 1)], {}, "non-empty string"),
        (["a", "b"], {}, "give their labels too"),
        (["a", "b"], {"labels": [1]}, "2 texts but 1 labels"),
        ({"text": ["a"]}, {}, "no column 'label'"),
        ([("fine", 1)], {"dataset": "imdb"}, "unknown dataset"),
    ],
)
def test_prepare_data_refuses_bad_input_and_writes_nothing(tmp_path, data, kwargs, message):
    out = tmp_path / "data.jsonl"
    with pytest.raises(FedloraError, match=re.escape(message)):
        sdk.prepare_data(data, out, **kwargs)
    assert not out.exists()


def test_bad_jsonl_lines_name_file_and_line(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "ok", "label": 1}\n\n{"text": "no label"}\n')
    with pytest.raises(FedloraError, match=r"bad\.jsonl:3: expected an object"):
        read_jsonl(bad)
    bad.write_text("not json\n")
    with pytest.raises(FedloraError, match=r"bad\.jsonl:1: not a JSON object"):
        read_jsonl(bad)


def test_existing_file_with_other_content_is_never_overwritten(tmp_path):
    out = tmp_path / "data.jsonl"
    out.write_text("precious\n")
    with pytest.raises(FedloraError, match="never overwritten"):
        sdk.prepare_data(PAIRS, out)
    assert out.read_text() == "precious\n"


SENTIMENTS = ("negative", "neutral", "positive")
SENTIMENT_WORDS = {"negative": "dull and tiresome", "neutral": "fine, nothing more", "positive": "a joy"}


def _sentiment_csv(path: Path, rows: int, start: int = 0) -> Path:
    """A 3-class CSV with the columns ``review`` and ``sentiment`` (label names)."""
    with open(path, "w", newline="", encoding="utf-8") as fh:
        out = csv.writer(fh)
        out.writerow(["id", "review", "sentiment"])
        for i in range(start, start + rows):
            label = SENTIMENTS[i % 3]
            out.writerow([i, f"Film {i} was {SENTIMENT_WORDS[label]}.", label])
    return path


@pytest.fixture(scope="module")
def own_csv(tmp_path_factory) -> Path:
    """The federation's own dataset: 200 rows, 3 classes."""
    return _sentiment_csv(tmp_path_factory.mktemp("federation") / "own.csv", 200)


def test_prepare_data_reads_a_csv_with_the_file_datasets_columns(tmp_path, own_csv):
    mine = _sentiment_csv(tmp_path / "mine.csv", 12, start=1000)
    columns = {"dataset": str(own_csv), "text_column": "review", "label_column": "sentiment"}
    out = sdk.prepare_data(mine, tmp_path / "node" / "data.jsonl", **columns)
    expected = [
        {"text": f"Film {i} was {SENTIMENT_WORDS[SENTIMENTS[i % 3]]}.", "label": i % 3}
        for i in range(1000, 1012)
    ]  # sorted names negative, neutral, positive: indices 0, 1, 2
    assert [json.loads(line) for line in out.read_text().splitlines()] == expected
    assert read_jsonl(out).labels == sdk.load_data(mine, **columns).labels
    mine.write_text("review,sentiment\nGood.,2\nBad.,negative\n")  # a whole number is a class index
    assert sdk.load_data(mine, **columns).labels == (2, 0)
    mine.write_text("review,sentiment\nGood.,ecstatic\n")
    with pytest.raises(FedloraError, match="unknown label name 'ecstatic'; known names: negative, neutral"):
        sdk.prepare_data(mine, tmp_path / "bad.jsonl", **columns)
    with pytest.raises(FedloraError, match=r"row 1 has no column 'stars' \(columns: review, sentiment\)"):
        sdk.load_data(mine, text_column="review", label_column="stars")
    assert not (tmp_path / "bad.jsonl").exists()


def test_command_takes_a_csv_and_a_csv_dataset_with_named_columns(tmp_path, own_csv):
    """join()/command() with the owner's CSV and the run's own.csv, both with review/sentiment
    columns: the node's JSONL is written into the state dir and its labels checked against own.csv."""
    mine = _sentiment_csv(tmp_path / "mine.csv", 9, start=500)
    columns = {"dataset": str(own_csv), "text_column": "review", "label_column": "sentiment"}
    argv = sdk.command("h:8000", mine, "fedavg", state_dir=tmp_path / "st", insecure=True, **columns)
    written = tmp_path / "st" / "data.jsonl"
    assert f'data-path="{written}"' in " ".join(argv)
    assert read_jsonl(written).labels == tuple(i % 3 for i in range(500, 509))
    with pytest.raises(FedloraError, match="reads a JSONL file"):
        sdk.NodeConfig("h:8000", mine, "fedavg", insecure=True, state_dir=tmp_path / "x").checked()


# --- the node's command line -----------------------------------------------------------------------
@pytest.fixture()
def data_file(tmp_path) -> Path:
    return sdk.prepare_data(PAIRS, tmp_path / "mine.jsonl")


def test_command_builds_the_supernode_argv(tmp_path, data_file):
    ca, key = tmp_path / "ca.crt", tmp_path / "node.key"
    ca.write_text("x")
    key.write_text("x")
    argv = sdk.command(
        "fl.example.org:8000",
        data_file,
        "dp-adamw",
        8.0,
        dataset="rotten-tomatoes",
        state_dir=tmp_path / "state dir",
        root_certificates=ca,
        auth_key=key,
        port=9123,
    )
    assert Path(argv[0]).name == "flower-supernode"
    flags = argv[1:-2]
    assert flags == [
        "--superlink",
        "fl.example.org:8000",
        "--root-certificates",
        str(ca),
        "--auth-supernode-private-key",
        str(key),
        "--host",
        "127.0.0.1",
        "--port",
        "9123",
        "--max-wait-time",  # sdk.GIVE_UP_AFTER: a node stops on a SuperLink that never answers
        "120",
    ]
    assert argv[-2] == "--node-config"
    from flwr.common.config import parse_config_args  # parsed exactly as flower-supernode does

    assert parse_config_args([argv[-1]]) == {
        "data-path": str(data_file),
        "state-dir": str(tmp_path / "state dir"),
        "mechanism": "dp-adamw",
        "delta": 1e-5,
        "trust": "none",
        "sample-epsilon": 8.0,
        "dataset": "rotten-tomatoes",
        "identity-key": str(key),  # the SuperNode key signs its secure-aggregation keys too
    }


def test_fedlora_node_takes_its_identity_and_the_roster_for_secure_aggregation(tmp_path, data_file, capsys):
    """``fedlora node --identity-key K --roster R``: both land in the node config (what the ClientApp
    checks signatures with); a missing roster is one line, nothing started."""
    from flwr.common.config import parse_config_args

    from common.secagg import identity

    identity.provision([tmp_path / "me"], tmp_path / "roster.pub")
    base = ["node", "--superlink", "h:8000", "--data", str(data_file), "--mechanism", "dp-fedavg"]
    base += ["--epsilon", "8", "--insecure", "--trust", "aggregate", "--state-dir", str(tmp_path / "st")]
    keys = ["--identity-key", str(tmp_path / "me"), "--roster", str(tmp_path / "roster.pub")]
    assert run_cli([*base, *keys, "--print-command"]) == 0
    config = parse_config_args([shlex.split(capsys.readouterr().out)[-1]])
    assert config["identity-key"] == str(tmp_path / "me") and config["secagg-roster"] == str(
        tmp_path / "roster.pub"
    )
    assert config["trust"] == "aggregate"
    assert run_cli([*base, "--roster", str(tmp_path / "missing.pub"), "--print-command"]) == 2
    err = capsys.readouterr().err.strip()
    assert "roster" in err and "missing.pub" in err and "\n" not in err


def test_command_insecure_client_level_and_in_memory_data(tmp_path):
    argv = sdk.command(
        "127.0.0.1:8000", PAIRS, "dp-fedavg", 3.0, state_dir=tmp_path / "st", insecure=True, model="minilm-l6"
    )
    assert "--insecure" in argv and "--root-certificates" not in argv
    port = int(argv[argv.index("--port") + 1])
    assert 0 < port < 65536
    from flwr.common.config import parse_config_args

    cfg = parse_config_args([argv[-1]])
    assert cfg["client-epsilon"] == 3.0 and "sample-epsilon" not in cfg and cfg["model-path"] == "minilm-l6"
    assert cfg["data-path"] == str(tmp_path / "st" / "data.jsonl")
    assert len(read_jsonl(cfg["data-path"])) == len(PAIRS)
    env = sdk.NodeConfig("127.0.0.1:8000", cfg["data-path"], "fedavg", state_dir=tmp_path / "st").environment(
        {}
    )
    assert env["FLWR_HOME"] == str(tmp_path / "st" / "flower")
    assert env["PATH"].split(os.pathsep)[0] == str(Path(sys.executable).parent)


@pytest.mark.parametrize(
    "path", ["/tmp/a b/data.jsonl", "/tmp/it's.jsonl", '/tmp/say "hi".jsonl', "/tmp/back\\slash"]
)
def test_node_config_values_survive_flowers_parser(path):
    from flwr.common.config import parse_config_args

    values = {"data-path": path, "delta": 1e-05, "sample-epsilon": 8.0}
    assert parse_config_args([sdk.toml_pairs(values)]) == values


def test_node_config_refuses_unquotable_values():
    with pytest.raises(FedloraError, match="cannot go into --node-config"):
        sdk.toml_pairs({"data-path": '/tmp/it\'s "x"'})


@pytest.mark.parametrize(
    "args, kwargs, message",
    [
        (("localhost", "fedavg", None), {}, "HOST:PORT"),
        (("https://fl.org:8000", "fedavg", None), {}, "without a URL prefix"),
        (("h:8000", "sgd", None), {}, "unknown mechanism 'sgd'"),
        (("h:8000", "prism", None), {}, "needs your privacy budget"),
        (("h:8000", "prism", -1.0), {}, "needs your privacy budget"),
        (("h:8000", "fedavg", 1.0), {}, "epsilon does not apply"),
        (("h:8000", "fedavg", None), {"insecure": True, "root_certificates": "ca.crt"}, "not both"),
        (("h:8000", "fedavg", None), {"insecure": True, "auth_key": "k"}, "needs TLS"),
        (
            ("h:8000", "fedavg", None),
            {"root_certificates": "missing.crt"},
            "root certificates file not found",
        ),
        (("h:8000", "fedavg", None), {"delta": 2.0}, "delta must be in (0, 1)"),
        (("h:8000", "fedavg", None), {"model": "no-such-model"}, "unknown model"),
        (("h:8000", "fedavg", None), {"colour": "red"}, "unknown option(s) colour"),
    ],
)
def test_command_refuses_bad_configuration(tmp_path, data_file, args, kwargs, message):
    superlink, mechanism, epsilon = args
    with pytest.raises(FedloraError, match=re.escape(message)):
        sdk.command(superlink, data_file, mechanism, epsilon, state_dir=tmp_path / "st", **kwargs)


def test_command_refuses_a_missing_or_bad_data_file(tmp_path):
    with pytest.raises(FedloraError, match="cannot read data file"):
        sdk.command("h:8000", tmp_path / "nope.jsonl", "fedavg", state_dir=tmp_path / "st")
    bad = _jsonl(tmp_path / "bad.jsonl", [{"text": "fine", "label": 7}])
    with pytest.raises(FedloraError, match="not a class of rotten-tomatoes"):
        sdk.command("h:8000", bad, "fedavg", state_dir=tmp_path / "st", dataset="rotten-tomatoes")


def test_fedlora_node_cli_prints_the_command_or_fails_in_one_line(tmp_path, data_file, capsys):
    base = ["node", "--superlink", "127.0.0.1:8000", "--data", str(data_file), "--state-dir", str(tmp_path)]
    assert run_cli([*base, "--mechanism", "prism", "--epsilon", "4", "--insecure", "--print-command"]) == 0
    argv = shlex.split(capsys.readouterr().out)
    assert Path(argv[0]).name == "flower-supernode" and "--insecure" in argv
    assert "sample-epsilon=4.0" in argv[-1] and 'mechanism="prism"' in argv[-1]
    assert run_cli([*base, "--mechanism", "prism", "--print-command"]) == 2
    err = capsys.readouterr().err
    assert (
        err.startswith("fedlora: error: mechanism prism needs your privacy budget") and err.count("\n") == 1
    )


def test_a_node_describes_its_csv_by_columns_and_label_names_not_the_federations_file(tmp_path):
    """docs/sdk.md's own-CSV join: the node names the federation's dataset (for its policy) and label
    names, holds no copy of tickets.csv; the JSONL prepare_data wrote is accepted with the column
    names still given; command() and join() use one port."""
    mine = _tickets_csv(tmp_path / "mine.csv", 6)
    columns = {"text_column": "ticket_text", "label_column": "category"}
    names = ["other", "billing", "bug"]  # declared in any order: the indices follow them sorted
    data = sdk.prepare_data(mine, tmp_path / "node" / "data.jsonl", label_names=names, **columns)
    assert read_jsonl(data).labels == (0, 1, 2, 0, 1, 2)
    node = dict(dataset="tickets.csv", label_names=names, state_dir=tmp_path / "st", insecure=True, **columns)
    argv = sdk.command("h:8000", data, "fedavg", **node)
    assert 'dataset="tickets.csv"' in argv[-1] and 'labels="billing,bug,other"' in argv[-1]
    assert f'data-path="{data}"' in argv[-1]  # the prepared JSONL itself, not re-read with the columns
    assert sdk.command("h:8000", data, "fedavg", **node) == argv  # the same port every time
    assert sdk.command("h:8000", mine, "fedavg", **node)[-1].replace(
        str(tmp_path / "st" / "data.jsonl"), "D"
    ) == (argv[-1].replace(str(data), "D"))  # the CSV itself, written to <state_dir>/data.jsonl
    with pytest.raises(FedloraError, match=r"dataset tickets\.csv is not on this machine.*label_names"):
        sdk.prepare_data(mine, tmp_path / "x.jsonl", dataset="tickets.csv", **columns)
    with pytest.raises(FedloraError, match="unknown label name 'bug'; known names: billing, other"):
        sdk.load_data(mine, label_names=["billing", "other"], **columns)
    with pytest.raises(FedloraError, match="label names declare 1 label"):
        sdk.load_data(mine, label_names=["billing"], **columns)
    with pytest.raises(FedloraError, match="not those of rotten-tomatoes: negative, positive"):
        sdk.load_data(mine, dataset="rotten-tomatoes", label_names=names, **columns)


def test_fedlora_node_reads_its_own_csv_by_columns_and_labels(tmp_path, capsys):
    theirs = _tickets_csv(tmp_path / "theirs.csv", 4, labels=("bug", "other"))
    base = ["node", "--superlink", "127.0.0.1:8000", "--data", str(theirs), "--mechanism", "fedavg",
            "--insecure", "--state-dir", str(tmp_path / "st"), "--dataset", "tickets.csv", "--print-command"]  # fmt: skip
    named = ["--text-column", "ticket_text", "--label-column", "category", "--labels", "billing,bug,other"]
    assert run_cli([*base, *named]) == 0
    argv = shlex.split(capsys.readouterr().out)
    assert 'labels="billing,bug,other"' in argv[-1] and 'dataset="tickets.csv"' in argv[-1]
    assert read_jsonl(tmp_path / "st" / "data.jsonl").labels == (
        1,
        2,
        1,
        2,
    )  # bug, other of billing/bug/other


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["--text-column", "body", "--label-column", "category", "--labels", "billing,bug,other"], "has no column 'body' (columns: ticket_text, category, customer)"),
        (["--text-column", "ticket_text", "--labels", "billing,bug,other"], "has no column 'label' (columns: ticket_text, category, customer)"),
        (["--text-column", "ticket_text", "--label-column", "category"], "dataset tickets.csv is not on this machine"),
        (["--text-column", "ticket_text", "--label-column", "category", "--labels", "bug,other"], "unknown label name 'billing'"),
        (["--text-column", "ticket_text", "--label-column", "category", "--labels", "bug"], "label names declare 1 label"),
    ],
)  # fmt: skip
def test_fedlora_node_refuses_bad_columns_and_labels_in_one_line(tmp_path, capsys, options, message):
    theirs = _tickets_csv(tmp_path / "theirs.csv", 3)
    base = ["node", "--superlink", "127.0.0.1:8000", "--data", str(theirs), "--mechanism", "fedavg",
            "--insecure", "--state-dir", str(tmp_path / "st"), "--dataset", "tickets.csv", "--print-command"]  # fmt: skip
    assert run_cli([*base, *options]) != 0
    out = capsys.readouterr()
    assert out.out == "" and out.err.startswith("fedlora: error: ") and out.err.count("\n") == 1, out.err
    assert message in out.err
    assert not (tmp_path / "st" / "data.jsonl").exists()


def test_a_node_with_label_names_needs_no_copy_of_the_runs_file(tmp_path):
    """The ClientApp's label space for a run on its own file: the node's declared names (sorted); the
    run's --labels, when declared, must be the same set; without names, a clear error."""
    from client.node.shard import run_label_space

    cfg = preset("minilm-rt", **RUN, dataset="absent/tickets.csv", text_column="ticket_text").check()
    assert run_label_space(cfg, "other,bug,billing").label_names == ("billing", "bug", "other")
    with pytest.raises(FedloraError, match=r"dataset absent/tickets\.csv is not on this node: declare"):
        run_label_space(cfg, "")
    declared = preset("minilm-rt", **RUN, dataset="absent/tickets.csv", labels="billing,bug").check()
    with pytest.raises(
        FedloraError, match="labels billing, bug, other are not the run's --labels billing, bug"
    ):
        run_label_space(declared, "billing,bug,other")
    with pytest.raises(FedloraError, match="not the classes of rotten-tomatoes"):
        run_label_space(preset("minilm-rt", **RUN).check(), "billing,bug,other")


# --- the node's policy -----------------------------------------------------------------------------
def test_policy_refuses_other_mechanisms_datasets_and_deltas():
    policy = NodePolicy.from_node_config(
        {"mechanism": "dp-adamw", "dataset": "rotten-tomatoes", "delta": 1e-5, "sample-epsilon": 8.0}
    )
    ok = preset("minilm-rt", mechanism="dp-adamw", sample_epsilon=4.0).check()
    policy.check_run(ok)
    for bad, message in [
        (
            ok.replace(mechanism="fedavg", sample_epsilon=0.0),
            "this node joins only dp-adamw runs; this run is fedavg",
        ),
        (ok.replace(local_optimizer="ffa"), "the run changes dp-adamw"),
        (ok.replace(dataset="bbc-news"), "this node's data is for rotten-tomatoes; the run is on bbc-news"),
        (ok.replace(delta=1e-3), "the run's delta 0.001 exceeds this node's 1e-05"),
    ]:
        with pytest.raises(FedloraError, match=re.escape(f"node policy: {message}")):
            policy.check_run(bad.check())
    with pytest.raises(FedloraError, match="needs sample-level DP"):
        NodePolicy(sample_epsilon=1.0).check_run(preset("minilm-rt").check())
    NodePolicy().check_run(preset("minilm-rt").check())  # no policy: everything goes (simulation)
    with pytest.raises(FedloraError, match="must be numbers"):
        NodePolicy.from_node_config({"sample-epsilon": "lots"})


def test_policy_client_level_budget_uses_the_run_plan():
    cfg = preset("minilm-rt", mechanism="dp-fedavg", target_epsilon=3.0).check()
    assert planned_client_epsilon(cfg) == pytest.approx(3.0, rel=1e-6) and planned_client_epsilon(cfg) <= 3.0
    NodePolicy(client_epsilon=3.0).check_run(cfg)
    with pytest.raises(FedloraError, match="plans client-level epsilon 3 > this node's budget 2"):
        NodePolicy(client_epsilon=2.0).check_run(cfg)
    noisy = preset("minilm-rt", mechanism="dp-fedavg", noise_multiplier=1.0, rounds=5).check()
    assert planned_client_epsilon(noisy) > 2.0  # sigma 1, 5 rounds at p = 1 (local noise)
    with pytest.raises(FedloraError, match="client-level epsilon"):
        NodePolicy(client_epsilon=2.0).check_run(noisy)


def _steps(run: str, rnd: int, steps: int) -> Charge:
    return Charge(run, rnd, 3.0, 0.25, steps, 0.25, 40, 1.0, "local", "dp-adamw")


def test_sample_budget_counts_the_ledger_history_across_restarts(tmp_path):
    policy = NodePolicy(sample_epsilon=4.0)
    ledger = sample_ledger(tmp_path, "rotten-tomatoes/0-of-1", 1e-5)
    policy.check_sample_budget(ledger, 3.0, 0.25, 10)  # a fresh node: the plan alone fits
    ledger.charge(_steps("old-run", 1, 100))  # an earlier federation spent most of the budget
    ledger.close()
    restarted = sample_ledger(tmp_path, "rotten-tomatoes/0-of-1", 1e-5)
    spent = restarted.spent()["eps_tight"]
    assert 0 < spent < 4.0
    with pytest.raises(
        FedloraError, match=r"node policy: sample-level budget 4 exceeded: .* spent before it"
    ):
        policy.check_sample_budget(restarted, 3.0, 0.25, 100)
    restarted.close()


@pytest.mark.heavy
def test_sample_budget_counts_a_retried_round_again(tmp_path):
    """A round run again (a retried message, a resumed server) is a new release: the check is the
    whole history plus this round's steps, so a retry that would pass the budget is refused."""
    budget = 4.0
    ledger = sample_ledger(tmp_path, "rotten-tomatoes/0-of-1", 1e-5)
    sigma = 1.0
    while (
        ledger.spent(Charge("x", 1, sigma, 0.25, 100, 0.25, 40, 1.0, "local", "ffa").event)["eps_tight"] > 3.0
    ):
        sigma *= 1.05  # 100 steps spend just under 3 (< budget); 200 spend more than 4
    policy = NodePolicy(sample_epsilon=budget)
    policy.check_sample_budget(ledger, sigma, 0.25, 100)  # the first attempt fits
    ledger.charge(Charge("7", 1, sigma, 0.25, 100, 0.25, 40, 1.0, "local", "dp-adamw"))
    assert (
        ledger.spent(Charge("7", 2, sigma, 0.25, 100, 0.25, 40, 1.0, "local", "x").event)["eps_tight"]
        > budget
    )
    with pytest.raises(FedloraError, match="sample-level budget 4 exceeded"):
        policy.check_sample_budget(ledger, sigma, 0.25, 100)  # the retry of round 1
    ledger.close()


@pytest.mark.heavy
def test_a_retried_round_is_charged_again_with_more_noise_and_stays_within_the_budget(tmp_path, own_data):
    """The same round asked again (a retried message, a resumed server) is a new release, charged
    again; the node re-plans its remaining steps with more noise (client/dp/sample_plan.py
    ``replan``), so its ledger stays within the run's target, which is also its budget here."""
    cfg = preset("minilm-rt", **RUN, mechanism="dp-adamw", sample_epsilon=4.0).check()
    node = {"data-path": str(own_data), "state-dir": str(tmp_path / "st"), "sample-epsilon": 4.0}
    _, _, shard = node_shard(node, cfg)
    app = load_component("client.app:app")
    assert not app(_message(shard.bundle.initial), _context(cfg, node)).has_error()
    assert not app(_message(shard.bundle.initial), _context(cfg, node)).has_error()  # the same round again
    ledger = sample_ledger(tmp_path / "st", "rotten-tomatoes/0-of-1", 1e-5)
    first, again = ledger.rows()
    assert (first["round"], again["round"]) == (1, 1) and again["run"].endswith("#2")
    assert again["sigma"] > first["sigma"] and ledger.spent()["eps_tight"] <= 4.0


def test_sample_ledger_refuses_another_delta(tmp_path):
    sample_ledger(tmp_path, "rotten-tomatoes/0-of-1", 1e-5).close()
    with pytest.raises(FedloraError, match="accounts at delta 1e-05; the run asks delta 1e-06"):
        sample_ledger(tmp_path, "rotten-tomatoes/0-of-1", 1e-6)
    sample_ledger(tmp_path, "rotten-tomatoes/0-of-1", 1e-5).close()


def test_policy_refuses_clear_statistics_unless_opted_in():
    clear = preset("minilm-rt", mechanism="dr-encoder", target_epsilon=8.0).check()
    noised = clear.replace(stats_noise_multiplier=2.0).check()
    policy = NodePolicy(mechanism="dr-encoder", client_epsilon=8.0)
    with pytest.raises(
        FedloraError, match="node policy: the run releases DR-Encoder statistics sent in the clear"
    ):
        policy.check_run(clear)
    policy.check_run(noised)
    NodePolicy(mechanism="dr-encoder", client_epsilon=8.0, clear_statistics=True).check_run(clear)
    NodePolicy().check_run(clear)  # a simulation node has no policy
    assert NodePolicy.from_node_config({"clear-statistics": True}).clear_statistics
    opted = sdk.NodeConfig("h:1", "d", "dr-encoder", 8.0, clear_statistics=True).node_config()
    assert opted["clear-statistics"] is True
    assert "clear-statistics" not in sdk.NodeConfig("h:1", "d", "dr-encoder", 8.0).node_config()


# --- the node's own data and model in the ClientApp --------------------------------------------------
def _message(state, rnd: int = 1) -> Message:
    message_identity()
    return Message(
        TrainInstruction(rnd, state).to_record(), dst_node_id=1001, message_type="train", group_id="1"
    )


def _context(cfg, node_config: dict, run_id: int = 42) -> Context:
    from common.config import to_flat

    return Context(
        run_id=run_id, node_id=1001, node_config=node_config, state=RecordDict(), run_config=to_flat(cfg)
    )


@pytest.fixture(scope="module")
def own_data(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("owner") / "reviews.jsonl"
    return _jsonl(path, [{"text": t, "label": y} for t, y in PAIRS * 2])


def test_shard_comes_from_data_path(own_data):
    cfg = preset("minilm-rt", **RUN).check()
    pid, parts, shard = node_shard({"data-path": str(own_data), "partition-id": 3, "num-partitions": 9}, cfg)
    assert (pid, parts) == (0, 1) and len(shard.examples) == 2 * len(PAIRS)
    assert [ex["label"] for ex in shard.examples] == [y for _, y in PAIRS * 2]
    with pytest.raises(FedloraError, match="absolute path"):
        load_own_shard(cfg, "reviews.jsonl")


def test_data_path_labels_must_fit_the_run_dataset(tmp_path):
    bad = _jsonl(tmp_path / "five.jsonl", [{"text": "a business story", "label": 4}])
    cfg = preset("minilm-rt", **RUN).check()
    with pytest.raises(FedloraError, match="label 4 is not a class of rotten-tomatoes"):
        node_shard({"data-path": str(bad)}, cfg)


@pytest.mark.heavy
def test_a_node_trains_on_csv_data_prepared_for_the_runs_own_csv_dataset(tmp_path, own_csv):
    columns = {"text_column": "review", "label_column": "sentiment"}
    data = sdk.prepare_data(
        _sentiment_csv(tmp_path / "mine.csv", 24, start=500),
        tmp_path / "mine.jsonl",
        dataset=str(own_csv),
        **columns,
    )
    cfg = preset("minilm-rt", **RUN, dataset=str(own_csv), **columns).check()
    node = {"data-path": str(data), "dataset": str(own_csv), "mechanism": "fedavg"}
    _, _, shard = node_shard(node, cfg)
    assert shard.bundle.kind == "seq-cls" and shard.bundle.model.config.num_labels == 3
    assert [ex["label"] for ex in shard.examples] == [i % 3 for i in range(500, 524)]
    reply = load_component("client.app:app")(_message(shard.bundle.initial), _context(cfg, node))
    assert not reply.has_error() and "increment" in reply.content


def _dp_adamw_node(tmp_path: Path, data: Path, budget: float, **more: object) -> dict:
    """The node config of a dp-adamw node over ``data`` with sample-level ``budget`` (and ``more``
    keys), its state in ``tmp_path/st``."""
    node = {"data-path": str(data), "state-dir": str(tmp_path / "st"), "mechanism": "dp-adamw"}
    return {**node, "sample-epsilon": budget, **more}


@pytest.mark.heavy
def test_client_app_trains_on_own_data_and_charges_its_ledger(tmp_path, own_data):
    cfg = preset("minilm-rt", **RUN, mechanism="dp-adamw", sample_epsilon=4.0).check()
    node = _dp_adamw_node(tmp_path, own_data, 8.0, dataset="rotten-tomatoes", delta=1e-5)
    _, _, shard = node_shard(node, cfg)
    app = load_component("client.app:app")
    reply = app(_message(shard.bundle.initial), _context(cfg, node))
    assert not reply.has_error() and "increment" in reply.content
    assert len(reply.content["metrics"]) == 0  # no example count, no loss: neither is private
    rows = sample_ledger(tmp_path / "st", "rotten-tomatoes/0-of-1", 1e-5).rows()
    assert [(r["run"], r["round"], r["count"], r["status"]) for r in rows] == [("42", 1, 2, "applied")]


def test_client_app_refuses_a_run_against_its_policy(tmp_path, own_data):
    cfg = preset("minilm-rt", **RUN, mechanism="dp-adamw", sample_epsilon=4.0).check()
    node = _dp_adamw_node(tmp_path, own_data, 2.0)
    _, _, shard = node_shard(node, cfg)
    app = load_component("client.app:app")
    with pytest.raises(FedloraError, match="node policy: sample-level budget 2 exceeded"):
        app(_message(shard.bundle.initial), _context(cfg, node))
    with pytest.raises(FedloraError, match="node policy: this node joins only dp-adamw runs"):
        app(_message(shard.bundle.initial), _context(preset("minilm-rt", **RUN).check(), node))
    assert sample_ledger(tmp_path / "st", "rotten-tomatoes/0-of-1", 1e-5).rows() == []  # nothing charged


def test_client_app_refuses_a_run_that_plans_more_than_the_nodes_run_epsilon(tmp_path, own_data):
    """Issue 75 item 6: a node with budget 8 that lets one run spend 2 refuses a run planned for 4
    (sample-level, before any step is charged) and a client-level plan above its cap."""
    cfg = preset("minilm-rt", **RUN, mechanism="dp-adamw", sample_epsilon=4.0).check()
    node = _dp_adamw_node(tmp_path, own_data, 8.0, **{"run-epsilon": 2.0})
    _, _, shard = node_shard(node, cfg)
    with pytest.raises(FedloraError, match="plans sample-level epsilon 4 > the 2 this node lets one run"):
        load_component("client.app:app")(_message(shard.bundle.initial), _context(cfg, node))
    assert sample_ledger(tmp_path / "st", "rotten-tomatoes/0-of-1", 1e-5).rows() == []  # nothing charged
    client = preset("minilm-rt", mechanism="dp-fedavg", target_epsilon=3.0).check()
    NodePolicy(client_epsilon=8.0, run_epsilon=3.0).check_run(client)
    with pytest.raises(FedloraError, match="plans client-level epsilon 3 > the 2 this node lets one run"):
        NodePolicy(client_epsilon=8.0, run_epsilon=2.0).check_run(client)


@pytest.mark.heavy
def test_model_path_must_fit_the_run_model(own_data):
    cfg = preset("minilm-rt", **RUN).check()
    node = {"data-path": str(own_data), "model-path": "minilm-l6"}
    _, _, shard = node_shard(node, cfg)
    app = load_component("client.app:app")
    state = adapter_state(shard.bundle.model)
    reply = app(_message(state), _context(cfg, node))
    assert not reply.has_error()
    wrong = {k: torch.zeros(v.shape[0] + 1, *v.shape[1:]) for k, v in state.items()}  # another hidden size
    with pytest.raises(FedloraError, match="does not fit this node's model-path 'minilm-l6': not the same"):
        app(_message(wrong), _context(cfg, node))
    llm = {"data-path": str(own_data), "model-path": "smollm2-135m"}  # no module the run's LoRA targets
    with pytest.raises(
        FedloraError, match="does not fit this node's model-path 'smollm2-135m': not the same"
    ):
        node_shard(llm, cfg)


# --- the README example, end to end ------------------------------------------------------------------
def readme_example() -> str:
    """The first ```python block of the "## Client SDK" section of this repository's README.md."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    match = re.search(r"^## Client SDK\n(.*?)(?=^## |\Z)", readme, re.S | re.M)
    assert match, "README.md has no '## Client SDK' section"
    block = re.search(r"^```python\n(.*?)^```", match.group(1), re.S | re.M)
    assert block, "no ```python block in the Client SDK section"
    return block.group(1)


def test_readme_sdk_example_is_in_the_readme_and_compiles():
    """What the slow end-to-end test runs is README.md's own example (no file outside the repository)."""
    source = readme_example()
    compile(source, "README.md#client-sdk", "exec")
    assert "sdk.prepare_data(" in source and "sdk.join(" in source


def _start(argv: list[str], log: Path, **kwargs) -> subprocess.Popen:
    """A process in its own session (so that it and its children are stopped together)."""
    return subprocess.Popen(
        argv, stdout=log.open("w"), stderr=subprocess.STDOUT, start_new_session=True, **kwargs
    )


def _stop(proc: subprocess.Popen) -> None:
    """SIGTERM to the process group of ``proc`` (which we started), SIGKILL if it lingers."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)  # children that outlived the group leader


def _wait_for_port(port: int, proc: subprocess.Popen, log: Path, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, log.read_text()[-3000:]
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.5)
    raise AssertionError(f"nothing listens on {port} after {timeout} s: {log.read_text()[-3000:]}")


def _process_env() -> dict[str, str]:
    """The environment of a test's real SuperLink and nodes: this Python's scripts first on PATH,
    this checkout importable, offline, no Flower update check or runtime installs."""
    scripts = Path(sys.executable).parent
    return {
        **os.environ,
        "PATH": f"{scripts}{os.pathsep}{os.environ.get('PATH', '')}",
        "PYTHONPATH": str(ROOT),
        "FLWR_DISABLE_UPDATE_CHECK": "1",
        "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
        "HF_HUB_OFFLINE": "1",
        "FEDLORA_CACHE": os.environ.get("FEDLORA_CACHE", str(ROOT / ".cache")),
    }


@pytest.mark.slow
def test_readme_sdk_example_joins_a_real_federation(tmp_path):
    scripts, env = Path(sys.executable).parent, _process_env()
    port = free_port()
    link_home, cli_home, owner = tmp_path / "link", tmp_path / "cli", tmp_path / "owner"
    for d in (link_home, cli_home, owner):
        d.mkdir()
    (cli_home / "config.toml").write_text(
        f'[superlink]\ndefault = "e2e"\n\n[superlink.e2e]\naddress = "127.0.0.1:{port}"\ninsecure = true\n'
    )
    (owner / "example.py").write_text(readme_example(), encoding="utf-8")
    link = _start(
        [str(scripts / "flower-superlink"), "--insecure", "--host", "127.0.0.1", "--port", str(port),
         "--database", str(tmp_path / "state.db"), "--disable-runtime-dependency-installation"],
        tmp_path / "superlink.log", env={**env, "FLWR_HOME": str(link_home)}, cwd=tmp_path,
    )  # fmt: skip
    node = None
    try:
        _wait_for_port(port, link, tmp_path / "superlink.log")
        node = _start(
            [sys.executable, "example.py"], tmp_path / "node.log", env={**env, "SUPERLINK": f"127.0.0.1:{port}"},
            cwd=owner,
        )  # fmt: skip
        run_dir = tmp_path / "run"
        overrides = (
            "preset='minilm-rt' num-clients=1 rounds=1 local-steps=2 batch-size=8 max-train-examples=200 "
            f"eval-examples=40 mechanism='dp-adamw' sample-epsilon=4.0 round-timeout=300 out-dir='{run_dir}'"
        )
        proc = subprocess.run(
            [str(scripts / "flwr"), "run", str(ROOT), "e2e", "--stream", "--run-config", overrides],
            env={**env, "FLWR_HOME": str(cli_home)}, cwd=tmp_path, capture_output=True, text=True, timeout=480,
        )  # fmt: skip
        logs = proc.stdout[-3000:] + proc.stderr[-2000:] + (tmp_path / "node.log").read_text()[-3000:]
        assert proc.returncode == 0, logs
        assert node.poll() is None, logs  # the node is still serving: join() blocks
        summary = json.loads((run_dir / "summary.json").read_text())
        assert summary["rounds_completed"] == 1 and summary["mechanism"] == "dp-adamw", summary
        records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
        assert records[-1]["replied"] == 1 and not records[-1]["rejected"], records
        node_log = (tmp_path / "node.log").read_text()
        assert "flower-supernode" in node_log.splitlines()[0]  # the example printed its command line
        data = owner / "my-node" / "reviews.jsonl"
        assert len(read_jsonl(data)) >= 8
        ledger = sample_ledger(owner / "my-node" / "state", "rotten-tomatoes/0-of-1", 1e-5)
        assert [(r["round"], r["count"], r["status"]) for r in ledger.rows()] == [(1, 2, "applied")]
        ledger.close()
    finally:
        for p in (node, link):
            if p is not None:
                _stop(p)


@pytest.mark.heavy
def test_client_refuses_a_round_that_asks_less_noise_than_the_plan(tmp_path, own_data):
    """Local noise holds against the server: the client adds what the run's plan says (σC), never a
    smaller std a round names."""
    cfg = preset("minilm-rt", **RUN, mechanism="dp-fedavg", noise_multiplier=1.0, clip=0.5).check()
    node = {"data-path": str(own_data), "state-dir": str(tmp_path / "st")}
    _, _, shard = node_shard(node, cfg)
    app = load_component("client.app:app")
    message_identity()

    def instruction(std: float) -> Message:
        content = TrainInstruction(1, shard.bundle.initial, noise_std=std).to_record()
        return Message(content, dst_node_id=1001, message_type="train", group_id="1")

    with pytest.raises(FedloraError, match=r"round asks noise std 0\.01 < 0\.5"):
        app(instruction(0.01), _context(cfg, node))
    reply = app(instruction(0.5), _context(cfg, node))
    assert reply.content["meta"]["noise-std"] == 0.5 and len(reply.content["metrics"]) == 0


# --- a federation on its own CSV, joined by data owners holding only their own files (slow) ----------
TICKET_LABELS = ("billing", "bug", "other")
TICKET_WORDS = {
    "billing": "I was charged twice",
    "bug": "the app crashes on start",
    "other": "where is your office",
}


def _tickets_csv(path: Path, rows: int, labels: tuple[str, ...] = TICKET_LABELS, start: int = 0) -> Path:
    """Support tickets with the columns ``ticket_text``, ``category`` (label names) and ``customer``."""
    with open(path, "w", newline="", encoding="utf-8") as fh:
        out = csv.writer(fh)
        out.writerow(["ticket_text", "category", "customer"])
        for i in range(start, start + rows):
            label = labels[i % len(labels)]
            out.writerow([f"Ticket {i}: {TICKET_WORDS[label]}.", label, f"c{i % 7}"])
    return path


NODE_SCRIPT = """
import os, shlex
from client.node import sdk

columns = dict(text_column="ticket_text", label_column="category")
data = sdk.prepare_data("mine.csv", "my-node/data.jsonl", label_names=["billing", "bug", "other"], **columns)
node = dict(superlink=os.environ["SUPERLINK"], data=data, mechanism="fedavg", dataset="tickets.csv",
            label_names=["billing", "bug", "other"], state_dir="my-node/state", insecure=True, **columns)
print(shlex.join(sdk.command(**node)), flush=True)
sdk.join(**node)
"""


@pytest.mark.slow
def test_an_own_csv_federation_is_joined_by_nodes_holding_only_their_own_files(tmp_path):
    """The run trains on its own tickets.csv (columns ticket_text/category/customer); two data owners,
    each with only their own CSV of those columns, join it: one with the SDK (prepare_data, then
    command and join with the prepared JSONL and the column names), one with ``fedlora node``
    (--text-column/--label-column/--labels; its data has two of the three classes). The label names
    give both the federation's class indices; the command the SDK prints is the one it runs."""
    scripts, env = Path(sys.executable).parent, _process_env()
    port = free_port()
    federation, link_home, cli_home = tmp_path / "federation", tmp_path / "link", tmp_path / "cli"
    owner_a, owner_b = tmp_path / "owner-a", tmp_path / "owner-b"
    for d in (federation, link_home, cli_home, owner_a, owner_b):
        d.mkdir()
    _tickets_csv(federation / "tickets.csv", 90)  # the federation's file: only the server's machine has it
    _tickets_csv(owner_a / "mine.csv", 12, start=100)
    _tickets_csv(owner_b / "theirs.csv", 10, labels=("bug", "other"), start=200)
    (owner_a / "join.py").write_text(NODE_SCRIPT, encoding="utf-8")
    (cli_home / "config.toml").write_text(
        f'[superlink]\ndefault = "e2e"\n\n[superlink.e2e]\naddress = "127.0.0.1:{port}"\ninsecure = true\n'
    )
    link = _start(
        [str(scripts / "flower-superlink"), "--insecure", "--host", "127.0.0.1", "--port", str(port),
         "--database", str(tmp_path / "state.db"), "--disable-runtime-dependency-installation"],
        tmp_path / "superlink.log", env={**env, "FLWR_HOME": str(link_home)}, cwd=federation,
    )  # fmt: skip
    nodes: list[subprocess.Popen] = []
    try:
        _wait_for_port(port, link, tmp_path / "superlink.log")
        node_env = {**env, "SUPERLINK": f"127.0.0.1:{port}"}
        nodes.append(_start([sys.executable, "join.py"], tmp_path / "node-a.log", env=node_env, cwd=owner_a))
        nodes.append(
            _start(
                [
                    str(scripts / "fedlora"),
                    "node",
                    "--superlink",
                    f"127.0.0.1:{port}",
                    "--data",
                    "theirs.csv",
                    "--text-column",
                    "ticket_text",
                    "--label-column",
                    "category",
                    "--labels",
                    "billing,bug,other",
                    "--dataset",
                    "tickets.csv",
                    "--mechanism",
                    "fedavg",
                    "--state-dir",
                    "state",
                    "--insecure",
                ],
                tmp_path / "node-b.log",
                env=node_env,
                cwd=owner_b,
            )
        )
        run_dir = tmp_path / "run"
        overrides = (
            "preset='minilm-rt' dataset='tickets.csv' text-column='ticket_text' label-column='category' "
            "num-clients=2 rounds=1 local-steps=1 batch-size=8 max-train-examples=60 eval-examples=20 "
            f"mechanism='fedavg' round-timeout=300 out-dir='{run_dir}'"
        )
        flwr = _start(
            [str(scripts / "flwr"), "run", str(ROOT), "e2e", "--stream", "--run-config", overrides],
            tmp_path / "flwr.log", env={**env, "FLWR_HOME": str(cli_home)}, cwd=tmp_path,
        )  # fmt: skip
        nodes.append(flwr)
        deadline = time.monotonic() + 300
        while flwr.poll() is None and time.monotonic() < deadline:  # a node that exits fails at once
            if any(node.poll() is not None for node in nodes[:2]):
                break
            time.sleep(0.5)
        logs = "".join((tmp_path / f"{n}.log").read_text()[-3000:] for n in ("flwr", "node-a", "node-b"))
        assert flwr.poll() == 0, logs
        nodes.remove(flwr)
        assert all(node.poll() is None for node in nodes), logs  # both nodes still serve
        summary = json.loads((run_dir / "summary.json").read_text())
        assert summary["rounds_completed"] == 1, summary
        records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
        assert records[-1]["replied"] == 2 and not records[-1]["rejected"], records
        # the federation's classes are billing, bug, other: the nodes' labels use those indices
        assert read_jsonl(owner_a / "my-node" / "data.jsonl").labels == tuple(i % 3 for i in range(100, 112))
        assert read_jsonl(owner_b / "state" / "data.jsonl").labels == tuple(
            1 + i % 2 for i in range(200, 210)
        )
        printed = shlex.split((tmp_path / "node-a.log").read_text().splitlines()[0])
        assert "flower-supernode" in printed[0]
        node_port = int(printed[printed.index("--port") + 1])
        with socket.socket() as s:  # the node listens on the port of the command it printed
            assert s.connect_ex(("127.0.0.1", node_port)) == 0, logs
        assert not (owner_a / "tickets.csv").exists() and not (owner_b / "tickets.csv").exists()
    finally:
        for p in (*nodes, link):
            _stop(p)
