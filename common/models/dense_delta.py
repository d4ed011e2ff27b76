"""Dense weight updates merged into the base layer of a LoRA module, undoable.

The Wishart M2 optimizer (client/dp/optimizers/wishart.py) trains ``W = W0 + D`` with a fresh random
projection every step, so its update ``D: (out, in)`` is dense, not a pair of LoRA factors. It is
written into ``base_layer.weight`` in place; ``W0`` is kept on the module so that :func:`restore_base`
puts the model back exactly as loaded (a process reuses one loaded model across runs).
"""

from __future__ import annotations

from peft.tuners.lora import LoraLayer
from torch import Tensor, nn

from common.models.lora import lora_layers

_W0 = "_fedlora_base_weight"  # attribute holding the base weight as loaded


def set_dense_delta(layer: LoraLayer, delta: Tensor) -> None:
    """``base_layer.weight = W0 + delta`` (``delta: (out, in)``), keeping ``W0`` for :func:`restore_base`."""
    weight = layer.get_base_layer().weight
    if not hasattr(layer, _W0):
        setattr(layer, _W0, weight.detach().clone())
    weight.data.copy_(getattr(layer, _W0) + delta.to(weight.dtype))


def dense_deltas(model: nn.Module) -> dict[str, Tensor]:
    """``{module: W - W0}`` (CPU copies) of every LoRA module with a merged dense update."""
    return {
        name: (layer.get_base_layer().weight.detach() - getattr(layer, _W0)).cpu()
        for name, layer in lora_layers(model).items()
        if hasattr(layer, _W0)
    }


def restore_base(model: nn.Module) -> None:
    """Put every base weight changed by :func:`set_dense_delta` back to ``W0`` exactly."""
    for layer in lora_layers(model).values():
        if hasattr(layer, _W0):
            layer.get_base_layer().weight.data.copy_(getattr(layer, _W0))
            delattr(layer, _W0)


__all__ = ["dense_deltas", "restore_base", "set_dense_delta"]
