"""``sparta-base``: SPARTA (Makni et al., KDD 2025) on rows of the base model's weights instead of the
LoRA factors: the dense rows of every LoRA target layer ``W: (out, in)``, trained as ``W0 + m ⊙ D``.

The same two phases as client/dp/optimizers/sparta.py, on the full weight gradient
``G_i = dyᵢᵀ xᵢ`` (never materialised per example: norms by the ghost-norm identity, sums by one
contraction over the batch):

1. **Selection** (the first ``selection_steps`` steps): nothing moves; each step releases
   ``|Σ_i clip(G_i)| + N(0, σ²C²)`` over every coordinate of every target layer, divided by the
   expected batch size; after the phase each row's score is ``max(0, Σ over the row)`` and the
   ``keep`` best rows (output neurons) per layer stay trainable.
2. **Sparse DP-AdamW**: per-example gradients restricted to the kept rows before they are clipped
   (their norm is the ghost norm of ``dy`` on those rows), noise on the kept rows only, AdamW on
   ``D``.

The update is dense, merged into the base weights (common/models/dense_delta.py) with LoRA's ``B = 0``
as the gradient tap: like ``wishart`` it runs in ``train-local``, not in a federation that exchanges
LoRA factors. Dense trainables (a classifier head) stay trainable, as SPARTA's head does (frozen while
selecting).
"""

from __future__ import annotations

import torch
from peft.tuners.lora import LoraLayer
from torch import Tensor, nn

from client.dp.optimizers.sparta import top_rows
from client.dp.optimizers.wishart import LayerIO
from common.errors import FedloraError
from common.models.dense_delta import set_dense_delta
from common.sparta import kept_rows


def check_base_rows(layers: dict[str, LoraLayer], keep: float) -> None:
    """Raise (one line) when ``keep`` asks for more rows than some target layer has."""
    for layer in layers.values():
        kept_rows(keep, layer.get_base_layer().weight.shape[0])


class SpartaBaseDp:
    """SPARTA row selection, then masked DP-AdamW, on the base weights of every module in ``layers``."""

    name = "sparta-base"
    needs_layer_io = True  # the engine passes LayerIO, not factor gradients

    def __init__(
        self,
        layers: dict[str, LoraLayer],
        lr: float,
        *,
        keep: float = 0.2,
        selection: int = 1,
        adapter: str = "default",
        betas: tuple[float, float] = (0.9, 0.999),
        weight_decay: float = 0.0,
    ) -> None:
        check_base_rows(layers, keep)
        for name, layer in layers.items():
            if bool(layer.lora_B[adapter].weight.detach().any()):
                raise FedloraError(
                    f"sparta-base needs lora_B = 0 (the gradient tap): {name} (use --lora-init peft)"
                )
        self.layers, self.keep, self.selection, self.steps_done = layers, keep, selection, 0
        self.deltas = {
            k: nn.Parameter(torch.zeros_like(layer.get_base_layer().weight, dtype=torch.float32))
            for k, layer in layers.items()
        }
        self.opt = torch.optim.AdamW(self.deltas.values(), lr=lr, betas=betas, weight_decay=weight_decay)
        self.released = {k: torch.zeros_like(d) for k, d in self.deltas.items()}
        self.rows: dict[str, Tensor] | None = None  # kept row indices per layer, after selection
        self.sums: dict[str, Tensor] = {}

    @property
    def selecting(self) -> bool:
        """True during the selection phase: the engine then leaves the dense trainables alone too."""
        return self.steps_done < self.selection

    def begin(self) -> None:
        self.sums = {
            k: torch.zeros_like(d) if self.rows is None else d.new_zeros(len(self.rows[k]), d.shape[1])
            for k, d in self.deltas.items()
        }

    def _dy(self, name: str, dy: Tensor) -> Tensor:
        """``dy`` on the rows this phase trains: all while selecting, the kept ones after."""
        return dy.float() if self.rows is None else dy.float()[..., self.rows[name]]

    def sq_norms(self, io: LayerIO) -> Tensor:
        total = 0.0
        for name, (x, dy) in io.items():
            x, dy = x.float(), self._dy(name, dy)
            total = total + ((x @ x.mT) * (dy @ dy.mT)).sum(dim=(1, 2))
        return total

    def accumulate(self, io: LayerIO, alpha: Tensor) -> None:
        for name, (x, dy) in io.items():
            self.sums[name] += torch.einsum("b,bto,bti->oi", alpha.float(), self._dy(name, dy), x.float())

    def step(self, noise_std: float, denom: float, generator: torch.Generator) -> None:
        if self.selecting:
            for name, acc in self.sums.items():
                noise = torch.randn(acc.shape, generator=generator, device=acc.device)
                self.released[name] += (acc.abs() + noise_std * noise) / denom
            self.steps_done += 1
            if not self.selecting:
                self.rows = {
                    k: top_rows(r.sum(1), self.keep).nonzero().flatten() for k, r in self.released.items()
                }
            return
        for name, delta in self.deltas.items():
            acc = self.sums[name]
            noise = torch.randn(acc.shape, generator=generator, device=acc.device)
            grad = torch.zeros_like(delta)
            grad[self.rows[name]] = (acc + noise_std * noise) / denom
            delta.grad = grad
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        with torch.no_grad():
            for name, layer in self.layers.items():
                set_dense_delta(layer, self.deltas[name])
        self.steps_done += 1

    def summary(self) -> dict[str, int]:
        """Selection steps, and base-weight coordinates kept trainable of all the target layers'."""
        total = sum(d.numel() for d in self.deltas.values())
        kept = (
            total
            if self.rows is None
            else sum(len(self.rows[k]) * d.shape[1] for k, d in self.deltas.items())
        )
        return {"selection_steps": self.selection, "kept_coordinates": kept, "base_coordinates": total}


__all__ = ["SpartaBaseDp", "check_base_rows"]
