"""``fedlora generate``: text from a saved causal-LM adapter, the same text plain PEFT + transformers
give for that adapter, and one-line refusals."""

from __future__ import annotations

import json

import pytest
import torch
from peft import PeftModel
from transformers import AutoModelForCausalLM

from common.cli import main
from common.models.generate import generate
from common.models.loader import ModelBundle, load_base
from common.models.lora import LoraSpec, adapter_state, attach_lora, lora_layers
from common.models.portable import save_adapter
from common.models.registry import MODELS

pytestmark = pytest.mark.heavy  # SmolLM2-135M: generation and a language-model federation

PROMPT = "To be, or not to be, that is"


def _saved(directory, name: str, kind: str, task_type: str):
    """A freshly built adapter (not the process's shared model) whose LoRA factors move the output."""
    spec = MODELS[name]
    base, tokenizer, _ = load_base(spec, 2, "cls")
    torch.manual_seed(0)
    model = attach_lora(base, LoraSpec(rank=2, targets=spec.default_targets or None), task_type)
    with torch.no_grad():
        for layer in lora_layers(model).values():
            layer.lora_B["default"].weight.normal_(0, 0.05)
    bundle = ModelBundle(name, kind, model, tokenizer, torch.device("cpu"), adapter_state(model))
    save_adapter(bundle, directory, "cls", "card\n")
    return model.eval(), tokenizer


@pytest.fixture(scope="module")
def smollm2_adapter(tmp_path_factory):
    directory = tmp_path_factory.mktemp("gen") / "adapter"
    model, tokenizer = _saved(directory, "smollm2-135m", "causal-lm", "CAUSAL_LM")
    return directory, model, tokenizer


def test_generate_prints_the_prompt_and_its_continuation(smollm2_adapter, capsys):
    directory, model, tokenizer = smollm2_adapter
    args = ["generate", "--adapter", str(directory), "--prompt", PROMPT, "--max-new-tokens", "6"]
    assert main([*args, "--temperature", "0"]) == 0
    printed = capsys.readouterr().out.strip()
    expected = generate(model, tokenizer, PROMPT, 6, temperature=0.0)
    assert printed == (PROMPT + expected).strip() and expected.strip()
    assert main([*args, "--samples", "2", "--seed", "3"]) == 0  # sampled: two, separated
    assert capsys.readouterr().out.count("---") == 1


def test_chat_sends_the_prompt_through_the_chat_template_and_prints_the_answer(smollm2_adapter, capsys):
    """``--chat``: the prompt is the user's message in the model's chat template (a system message
    before it with ``--system``), and what prints is the assistant's answer alone."""
    directory, model, tokenizer = smollm2_adapter
    args = ["generate", "--adapter", str(directory), "--prompt", "Name a colour.", "--max-new-tokens", "6"]
    assert main([*args, "--chat", "--system", "Be brief.", "--temperature", "0"]) == 0
    printed = capsys.readouterr().out.strip()
    turns = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a colour."}]
    templated = tokenizer.apply_chat_template(turns, tokenize=False, add_generation_prompt=True)
    assert templated.endswith("<|im_start|>assistant\n")
    assert printed == generate(model, tokenizer, templated, 6, temperature=0.0).strip() and printed
    assert main([*args, "--system", "Be brief."]) == 2  # --system without --chat: one line
    assert capsys.readouterr().err.strip() == "fedlora: error: --system goes with --chat"


def test_with_base_prints_the_base_and_the_adapter_side_by_side(smollm2_adapter, capsys):
    """Same prompt, same seed: the base model's text (the adapter disabled) first, then the adapter's,
    each what generating with that model alone gives."""
    directory, model, tokenizer = smollm2_adapter
    args = ["generate", "--adapter", str(directory), "--prompt", PROMPT, "--max-new-tokens", "6"]
    assert main([*args, "--seed", "4", "--with-base"]) == 0
    printed = capsys.readouterr().out
    with model.disable_adapter():
        base = generate(model, tokenizer, PROMPT, 6, seed=4)
    tuned = generate(model, tokenizer, PROMPT, 6, seed=4)
    assert printed == f"[base, seed 4]\n{PROMPT + base}\n[adapter, seed 4]\n{PROMPT + tuned}\n"
    assert base != tuned  # the adapter's factors move the output


def test_plain_peft_and_transformers_generate_the_same_text(smollm2_adapter):
    directory, model, tokenizer = smollm2_adapter
    base = AutoModelForCausalLM.from_pretrained(MODELS["smollm2-135m"].locate(), dtype=torch.float32)
    plain = PeftModel.from_pretrained(base, directory).eval()
    ids = tokenizer(PROMPT, return_tensors="pt")
    with torch.no_grad():
        out = plain.generate(**ids, max_new_tokens=6, do_sample=False, pad_token_id=tokenizer.eos_token_id)
        adapted = plain(**ids).logits
        with plain.disable_adapter():
            bare = plain(**ids).logits
    text = tokenizer.decode(out[0, ids["input_ids"].shape[1] :], skip_special_tokens=True)
    assert text == generate(model, tokenizer, PROMPT, 6, temperature=0.0)
    assert not torch.allclose(adapted, bare)  # the adapter was applied, not just the base


def test_a_classifier_adapter_is_refused_in_one_line(tmp_path, capsys):
    directory = tmp_path / "adapter"
    _saved(directory, "minilm-l6", "seq-cls", "SEQ_CLS")
    assert main(["generate", "--adapter", str(directory), "--prompt", "hi"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "generate needs a causal LM adapter" in err


def test_bad_generation_settings_are_one_line(smollm2_adapter, capsys):
    directory, _, _ = smollm2_adapter
    for bad in (["--max-new-tokens", "0"], ["--top-p", "1.5"], ["--temperature", "-1"]):
        assert main(["generate", "--adapter", str(directory), "--prompt", "x", *bad]) == 2
        assert len(capsys.readouterr().err.strip().splitlines()) == 1
    assert main(["generate", "--adapter", str(directory.parent / "nope"), "--prompt", "x"]) == 2
    assert "not a saved adapter" in capsys.readouterr().err


@pytest.mark.slow  # make test-all: make test keeps `fedlora generate` through its entry point
def test_a_language_model_runs_card_shows_two_samples_and_its_perplexities(tmp_path):
    from common.presets import preset
    from server.simulate import simulate

    cfg = preset(
        "smollm2-rt",
        dataset="shakespeare",
        partition="natural",
        num_clients=4,
        sample_rate=1.0,
        rounds=1,
        local_steps=1,
        batch_size=2,
        max_length=32,
        eval_examples=2,
        workers=1,
    ).check()
    summary = json.loads((simulate(cfg, tmp_path / "r") / "summary.json").read_text())
    card = (tmp_path / "r" / "adapter" / "README.md").read_text()
    assert summary["metric"] == "perplexity" and "Held-out perplexity" in card
    from server.summary import format_summary

    blocks = summary["eval_examples"]  # the 2 held-out texts, cut into blocks of 32 tokens
    assert summary["eval_texts"] == 2 < blocks
    assert f"(2 held-out texts, cut into {blocks} blocks of at most --max-length tokens)" in format_summary(
        summary
    )
    samples = card.split("## Samples", 1)[1].split("## Loading", 1)[0]
    assert samples.count("> **") == 2 and len(samples.split()) > 20
