"""Shared fixtures. Models come from the packaged assets (offline); the SmolLM2 conversion is
cached in $FEDLORA_CACHE (the Makefile points it at .cache/) and reused across runs."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest
import torch
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

from common.models import LoraSpec, load_model
from common.models.lora import attach_lora, lora_layers
from common.models.smollm2 import smollm2_dir

torch.set_num_threads(2)


@pytest.fixture(scope="session")
def minilm():
    return load_model("minilm-l6", LoraSpec(rank=4), torch.device("cpu"), num_labels=2, seed=0)


@pytest.fixture(scope="session")
def smollm2_tokenizer():
    tok = AutoTokenizer.from_pretrained(smollm2_dir())
    tok.pad_token = tok.pad_token or tok.eos_token
    return tok


def tiny_llama_config(vocab_size: int, **overrides) -> LlamaConfig:
    """Hidden 32, 4 heads, 2 KV heads (k/v_proj: 16 x 32), 2 layers unless overridden."""
    values = dict(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
    )
    return LlamaConfig(vocab_size=vocab_size, **{**values, **overrides})


@pytest.fixture()
def tiny_llama(smollm2_tokenizer):
    """A 2-layer random Llama with SmolLM2's real tokenizer: fast, and exercises the causal-LM path."""
    torch.manual_seed(0)
    cfg = tiny_llama_config(len(smollm2_tokenizer))
    model = attach_lora(LlamaForCausalLM(cfg), LoraSpec(rank=4, targets=("q_proj", "v_proj")), "CAUSAL_LM")
    return model.eval()


def randomize_lora(model: torch.nn.Module, seed: int = 0) -> None:
    """Non-zero LoRA factors (PEFT starts lora_B at 0, which would hide adapter bugs)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ".lora_" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.1)


def run_cli(argv: list[str]) -> int:
    """``fedlora`` in-process, returning its exit code (argparse's own errors exit via SystemExit)."""
    from common.cli import main

    try:
        return main(argv)
    except SystemExit as exc:
        return int(exc.code)


@pytest.fixture(scope="module")
def one_thread():
    """Run a module's tests on one torch thread (the autoencoder tests), restoring the count after."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def per_example_base_grads(model, task, examples) -> list[dict[str, torch.Tensor]]:
    """``∂L_i/∂W`` of every LoRA layer's base weight, one example at a time (plain autograd)."""
    layers = lora_layers(model)
    weights = {k: layer.get_base_layer().weight for k, layer in layers.items()}
    for w in weights.values():
        w.requires_grad_(True)
    out = []
    for ex in examples:
        batch = task.collate([ex], torch.device("cpu"))
        grads = torch.autograd.grad(task.per_example_loss(model, batch).sum(), list(weights.values()))
        out.append(dict(zip(weights, grads, strict=True)))
    for w in weights.values():
        w.requires_grad_(False)
    return out
