"""Adapters that travel. A saved adapter is a standard PEFT directory whose ``adapter_config.json``
names the base model by its Hub id (not by a path inside this machine's virtualenv), plus:

- ``fedlora.json``: what PEFT's config cannot say (the registry name, the number of labels, the
  pooling an encoder head reads and, for a classification dataset, its class names as transformers'
  ``id2label``/``label2id``); no file of the directory holds a path of the machine it was saved on;
- ``README.md``: the model card (the caller writes it: data, metrics, privacy guarantee).

:func:`load_adapter` loads one anywhere: a Hub id of a packaged model resolves to the packaged
weights offline (common/models/registry.py), any other id loads through Hugging Face as usual; an
encoder's head gets the class names on its config (``model.config.id2label``).

The class names live in ``fedlora.json``, not in a ``config.json`` beside the adapter: transformers
takes a directory holding both ``config.json`` and ``adapter_config.json`` for a full model with an
embedded adapter, and PEFT warns on keys its ``adapter_config.json`` does not know.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import torch
from peft import PeftModel
from transformers import PreTrainedTokenizerBase

from common.errors import FedloraError
from common.models.loader import ModelBundle, load_base
from common.models.registry import resolve_model

SIDECAR = "fedlora.json"


def label_maps(label_names: Sequence[str]) -> dict[str, dict]:
    """``{"id2label": {"0": name, ...}, "label2id": {name: 0, ...}}`` as a transformers config.json
    writes them (class ``i`` is ``label_names[i]``); empty without names."""
    if not label_names:
        return {}
    return {
        "id2label": {str(i): name for i, name in enumerate(label_names)},
        "label2id": {name: i for i, name in enumerate(label_names)},
    }


def save_adapter(
    bundle: ModelBundle, directory: Path, pooling: str, card: str, label_names: Sequence[str] = ()
) -> None:
    """Write ``bundle``'s adapter as a portable PEFT directory (``directory`` must be new or empty)
    with the model card ``card`` as its README.md; ``label_names``: the dataset's class names in
    class-index order (``Corpus.label_names``), recorded as ``id2label``/``label2id`` (none: none)."""
    config = bundle.model.peft_config["default"]
    local = config.base_model_name_or_path
    portable = resolve_model(bundle.name).hub_id or local
    config.base_model_name_or_path = portable
    try:
        bundle.model.save_pretrained(directory, save_embedding_layers=False)  # LoRA never trains them
    finally:
        config.base_model_name_or_path = local
    bundle.tokenizer.save_pretrained(directory)
    head = bundle.model.base_model.model.num_labels if bundle.kind == "seq-cls" else None
    sidecar = {
        "model": bundle.name,
        "base_model": portable,
        "kind": bundle.kind,
        "num_labels": head,
        "pooling": pooling,
        **label_maps(label_names),
    }
    (directory / SIDECAR).write_text(json.dumps(sidecar, indent=2) + "\n", encoding="utf-8")
    (directory / "README.md").write_text(card, encoding="utf-8")


def load_adapter(directory: str | Path, device: str = "cpu") -> tuple[PeftModel, PreTrainedTokenizerBase]:
    """``PeftModel.from_pretrained`` on the base model the adapter names, in eval mode; an encoder
    classifier's config carries the saved class names (``id2label``/``label2id``) when the adapter
    has them."""
    directory = Path(directory)
    config_path = directory / "adapter_config.json"
    if not config_path.is_file():
        raise FedloraError(f"{directory} is not a saved adapter (no adapter_config.json)")
    base_id = json.loads(config_path.read_text(encoding="utf-8"))["base_model_name_or_path"]
    sidecar_path = directory / SIDECAR
    extra = json.loads(sidecar_path.read_text(encoding="utf-8")) if sidecar_path.is_file() else {}
    spec = resolve_model(base_id)
    base, tokenizer, _ = load_base(spec, extra.get("num_labels") or 2, extra.get("pooling", "cls"))
    if spec.kind == "seq-cls" and extra.get("id2label"):
        id2label = {int(i): str(name) for i, name in extra["id2label"].items()}
        if sorted(id2label) != list(range(base.config.num_labels)):
            raise FedloraError(
                f"{sidecar_path}: id2label names classes {sorted(id2label)}, "
                f"the head has {base.config.num_labels}"
            )
        base.config.id2label = id2label
        base.config.label2id = {name: i for i, name in id2label.items()}
    model = PeftModel.from_pretrained(base, directory).to(torch.device(device))
    return model.eval(), tokenizer


__all__ = ["SIDECAR", "label_maps", "load_adapter", "save_adapter"]
