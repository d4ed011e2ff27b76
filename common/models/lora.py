"""LoRA via PEFT, and the one adapter between PEFT modules and the papers' factors.

Papers: ``W = W0 + Z``, ``Z = A Bᵀ`` with ``A: (m, r)`` (output side), ``B: (n, r)`` (input side).
PEFT: ``ΔW = s · lora_B.weight @ lora_A.weight`` with ``lora_B.weight: (m, r)``,
``lora_A.weight: (r, n)`` and ``s = alpha / r``. We fold the scaling symmetrically,
``A = √s · lora_B.weight`` and ``B = √s · lora_A.weightᵀ``, so that ``A Bᵀ == ΔW`` exactly.

An *adapter state* is a flat ``{name: tensor}``: ``"<module>.A"``, ``"<module>.B"`` for each LoRA
module plus every other trainable parameter by its own name (e.g. a classification head).
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Mapping
from dataclasses import dataclass

import torch
from peft import LoraConfig, PeftModel, get_peft_model
from peft.tuners.lora import LoraLayer
from torch import Tensor, nn

from common.errors import FedloraError

AdapterState = dict[str, Tensor]


class LoraTargetsError(FedloraError):
    """The named LoRA targets are not modules of the model (another architecture)."""


@dataclass(frozen=True)
class LoraSpec:
    """PEFT LoRA settings; ``targets=None`` uses the model's defaults."""

    rank: int = 8
    alpha: float = 16.0
    dropout: float = 0.0
    targets: tuple[str, ...] | None = None


def attach_lora(model: nn.Module, spec: LoraSpec, task_type: str) -> PeftModel:
    """Wrap ``model`` with PEFT LoRA (``task_type``: ``CAUSAL_LM`` or ``SEQ_CLS``)."""
    if spec.rank < 1:
        raise FedloraError(f"LoRA rank must be >= 1, got {spec.rank}")
    config = LoraConfig(
        r=spec.rank,
        lora_alpha=spec.alpha,
        lora_dropout=spec.dropout,
        target_modules=list(spec.targets) if spec.targets else None,
        task_type=task_type,
    )
    _LAYOUT.clear()  # modules are replaced in place: no model's cached layout survives
    try:
        return get_peft_model(model, config)
    except ValueError as exc:
        if spec.targets:
            raise LoraTargetsError(f"cannot attach LoRA: {str(exc).splitlines()[0]}") from None
        kind = getattr(getattr(model, "config", None), "model_type", type(model).__name__)
        raise FedloraError(
            f"PEFT has no default LoRA targets for model type '{kind}': name them with --targets "
            f"(its linear layers: {', '.join(linear_names(model))})"
        ) from None


def linear_names(model: nn.Module) -> list[str]:
    """The distinct last names of ``model``'s ``nn.Linear`` modules, in module order (what
    ``--targets`` takes)."""
    names = [name.rsplit(".", 1)[-1] for name, m in model.named_modules() if isinstance(m, nn.Linear)]
    return list(dict.fromkeys(names))


#: model → (its LoRA modules by name, its parameters that are not LoRA factors): walking a
#: transformer's modules costs milliseconds, and a resident model is walked by every client it trains
_LAYOUT: weakref.WeakKeyDictionary[nn.Module, tuple[dict[str, nn.Module], dict[str, nn.Parameter]]]
_LAYOUT = weakref.WeakKeyDictionary()


def _layout(model: nn.Module) -> tuple[dict[str, nn.Module], dict[str, nn.Parameter]]:
    if model not in _LAYOUT:
        lora = {name: m for name, m in model.named_modules() if isinstance(m, LoraLayer)}
        other = {
            name: p
            for name, p in model.named_parameters()
            if ".lora_A." not in name and ".lora_B." not in name
        }
        _LAYOUT[model] = lora, other
    return _LAYOUT[model]


def lora_layers(model: nn.Module, adapter: str = "default") -> dict[str, LoraLayer]:
    """LoRA modules of ``model`` by qualified name, in module order."""
    return {name: m for name, m in _layout(model)[0].items() if adapter in getattr(m, "lora_A", {})}


