"""What ``fedlora train-local`` publishes: result.json and the printed summary of a DP run hold nothing
derived from the realised Poisson batches (their sizes depend on the private data set and are not
covered by the sample-level guarantee)."""

from __future__ import annotations

import json

from tests.conftest import run_cli

TINY_LOCAL = [
    "--local-steps",
    "2",
    "--batch-size",
    "4",
    "--max-train-examples",
    "32",
    "--eval-examples",
    "8",
    "--max-length",
    "16",
]
#: every key result.json may hold; a new one must be checked against the threat model before it joins
PUBLISHED = {
    "mechanism",
    "model",
    "dataset",
    "seed",
    "init",
    "examples",
    "eval_examples",
    "steps",
    "batch_size",
    "lr",
    "clip",
    "sample_rate",
    "noise_multiplier",
    "accuracy",
    "lora_norm",
    "privacy",
    "seconds",
}


def test_dp_run_publishes_no_realised_batch_sizes(tmp_path, capsys):
    out = tmp_path / "run"
    code = run_cli(["train-local", "--mechanism", "dp-adamw", *TINY_LOCAL, "--out", str(out)])
    printed = capsys.readouterr().out
    assert code == 0
    result = json.loads((out / "result.json").read_text(encoding="utf-8"))
    assert not {"examples-used", "empty-batches"} & set(result)
    assert set(result) <= PUBLISHED, set(result) - PUBLISHED
    assert result["steps"] == 2 and result["privacy"]["epsilon"] > 0
    assert "sample-level epsilon" in printed and "empty" not in printed and "examples-used" not in printed
