"""Load a model with LoRA attached, once per process and configuration."""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from functools import lru_cache

import torch
from peft import PeftModel
from torch import nn
from transformers import (
    AutoModelForCausalLM,
    AutoModelForSequenceClassification,
    AutoTokenizer,
    LlamaConfig,
    PreTrainedTokenizerBase,
)
from transformers.utils import logging as hf_logging

from common.errors import FedloraError
from common.models.lora import AdapterState, LoraSpec, adapter_state, attach_lora
from common.models.pooling import use_mean_pooling
from common.models.precision import attention_for, hold_frozen_in
from common.models.registry import ModelSpec, resolve_model


@dataclass
class ModelBundle:
    """A PEFT model with its tokenizer. ``kind``: ``causal-lm`` or ``seq-cls``. ``initial`` is the
    adapter state as loaded (the bundle is shared per process: restore it to start afresh)."""

    name: str
    kind: str
    model: PeftModel
    tokenizer: PreTrainedTokenizerBase
    device: torch.device
    initial: AdapterState


def load_model(
    name: str,
    lora: LoraSpec,
    device: torch.device,
    num_labels: int = 2,
    seed: int = 0,
    pooling: str = "cls",
    precision: str = "fp32",
) -> ModelBundle:
    """Base model + LoRA (``seed`` fixes the LoRA and head init; ``pooling`` what an encoder's head
    reads, common/models/pooling.py; ``precision`` the frozen base's, common/models/precision.py).
    Cached per process: callers that share a bundle must load the adapter state they need before
    using it."""
    return _load(name, lora, str(device), num_labels, seed, pooling, precision)


def _quiet_transformers() -> None:
    """Drop load reports and progress bars (expected: a new classification head is initialised)."""
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)


@lru_cache(maxsize=4)
def _load(
    name: str, lora: LoraSpec, device: str, num_labels: int, seed: int, pooling: str, precision: str
) -> ModelBundle:
    spec = resolve_model(name)
    torch.manual_seed(seed)
    base, tokenizer, task_type = load_base(spec, num_labels, pooling)
    targets = lora.targets or _defaults(spec)
    model = attach_lora(base, LoraSpec(lora.rank, lora.alpha, lora.dropout, targets), task_type)
    model.to(device)
    hold_frozen_in(model, precision)
    attention_for(model, precision, device)
    return ModelBundle(spec.name, spec.kind, model, tokenizer, torch.device(device), adapter_state(model))


def load_base(
    spec: ModelSpec, num_labels: int, pooling: str
) -> tuple[nn.Module, PreTrainedTokenizerBase, str]:
    """The base model (float32, no LoRA yet), its tokenizer (a pad token set) and PEFT's task type."""
    _quiet_transformers()
    path = str(spec.locate())
    tokenizer = AutoTokenizer.from_pretrained(path)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    if spec.kind == "causal-lm":
        if pooling != "cls":
            raise FedloraError(
                f"--pooling {pooling} is for encoder classifiers; {spec.name} scores label words"
            )
        if spec.shape:  # random weights of a named shape (seeded by the caller): for timing only
            config = LlamaConfig(vocab_size=len(tokenizer), tie_word_embeddings=True, **dict(spec.shape))
            return AutoModelForCausalLM.from_config(config, dtype=torch.float32), tokenizer, "CAUSAL_LM"
        return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32), tokenizer, "CAUSAL_LM"
    base = AutoModelForSequenceClassification.from_pretrained(
        path, num_labels=num_labels, dtype=torch.float32
    )
    base.config.pad_token_id = tokenizer.pad_token_id
    if pooling == "mean":
        use_mean_pooling(base)
    return base, tokenizer, "SEQ_CLS"


def _defaults(spec: ModelSpec) -> tuple[str, ...] | None:
    return spec.default_targets or None
