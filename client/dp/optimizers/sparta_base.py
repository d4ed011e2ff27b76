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
from torch import Tensor

from client.dp.optimizers.dense import DenseUpdate, LayerIO, ghost_sq_norms
from client.dp.optimizers.sparta import top_rows
from common.sparta import kept_rows


def check_base_rows(layers: dict[str, LoraLayer], keep: float) -> None:
    """Raise (one line) when ``keep`` asks for more rows than some target layer has."""
    for layer in layers.values():
        kept_rows(keep, layer.get_base_layer().weight.shape[0])


class SpartaBaseDp(DenseUpdate):
    """SPARTA row selection, then masked DP-AdamW, on the base weights of every module in ``layers``."""

    name = "sparta-base"

    def __init__(
        self,
        layers: dict[str, LoraLayer],
        lr: float,
        *,
        keep: float = 0.2,
        selection: int = 1,
        adapter: str = "default",
        **adamw,
    ) -> None:
        check_base_rows(layers, keep)
        super().__init__(layers, lr, adapter=adapter, **adamw)
        self.keep, self.selection, self.steps_done = keep, selection, 0
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
        return sum(ghost_sq_norms(x, self._dy(name, dy)) for name, (x, dy) in io.items())

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
        self.apply()
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
