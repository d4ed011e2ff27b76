"""SPARTA (Makni et al., KDD 2025, "SPARTA: An Optimization Framework for Differentially Private
Sparse Fine-Tuning") on the rows of the LoRA factors, with AdamW.

Two phases share one noise plan (every step is the same Poisson-subsampled Gaussian mechanism, so the
node's ledger composes them as one run of steps; the mask and all that follows are post-processing):

1. **Selection** (the first ``selection_steps`` steps): nothing moves. Each step releases
   ``|Σ_i clip(g_i)| + N(0, σ²C²)`` (the official code's form: the absolute value of the clipped
   *sum*; its ℓ2 sensitivity is still ≤ C) divided by the expected batch size; the releases are
   summed, and each row group's score is ``max(0, Σ over the row's coordinates)``. Per factor of
   every module, the ``keep`` best rows stay trainable (the official code keeps rows per layer).
2. **Sparse DP-AdamW**: per-example gradients are masked before they are clipped (the official
   reparametrisation ``W_init + m ⊙ W`` makes masked coordinates' gradients exactly 0), so the whole
   clip budget goes to the kept rows, and noise is added to the kept rows only.

Row groups are the rows of the paper factors (common/models/lora.py): ``lora_B``'s rows (output
neurons, ``A: (m, r)``) and ``lora_A``'s columns (input features, ``B: (n, r)``). Dense trainables (a
classifier head) stay fully trainable, as SPARTA's head does; they are frozen during selection.
"""

from __future__ import annotations

import torch
from peft.tuners.lora import LoraLayer
from torch import Tensor

from client.dp.grad_sample import per_module
from client.dp.optimizers.factor import FactorDp
from common.sparta import kept_rows


def check_rows(layers: dict[str, LoraLayer], keep: float, adapter: str = "default") -> None:
    """Raise (one line) when ``keep`` asks for more rows than some factor has."""
    for layer in layers.values():
        lora_b, lora_a = layer.lora_B[adapter].weight, layer.lora_A[adapter].weight
        kept_rows(keep, min(lora_b.shape[0], lora_a.shape[1]))


class SpartaDp(FactorDp):
    """SPARTA row selection, then masked DP-AdamW, on ``lora_B`` and ``lora_A`` of every module
    (stacked per shape group, as :class:`FactorDp`)."""

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
        check_rows(layers, keep, adapter)
        super().__init__(layers, lr, adapter=adapter, **adamw)
        self.name = "sparta"
        self.keep = keep
        self.selection = selection
        self.steps_done = 0
        # per group, the running sum of the noisy releases: lora_B (g, m, r) and lora_A (g, r, n)
        self._released = [
            [
                torch.zeros(len(names), *w.shape, dtype=w.dtype, device=w.device)
                for w in self.weights[names[0]]
            ]
            for names in self.groups
        ]
        # per group, 0/1 masks broadcastable to the stacked PEFT weights: lora_B (g, m, 1), lora_A
        # (g, 1, n); None while selecting
        self._masks: list[tuple[Tensor, Tensor]] | None = None

    @property
    def selecting(self) -> bool:
        """True during the selection phase: the engine then leaves the dense trainables alone too."""
        return self.steps_done < self.selection

    @property
    def masks(self) -> dict[str, list[Tensor]] | None:
        """``{module: [lora_B row mask (m, 1), lora_A column mask (1, n)]}``; None while selecting."""
        return None if self._masks is None else per_module(self.groups, self._masks)

    @property
    def released(self) -> dict[str, list[Tensor]]:
        """``{module: [summed releases for lora_B (m, r), for lora_A (r, n)]}``."""
        return per_module(self.groups, self._released)

    def clipped(self, k: int, g_a: Tensor, g_b: Tensor) -> tuple[Tensor, Tensor]:
        if self._masks is None:
            return g_a, g_b
        mask_b, mask_a = self._masks[k]  # mask-then-clip: the engine clips what this returns
        return g_a * mask_b[:, None], g_b * mask_a.mT[:, None]

    def step(self, noise_std: float, denom: float, generator: torch.Generator) -> None:
        if not self.selecting:
            super().step(noise_std, denom, generator)
            self.steps_done += 1
            return
        for sums, released in zip(self.sums, self._released, strict=True):
            for acc, running in zip(sums, released, strict=True):
                noise = torch.randn(acc.shape, generator=generator, dtype=acc.dtype, device=acc.device)
                running += (acc.abs() + noise_std * noise) / denom
        self.steps_done += 1
        if not self.selecting:
            self._masks = [
                (top_rows(b.sum(2), self.keep)[..., None], top_rows(a.sum(1), self.keep)[:, None, :])
                for b, a in self._released
            ]

    def noise_masks(self, k: int) -> list[Tensor | None]:
        """Noise on the kept rows only (masked coordinates never move)."""
        return [None, None] if self._masks is None else list(self._masks[k])

    def summary(self) -> dict[str, int]:
        """Selection steps, and LoRA coordinates kept trainable of all (post-processing of DP releases)."""
        total = sum(b.numel() + a.numel() for b, a in self.weights.values())
        kept = total
        if self._masks is not None:
            rank = [self.weights[names[0]][0].shape[1] for names in self.groups]
            kept = sum(int(mb.sum() + ma.sum()) * r for (mb, ma), r in zip(self._masks, rank, strict=True))
        return {"selection_steps": self.selection, "kept_coordinates": kept, "lora_coordinates": total}


def top_rows(scores: Tensor, keep: float) -> Tensor:
    """0/1 float mask of the ``kept_rows`` highest ``max(0, score)`` entries along the last dimension
    (``scores``: (rows,) or (g, rows), one selection per leading index)."""
    k = kept_rows(keep, scores.shape[-1])
    top = torch.topk(scores.clamp(min=0), k, dim=-1, sorted=False).indices
    return torch.zeros_like(scores).scatter_(-1, top, 1.0)
