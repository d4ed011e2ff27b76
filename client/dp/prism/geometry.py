"""Per-module quantities cached once per logical batch (PRISM App. A.14; docs/design.md §7.1).

All PRISM math runs in float32 (float64 inputs stay float64, which the tests use for exactness), except
the ``r × r`` eigendecompositions of ``AᵀA`` and ``BᵀB``, which run in float64.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


def as_compute(x: Tensor) -> Tensor:
    """``x`` in the compute dtype: float32, or float64 if it already is (bf16/fp16 are promoted)."""
    return x.to(torch.promote_types(x.dtype, torch.float32))


def psd_eigh(S: Tensor) -> tuple[Tensor, Tensor]:
    """Eigen-decomposition of a small symmetric PSD ``S: (r, r)`` → ``w: (r,)`` (≥ 0, ascending), ``V: (r, r)``.

    Symmetrises ``S``; if ``eigh`` does not converge, retries with diagonal jitter
    ``1e-6·(mean|diag| + 1)``, then on the CPU in float64 (the official code's ``_psd_eigh``).
    The fallback runs only after a failure, which already synchronised with the host.
    """
    S = 0.5 * (S + S.mT)
    try:
        w, V = torch.linalg.eigh(S)
    except torch.linalg.LinAlgError:
        jitter = 1e-6 * (S.diagonal(dim1=-2, dim2=-1).abs().mean(-1) + 1.0)
        S = S + jitter[..., None, None] * torch.eye(S.shape[-1], dtype=S.dtype, device=S.device)
        try:
            w, V = torch.linalg.eigh(S)
        except torch.linalg.LinAlgError:
            w, V = torch.linalg.eigh(S.to(device="cpu", dtype=torch.float64))
            w, V = w.to(device=S.device, dtype=S.dtype), V.to(device=S.device, dtype=S.dtype)
    return w.clamp(min=0.0), V


def _from_eig(w: Tensor, V: Tensor) -> Tensor:
    """``V diag(w) Vᵀ``, symmetrised."""
    out = (V * w[..., None, :]) @ V.mT
    return 0.5 * (out + out.mT)


@dataclass(frozen=True)
class Geometry:
    """Cached geometry of one LoRA module ``Z = A Bᵀ`` (compute dtype, on the factors' device).

    ``A: (m, r)``, ``B: (n, r)``; ``QA: (m, r)``, ``QB: (n, r)`` thin-QR bases (Π_A = QA QAᵀ);
    ``M = AᵀA``, ``N = BᵀB`` with eigenpairs ``M_w, M_V``, ``N_w, N_V``; ``M_pinv``, ``N_pinv``
    PSD pseudo-inverses and ``M_invsqrt = M^{-1/2}``, ``N_invsqrt = N^{-1/2}`` on the eigenvalues kept
    (all ``(r, r)``); ``full_rank``: 0-dim bool, no eigenvalue of ``M`` or ``N`` was dropped.
    The eigenpairs come from float64 Grams: a float32 Gram has absolute error ~1e-7·max(w).
    """

    A: Tensor
    B: Tensor
    QA: Tensor
    QB: Tensor
    M: Tensor
    N: Tensor
    M_w: Tensor
    M_V: Tensor
    N_w: Tensor
    N_V: Tensor
    M_pinv: Tensor
    N_pinv: Tensor
    M_invsqrt: Tensor
    N_invsqrt: Tensor
    full_rank: Tensor


def _kept(w: Tensor, rcond: float) -> Tensor:
    """Eigenvalues ``w: (r,)`` above ``rcond·max(w)``: ``(r,)`` bool (all False when ``w`` is zero)."""
    return w > rcond * w.max(-1, keepdim=True).values


def _pinv_power(w: Tensor, V: Tensor, keep: Tensor, power: float) -> Tensor:
    """``V diag(w^power) Vᵀ`` on the kept eigenvalues, 0 on the dropped ones."""
    return _from_eig(torch.where(keep, torch.where(keep, w, 1.0).pow(power), 0.0), V)


def _gram_eigh(X: Tensor) -> tuple[Tensor, Tensor]:
    """Eigenpairs of ``XᵀX`` for ``X: (k, r)``, formed and decomposed in float64."""
    X = X.to(torch.float64)
    return psd_eigh(X.mT @ X)


def geometry(A: Tensor, B: Tensor, rcond: float = 1e-6) -> Geometry:
    """Geometry of ``Z = A Bᵀ`` for ``A: (m, r)``, ``B: (n, r)``; cost ``O((m + n) r² + r³)``.

    Eigenvalues ``≤ rcond·max`` are dropped from the pseudo-inverses and their square roots.
    """
    A, B = as_compute(A), as_compute(B)
    QA = torch.linalg.qr(A, mode="reduced").Q
    QB = torch.linalg.qr(B, mode="reduced").Q
    M_w, M_V = _gram_eigh(A)
    N_w, N_V = _gram_eigh(B)
    M_keep, N_keep = _kept(M_w, rcond), _kept(N_w, rcond)
    dt = A.dtype
    return Geometry(
        A=A,
        B=B,
        QA=QA,
        QB=QB,
        M=A.mT @ A,
        N=B.mT @ B,
        M_w=M_w.to(dt),
        M_V=M_V.to(dt),
        N_w=N_w.to(dt),
        N_V=N_V.to(dt),
        M_pinv=_pinv_power(M_w, M_V, M_keep, -1.0).to(dt),
        N_pinv=_pinv_power(N_w, N_V, N_keep, -1.0).to(dt),
        M_invsqrt=_pinv_power(M_w, M_V, M_keep, -0.5).to(dt),
        N_invsqrt=_pinv_power(N_w, N_V, N_keep, -0.5).to(dt),
        full_rank=M_keep.all(-1) & N_keep.all(-1),
    )
