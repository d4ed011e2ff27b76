"""``fedlora bench prism-step``: both optimizers measured in one process, on a tiny random Llama
saved as a local model directory (the bench's code path, without SmolLM2's 36 s)."""

import json

import pytest
from transformers import LlamaForCausalLM

from tests.conftest import run_cli, tiny_llama_config


@pytest.mark.heavy
def test_prism_step_bench_measures_both_methods_on_a_local_model(tmp_path, smollm2_tokenizer, capsys):
    model_dir = tmp_path / "tiny-llama"
    LlamaForCausalLM(tiny_llama_config(len(smollm2_tokenizer))).save_pretrained(model_dir)
    smollm2_tokenizer.save_pretrained(model_dir)
    argv = ["bench", "prism-step", "--model", str(model_dir), "--targets", "q_proj,v_proj", "--rank", "2"]
    assert run_cli([*argv, "--batch", "2", "--seq", "16", "--repeats", "2", "--json"]) == 0
    record = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert (record["targets"], record["rank"], record["batch"], record["seq"]) == ("q_proj,v_proj", 2, 2, 16)
    for method in ("prism", "dp_adamw"):
        cost = record[method]
        assert cost["seconds"] > 0 and 0 <= cost["step_extra_bytes"] <= cost["peak_bytes"]
    assert record["device"] == "cpu" and record["threads"] >= 1
