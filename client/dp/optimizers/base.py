"""What every local DP optimizer of LoRA factors provides to the step engine (client/dp/engine.py).

One logical (Poisson-sampled) batch is: :meth:`begin`, then per micro-batch :meth:`sq_norms` of the
per-example contributions and :meth:`accumulate` of the clipped ones, then one :meth:`step` that adds
noise to the clipped **sum** and divides by the expected batch size. Clipping is global: the engine
adds the optimizer's squared norms to those of the dense trainables (a classifier head) and clips each
example once, so every example's whole contribution has norm at most C.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

import torch
from torch import Tensor

#: ``{module: (g_A: (b, m, r), g_B: (b, n, r))}``: per-example gradients in paper factors (the
#: engine passes client/dp/grad_sample.StackedGrads, which holds them stacked per shape group)
FactorGrads = Mapping[str, tuple[Tensor, Tensor]]


class LoraDpOptimizer(Protocol):
    """A DP optimizer of the LoRA factors of one model."""

    name: str

    def begin(self) -> None:
        """Start a logical batch: cache what depends on the current factors, zero the sums."""

    def sq_norms(self, grads: FactorGrads) -> Tensor:
        """Per-example squared norms ``(b,)`` of what this optimizer clips, summed over modules."""

    def accumulate(self, grads: FactorGrads, alpha: Tensor) -> None:
        """Add ``Σ_i α_i g_i`` (``alpha: (b,)`` clip factors) to the batch's sums."""

    # An optimizer may also have ``selecting: bool``: while True, its steps move nothing and the engine
    # leaves the dense trainables alone (SPARTA's selection phase, client/dp/optimizers/sparta.py).

    def step(self, noise_std: float, denom: float, generator: torch.Generator) -> None:
        """Release ``(sum + N(0, noise_std²)) / denom`` in this optimizer's space and update the factors."""
