"""``fedlora bench prism-step``: the plain step and both DP optimizers measured in one process, on a
tiny random Llama saved as a local model directory (the bench's code path, without SmolLM2's 36 s).

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
    assert run_cli([*argv, "--batch", "2,3", "--seq", "16", "--repeats", "2", "--json"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    record, larger = (json.loads(line) for line in lines[-2:])
    assert (record["targets"], record["rank"], record["batch"], record["seq"]) == (targets, 2, 2, 16)
    assert (
        larger["batch"] == 3 and "ops" not in larger["prism"]
    )  # ops are counted once: they do not grow with b
    for method in ("plain", "prism", "dp_adamw"):
        cost = record[method]
        assert cost["seconds"] > 0 and 0 <= cost["step_extra_bytes"] <= cost["peak_bytes"]
        assert cost["ops"] > 16 * cost["ops_per_layer"] > 0  # a forward and backward per layer, at least
        assert cost["passes"] == {"plain": 2, "dp": 2, "fit": False}  # the CPU: the batch in one pass here
    for method in ("prism", "dp_adamw"):
        versus = record["over_plain"][method]
        assert versus["time"] == pytest.approx(record[method]["seconds"] / record["plain"]["seconds"])
        assert versus["memory"] == pytest.approx(record[method]["peak_bytes"] / record["plain"]["peak_bytes"])
        # the per-example work is stacked per shape group: a DP step's extra ops do not scale with modules
        assert record["ops_over_plain"][method] <= 1.5
    assert record["device"] == "cpu" and record["threads"] >= 1
    assert record["ops_ratio"] == pytest.approx(record["prism"]["ops"] / record["dp_adamw"]["ops"])
    assert record["ops_ratio"] <= 1.3
    assert record["prism_extra_ops_per_layer"] <= 50


@pytest.mark.parametrize("batch", ["0", "8,x", ""])
def test_a_bad_batch_list_is_one_line_exit_2(batch, capsys):
    assert run_cli(["bench", "prism-step", "--batch", batch]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--batch" in err[0]
