"""``fedlora bench prism-step``: both optimizers measured in one process, on a tiny random Llama
saved as a local model directory (the bench's code path, without SmolLM2's 36 s).

The op counts are issue 36's CPU proxy for a GPU step's launch overhead: on a 16-layer model PRISM
must dispatch at most 1.3x the ops of DP-AdamW, and at most 50 more than DP-AdamW per added layer
(before batching across modules: 2.87x and 1,340).
"""

import json

import pytest
from transformers import LlamaForCausalLM

from tests.conftest import run_cli, tiny_llama_config


@pytest.mark.heavy
def test_prism_step_bench_measures_both_methods_on_a_local_model(tmp_path, smollm2_tokenizer, capsys):
    model_dir = tmp_path / "tiny-llama"
    LlamaForCausalLM(tiny_llama_config(len(smollm2_tokenizer), num_hidden_layers=16)).save_pretrained(
        model_dir
    )
    smollm2_tokenizer.save_pretrained(model_dir)
    targets = "q_proj,k_proj,v_proj,o_proj"
    argv = ["bench", "prism-step", "--model", str(model_dir), "--targets", targets, "--rank", "2"]
    assert run_cli([*argv, "--batch", "2", "--seq", "16", "--repeats", "2", "--json"]) == 0
    record = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert (record["targets"], record["rank"], record["batch"], record["seq"]) == (targets, 2, 2, 16)
    for method in ("prism", "dp_adamw"):
        cost = record[method]
        assert cost["seconds"] > 0 and 0 <= cost["step_extra_bytes"] <= cost["peak_bytes"]
        assert cost["ops"] > 16 * cost["ops_per_layer"] > 0  # a forward and backward per layer, at least
    assert record["device"] == "cpu" and record["threads"] >= 1
    assert record["ops_ratio"] == pytest.approx(record["prism"]["ops"] / record["dp_adamw"]["ops"])
    assert record["ops_ratio"] <= 1.3
    assert record["prism_extra_ops_per_layer"] <= 50
