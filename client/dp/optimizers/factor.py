"""Factor-space DP-SGD with AdamW on PEFT's LoRA weights: ``dp-adamw`` (the naive DP-LoRA: clip the
concatenated per-example ``(∂lora_B, ∂lora_A)``, isotropic noise; PRISM §2, Eq. 3–9) and ``ffa``
(FFA-LoRA, Sun et al. 2024: PEFT ``lora_A`` frozen, DP on ``lora_B`` only; PRISM Table 1). Both are
described in docs/design.md §7.8.

Norms and noise live where Opacus + PEFT would put them, on the PEFT weights: with the scaling
``s = α/r``, ``∂L/∂lora_B = √s·g_A`` and ``∂L/∂lora_A = √s·g_Bᵀ`` (common/models/lora.py), so a clip C
here is C/√s in paper factors. Noisy means are written to ``.grad`` and ``torch.optim.AdamW`` steps
(or plain SGD, ``rule="sgd"``: DP-SGD, Opacus's default and the FFA-LoRA paper's optimizer; the
increment of a round is then a sum of noisy gradient steps, which a server optimizer can adapt).
"""

from __future__ import annotations

import math

import torch
from peft.tuners.lora import LoraLayer
from torch import Tensor

from client.dp.optimizers.base import FactorGrads


def update_rule(
    rule: str,
    params,
    lr: float,
    betas: tuple[float, float] = (0.9, 0.999),
    weight_decay: float = 0.0,
) -> torch.optim.Optimizer:
    """The step a DP optimizer takes on its noisy mean gradient: ``adamw`` or ``sgd``, ``foreach``: one
    multi-tensor op per update instead of a loop over parameters (CUDA's default; issue 36)."""
    if rule == "adamw":
        return torch.optim.AdamW(params, lr=lr, betas=betas, weight_decay=weight_decay, foreach=True)
    if rule == "sgd":
        return torch.optim.SGD(params, lr=lr, weight_decay=weight_decay, foreach=True)
    raise ValueError(f"unknown update rule '{rule}'")


class FactorDp:
    """DP-AdamW on ``lora_B`` (and ``lora_A`` unless ``freeze_a``) of every module in ``layers``."""

    def __init__(
        self,
        layers: dict[str, LoraLayer],
        lr: float,
        *,
        freeze_a: bool = False,
        betas: tuple[float, float] = (0.9, 0.999),
        weight_decay: float = 0.0,
        adapter: str = "default",
        rule: str = "adamw",
    ) -> None:
        self.name = "ffa" if freeze_a else "dp-adamw"
        self.freeze_a = freeze_a
        self.roots = {k: math.sqrt(layer.scaling[adapter]) for k, layer in layers.items()}
        self.weights: dict[str, tuple[torch.nn.Parameter, torch.nn.Parameter]] = {
            k: (layer.lora_B[adapter].weight, layer.lora_A[adapter].weight) for k, layer in layers.items()
        }
        for _, lora_a in self.weights.values():
            lora_a.requires_grad_(not freeze_a)
        params = [w for pair in self.weights.values() for w in pair if w.requires_grad]
        self.opt = update_rule(rule, params, lr, betas, weight_decay)
        self.sums: dict[str, list[Tensor | None]] = {}

    def begin(self) -> None:
        self.sums = {
            k: [torch.zeros_like(lora_b), None if self.freeze_a else torch.zeros_like(lora_a)]
            for k, (lora_b, lora_a) in self.weights.items()
        }

    def _peft_grads(self, name: str, gA: Tensor, gB: Tensor) -> tuple[Tensor, Tensor | None]:
        """Per-example ``(∂lora_B: (b, m, r), ∂lora_A: (b, r, n) or None)``."""
        root = self.roots[name]
        return root * gA, None if self.freeze_a else root * gB.mT

    def sq_norms(self, grads: FactorGrads) -> Tensor:
        total = 0.0
        for name, (gA, gB) in grads.items():
            for g in self._peft_grads(name, gA, gB):
                if g is not None:
                    total = total + g.square().sum(dim=(1, 2))
        return total

    def accumulate(self, grads: FactorGrads, alpha: Tensor) -> None:
        for name, (gA, gB) in grads.items():
            for acc, g in zip(self.sums[name], self._peft_grads(name, gA, gB), strict=True):
                if g is not None:
                    acc += torch.einsum("b,b...->...", alpha.to(g.dtype), g)

    def noise_mask(self, name: str) -> list[Tensor | None]:
        """Per weight of module ``name``, a 0/1 mask of the coordinates that are released (None: all)."""
        return [None, None]

    def step(self, noise_std: float, denom: float, generator: torch.Generator) -> None:
        for name, weights in self.weights.items():
            for w, acc, mask in zip(weights, self.sums[name], self.noise_mask(name), strict=True):
                if acc is not None:
                    noise = torch.randn(acc.shape, generator=generator, dtype=acc.dtype, device=acc.device)
                    noisy = acc + noise_std * noise
                    w.grad = (noisy if mask is None else noisy * mask) / denom
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
