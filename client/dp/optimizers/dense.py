"""What the dense-update optimizers (``wishart``, ``sparta-base``) share: a dense update ``D: (out, in)``
per LoRA target layer, trained with AdamW and merged into the base weight
(common/models/dense_delta.py), with PEFT's LoRA left at ``B = 0`` as the gradient tap (the engine
passes each layer's input ``x`` and output gradient ``dy``, client/dp/grad_sample.py ``layer_io``).
"""

from __future__ import annotations

import torch
from peft.tuners.lora import LoraLayer
from torch import Tensor, nn

from common.errors import FedloraError
from common.models.dense_delta import set_dense_delta

#: ``{module: (x: (b, T, in), dy: (b, T, out))}``: each LoRA layer's input and ∂L/∂(its output)
LayerIO = dict[str, tuple[Tensor, Tensor]]


def ghost_sq_norms(x: Tensor, dy: Tensor) -> Tensor:
    """``‖dyᵢᵀ xᵢ‖_F²`` per example without forming it: ``⟨xᵢxᵢᵀ, dyᵢdyᵢᵀ⟩`` (token Gram matrices), ``(b,)``."""
    x, dy = x.float(), dy.float()
    return ((x @ x.mT) * (dy @ dy.mT)).sum(dim=(1, 2))


class DenseUpdate:
    """AdamW on one dense ``D`` per layer of ``layers``, merged into the base weights by :meth:`apply`."""

    needs_layer_io = True  # the engine passes LayerIO, not factor gradients

    def __init__(
        self,
        layers: dict[str, LoraLayer],
        lr: float,
        *,
        adapter: str = "default",
        betas: tuple[float, float] = (0.9, 0.999),
        weight_decay: float = 0.0,
    ) -> None:
        for name, layer in layers.items():
            if bool(layer.lora_B[adapter].weight.detach().any()):
                raise FedloraError(
                    f"{self.name} needs lora_B = 0 (the gradient tap): {name} (use --lora-init peft)"
                )
            if not isinstance(layer.lora_dropout[adapter], nn.Identity):
                raise FedloraError(f"{self.name} needs --lora-dropout 0 (it reads the undropped input)")
        self.layers = layers
        self.deltas = {
            k: nn.Parameter(torch.zeros_like(layer.get_base_layer().weight, dtype=torch.float32))
            for k, layer in layers.items()
        }
        self.opt = torch.optim.AdamW(self.deltas.values(), lr=lr, betas=betas, weight_decay=weight_decay)

    def apply(self) -> None:
        """One AdamW step on the ``.grad`` of every ``D``, then ``W = W0 + D`` for every layer."""
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        with torch.no_grad():
            for k, layer in self.layers.items():
                set_dense_delta(layer, self.deltas[k])


__all__ = ["DenseUpdate", "LayerIO", "ghost_sq_norms"]
