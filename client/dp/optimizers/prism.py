"""PRISM as a local DP optimizer of LoRA factors (docs/design.md §7.7, the official code's final
variant): per-example Eq. 14 lifts and Eq. 15 intrinsic norms, the clipped sum, Eq. 19 tangent noise,
Sylvester horizontalisation before the moments and before the retraction, the DP-aware adaptive step
(Eq. 24–26) and the rank-2r retraction with balanced refactorisation and Procrustes alignment.

The lift is linear in the factor gradients, so the clipped sum of lifts is the lift of the clipped sum
of raw gradients: per example only the norm is computed; one lift per module and batch follows.
Noise ``N(0, σ²C²)`` is added to the **sum** and the result divided by the expected batch size
(docs/design.md §7.7: the official code divides by the realised Poisson batch).

Floors (``floor``): ``"clamp"`` (the official code's eigenvalue floor ``max(w, λ)``) or ``"ridge"``
(the paper's ``(V + λI)^{-1/2}``); see client/dp/prism/adaptive.py. The default is ``clamp``, the official
code's choice, kept after one validation run each (ridge 0.732, clamp 0.745 on 1,000 examples, within
their noise: nothing favours the ridge; docs/prism.md, the grid's notes).
"""

from __future__ import annotations

import torch
from peft.tuners.lora import LoraLayer
from torch import Tensor

from client.dp.optimizers.base import FactorGrads
from client.dp.prism import (
    Geometry,
    Moments,
    adaptive_direction,
    dp_floors,
    geometry,
    horizontalize,
    init_moments,
    lift,
    retract,
    tangent_noise,
    tangent_sq_norm,
)
from client.dp.prism.adaptive import Floor, FloorMode
from client.dp.prism.tangent import RANK_DEFICIENT
from common.errors import FedloraError
from common.models.lora import get_factors, set_factors


class PrismDp:
    """PRISM on every LoRA module of ``layers``; the factors must have full column rank."""

    name = "prism"

    def __init__(
        self,
        layers: dict[str, LoraLayer],
        lr: float,
        *,
        floor: Floor = "clamp",
        floor_mode: FloorMode = "scalar",
        floor_factor: float = 0.5,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        cond_max: float | None = 1e4,
        rcond: float = 1e-6,
    ) -> None:
        self.layers, self.lr = layers, lr
        self.floor, self.floor_mode, self.floor_factor = floor, floor_mode, floor_factor
        self.betas, self.eps, self.cond_max, self.rcond = betas, eps, cond_max, rcond
        self.moments: dict[str, Moments] = {}
        for name, layer in layers.items():
            A, B = get_factors(layer)
            if not (bool(A.abs().sum() > 0) and bool(B.abs().sum() > 0)):
                raise FedloraError(
                    f"PRISM needs full-rank LoRA factors, but module {name} starts at zero "
                    "(PEFT's default init); use the balanced init (--init balanced)"
                )
            _require_full_rank(name, geometry(A, B, rcond))
            self.moments[name] = init_moments(A, B)
            for module in (layer.lora_A["default"], layer.lora_B["default"]):
                module.weight.requires_grad_(True)  # the engine's hooks need both (FFA may have frozen one)
        self.geo: dict[str, Geometry] = {}
        self.sums: dict[str, list[Tensor]] = {}

    def begin(self) -> None:
        self.geo = {name: geometry(*get_factors(layer), self.rcond) for name, layer in self.layers.items()}
        for name, geo in self.geo.items():
            _require_full_rank(name, geo)  # before any noise is drawn (Eq. 19 needs M^{-1/2}, N^{-1/2})
        self.sums = {name: [torch.zeros_like(g.A), torch.zeros_like(g.B)] for name, g in self.geo.items()}

    def sq_norms(self, grads: FactorGrads) -> Tensor:
        total = 0.0
        for name, (gA, gB) in grads.items():
            geo = self.geo[name]
            total = total + tangent_sq_norm(geo, *lift(geo, gA, gB))  # Eq. 15 on the Eq. 14 lift
        return total

    def accumulate(self, grads: FactorGrads, alpha: Tensor) -> None:
        for name, (gA, gB) in grads.items():
            acc = self.sums[name]
            acc[0] += torch.einsum("b,bmr->mr", alpha.to(acc[0].dtype), gA.to(acc[0].dtype))
            acc[1] += torch.einsum("b,bnr->nr", alpha.to(acc[1].dtype), gB.to(acc[1].dtype))

    def step(self, noise_std: float, denom: float, generator: torch.Generator) -> None:
        tau = noise_std / denom  # σC/b
        for name, layer in self.layers.items():
            geo = self.geo[name]
            dA, dB = lift(geo, self.sums[name][0] / denom, self.sums[name][1] / denom)
            if noise_std > 0:
                xi_a, xi_b = tangent_noise(geo, generator)  # Eq. 19
                dA, dB = dA + tau * xi_a, dB + tau * xi_b
            dA, dB = horizontalize(geo, dA, dB)  # before the moments
            lam_a, lam_b = dp_floors(
                geo, tau, self.floor_mode if noise_std > 0 else "none", self.floor_factor
            )
            UA, UB, self.moments[name] = adaptive_direction(
                self.moments[name],
                dA,
                dB,
                lam_a,
                lam_b,
                floor=self.floor,
                betas=self.betas,
                eps=self.eps,
                cond_max=self.cond_max,
            )
            UA, UB = horizontalize(geo, UA, UB)  # before the retraction
            A, B = retract(geo.A, geo.B, UA, UB, self.lr, align=True)  # Alg. 1 line 14
            set_factors(layer, A, B)


def _require_full_rank(name: str, geo: Geometry) -> None:
    """Refuse module ``name`` when ``AᵀA`` or ``BᵀB`` has an eigenvalue ``≤ rcond·max`` (one host sync)."""
    if not bool(geo.full_rank):
        raise FedloraError(RANK_DEFICIENT.format(what=f"module {name}"))
