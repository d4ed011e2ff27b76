"""Random-weight model shapes (``--model random:<shape>``, ``fedlora bench scale --shape``): the named
transformer's sizes, no weights on disk."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM, LlamaConfig

from common.errors import FedloraError
from common.models.registry import MODELS, SHAPES, resolve_model
from common.models.smollm2 import smollm2_dir


def _count(config) -> int:
    with torch.device("meta"):
        return sum(p.numel() for p in AutoModelForCausalLM.from_config(config).parameters())


def test_the_smollm2_shape_has_the_real_models_parameter_count():
    spec = resolve_model("random:smollm2-135m")
    assert spec.kind == "causal-lm" and spec.default_targets == MODELS["smollm2-135m"].default_targets
    real = AutoConfig.from_pretrained(smollm2_dir())
    shaped = LlamaConfig(vocab_size=real.vocab_size, tie_word_embeddings=True, **dict(spec.shape))
    assert _count(shaped) == _count(real)


@pytest.mark.parametrize(("shape", "billions"), [("tinyllama-1.1b", 1.07), ("llama-3.2-1b", 1.07)])
def test_the_billion_parameter_shapes_are_that_large(shape, billions):
    """With SmolLM2's 49,152-token vocabulary (the real models' vocabularies differ: the docs say so)."""
    config = LlamaConfig(vocab_size=49152, tie_word_embeddings=True, **SHAPES[shape])
    assert _count(config) / 1e9 == pytest.approx(billions, abs=0.01)


def test_an_unknown_shape_is_one_clear_error():
    with pytest.raises(FedloraError, match="unknown model shape 'llama-9b'; use one of smollm2-135m"):
        resolve_model("random:llama-9b")
