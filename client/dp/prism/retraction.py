"""Rank-r retraction through a 2r × 2r core, balanced refactorisation and Procrustes alignment
(PRISM Eq. 22, Alg. 1, Prop. 3.2; docs/design.md §7.5)."""

from __future__ import annotations

import torch
from torch import Tensor

from client.dp.prism.geometry import as_compute


def procrustes_align(A_new: Tensor, B_new: Tensor, A_ref: Tensor, B_ref: Tensor) -> tuple[Tensor, Tensor]:
    """``(A_new Q, B_new Q)`` with the orthogonal ``Q: (r, r)`` minimising ``‖A_new Q − A_ref‖² + ‖B_new Q − B_ref‖²``.

    ``A_*: (m, r)``, ``B_*: (n, r)``; ``A Bᵀ``, ``Π_A``, ``Π_B`` and balance are kept.
    """
    U, _, Vh = torch.linalg.svd(A_new.mT @ A_ref + B_new.mT @ B_ref)
    Q = U @ Vh
    return A_new @ Q, B_new @ Q


def retract(
    A: Tensor, B: Tensor, UA: Tensor, UB: Tensor, eta: float | Tensor, align: bool = True
) -> tuple[Tensor, Tensor]:
    """Best rank-r approximation of ``X = A Bᵀ − η (UA Bᵀ + A UBᵀ)`` as balanced factors (PRISM Eq. 22, Alg. 1).

    ``A: (m, r)``, ``B: (n, r)``, ``UA: (m, r)``, ``UB: (n, r)``, learning rate ``eta`` → ``A': (m, r)``,
    ``B': (n, r)`` in the compute dtype with ``A'ᵀA' = B'ᵀB'`` (diagonal = singular values when ``align``
    is false) and ``A' B'ᵀ = Retr_r(X)``. No bilinear ``η² UA UBᵀ`` term. With ``align`` the result is
    Procrustes-aligned to ``(A, B)``. Columns are zero-padded if ``X`` has fewer than ``r`` singular values
    (``min(m, n) < r``). Cost ``O((m + n) r² + r³)``.
    """
    A, B, UA, UB = (as_compute(x) for x in (A, B, UA, UB))
    r = A.shape[-1]
    Qu, Ru = torch.linalg.qr(torch.cat([A, UA], dim=-1), mode="reduced")
    Qv, Rv = torch.linalg.qr(torch.cat([B, UB], dim=-1), mode="reduced")
    # X = [A, UA] K [B, UB]ᵀ with K = [[I, −ηI], [−ηI, 0]] (2r × 2r).
    eye = torch.eye(r, dtype=A.dtype, device=A.device)
    K = torch.cat([torch.cat([eye, -eta * eye], -1), torch.cat([-eta * eye, 0.0 * eye], -1)], -2)
    Uc, S, Vch = torch.linalg.svd(Ru @ K @ Rv.mT, full_matrices=False)
    k = min(r, S.shape[-1])
    root = S[..., :k].clamp(min=0.0).sqrt()
    A_new = (Qu @ Uc[..., :k]) * root[..., None, :]
    B_new = (Qv @ Vch[..., :k, :].mT) * root[..., None, :]
    if k < r:
        A_new = torch.nn.functional.pad(A_new, (0, r - k))
        B_new = torch.nn.functional.pad(B_new, (0, r - k))
    return procrustes_align(A_new, B_new, A, B) if align else (A_new, B_new)
