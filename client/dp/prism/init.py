"""Full-rank balanced LoRA initialisations for PRISM (docs/design.md §7.9; the paper is silent).

Factors are in this project's convention (``common/models/lora.py``): ``A: (m, r)``, ``B: (n, r)`` with
``A Bᵀ = ΔW`` and the PEFT scaling ``s = α/r`` already folded in. The official code writes PEFT weights,
hence its ``S/s`` and its ``factor_scale`` (which equals ``scale/√s`` here).
"""

from __future__ import annotations

import torch
from torch import Tensor

from client.dp.prism.geometry import as_compute
from common.models.lora_init import balanced_random_init

__all__ = ["balanced_random_init", "spectral_init"]


def _randomized_svd(
    W: Tensor, r: int, oversample: int, n_iter: int, generator: torch.Generator | None
) -> tuple[Tensor, Tensor, Tensor]:
    """Top-``r`` SVD of ``W: (m, n)`` by randomized range finding → ``U: (m, r)``, ``S: (r,)``, ``V: (n, r)``."""
    sketch = torch.randn(
        W.shape[-1], min(W.shape[-1], r + oversample), generator=generator, dtype=W.dtype, device=W.device
    )
    Y = W @ sketch
    for _ in range(n_iter):
        # Re-orthonormalising between power iterations spans the same subspace as the code's plain
        # W Wᵀ Y, without losing the small directions to rounding.
        Y = W @ (W.mT @ torch.linalg.qr(Y, mode="reduced").Q)
    Q = torch.linalg.qr(Y, mode="reduced").Q
    Ub, S, Vh = torch.linalg.svd(Q.mT @ W, full_matrices=False)
    return (Q @ Ub)[:, :r], S[:r], Vh[:r].mT


def spectral_init(
    W0: Tensor,
    r: int,
    generator: torch.Generator | None = None,
    oversample: int = 8,
    n_iter: int = 2,
) -> tuple[Tensor, Tensor, Tensor]:
    """Spectral residual (PiSSA-like) init used by the official PRISM runs.

    ``W0: (m, n)`` frozen weight (out × in), rank ``r ≤ min(m, n)``. With the randomized top-``r`` SVD
    ``W_r = U diag(S) Vᵀ`` (oversample 8, 2 power iterations) returns, in the compute dtype,
    ``A = U diag(√S): (m, r)``, ``B = V diag(√S): (n, r)`` (balanced: ``AᵀA = BᵀB = diag(S)``) and the new
    frozen base ``W_res = W0 − A Bᵀ: (m, n)``, so ``W_res + A Bᵀ = W0`` and the model is unchanged at init.
    The caller replaces ``W0`` by ``W_res``; an adapter saved for the original ``W0`` must carry
    ``A Bᵀ − A₀B₀ᵀ`` (rank ``2r``). ``generator`` (on ``W0``'s device) draws the sketch.
    """
    m, n = W0.shape
    if not 1 <= r <= min(m, n):
        raise ValueError(f"rank {r} must be in [1, min(m, n) = {min(m, n)}]")
    W0 = as_compute(W0)
    U, S, V = _randomized_svd(W0, r, oversample, n_iter, generator)
    root = S.clamp(min=0.0).sqrt()
    A, B = U * root, V * root
    return A, B, W0 - A @ B.mT