def get_factors(layer: LoraLayer, adapter: str = "default") -> tuple[Tensor, Tensor]:
    """Paper factors of one PEFT module: ``A: (m, r)``, ``B: (n, r)`` with ``A Bᵀ = ΔW``."""
    root = math.sqrt(layer.scaling[adapter])
    a = layer.lora_B[adapter].weight.detach() * root
    b = layer.lora_A[adapter].weight.detach().T * root
    return a.clone(), b.contiguous()  # b is a new tensor; contiguous for safetensors


def set_factors(layer: LoraLayer, a: Tensor, b: Tensor, adapter: str = "default") -> None:
    """Inverse of :func:`get_factors`: write ``A: (m, r)``, ``B: (n, r)`` into the PEFT weights."""
    root = math.sqrt(layer.scaling[adapter])
    lora_b, lora_a = layer.lora_B[adapter].weight, layer.lora_A[adapter].weight
    if a.shape != lora_b.shape or b.T.shape != lora_a.shape:
        raise ValueError(
            f"factor shapes {tuple(a.shape)}, {tuple(b.shape)} do not match "
            f"LoRA weights {tuple(lora_b.shape)}, {tuple(lora_a.T.shape)}"
        )
    with torch.no_grad():
        lora_b.copy_(a / root)
        lora_a.copy_(b.T / root)


def lora_norm(model: nn.Module) -> float:
    """``sqrt(Σ_ℓ ‖A_ℓ B_ℓᵀ‖_F²)`` over the LoRA modules: how far the adapter moved the weights."""
    total = 0.0
    for layer in lora_layers(model).values():
        a, b = get_factors(layer)
        total += float(torch.linalg.matrix_norm(a @ b.T) ** 2)
    return math.sqrt(total)


def dense_trainables(model: nn.Module) -> dict[str, nn.Parameter]:
    """Trainable parameters that are not LoRA factors (e.g. PEFT ``modules_to_save`` heads)."""
    return {name: p for name, p in _layout(model)[1].items() if p.requires_grad}


def adapter_state(model: nn.Module) -> AdapterState:
    """Snapshot of everything that is trained: paper factors plus dense trainables (CPU copies)."""
    state: AdapterState = {}
    for name, layer in lora_layers(model).items():
        a, b = get_factors(layer)
        state[f"{name}.A"], state[f"{name}.B"] = a.cpu(), b.cpu()
    for name, p in dense_trainables(model).items():
        state[name] = p.detach().cpu().clone()
    return state


def load_adapter_state(model: nn.Module, state: AdapterState) -> None:
    """Write an :func:`adapter_state` back; names and shapes must match exactly."""
    expected = adapter_shapes(model)
    if set(state) != set(expected):
        missing, extra = set(expected) - set(state), set(state) - set(expected)
        raise ValueError(f"adapter state mismatch: missing {sorted(missing)[:3]}, extra {sorted(extra)[:3]}")
    for name, layer in lora_layers(model).items():
        device = layer.lora_A["default"].weight.device
        set_factors(layer, state[f"{name}.A"].to(device), state[f"{name}.B"].to(device))
    with torch.no_grad():
        for name, p in dense_trainables(model).items():
            p.copy_(state[name].to(p.device))


def adapter_size(adapter: Mapping[str, Tensor | tuple[int, ...]]) -> int:
    """Coordinates of an adapter, given its tensors or their shapes (name -> shape)."""
    return sum(math.prod(v.shape if isinstance(v, Tensor) else v) for v in adapter.values())


def adapter_shapes(model: nn.Module) -> dict[str, tuple[int, ...]]:
    """Expected name -> shape of :func:`adapter_state`, without copying tensors."""
    shapes: dict[str, tuple[int, ...]] = {}
    for name, layer in lora_layers(model).items():
        m, r = layer.lora_B["default"].weight.shape
        n = layer.lora_A["default"].weight.shape[1]
        shapes[f"{name}.A"], shapes[f"{name}.B"] = (m, r), (n, r)
    for name, p in dense_trainables(model).items():
        shapes[name] = tuple(p.shape)
    return shapes
