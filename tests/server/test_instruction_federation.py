"""A data owner's instruction file, in each of the three forms, trains SmolLM2 in ``fedlora
simulate`` (the real entry point): conversations through the chat template, the loss on the
answers, their perplexity falls, the summary and model card name the format, and ``generate
--chat`` answers from the adapter."""

from __future__ import annotations

import json
import subprocess

import pytest

from tests.conftest import run_cli
from tests.harness import FORMS, write_form
from tests.server.test_resume import _fedlora, _finish, kill_after
from tests.server.test_resume import _rows as _charges

pytestmark = pytest.mark.heavy  # SmolLM2-135M: two rounds of six nodes, about 30 s a form on 2 cores


def _rows(count: int = 48) -> list[tuple[str, str, str]]:
    rows = []
    for k in range(count):
        a, b = k % 7 + 1, k % 5 + 2
        prompt, answer = (
            (f"Add the two numbers.\n\n{a} and {b}", str(a + b))
            if k % 2
            else (f"Say the word {('red', 'blue', 'green')[k % 3]}.", ("Red.", "Blue.", "Green.")[k % 3])
        )
        rows.append((prompt, answer, f"owner-{k % 6}"))
    return rows


@pytest.mark.parametrize("form", FORMS)
def test_an_instruction_file_federates_and_the_answers_perplexity_falls(tmp_path, capsys, form):
    data, out = write_form(tmp_path, form, _rows()), tmp_path / "run"
    argv = [
        "simulate", "--preset", "smollm2-shakespeare-xdev", "--dataset", str(data), "--partition-by", "user",
        "--num-clients", "6", "--sample-rate", "1.0", "--rounds", "2", "--local-steps", "2", "--batch-size", "4",
        "--lr", "0.5", "--eval-examples", "12", "--eval-every", "1", "--workers", "1", "--out", str(out),
    ]  # fmt: skip
    assert run_cli(argv) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["metric"] == "perplexity" and summary["dataset_rows"] == 48
    assert summary["after"]["perplexity"] < summary["before"]["perplexity"]
    assert summary["data_format"].startswith("conversations, the loss on assistant turns only")
    assert "chat template: the tokenizer's own" in (out / "adapter" / "README.md").read_text()
    capsys.readouterr()
    chat = ["generate", "--adapter", str(out / "adapter"), "--chat", "--prompt", "Say the word red."]
    assert run_cli([*chat, "--temperature", "0", "--max-new-tokens", "4"]) == 0
    assert capsys.readouterr().out.strip()


@pytest.mark.slow  # about 90 s on 2 cores: SmolLM2 scored on 13 held-out items twice
@pytest.mark.parametrize("dataset", ["instruct-mc", "instruct-mc-balanced"])
def test_the_multiple_choice_benchmark_federates_and_is_scored_per_set(tmp_path, dataset):
    out = tmp_path / "mc"
    argv = [
        "simulate", "--preset", "smollm2-instruct-xdev", "--dataset", dataset, "--rounds", "1", "--num-clients", "4",
        "--sample-rate", "1.0", "--local-steps", "1", "--max-train-examples", "40", "--eval-examples", "13",
        "--max-length", "256", "--workers", "1", "--out", str(out),
    ]  # fmt: skip
    assert run_cli(argv) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["metric"] == "accuracy" and summary["data_format"].startswith("conversations")
    after = summary["after"]
    assert 0 <= after["accuracy"] <= 1 and {"acc_norm", "exact_match", "answered", "perplexity"} <= set(after)
    per_set = [key for key in after if key.startswith("accuracy/")]
    assert len(per_set) >= 2 and all(0 <= after[key] <= 1 for key in per_set)  # a seeded 13 of 753 items


@pytest.mark.slow  # SmolLM2 killed after its first private round and resumed: about a minute on 2 cores
def test_an_instruction_run_killed_mid_run_resumes_to_its_last_round(tmp_path):
    data, out = write_form(tmp_path, "chat", _rows()), tmp_path / "run"
    argv = [
        "simulate", "--preset", "smollm2-shakespeare-xdev", "--dataset", str(data), "--partition-by", "user",
        "--num-clients", "6", "--sample-rate", "1.0", "--rounds", "3", "--local-steps", "1", "--batch-size", "4",
        "--eval-examples", "8", "--workers", "1", "--mechanism", "dp-fedavg", "--threat-model", "central",
        "--clip", "1.0", "--noise-multiplier", "0.5", "--out", str(out),
    ]  # fmt: skip
    proc = _fedlora(*argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    ledger = out / "ledger.sqlite"
    kill_after(proc, ledger, 1)
    resumed = _finish("simulate", "--resume", "--out", str(out))
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    rows = _charges(ledger)
    assert [r["round"] for r in rows] == [1, 2, 3] and {r["status"] for r in rows} <= {
        "applied",
        "interrupted",
    }
    summary = json.loads((out / "summary.json").read_text())
    interrupted = [r["round"] for r in rows if r["status"] == "interrupted"]
    assert summary["rounds_completed"] + len(interrupted) == 3, summary
    assert (
        summary["data_format"].startswith("conversations") and "resuming" in resumed.stderr + resumed.stdout
    )
