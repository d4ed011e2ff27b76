"""What ``fedlora train-local`` publishes: result.json and the printed summary of a DP run hold nothing
derived from the realised Poisson batches (their sizes depend on the private data set and are not
covered by the sample-level guarantee)."""

from __future__ import annotations

import json

import pytest

from common.models.precision import native_bf16
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
    # added with a threat-model check: evaluations of the held-out split (test, or --validation,
    # which privacy.not_covered names), the run's options, and planned throughput with wall times
    # (side channels like "seconds"; privacy.not_covered names them)
    "eval_split",
    "pooling",
    "head_init",
    "before",
    "top_class_share",
    "train_seconds",
    "examples_per_second",
    # the shard options (--node of a --num-clients split): options, and the shard's size N is
    # already public as "examples" (the split is a seeded function of public choices)
    "node",
    "num_clients",
    "partition",
    # the dense update's norm (wishart, sparta-base): what "lora_norm" is for a LoRA update
    "dense_norm",
    # an option of the run (prism only)
    "prism_floor",
    # when, at which commit and on what device the run was made: the code and the machine, no data
    "made",
    # the frozen base's precision as this machine resolved --precision: an option and the machine
    "precision",
}


@pytest.mark.heavy
def test_dp_run_publishes_no_realised_batch_sizes(tmp_path, capsys):
    out = tmp_path / "run"
    code = run_cli(["train-local", "--mechanism", "dp-adamw", *TINY_LOCAL, "--out", str(out)])
    printed = capsys.readouterr().out
    assert code == 0
    result = json.loads((out / "result.json").read_text(encoding="utf-8"))
    assert not {"examples-used", "empty-batches"} & set(result)
    assert set(result) <= PUBLISHED, set(result) - PUBLISHED
    assert result["steps"] == 2 and result["privacy"]["epsilon"] > 0
    assert result["precision"] == ("bf16" if native_bf16("cpu") else "fp32")  # auto, as resolved here
    assert "sample-level epsilon" in printed and "empty" not in printed and "examples-used" not in printed


@pytest.mark.heavy
def test_zero_shot_head_and_validation_split(tmp_path, capsys):
    out = tmp_path / "run"
    args = ["--head-init", "zero-shot", "--pooling", "mean", "--validation", "8", "--out", str(out)]
    code = run_cli(["train-local", "--mechanism", "dp-adamw", *TINY_LOCAL, *args])
    printed = capsys.readouterr().out
    assert code == 0
    result = json.loads((out / "result.json").read_text(encoding="utf-8"))
    assert result["eval_split"] == "validation" and result["eval_examples"] == 8
    assert result["examples"] == 32 - 8  # the held-out examples are never trained on
    assert (result["head_init"], result["pooling"]) == ("zero-shot", "mean")
    assert 0.0 <= result["before"] <= 1.0 and result["examples_per_second"] > 0
    assert any("validation" in item for item in result["privacy"]["not_covered"])
    assert "validation accuracy" in printed and "before ->" in printed


def test_bad_logical_batches_fail_with_one_line(tmp_path, capsys):
    base = ["train-local", "--mechanism", "dp-adamw", "--max-train-examples", "32", "--eval-examples", "8"]
    code = run_cli([*base, "--batch-size", "64", "--out", str(tmp_path / "a")])
    assert code != 0 and "exceeds the 32 training examples" in capsys.readouterr().err
    code = run_cli([*base, "--batch-size", "8", "--microbatch", "16", "--out", str(tmp_path / "b")])
    assert code != 0 and "--microbatch 16 exceeds the logical batch --batch-size 8" in capsys.readouterr().err
    code = run_cli([*base, "--batch-size", "8", "--validation", "32", "--out", str(tmp_path / "c")])
    assert code != 0 and "--validation must be in [0, 32)" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())  # nothing written
