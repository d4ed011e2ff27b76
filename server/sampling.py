"""Client sampling: Poisson with rate p, each node independently (the amplification DP assumes).

The sampler is seeded from OS entropy and its state is never stored: a sample that could be
replayed from the run's published seed would void the amplification the accountant takes.
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence

import numpy as np


def os_sampler() -> np.random.Generator:
    """A fresh generator seeded from OS entropy (never from the run's seed, never checkpointed)."""
    return np.random.default_rng(secrets.randbits(128))


def poisson_sample(node_ids: Sequence[int], rate: float, rng: np.random.Generator) -> list[int]:
    """Each node is included with probability ``rate``; the result may be empty."""
    if not 0.0 < rate <= 1.0:
        raise ValueError(f"sample rate must be in (0, 1], got {rate}")
    keep = rng.random(len(node_ids)) < rate
    return [n for n, k in zip(node_ids, keep, strict=True) if k]


def eligible(node_ids: Sequence[int], ledger, cap: int) -> list[int]:
    """Secure aggregation: the nodes that have taken part (as the ``ledger``'s charges name them)
    fewer than ``cap`` times, the rest having spent their per-client budget."""
    taken = ledger.participations() if ledger is not None else {}
    return [n for n in node_ids if taken.get(n, 0) < cap]


def cut_to(sampled: list[int], most: int, rng: np.random.Generator) -> list[int]:
    """``sampled``, or ``most`` of them chosen uniformly at random when there are more (secure
    aggregation's cohort bound fixes the bits of the modular sum)."""
    if len(sampled) <= most:
        return sampled
    return sorted(int(n) for n in rng.choice(sampled, size=most, replace=False))


__all__ = ["cut_to", "eligible", "os_sampler", "poisson_sample"]
