"""Client-level Gaussian release of an adapter increment: clip its global L2 norm to C, add noise.

Who adds how much noise depends on the threat model, with noise multiplier σ
(common/privacy/planning/plan.py sizes the shares; common/privacy/participation/threat.py says what each guarantees):
``local``        each client adds N(0, σ²C²) per coordinate: private against the server itself;
``distributed``  each of the K sampled clients adds N(0, σ²C²/m), m = min(min-replies, K): any
                 applied sum carries at least N(0, σ²C²);
``central``      clients only clip; the (trusted) server clips again and adds N(0, σ²C²) to the sum.

Noise comes from a generator seeded with OS entropy on every call: DP noise must not be
reproducible from the run's seed.
"""

from __future__ import annotations

import math
import secrets

import torch

from common.models import AdapterState


def global_norm(state: AdapterState) -> float:
    """L2 norm over all tensors of ``state`` together."""
    return math.sqrt(sum(float(t.double().pow(2).sum()) for t in state.values()))


def clip(state: AdapterState, bound: float) -> tuple[AdapterState, float]:
    """``state`` scaled to global norm at most ``bound`` (Opacus' flat clipping); returns the original norm."""
    norm = global_norm(state)
    factor = min(1.0, bound / (norm + 1e-12))
    return {k: t * factor for k, t in state.items()}, norm


def add_noise(state: AdapterState, std: float) -> AdapterState:
    """``state`` + N(0, std²) on every coordinate, from a freshly OS-seeded generator."""
    if std == 0:
        return dict(state)
    gen = torch.Generator().manual_seed(secrets.randbits(63))
    return {k: t + std * torch.randn(t.shape, generator=gen, dtype=t.dtype) for k, t in state.items()}


def clip_and_noise(state: AdapterState, bound: float, std: float) -> AdapterState:
    """The Gaussian release of ``state``: clipped to global norm ``bound``, then N(0, std²) per coordinate."""
    return add_noise(clip(state, bound)[0], std)


__all__ = ["add_noise", "clip", "clip_and_noise", "global_norm"]
