"""PEFT <-> paper-factor adapter: A Bᵀ is PEFT's ΔW, and the mapping round-trips exactly."""

import pytest
import torch

from common.models import (
    adapter_shapes,
    adapter_state,
    get_factors,
    load_adapter_state,
    lora_layers,
    set_factors,
)
from tests.conftest import randomize_lora


def test_factors_reproduce_peft_delta_weight(tiny_llama):
    randomize_lora(tiny_llama)
    layers = lora_layers(tiny_llama)
    assert len(layers) == 4  # q_proj, v_proj in 2 layers
    for layer in layers.values():
        a, b = get_factors(layer)
        m, n = layer.base_layer.weight.shape
        assert a.shape == (m, 4) and b.shape == (n, 4)
        torch.testing.assert_close(a @ b.T, layer.get_delta_weight("default"), rtol=1e-5, atol=1e-7)


def test_set_get_roundtrip_preserves_delta_and_forward(tiny_llama):
    randomize_lora(tiny_llama, seed=1)
    ids = torch.randint(0, 1000, (2, 12))
    before = tiny_llama(input_ids=ids).logits
    for layer in lora_layers(tiny_llama).values():
        delta = layer.get_delta_weight("default").clone()
        a, b = get_factors(layer)
        set_factors(layer, torch.zeros_like(a), torch.zeros_like(b))
        assert layer.get_delta_weight("default").abs().max() == 0
        set_factors(layer, a, b)
        torch.testing.assert_close(layer.get_delta_weight("default"), delta)
    torch.testing.assert_close(tiny_llama(input_ids=ids).logits, before)


def test_scaling_is_folded_symmetrically(tiny_llama):
    randomize_lora(tiny_llama, seed=2)
    layer = next(iter(lora_layers(tiny_llama).values()))
    s = layer.scaling["default"]
    a, b = get_factors(layer)
    torch.testing.assert_close(a, layer.lora_B["default"].weight * s**0.5)
    torch.testing.assert_close(b, layer.lora_A["default"].weight.T * s**0.5)


def test_adapter_state_roundtrip_includes_head(minilm):
    model = minilm.model
    randomize_lora(model, seed=3)
    state = adapter_state(model)
    head = [k for k in state if "classifier" in k]
    assert head, "the classification head must travel with the adapter"
    assert {k: tuple(v.shape) for k, v in state.items()} == adapter_shapes(model)
    perturbed = {k: v + 1.0 for k, v in state.items()}
    load_adapter_state(model, perturbed)
    back = adapter_state(model)
    for k in state:
        torch.testing.assert_close(back[k], perturbed[k])
    load_adapter_state(model, state)


def test_a_model_type_without_peft_defaults_names_targets_and_its_linear_layers():
    from transformers import DistilBertConfig, DistilBertForSequenceClassification

    from common.errors import FedloraError
    from common.models.lora import LoraSpec, attach_lora, lora_layers

    def tiny():
        return DistilBertForSequenceClassification(
            DistilBertConfig(n_layers=1, dim=32, hidden_dim=64, n_heads=2, vocab_size=100)
        )

    with pytest.raises(FedloraError) as err:
        attach_lora(tiny(), LoraSpec(), "SEQ_CLS")
    message = str(err.value)
    assert "\n" not in message and "--targets" in message and "'distilbert'" in message
    assert "q_lin, k_lin, v_lin, out_lin, lin1, lin2" in message
    named = attach_lora(tiny(), LoraSpec(targets=("q_lin", "v_lin")), "SEQ_CLS")
    assert {name.rsplit(".", 1)[-1] for name in lora_layers(named)} == {"q_lin", "v_lin"}
