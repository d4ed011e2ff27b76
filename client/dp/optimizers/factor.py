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

from client.dp.grad_sample import per_module, shape_groups, stacked
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
    """DP-AdamW on ``lora_B`` (and ``lora_A`` unless ``freeze_a``) of every module in ``layers``.

    Modules of one shape are handled as a stack (client/dp/grad_sample.py ``shape_groups``): norms,
    clipped sums and noise are one operation per group and factor, whatever the model's depth.
    """

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
        self.groups = shape_groups(layers, adapter)
        for _, lora_a in self.weights.values():
            lora_a.requires_grad_(not freeze_a)
        params = [w for pair in self.weights.values() for w in pair if w.requires_grad]
        self.opt = update_rule(rule, params, lr, betas, weight_decay)
        # per group: the clipped sums of ∂lora_B (g, m, r) and of ∂lora_A (g, r, n) (None: frozen)
        self.sums: list[list[Tensor | None]] = []

    def begin(self) -> None:
        self.sums = []
        for names in self.groups:
            lora_b, lora_a = self.weights[names[0]]
            opts = {"dtype": lora_b.dtype, "device": lora_b.device}
            sum_a = None if self.freeze_a else torch.zeros(len(names), *lora_a.shape, **opts)
            self.sums.append([torch.zeros(len(names), *lora_b.shape, **opts), sum_a])

    def module_sums(self) -> dict[str, list[Tensor | None]]:
        """``{module: [clipped sum of ∂lora_B (m, r), of ∂lora_A (r, n) or None]}`` (views)."""
        return per_module(self.groups, self.sums)

    def clipped(self, k: int, g_a: Tensor, g_b: Tensor) -> tuple[Tensor, Tensor]:
        """Group ``k``'s per-example paper-factor gradients ``(g, b, m, r)``, ``(g, b, n, r)`` as this
        optimizer clips them (all of them here; SPARTA masks rows)."""
        return g_a, g_b

    def sq_norms(self, grads: FactorGrads) -> Tensor:
        total = 0.0
        for k, group in enumerate(stacked(grads, self.groups)):
            g_a, g_b = self.clipped(k, group.g_a, group.g_b)
            part = g_a.square().sum((0, 2, 3))
            if not self.freeze_a:
                part = part + g_b.square().sum((0, 2, 3))
            total = total + self.roots[group.names[0]] ** 2 * part  # ‖√s·g‖² (PEFT weights)
        return total

    def accumulate(self, grads: FactorGrads, alpha: Tensor) -> None:
        for k, group in enumerate(stacked(grads, self.groups)):
            g_a, g_b = self.clipped(k, group.g_a, group.g_b)
            weight = alpha.to(g_a.dtype) * self.roots[group.names[0]]
            acc_b, acc_a = self.sums[k]
            acc_b += torch.einsum("b,gbmr->gmr", weight, g_a)
            if acc_a is not None:
                acc_a += torch.einsum("b,gbnr->grn", weight, g_b)

    def noise_masks(self, k: int) -> list[Tensor | None]:
        """Per factor of group ``k``, a 0/1 mask of the coordinates that are released (None: all)."""
        return [None, None]

    def step(self, noise_std: float, denom: float, generator: torch.Generator) -> None:
        for k, names in enumerate(self.groups):
            for i, (acc, mask) in enumerate(zip(self.sums[k], self.noise_masks(k), strict=True)):
                if acc is None:
                    continue
                noise = torch.randn(acc.shape, generator=generator, dtype=acc.dtype, device=acc.device)
                noisy = torch.add(acc, noise, alpha=noise_std)
                grad = (noisy if mask is None else noisy * mask) / denom
                for name, g in zip(names, grad.unbind(0), strict=True):
                    self.weights[name][i].grad = g
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
