"""Models: registry (named, HF id or local dir), loading, LoRA and the PEFT <-> factor adapter.

The names below load on first use: ``common.models.generate``'s options, say, need no transformers."""

from common.lazy import lazy_exports

_EXPORTS = {
    "common.models.loader": ("ModelBundle", "load_model"),
    "common.models.lora": (
        "AdapterState",
        "LoraSpec",
        "adapter_shapes",
        "adapter_size",
        "adapter_state",
        "get_factors",
        "load_adapter_state",
        "lora_layers",
        "set_factors",
    ),
    "common.models.registry": ("MODELS", "resolve_model"),
}
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
__all__ = sorted(name for names in _EXPORTS.values() for name in names)
