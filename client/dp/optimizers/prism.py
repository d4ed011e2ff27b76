"""PRISM as a local DP optimizer of LoRA factors (docs/design.md §7.7, the official code's final
variant): per-example Eq. 14 lifts and Eq. 15 intrinsic norms, the clipped sum, Eq. 19 tangent noise,
Sylvester horizontalisation before the moments and before the retraction, the DP-aware adaptive step
(Eq. 24–26) and the rank-2r retraction with balanced refactorisation and Procrustes alignment.

The lift is linear in the factor gradients, so the clipped sum of lifts is the lift of the clipped sum
of raw gradients: per example only the norm is computed; one lift per module and batch follows.
Noise ``N(0, σ²C²)`` is added to the **sum** and the result divided by the expected batch size
(docs/design.md §7.7: the official code divides by the realised Poisson batch).

Batched across modules (issue 36): modules of one shape (and LoRA scaling) are stacked into a group,
and every per-step product, Gram, eigendecomposition, QR and SVD runs once per group on ``(g, ·, ·)``
stacks, so a step dispatches a number of ops that does not grow with the model's depth; the noise
``Ω_A``, ``Ω_B`` is drawn a group's stack at a time (issue 54), groups in order of their first module:
tests/client/dp/test_prism_batched.py checks the steps against a per-module step drawing the same
stream. The rank check is one host synchronisation per step, before any noise is drawn.

Floors (``floor``): ``"clamp"`` (the official code's eigenvalue floor ``max(w, λ)``) or ``"ridge"``
(the paper's ``(V + λI)^{-1/2}``); see client/dp/prism/adaptive.py. The default is ``clamp``, the official
code's choice, kept after one validation run each (ridge 0.732, clamp 0.745 on 1,000 examples, within
their noise: nothing favours the ridge; docs/prism.md, the grid's notes).
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch
from peft.tuners.lora import LoraLayer
from torch import Tensor

from client.dp.grad_sample import shape_groups, stacked
from client.dp.optimizers.base import FactorGrads
from client.dp.prism import (
    AdaptiveSettings,
    Geometry,
    Moments,
    adaptive_direction,
    dp_floors,
    geometry,
    horizontalize,
    init_moments,
    lift,
    retract,
    shape_noise,
    tangent_sq_norm,
)
from client.dp.prism.adaptive import FloorMode
from client.dp.prism.tangent import RANK_DEFICIENT
from common.errors import FedloraError
from common.models.lora import get_factors


@dataclass
class _Group:
    """LoRA modules of one shape: ``names`` in model order, their PEFT weights and adaptive state.

    Paper factors ``A = root·lora_B: (g, m, r)`` and ``B = root·lora_Aᵀ: (g, n, r)``.
    """

    names: list[str]
    lora_b: list[torch.nn.Parameter]
    lora_a: list[torch.nn.Parameter]
    root: float
    moments: Moments | None = None

    @torch.no_grad()
    def factors(self) -> tuple[Tensor, Tensor]:
        """The group's current factors ``(A: (g, m, r), B: (g, n, r))``, new tensors."""
        return torch.stack(self.lora_b) * self.root, torch.stack(self.lora_a).mT * self.root

    @torch.no_grad()
    def write(self, A: Tensor, B: Tensor) -> None:
        """Store factors ``A: (g, m, r)``, ``B: (g, n, r)`` in the PEFT weights (one foreach copy)."""
        peft_b, peft_a = (A / self.root).unbind(0), (B / self.root).mT.unbind(0)
        torch._foreach_copy_([*self.lora_b, *self.lora_a], [*peft_b, *peft_a])


#: the adaptive step of :class:`PrismDp` unless told otherwise (the official code's: clamp floor)
DEFAULT_ADAPTIVE = AdaptiveSettings()


def _per_example(geo: Geometry) -> Geometry:
    """The geometry of ``(g, ·, ·)`` stacked modules, broadcastable over ``(g, b, ·, ·)`` examples."""
    return Geometry(**{f.name: getattr(geo, f.name).unsqueeze(1) for f in fields(Geometry)})


