"""A data owner's instruction or chat file through the node path (docs/instruction-tuning.md): the
SDK and ``fedlora node`` write it as conversation records, the node trains it as conversations, and
a federation of SmolLM2 on instruction data completes a round through a real SuperLink, with one
node for each of the three forms of data."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest

from client.node import sdk
from client.node.shard import load_own_shard
from common.data.owner import read_conversations
from common.errors import FedloraError
from common.flower_processes import free_port
from common.presets import preset
from common.tasks.chat import ChatTask
from tests.client.test_sdk import ROOT, _process_env, _start, _stop, _wait_for_port
from tests.conftest import run_cli
from tests.harness import FILES, FORMS, write_form

ROWS = [
    ("Say the word red.", "Red."),
    ("Add 2 and 3.", "5"),
    ("Say the word blue.", "Blue."),
    ("Add 1 and 1.", "2"),
]


def _alpaca(path: Path, rows=ROWS) -> Path:
    path.write_text("".join(json.dumps({"instruction": q, "output": a}) + "\n" for q, a in rows))
    return path


def _prompt_csv(path: Path, rows=ROWS) -> Path:
    """A CSV of ``prompt`` and ``completion`` columns (found as prompt/completion data)."""
    with path.open("w", newline="") as fh:
        csv.writer(fh).writerows([("prompt", "completion"), *rows])
    return path


def test_prepare_data_writes_an_instruction_file_as_conversations(tmp_path):
    out = sdk.prepare_data(_alpaca(tmp_path / "sft.jsonl"), tmp_path / "node" / "data.jsonl")
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert records[0] == {
        "messages": [
            {"role": "user", "content": "Say the word red."},
            {"role": "assistant", "content": "Red."},
        ]
    }
    assert len(read_conversations(out)) == 4
    assert sdk.prepare_data(_alpaca(tmp_path / "sft.jsonl"), out) == out  # the same content again: fine
    with pytest.raises(FedloraError, match="instruction data \\(conversations\\): it has no labels"):
        sdk.prepare_data(tmp_path / "sft.jsonl", tmp_path / "other.jsonl", label_names=["a", "b"])


def test_fedlora_node_takes_a_prompt_completion_csv(tmp_path, capsys):
    """``fedlora node --data`` with a CSV of ``prompt`` and ``completion`` columns: found as
    instruction data and written to the state directory as conversations."""
    data, state = _prompt_csv(tmp_path / "tickets.csv"), tmp_path / "state"
    argv = ["node", "--superlink", "127.0.0.1:9", "--data", str(data), "--mechanism", "fedavg",
            "--state-dir", str(state), "--insecure", "--print-command"]  # fmt: skip
    assert run_cli(argv) == 0
    assert "flower-supernode" in capsys.readouterr().out
    assert len(read_conversations(state / "data.jsonl")) == 4


def test_fedlora_node_reads_renamed_prompt_and_response_columns(tmp_path, capsys):
    """``--prompt-column`` / ``--response-column`` name a prompt/completion file's columns, as in
    ``fedlora simulate``; naming a form whose columns the file lacks is one line, exit 2."""
    data = tmp_path / "faq.csv"
    with data.open("w", newline="") as fh:
        csv.writer(fh).writerows([("question", "answer"), *ROWS])
    base = ["node", "--superlink", "127.0.0.1:9", "--data", str(data), "--mechanism", "fedavg", "--insecure",
            "--print-command"]  # fmt: skip
    renamed = [
        "--prompt-column",
        "question",
        "--response-column",
        "answer",
        "--state-dir",
        str(tmp_path / "a"),
    ]
    assert run_cli([*base, *renamed]) == 0
    turns = [
        json.loads(line)["messages"] for line in (tmp_path / "a" / "data.jsonl").read_text().splitlines()
    ]
    assert turns[1] == [{"role": "user", "content": "Add 2 and 3."}, {"role": "assistant", "content": "5"}]
    capsys.readouterr()
    assert run_cli([*base, "--instruction-format", "alpaca", "--state-dir", str(tmp_path / "b")]) == 2
    err = capsys.readouterr().err.strip()
    assert "no 'instruction' or 'output' column for --instruction-format alpaca" in err and "\n" not in err


@pytest.mark.heavy  # SmolLM2's tokenizer and model
def test_a_node_trains_its_conversations_and_refuses_a_run_that_is_not_one(tmp_path):
    own = sdk.prepare_data(_alpaca(tmp_path / "mine.jsonl"), tmp_path / "node" / "data.jsonl")
    run = _alpaca(tmp_path / "federation.jsonl", ROWS[:2] * 3)
    cfg = preset("smollm2-shakespeare-xdev", dataset=str(run), num_clients=1, max_length=64).check()
    shard = load_own_shard(cfg, str(own))
    assert isinstance(shard.task, ChatTask) and len(shard.examples) == 4
    assert all(any(label != -100 for label in ex["labels"]) for ex in shard.examples)
    with pytest.raises(FedloraError, match="the run's dataset shakespeare is lm"):
        load_own_shard(cfg.replace(dataset="shakespeare"), str(own))
    with pytest.raises(FedloraError, match="it declares labels"):
        load_own_shard(cfg, str(own), "", "a,b")


@pytest.mark.slow  # a SuperLink, three SmolLM2 nodes (one per form of data) and a round: minutes on 2 cores
def test_fedlora_node_with_instruction_data_completes_a_round_of_a_real_federation(tmp_path):
    scripts, env, port = Path(sys.executable).parent, _process_env(), free_port()
    link_home, cli_home = tmp_path / "link", tmp_path / "cli"
    for d in (link_home, cli_home):
        d.mkdir()
    (cli_home / "config.toml").write_text(
        f'[superlink]\ndefault = "e2e"\n\n[superlink.e2e]\naddress = "127.0.0.1:{port}"\ninsecure = true\n'
    )
    server_data = _alpaca(tmp_path / "federation.jsonl", ROWS * 4)
    owners = {form: tmp_path / f"owner-{form}" for form in FORMS}  # one node per form of data
    for form, home in owners.items():
        home.mkdir()
        write_form(home, form, [(q, a, form) for q, a in ROWS])
    link = _start(
        [str(scripts / "flower-superlink"), "--insecure", "--host", "127.0.0.1", "--port", str(port),
         "--database", str(tmp_path / "state.db"), "--disable-runtime-dependency-installation"],
        tmp_path / "superlink.log", env={**env, "FLWR_HOME": str(link_home)}, cwd=tmp_path,
    )  # fmt: skip
    nodes = []
    try:
        _wait_for_port(port, link, tmp_path / "superlink.log")
        for form, home in owners.items():
            nodes.append(_start(
                [str(scripts / "fedlora"), "node", "--superlink", f"127.0.0.1:{port}", "--data",
                 str(home / FILES[form]), "--mechanism", "fedavg", "--state-dir", str(home / "state"), "--insecure"],
                home / "node.log", env=env, cwd=tmp_path,
            ))  # fmt: skip
        run_dir = tmp_path / "run"
        overrides = (
            f"preset='smollm2-shakespeare-xdev' dataset='{server_data}' num-clients=3 sample-rate=1.0 rounds=1 "
            f"local-steps=2 batch-size=2 max-length=64 eval-examples=8 round-timeout=300 out-dir='{run_dir}'"
        )
        proc = subprocess.run(
            [str(scripts / "flwr"), "run", str(ROOT), "e2e", "--stream", "--run-config", overrides],
            env={**env, "FLWR_HOME": str(cli_home)}, cwd=tmp_path, capture_output=True, text=True, timeout=600,
        )  # fmt: skip
        logs = proc.stdout[-3000:] + proc.stderr[-2000:]
        logs += "".join((home / "node.log").read_text()[-2000:] for home in owners.values())
        assert proc.returncode == 0, logs
        summary = json.loads((run_dir / "summary.json").read_text())
        assert summary["rounds_completed"] == 1 and summary["data_format"].startswith("conversations"), logs
        records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
        assert records[-1]["replied"] == 3 and not records[-1]["rejected"], records
        assert summary["nodes_own_data"] == 3, summary
    finally:
        for p in [*nodes, link]:
            _stop(p)


def test_fedlora_node_and_prepare_data_skip_bad_rows_when_told(tmp_path, capsys, caplog):
    """Issue 75 item 3: the one-line refusal of a malformed row says "pass --skip-bad-rows", and
    both fedlora node and sdk.prepare_data take it: the bad rows skipped and counted."""
    bad = tmp_path / "faq.csv"
    bad.write_text(
        'prompt,completion\nSay red.,Red.\n"Say blue.,Blue.\nAdd 1 and 1.,2\n'
    )  # line 3: open quote
    labelled = tmp_path / "tickets.csv"
    labelled.write_text("text,label\nprinter broken,it\nrefund me,billing,extra\nlogin fails,it\n")
    base = ["node", "--superlink", "127.0.0.1:9", "--data", str(bad), "--mechanism", "fedavg", "--insecure",
            "--print-command"]  # fmt: skip
    assert run_cli([*base, "--state-dir", str(tmp_path / "a")]) == 2
    err = capsys.readouterr().err.strip()
    assert f"{bad}:3:" in err and "--skip-bad-rows" in err and "\n" not in err
    assert run_cli([*base, "--state-dir", str(tmp_path / "b"), "--skip-bad-rows"]) == 0
    assert len(read_conversations(tmp_path / "b" / "data.jsonl")) == 2  # lines 2 and 4
    assert "skipped 1 bad row" in caplog.text
    assert caplog.text.count("skipped 1 bad row") == 1  # reported once, not by every reading of the file
    with pytest.raises(FedloraError, match="--skip-bad-rows"):
        sdk.prepare_data(labelled, tmp_path / "c.jsonl", label_names=["billing", "it"])
    out = sdk.prepare_data(labelled, tmp_path / "d.jsonl", label_names=["billing", "it"], skip_bad_rows=True)
    assert [json.loads(line)["text"] for line in out.read_text().splitlines()] == [
        "printer broken",
        "login fails",
    ]
