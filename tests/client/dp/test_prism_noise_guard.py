"""PRISM's Eq. 19 tangent noise is never short: its covariance is exactly the tangent projector for
small or ill-conditioned factors, and numerically rank-deficient factors are refused.

The covariance is computed in closed form: ``tangent_noise`` is linear in its Gaussian draws
``(Ω_A, Ω_B)``, so feeding it unit vectors gives the matrix ``J`` of that map and ``Cov = J Jᵀ``.
"""

from __future__ import annotations

import re
from collections.abc import Callable

import pytest
import torch
from peft.tuners.lora import LoraLayer
from torch import Tensor

from client.dp.optimizers import PrismDp
from client.dp.prism import geometry, tangent_noise
from common.errors import FedloraError
from common.models.lora import get_factors, lora_layers, set_factors
from common.models.lora_init import apply_lora_init

F64 = torch.float64


def with_singular_values(k: int, s: list[float], seed: int, dtype: torch.dtype = F64) -> Tensor:
    """A ``(k, len(s))`` factor with singular values ``s`` and random singular vectors."""
    g = torch.Generator().manual_seed(seed)
    U = torch.linalg.qr(torch.randn(k, len(s), generator=g, dtype=F64)).Q
    V = torch.linalg.qr(torch.randn(len(s), len(s), generator=g, dtype=F64)).Q
    return ((U * torch.tensor(s, dtype=F64)) @ V.mT).to(dtype)


def fixed_draws(*draws: Tensor) -> Callable[..., Tensor]:
    """A stand-in for ``torch.randn`` that returns ``draws`` in order (checking their shapes)."""
    queue = iter(draws)

    def randn(shape: tuple[int, ...], **_: object) -> Tensor:
        draw = next(queue)
        assert tuple(shape) == tuple(draw.shape)
        return draw

    return randn


def noise_map(A: Tensor, B: Tensor, monkeypatch: pytest.MonkeyPatch) -> Tensor:
    """Matrix ``J: (m n, (m + n) r)`` of ``(Ω_A, Ω_B) ↦ vec(Ξ_A Bᵀ + A Ξ_Bᵀ)`` (row-major vec), float64.

    ``torch.randn`` is replaced by unit draws, ``Ω_A: (m, r)`` before ``Ω_B: (n, r)`` (Eq. 19's order).
    """
    geo = geometry(A, B)
    (m, r), n = A.shape, B.shape[0]
    columns = []
    for k in range((m + n) * r):
        unit = torch.zeros((m + n) * r, dtype=geo.A.dtype)
        unit[k] = 1.0
        with monkeypatch.context() as patch:
            patch.setattr(
                torch, "randn", fixed_draws(unit[: m * r].reshape(m, r), unit[m * r :].reshape(n, r))
            )
            XA, XB = tangent_noise(geo, torch.Generator())
        columns.append((XA @ geo.B.mT + geo.A @ XB.mT).to(F64).reshape(-1))
    return torch.stack(columns, 1)


def tangent_projector(A: Tensor, B: Tensor) -> Tensor:
    """``P_{A,B}`` (PRISM Eq. 13) as an ``(m n, m n)`` matrix on row-major ``vec``, float64."""
    QA, QB = torch.linalg.qr(A.to(F64)).Q, torch.linalg.qr(B.to(F64)).Q
    PA, PB = QA @ QA.mT, QB @ QB.mT
    Im, In = torch.eye(len(PA), dtype=F64), torch.eye(len(PB), dtype=F64)
    return torch.kron(PA, In) + torch.kron(Im, PB) - torch.kron(PA, PB)


@pytest.mark.parametrize(
    ("sA", "sB", "dtype", "tol"),
    [
        ([1e-3, 1e-4], [2e-3, 1e-4], F64, 1e-9),  # small factors: eigenvalues 1e-8 of AᵀA and BᵀB
        ([1.0, 4e-3], [1.0, 1e-2], F64, 1e-9),  # ill-conditioned, above the rcond 1e-6 refusal
        ([1e-3, 1e-4], [2e-3, 1e-4], torch.float32, 1e-5),
        # float32 Grams would be off by 3e-4 and 5e-3 here: the eigendecompositions run in float64.
        ([1.0, 4e-3], [1.0, 1e-2], torch.float32, 5e-5),
        ([1.0, 1.5e-3], [1.0, 1.5e-3], torch.float32, 2e-4),  # eigenvalue ratio 2.25e-6
    ],
)
def test_noise_covariance_is_the_tangent_projector(sA, sB, dtype, tol, monkeypatch):
    A, B = with_singular_values(6, sA, seed=1, dtype=dtype), with_singular_values(5, sB, seed=2, dtype=dtype)
    J = noise_map(A, B, monkeypatch)
    P = tangent_projector(A, B)
    err = float((J @ J.mT - P).abs().max())
    assert err < tol
    # The weakest tangent direction u vᵀ (u: A's smallest left singular vector, v ⊥ span B) gets variance 1.
    u = torch.linalg.svd(A.to(F64), full_matrices=False).U[:, -1]
    v = torch.linalg.svd(B.to(F64), full_matrices=True).U[:, -1]
    t = torch.outer(u, v).reshape(-1)
    assert float(t @ P @ t) == pytest.approx(1.0, abs=1e-12)
    variance = float((J.mT @ t).square().sum())
    assert variance == pytest.approx(1.0, rel=tol)


@pytest.mark.parametrize(
    "sA",
    [[1.0, 1e-4], [1.0, 0.0], [0.0, 0.0]],  # eigenvalue ratio 1e-8 ≤ rcond, exactly rank 1, zero
)
def test_noise_refuses_numerically_rank_deficient_factors(sA):
    A, B = with_singular_values(6, sA, seed=3), with_singular_values(5, [1.0, 0.5], seed=4)
    for a, b in [(A, B), (B, A)]:
        with pytest.raises(FedloraError, match="rank-deficient"):
            tangent_noise(geometry(a, b), torch.Generator())


def test_noise_accepts_factors_just_above_rcond():
    A, B = with_singular_values(6, [1.0, 2e-3], seed=5), with_singular_values(5, [1.0, 0.5], seed=6)
    XA, XB = tangent_noise(geometry(A, B, rcond=1e-6), torch.Generator().manual_seed(0))
    assert bool(torch.isfinite(XA).all() and torch.isfinite(XB).all())
    with pytest.raises(FedloraError, match="rank-deficient"):
        tangent_noise(geometry(A, B, rcond=1e-5), torch.Generator())


def _make_rank_one(layer: LoraLayer) -> None:
    A, B = get_factors(layer)
    set_factors(layer, A, torch.ones_like(B))  # BᵀB = n·11ᵀ has rank 1


def test_prism_refuses_rank_deficient_factors_at_start_and_per_step(tiny_llama):
    apply_lora_init(tiny_llama, "balanced", seed=0, scale=0.3)
    layers = lora_layers(tiny_llama)
    name = sorted(layers)[1]
    opt = PrismDp(layers, lr=1e-3)
    opt.begin()
    _make_rank_one(layers[name])
    with pytest.raises(FedloraError, match=re.escape(f"module {name} is numerically rank-deficient")):
        opt.begin()
    with pytest.raises(FedloraError, match=re.escape(f"module {name} is numerically rank-deficient")):
        PrismDp(layers, lr=1e-3)
