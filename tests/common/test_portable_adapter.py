"""A saved adapter travels: its config names the base model by Hub id (no path into this machine's
virtualenv), it loads offline through the registry on another path, and its model card states the
run's guarantee (or that there is none)."""

from __future__ import annotations

import json
import shutil
import sys

import pytest
import torch

from common.models import LoraSpec, adapter_shapes, load_adapter_state, load_model
from common.models.portable import SIDECAR, load_adapter
from common.models.registry import MODELS, resolve_model
from common.presets import preset
from server import checkpoint
from server.model_card import model_card
from server.simulate import simulate
from tests.harness import TINY, card_summary

HUB_ID = "sentence-transformers/all-MiniLM-L6-v2"


@pytest.fixture(scope="module")
def private_run(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("portable") / "r"
    cfg = preset(
        "minilm-rt",
        **TINY,
        pooling="mean",
        mechanism="dp-fedavg",
        threat_model="central",
        noise_multiplier=1.0,
        clip=1.0,
    ).check()
    simulate(cfg, run_dir)
    return run_dir


def test_a_packaged_models_hub_id_resolves_to_the_packaged_weights_offline():
    assert resolve_model(HUB_ID) is MODELS["minilm-l6"]
    assert resolve_model("HuggingFaceTB/SmolLM2-135M-Instruct") is MODELS["smollm2-135m"]


@pytest.mark.integration
def test_the_adapter_config_names_the_hub_id_and_no_local_path(private_run):
    adapter = private_run / "adapter"
    config = json.loads((adapter / "adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == HUB_ID
    for path in adapter.iterdir():  # no file names a path of this machine (virtualenv, run, home)
        if path.suffix in (".json", ".md", ".txt"):
            text = path.read_text(encoding="utf-8", errors="replace")
            assert sys.prefix not in text and str(private_run) not in text, path.name
            assert str(MODELS["minilm-l6"].locate()) not in text, path.name
    sidecar = json.loads((adapter / SIDECAR).read_text())
    assert sidecar == {
        "model": "minilm-l6",
        "base_model": HUB_ID,
        "kind": "seq-cls",
        "num_labels": 2,
        "pooling": "mean",
        "id2label": {"0": "negative", "1": "positive"},  # rotten-tomatoes' class names
        "label2id": {"negative": 0, "positive": 1},
    }


@pytest.mark.integration
def test_a_copied_adapter_loads_offline_and_computes_what_the_run_trained(private_run, tmp_path):
    moved = tmp_path / "elsewhere" / "adapter"
    shutil.copytree(private_run / "adapter", moved)  # nothing rewritten, only moved
    model, tokenizer = load_adapter(moved)
    # Reference: the run's own loader and the final state from its checkpoint.
    bundle = load_model(
        "minilm-l6", LoraSpec(rank=8), torch.device("cpu"), num_labels=2, seed=5, pooling="mean"
    )
    state, _, _ = checkpoint.load(private_run / checkpoint.CHECKPOINT_FILE, adapter_shapes(bundle.model))
    load_adapter_state(bundle.model, state)
    batch = tokenizer(["a moving, funny film", "dull and far too long"], return_tensors="pt", padding=True)
    with torch.no_grad():
        got = model(**batch).logits
        want = bundle.model.eval()(**batch).logits
    load_adapter_state(bundle.model, bundle.initial)  # the bundle is shared per process
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.integration
def test_the_model_card_states_the_runs_guarantee(private_run):
    card = (private_run / "adapter" / "README.md").read_text()
    summary = json.loads((private_run / "summary.json").read_text())
    totals = summary["client_privacy"]
    assert card.startswith("---\nbase_model: " + HUB_ID + "\nlibrary_name: peft\n")
    assert "More Information Needed" not in card  # not PEFT's empty template
    assert summary["privacy"] in card  # unit, threat model, sigma, accountants, delta, observer
    pld = f"{totals['eps_tight']:.4g}"
    assert f"{pld} (pld, the guarantee" in card or f"pld {pld} is the tight upper bound" in card
    assert f"at delta {float(totals['delta']):g}" in card
    assert "Not private" not in card
    assert f"{summary['after']['accuracy']:.4g}" in card
    assert "--pooling mean" in card


def test_a_non_private_card_says_so_and_a_causal_lm_card_loads_a_causal_lm():
    cfg = preset("smollm2-rt")
    card = model_card(cfg, card_summary(), None)
    assert "**Not private.**" in card
    assert "AutoModelForCausalLM" in card and "num_labels" not in card
    assert "base_model: HuggingFaceTB/SmolLM2-135M-Instruct" in card and "dequantised" in card
    sample = "sample-level (prism, target epsilon 3 (pld) per node at delta 1e-05; ...)"
    card = model_card(
        cfg, card_summary(privacy="none (no client-level release)", sample_privacy=sample), None
    )
    assert "Not private" not in card and sample in card
