"""LoRA initialisations shared by server and clients (docs/design.md §2, §7.9; the PRISM paper is silent).

``peft``: PEFT's default (``lora_B = 0``, so ``Z = 0`` and the factors are rank-deficient).
``balanced``: the tiny full-rank balanced init PRISM needs; every method in a comparison uses it.
Factors are paper factors (``A: (m, r)``, ``B: (n, r)``, common/models/lora.py).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from common.config import LORA_INITS
from common.errors import FedloraError
from common.models.lora import lora_layers, set_factors


def balanced_random_init(
    m: int,
    n: int,
    r: int,
    scale: float = 0.02,
    generator: torch.Generator | None = None,
    device: torch.device | str | None = None,
) -> tuple[Tensor, Tensor]:
    """Tiny full-rank balanced init (the code's no-spectral ablation): ``A = scale·Q_out: (m, r)``,
    ``B = scale·Q_in: (n, r)`` with random orthonormal ``Q`` (``Q_in`` drawn first), float32.

    ``AᵀA = BᵀB = scale² I`` and ``‖A Bᵀ‖_F² = r·scale⁴``; the base weight is untouched.
    """
    opts = {"generator": generator, "dtype": torch.float32, "device": device}
    Q_in = torch.linalg.qr(torch.randn(n, r, **opts), mode="reduced").Q
    Q_out = torch.linalg.qr(torch.randn(m, r, **opts), mode="reduced").Q
    return scale * Q_out, scale * Q_in


def check_ranks(model: nn.Module) -> None:
    """Every LoRA module needs ``r ≤ min(m, n)`` (otherwise ``Z`` cannot have rank r)."""
    for name, layer in lora_layers(model).items():
        m, r = layer.lora_B["default"].weight.shape
        n = layer.lora_A["default"].weight.shape[1]
        if r > min(m, n):
            raise FedloraError(f"LoRA rank {r} exceeds min(m, n) = {min(m, n)} of module {name} ({m} x {n})")


def apply_lora_init(model: nn.Module, kind: str, seed: int, scale: float = 0.02) -> None:
    """Re-initialise every LoRA module of ``model`` in place (``kind`` in :data:`LORA_INITS`); the
    same ``seed`` gives the same factors on every machine (drawn on the CPU, then moved)."""
    if kind not in LORA_INITS:
        raise FedloraError(f"unknown LoRA init '{kind}'; choose {', '.join(LORA_INITS)}")
    check_ranks(model)
    if kind == "peft":
        return
    gen = torch.Generator().manual_seed(seed)
    for layer in lora_layers(model).values():
        weight = layer.lora_B["default"].weight
        (m, r), n = weight.shape, layer.lora_A["default"].weight.shape[1]
        A, B = balanced_random_init(m, n, r, scale, gen)
        set_factors(layer, A.to(weight.device), B.to(weight.device))
