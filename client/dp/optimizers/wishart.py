"""``wishart``: the noisy random-projection mechanism M2 of Hu, Düngler, Schölkopf & Sanyal ("LoRA and
Privacy: When Random Projections Help (and When They Don't)"), run as local DP steps on every LoRA
target layer, so that the Wishart-amplified accountant (common/privacy/mechanisms/wishart.py) applies.

Per step and per layer ``W = W0 + D`` (``W: (out, in)``):

1. ``A_t: (r, in)`` i.i.d. ``N(0, 1/r)``, drawn by this client from OS entropy, afresh at every step
   and independently of the data (Alg. 3; App. F.2 resamples A at every step).
2. Each example's *full* weight gradient ``G_i = dyᵢᵀ xᵢ`` is clipped to ``C`` (global over layers);
   its norm comes from the ghost-norm identity ``‖G_i‖² = ⟨xᵢxᵢᵀ, dyᵢdyᵢᵀ⟩`` (token Gram matrices),
   never from an ``(out, in)`` matrix per example.
3. LoRA's B-gradient at ``B = 0`` with noise on the full gradient *before* the projection,
   ``Y = (Σᵢ cᵢGᵢ + σC·E) A_tᵀ``, is sampled exactly and cheaply as ``Σᵢ cᵢ dyᵢᵀ(xᵢA_tᵀ) + σC·ε Lᵀ``
   with ``ε: (out, r)`` standard normal and ``L Lᵀ = A_t A_tᵀ`` (exact in law: each row of ``E A_tᵀ``
   is ``N(0, σ²C² A_t A_tᵀ)``): the released quantity, whose privacy is M2's.
4. ``Y A_t / (qN)`` (an unbiased estimate of the mean clipped gradient, ``E[A_tᵀA_t] = I``) goes to
   AdamW on ``D``; post-processing. ``B`` stays 0 (B_t is merged at once), so the next ``A`` never
   depends on the data through ``W``.

PEFT's LoRA modules stay in place as the gradient tap (``lora_B = 0``: its output's gradient is
``s·∂L/∂y``) and the dense ``D`` is merged into the base weight (common/models/dense_delta.py), so
the update is dense, not LoRA factors: ``wishart`` runs in ``train-local``, not in a federation that
exchanges factors. Dense trainables (a classification head) stay frozen: a trained head would not be
projected and would void the amplification (``only_projected_params``).
"""

from __future__ import annotations

import math
import secrets

import torch
from peft.tuners.lora import LoraLayer
from torch import Tensor

from client.dp.optimizers.dense import DenseUpdate, LayerIO, ghost_sq_norms
from common.errors import FedloraError


class WishartDp(DenseUpdate):
    """M2 steps with AdamW on the dense update ``D`` of every module in ``layers``."""

    name = "wishart"
    trains_dense = False  # dense trainables (a head) stay as initialised

    def __init__(self, layers: dict[str, LoraLayer], lr: float, *, adapter: str = "default", **adamw) -> None:
        super().__init__(layers, lr, adapter=adapter, **adamw)
        self.rank = {k: layer.r[adapter] for k, layer in layers.items()}
        self._draw: dict[torch.device, torch.Generator] = {}
        self.a: dict[str, Tensor] = {}
        self.sums: dict[str, Tensor] = {}
        self.draws = 0
        self.steps = 0

    def _generator(self, device: torch.device) -> torch.Generator:
        """The client's own CSPRNG-seeded stream for A (never the run's seed, never the server's)."""
        if device not in self._draw:
            self._draw[device] = torch.Generator(device=device).manual_seed(secrets.randbits(63))
        return self._draw[device]

    def begin(self) -> None:
        """A fresh ``A_t ~ N(0, 1/r)`` per layer and zero sums."""
        for k, delta in self.deltas.items():
            r, n_in = self.rank[k], delta.shape[1]
            gen = self._generator(delta.device)
            self.a[k] = torch.randn((r, n_in), generator=gen, device=delta.device) / math.sqrt(r)
            self.sums[k] = torch.zeros(delta.shape[0], r, device=delta.device)
        self.draws += 1

    def sq_norms(self, io: LayerIO) -> Tensor:
        """``Σ_layers ‖G_i‖_F²`` per example by the ghost-norm identity: ``(b,)``."""
        return sum(ghost_sq_norms(x, dy) for x, dy in io.values())

    def accumulate(self, io: LayerIO, alpha: Tensor) -> None:
        """``Σ_i α_i G_i A_tᵀ = Σ_i α_i dyᵢᵀ (xᵢ A_tᵀ)``."""
        for k, (x, dy) in io.items():
            h = x.float() @ self.a[k].T  # (b, T, r)
            self.sums[k] += torch.einsum("b,btm,btr->mr", alpha.float(), dy.float(), h)

    def step(self, noise_std: float, denom: float, generator: torch.Generator) -> None:
        for k, delta in self.deltas.items():
            a = self.a[k]
            released = self.sums[k] + projected_noise(a, delta.shape[0], noise_std, generator)
            delta.grad = (released @ a) / denom
        self.apply()
        self.steps += 1

    def summary(self) -> dict:
        """What the amplified claim rests on, as this run realised it (common/privacy/mechanisms/wishart.py)."""
        return {
            "projection_draws": self.draws,
            "assumptions": {
                "a_gaussian": True,
                "a_redrawn_each_step": self.draws == self.steps and self.steps > 0,
                "a_independent_of_data": True,
                "noise_before_projection": True,
                "clip_full_gradient": True,
                "only_projected_params": True,
            },
        }


def projected_noise(a: Tensor, rows: int, std: float, generator: torch.Generator) -> Tensor:
    """``std·E Aᵀ`` in law, ``E: (rows, in)`` standard normal, ``a: (r, in)``: ``std·ε Lᵀ`` with
    ``ε: (rows, r)`` standard normal and ``L Lᵀ = A Aᵀ`` (each row of ``E Aᵀ`` is ``N(0, A Aᵀ)``)."""
    chol = torch.linalg.cholesky(a @ a.T)
    eps = torch.randn((rows, a.shape[0]), generator=generator, device=a.device, dtype=a.dtype)
    return std * eps @ chol.T


def projection_shape(
    layers: dict[str, LoraLayer], tokens: int, adapter: str = "default"
) -> tuple[int, int, int]:
    """``(rank, dim, grad_rank)`` for the Wishart accountant: the LoRA rank, the smallest projected
    (input) dimension (the least amplification), and ``Σ_layers min(tokens, out, in)``, a bound on the
    rank of one example's clipped gradient over every layer (a sum of ``tokens`` outer products per
    layer; the union bound runs over a basis of it)."""
    ranks = {layer.r[adapter] for layer in layers.values()}
    if len(ranks) != 1:
        raise FedloraError(f"wishart needs one LoRA rank for every layer, got {sorted(ranks)}")
    shapes = [tuple(layer.get_base_layer().weight.shape) for layer in layers.values()]
    dim = min(n_in for _, n_in in shapes)
    grad_rank = sum(min(tokens, m, n) for m, n in shapes)
    return ranks.pop(), dim, grad_rank


__all__ = ["WishartDp", "projected_noise", "projection_shape"]
