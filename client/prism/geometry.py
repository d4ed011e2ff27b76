"""Per-module quantities cached once per logical batch (research/prism.md §1.3).

All PRISM math runs in float32 (float64 inputs stay float64, which the tests use for exactness).
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
    PSD pseudo-inverses; ``M_invsqrt = (M + εI)^{-1/2}``, ``N_invsqrt = (N + εI)^{-1/2}`` (all ``(r, r)``).
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


def _pinv(w: Tensor, V: Tensor, rcond: float) -> Tensor:
    """PSD pseudo-inverse: eigenvalues ``≤ rcond·max(w)`` are dropped."""
    keep = w > rcond * w.max(-1, keepdim=True).values
    return _from_eig(torch.where(keep, 1.0 / torch.where(keep, w, 1.0), 0.0), V)


def geometry(A: Tensor, B: Tensor, rcond: float = 1e-6, eps: float = 1e-8) -> Geometry:
    """Geometry of ``Z = A Bᵀ`` for ``A: (m, r)``, ``B: (n, r)``; cost ``O((m + n) r² + r³)``."""
    A, B = as_compute(A), as_compute(B)
    QA = torch.linalg.qr(A, mode="reduced").Q
    QB = torch.linalg.qr(B, mode="reduced").Q
    M, N = A.mT @ A, B.mT @ B
    M_w, M_V = psd_eigh(M)
    N_w, N_V = psd_eigh(N)
    return Geometry(
        A=A,
        B=B,
        QA=QA,
        QB=QB,
        M=M,
        N=N,
        M_w=M_w,
        M_V=M_V,
        N_w=N_w,
        N_V=N_V,
        M_pinv=_pinv(M_w, M_V, rcond),
        N_pinv=_pinv(N_w, N_V, rcond),
        M_invsqrt=_from_eig((M_w + eps).rsqrt(), M_V),
        N_invsqrt=_from_eig((N_w + eps).rsqrt(), N_V),
    )
