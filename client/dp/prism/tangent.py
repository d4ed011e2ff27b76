"""Tangent-space DP primitives: lift, intrinsic norm, global clipping, noise, horizontal lift.

Shapes: ``m`` output rows of ``A``, ``n`` input rows of ``B``, rank ``r``, ``b`` examples.
No ``m × n`` matrix is formed; costs are ``O((m + n) r² + r³)`` per example or per module.
Every function also takes a stack of modules of one shape: a :class:`Geometry` of ``(g, m, r)``
factors with ``(g, m, r)`` arguments, or, per example, the geometry's tensors unsqueezed to
``(g, 1, ·, ·)`` with ``(g, b, m, r)`` arguments (client/dp/optimizers/prism.py).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from client.dp.prism.geometry import Geometry
from common.errors import FedloraError

#: refusal of factors whose Gram has an eigenvalue ``≤ rcond·max`` (``what`` names the module)
RANK_DEFICIENT = (
    "PRISM needs full-rank LoRA factors, but {what} is numerically rank-deficient "
    "(A^T A or B^T B has an eigenvalue <= rcond * its largest), so its tangent noise is ill-defined"
)


def lift(geo: Geometry, gA: Tensor, gB: Tensor) -> tuple[Tensor, Tensor]:
    """Canonical factor lift of ``P_{A,B}(G_i)`` from factor gradients (PRISM Eq. 14).

    ``gA = G B: (b, m, r)``, ``gB = Gᵀ A: (b, n, r)`` → ``dA: (b, m, r)``, ``dB: (b, n, r)`` with
    ``dA Bᵀ + A dBᵀ = Π_A G + G Π_B − Π_A G Π_B``. Unbatched ``(m, r)``, ``(n, r)`` inputs also work;
    inputs are cast to the geometry's dtype.
    """
    YA = gA.to(geo.A.dtype) @ geo.N_pinv
    YB = gB.to(geo.A.dtype) @ geo.M_pinv
    # Each half carries −½ Π_A G Π_B, so the sum subtracts it once.
    dA = YA - 0.5 * geo.QA @ (geo.QA.mT @ YA)
    dB = YB - 0.5 * geo.QB @ (geo.QB.mT @ YB)
    return dA, dB


def tangent_sq_norm(geo: Geometry, dA: Tensor, dB: Tensor) -> Tensor:
    """``‖dA Bᵀ + A dBᵀ‖_F²`` for any lift (PRISM Eq. 15): ``(b, m, r), (b, n, r)`` → ``(b,)``; unbatched → ``()``."""
    # ⟨X, Y⟩_F as (X * Y).sum: broadcasts a geometry of modules (g, 1, ·, ·) over examples (g, b, ·, ·).
    quadratic = (dA.mT @ dA) * geo.N + (dB.mT @ dB) * geo.M + 2.0 * (geo.A.mT @ dA) * (geo.B.mT @ dB).mT
    return quadratic.sum((-2, -1))


def clip_coefficients(sq_norms: Sequence[Tensor], clip: float) -> Tensor:
    """Global per-example clip factors ``α_i = min(1, C / s_i)`` shared by all modules (PRISM Eq. 16).

    ``sq_norms``: one ``(b,)`` tensor of ``‖ΔZ_{i,ℓ}‖_F²`` per module; ``s_i = sqrt(Σ_ℓ ... + 1e-12)``.
    """
    total = torch.stack(list(sq_norms)).sum(0).clamp(min=0.0)
    return (clip / torch.sqrt(total + 1e-12)).clamp(max=1.0)


def tangent_noise(geo: Geometry, generator: torch.Generator) -> tuple[Tensor, Tensor]:
    """One draw of unit-scale tangent noise (PRISM Eq. 19): ``Ξ_A: (m, r)``, ``Ξ_B: (n, r)``.

    ``Ξ_A = (I − Π_A) Ω_A N^{-1/2}``, ``Ξ_B = Ω_B M^{-1/2}`` with ``Ω_A`` drawn before ``Ω_B``;
    ``Ξ_A Bᵀ + A Ξ_Bᵀ ~ P_{A,B}(Ξ)``, ``Ξ ~ N(0, I_{m×n})``. Scale by ``τ = σC/b`` outside.
    ``generator`` must live on the factors' device. Raises :class:`FedloraError` unless
    ``geo.full_rank``: the exact inverse square roots are what make the covariance ``P_{A,B}``.
    """
    if not bool(geo.full_rank.all()):
        raise FedloraError(RANK_DEFICIENT.format(what="a LoRA module"))
    opts = {"generator": generator, "dtype": geo.A.dtype, "device": geo.A.device}
    OA = torch.randn(geo.A.shape, **opts)
    OB = torch.randn(geo.B.shape, **opts)
    return shape_noise(geo, OA, OB)


def shape_noise(geo: Geometry, OA: Tensor, OB: Tensor) -> tuple[Tensor, Tensor]:
    """Eq. 19 on given standard normal draws ``Ω_A: (..., m, r)``, ``Ω_B: (..., n, r)`` → ``(Ξ_A, Ξ_B)``.

    No rank check (the caller has made it: :func:`tangent_noise`, or PRISM's step once per batch).
    """
    # (I − Π_A) keeps the Π_A Ξ Π_B block from being counted twice.
    XiA = (OA - geo.QA @ (geo.QA.mT @ OA)) @ geo.N_invsqrt
    XiB = OB @ geo.M_invsqrt
    return XiA, XiB


def horizontalize(geo: Geometry, dA: Tensor, dB: Tensor, floor: float = 1e-12) -> tuple[Tensor, Tensor]:
    """Min-factor-norm (horizontal) lift of the same ``ΔZ``: ``(dA + AΩ, dB − BΩᵀ)`` (PRISM Prop. A.11; docs/design.md §7.6).

    ``dA: (m, r)``, ``dB: (n, r)``. ``Ω: (r, r)`` solves ``MΩ + ΩN = dBᵀB − AᵀdA`` (the official code's
    right-hand side; the paper's Eq. 39 prints ``BᵀdB``, which is wrong), so that ``AᵀdA' = dB'ᵀB``.
    Eigen-denominators ``w_M,i + w_N,j`` are floored at ``floor``.
    """
    dA, dB = dA.to(geo.A.dtype), dB.to(geo.A.dtype)
    rhs = dB.mT @ geo.B - geo.A.mT @ dA
    denom = (geo.M_w[..., :, None] + geo.N_w[..., None, :]).clamp(min=floor)
    omega = geo.M_V @ ((geo.M_V.mT @ rhs @ geo.N_V) / denom) @ geo.N_V.mT
    return dA + geo.A @ omega, dB - geo.B @ omega.mT