class PrismDp:
    """PRISM on every LoRA module of ``layers``; the factors must have full column rank."""

    name = "prism"

    def __init__(
        self,
        layers: dict[str, LoraLayer],
        lr: float,
        *,
        adaptive: AdaptiveSettings = DEFAULT_ADAPTIVE,
        floor_mode: FloorMode = "scalar",
        floor_factor: float = 0.5,
        rcond: float = 1e-6,
    ) -> None:
        """``adaptive``: the adaptive step's floor, betas, eps and condition clamp; ``floor_mode`` and
        ``floor_factor``: the DP floor λ (:func:`~client.dp.prism.dp_floors`); ``rcond``: the
        geometry's rank tolerance."""
        self.layers, self.lr = layers, lr
        self.adaptive, self.floor_mode, self.floor_factor = adaptive, floor_mode, floor_factor
        self.rcond = rcond
        for name, layer in layers.items():
            A, B = get_factors(layer)
            if not (bool(A.abs().sum() > 0) and bool(B.abs().sum() > 0)):
                raise FedloraError(
                    f"PRISM needs full-rank LoRA factors, but module {name} starts at zero "
                    "(PEFT's default init); use the balanced init (--init balanced)"
                )
            if not bool(geometry(A, B, rcond).full_rank):
                raise FedloraError(RANK_DEFICIENT.format(what=f"module {name}"))
            for module in (layer.lora_A["default"], layer.lora_B["default"]):
                module.weight.requires_grad_(True)  # the engine's hooks need both (FFA may have frozen one)
        self.groups = [self._group(names) for names in shape_groups(layers)]
        self.geo: list[Geometry] = []
        self._examples: list[Geometry] = []  # self.geo broadcastable over examples (per_example)
        self.sums: list[list[Tensor]] = []

    def _group(self, names: list[str]) -> _Group:
        group = _Group(
            names,
            [self.layers[n].lora_B["default"].weight for n in names],
            [self.layers[n].lora_A["default"].weight for n in names],
            self.layers[names[0]].scaling["default"] ** 0.5,
        )
        group.moments = init_moments(*group.factors())
        return group

    def begin(self) -> None:
        self.geo = [geometry(*g.factors(), self.rcond) for g in self.groups]
        # Before any noise is drawn (Eq. 19 needs M^{-1/2}, N^{-1/2}); one host sync for all modules.
        if not bool(torch.stack([geo.full_rank.all() for geo in self.geo]).all()):
            for group, geo in zip(self.groups, self.geo, strict=True):
                for name, ok in zip(group.names, geo.full_rank.tolist(), strict=True):
                    if not ok:
                        raise FedloraError(RANK_DEFICIENT.format(what=f"module {name}"))
        self._examples = [_per_example(geo) for geo in self.geo]
        self.sums = [[torch.zeros_like(geo.A), torch.zeros_like(geo.B)] for geo in self.geo]

    def _stack(self, grads: FactorGrads) -> list[tuple[Tensor, Tensor]]:
        """Per group ``(g_A: (g, b, m, r), g_B: (g, b, n, r))`` (the engine's stacks, as they are)."""
        return [(g.g_a, g.g_b) for g in stacked(grads, [group.names for group in self.groups])]

    def sq_norms(self, grads: FactorGrads) -> Tensor:
        total = 0.0
        for geo, (gA, gB) in zip(self._examples, self._stack(grads), strict=True):
            total = total + tangent_sq_norm(geo, *lift(geo, gA, gB)).sum(0)  # Eq. 15 on the Eq. 14 lift
        return total

    def accumulate(self, grads: FactorGrads, alpha: Tensor) -> None:
        for acc, (gA, gB) in zip(self.sums, self._stack(grads), strict=True):
            acc[0] += torch.einsum("b,gbmr->gmr", alpha.to(acc[0].dtype), gA.to(acc[0].dtype))
            acc[1] += torch.einsum("b,gbnr->gnr", alpha.to(acc[1].dtype), gB.to(acc[1].dtype))

    def _draws(self, generator: torch.Generator) -> list[tuple[Tensor, Tensor]]:
        """Standard normal ``(Ω_A: (g, m, r), Ω_B: (g, n, r))`` per group, each stack in one draw."""
        return [
            tuple(
                torch.randn(t.shape, generator=generator, dtype=t.dtype, device=t.device)
                for t in (geo.A, geo.B)
            )
            for geo in self.geo
        ]

    def step(self, noise_std: float, denom: float, generator: torch.Generator) -> None:
        tau = noise_std / denom  # σC/b
        draws = self._draws(generator) if noise_std > 0 else [None] * len(self.groups)
        for group, geo, (sA, sB), omega in zip(self.groups, self.geo, self.sums, draws, strict=True):
            dA, dB = lift(geo, sA / denom, sB / denom)
            if omega is not None:
                xi_a, xi_b = shape_noise(geo, *omega)  # Eq. 19
                dA, dB = dA + tau * xi_a, dB + tau * xi_b
            dA, dB = horizontalize(geo, dA, dB)  # before the moments
            lam_a, lam_b = dp_floors(
                geo, tau, self.floor_mode if noise_std > 0 else "none", self.floor_factor
            )
            UA, UB, group.moments = adaptive_direction(group.moments, dA, dB, lam_a, lam_b, self.adaptive)
            UA, UB = horizontalize(geo, UA, UB)  # before the retraction
            group.write(*retract(geo.A, geo.B, UA, UB, self.lr, align=True))  # Alg. 1 line 14

    def per_module(self) -> dict[str, tuple[Geometry, Tensor, Tensor]]:
        """``{module: (its geometry, clipped sum of g_A: (m, r), of g_B: (n, r))}`` for inspection."""
        out = {}
        for group, geo, (sA, sB) in zip(self.groups, self.geo, self.sums, strict=True):
            for i, name in enumerate(group.names):
                out[name] = (
                    Geometry(**{f.name: getattr(geo, f.name)[i] for f in fields(Geometry)}),
                    sA[i],
                    sB[i],
                )
        return out
