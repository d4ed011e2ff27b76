"""DP-aware rank-space adaptive direction (PRISM Eq. 24–26; the official code's ``_adaptive_direction``).

``floor`` picks how the DP floor ``λ`` enters the preconditioner ``P^{-1/2}``:

- ``"clamp"`` (official code): eigenvalues ``w ← max(w + ε, λ)``;
- ``"ridge"`` (paper Eq. 25): ``w ← w + ε + λ``, i.e. ``(V + λI)^{-1/2}``.

Both then raise small eigenvalues to ``max(w)/cond_max`` and give ``‖P^{-1/2}‖₂ ≤ λ^{-1/2}`` (Thm 3.5).
The default ``"clamp"`` is provisional: the project picks the default by measurement.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

from client.dp.prism.geometry import Geometry, as_compute, psd_eigh

Floor = Literal["clamp", "ridge"]
FloorMode = Literal["scalar", "geometry", "none"]


@dataclass(frozen=True)
class AdaptiveSettings:
    """The hyper-parameters of :func:`adaptive_direction` (PRISM Eq. 24–25).

    floor: how the DP floor ``λ`` enters ``P^{-1/2}`` (``clamp`` or ``ridge``: the module docstring).
    betas: ``(β1, β2)``, the decay of the first moments ``mA, mB`` and of the second moments ``vA, vB``.
    eps: added to the second moment's eigenvalues (numerical).
    cond_max: the largest condition number of the preconditioner (None: no clamp).
    """

    floor: Floor = "clamp"
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    cond_max: float | None = 1e4


@dataclass(frozen=True)
class Moments:
    """Adaptive state of one module: ``mA: (m, r)``, ``mB: (n, r)``, ``vA, vB: (r, r)``, ``step`` taken so far."""

    mA: Tensor
    mB: Tensor
    vA: Tensor
    vB: Tensor
    step: int = 0


def init_moments(A: Tensor, B: Tensor) -> Moments:
    """Zero moments for factors ``A: (..., m, r)``, ``B: (..., n, r)`` (compute dtype, same device)."""
    A, B = as_compute(A), as_compute(B)
    r = A.shape[-1]
    zeros_rr = torch.zeros(*A.shape[:-2], r, r, dtype=A.dtype, device=A.device)
    return Moments(torch.zeros_like(A), torch.zeros_like(B), zeros_rr, zeros_rr.clone())


def noise_second_moments(geo: Geometry, tau: float | Tensor) -> tuple[Tensor, Tensor]:
    """Expected rank-space noise moments ``τ²(m−r)/m N⁻¹`` and ``τ² M⁻¹``, both ``(r, r)`` (PRISM Eq. 49–50).

    ``τ = σC/b`` is the per-coordinate noise scale. These are ``E[Ξ_AᵀΞ_A]/m`` and ``E[Ξ_BᵀΞ_B]/n`` after scaling.
    """
    m, r = geo.A.shape[-2:]
    EA = (tau * tau * max(m - r, 0) / m) * (geo.N_invsqrt @ geo.N_invsqrt)
    EB = (tau * tau) * (geo.M_invsqrt @ geo.M_invsqrt)
    return EA, EB


def dp_floors(
    geo: Geometry, tau: float | Tensor, mode: FloorMode = "scalar", factor: float = 0.5
) -> tuple[Tensor, Tensor]:
    """DP-aware floors ``(λ_A, λ_B)``: 0-dim tensors, or one per module of a stacked geometry in the
    ``"geometry"`` mode (PRISM Eq. 26; docs/design.md §7.4).

    ``"scalar"`` (official final runs): ``λ_A = λ_B = f τ²``. ``"geometry"`` (official code's reading of
    Eq. 26): ``λ_A = max(f τ², f·tr(E_A)/r)``, same for B, with ``E_A, E_B`` from :func:`noise_second_moments`
    (Eq. 26 itself has no ``(m−r)/m`` factor and no ``max``). ``"none"``: zero (non-DP).
    """
    opts = {"dtype": geo.A.dtype, "device": geo.A.device}
    if mode == "none":
        zero = torch.zeros((), **opts)
        return zero, zero
    base = torch.as_tensor(factor * tau * tau, **opts)
    if mode == "scalar":
        return base, base
    if mode != "geometry":
        raise ValueError(f"unknown floor mode {mode!r}")
    r = geo.A.shape[-1]
    EA, EB = noise_second_moments(geo, tau)
    lam_A = factor * EA.diagonal(dim1=-2, dim2=-1).sum(-1) / r
    lam_B = factor * EB.diagonal(dim1=-2, dim2=-1).sum(-1) / r
    return torch.maximum(base, lam_A), torch.maximum(base, lam_B)


def preconditioner(
    V: Tensor, lam: float | Tensor, floor: Floor = "clamp", eps: float = 1e-8, cond_max: float | None = 1e4
) -> Tensor:
    """Floored inverse square root ``P^{-1/2}: (..., r, r)`` of the second moment ``V: (..., r, r)`` with
    floor ``λ`` (a number, or one per matrix: shape ``V.shape[:-2]``).

    See the module docstring for ``floor``; ``cond_max=None`` skips the condition-number clamp.
    """
    w, Q = psd_eigh(V)
    lam = torch.as_tensor(lam, dtype=w.dtype, device=w.device)[..., None]  # one floor per matrix of a batch
    if floor == "clamp":
        w = torch.maximum(w + eps, lam)
    elif floor == "ridge":
        w = w + eps + lam
    else:
        raise ValueError(f"unknown floor {floor!r}")
    if cond_max is not None:
        w = torch.maximum(w, w.max(-1, keepdim=True).values / cond_max)
    return (Q * w.rsqrt()[..., None, :]) @ Q.mT


def adaptive_direction(
    state: Moments,
    gA: Tensor,
    gB: Tensor,
    lam_A: float | Tensor,
    lam_B: float | Tensor,
    settings: AdaptiveSettings = AdaptiveSettings(),
    *,
    debias: tuple[Tensor, Tensor] | None = None,
) -> tuple[Tensor, Tensor, Moments]:
    """One adaptive step on the noisy tangent lift ``gA: (m, r)``, ``gB: (n, r)`` → ``(UA, UB, new state)``.

    Adam-style moments with bias correction; right rank-space preconditioning
    ``UA = m̂A P_A^{-1/2}``, ``UB = m̂B P_B^{-1/2}`` (PRISM Eq. 24–25). ``V_t`` includes the current step.
    ``debias``: ``(E_A, E_B)`` subtracted from ``V̂`` (:func:`noise_second_moments`), or ``None`` (off).
    """
    gA, gB = gA.to(state.mA.dtype), gB.to(state.mB.dtype)
    b1, b2 = settings.betas
    floor, eps, cond_max = settings.floor, settings.eps, settings.cond_max
    t = state.step + 1
    m, n = gA.shape[-2], gB.shape[-2]
    mA = b1 * state.mA + (1 - b1) * gA
    mB = b1 * state.mB + (1 - b1) * gB
    vA = b2 * state.vA + (1 - b2) * (gA.mT @ gA) / m
    vB = b2 * state.vB + (1 - b2) * (gB.mT @ gB) / n
    vA_hat, vB_hat = vA / (1 - b2**t), vB / (1 - b2**t)
    if debias is not None:
        vA_hat, vB_hat = vA_hat - debias[0], vB_hat - debias[1]
    PA = preconditioner(vA_hat, lam_A, floor, eps, cond_max)
    PB = preconditioner(vB_hat, lam_B, floor, eps, cond_max)
    UA = (mA / (1 - b1**t)) @ PA
    UB = (mB / (1 - b1**t)) @ PB
    return UA, UB, Moments(mA, mB, vA, vB, t)
