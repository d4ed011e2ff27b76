"""Models: registry (named, HF id or local dir), loading, LoRA and the PEFT <-> factor adapter."""

from common.models.loader import ModelBundle, load_model
from common.models.lora import (
    AdapterState,
    LoraSpec,
    adapter_shapes,
    adapter_size,
    adapter_state,
    get_factors,
    load_adapter_state,
    lora_layers,
    set_factors,
)
from common.models.registry import MODELS, resolve_model

__all__ = [
    "MODELS",
    "AdapterState",
    "LoraSpec",
    "ModelBundle",
    "adapter_shapes",
    "adapter_size",
    "adapter_state",
    "get_factors",
    "load_adapter_state",
    "load_model",
    "lora_layers",
    "resolve_model",
    "set_factors",
]
