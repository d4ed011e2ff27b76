"""Client sampling: Poisson with rate p, each node independently (the amplification DP assumes).

The sampler is seeded from OS entropy and its state is never stored: a sample that could be
replayed from the run's published seed would void the amplification the accountant takes.
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence

import numpy as np

from common.privacy.ledger import Ledger


def os_sampler() -> np.random.Generator:
    """A fresh generator seeded from OS entropy (never from the run's seed, never checkpointed)."""
    return np.random.default_rng(secrets.randbits(128))


def poisson_sample(node_ids: Sequence[int], rate: float, rng: np.random.Generator) -> list[int]:
    """Each node is included with probability ``rate``; the result may be empty."""
    if not 0.0 < rate <= 1.0:
        raise ValueError(f"sample rate must be in (0, 1], got {rate}")
    keep = rng.random(len(node_ids)) < rate
    return [n for n, k in zip(node_ids, keep, strict=True) if k]


def eligible(node_ids: Sequence[int], ledger: Ledger | None, cap: int) -> list[int]:
    """Secure aggregation: the nodes that have taken part (as the ``ledger``'s charges name them)
    fewer than ``cap`` times, the rest having spent their per-client budget."""
    taken = ledger.participations() if ledger is not None else {}
    return [n for n in node_ids if taken.get(n, 0) < cap]


def fixed_sample(node_ids: Sequence[int], size: int, rng: np.random.Generator) -> list[int]:
    """``size`` of ``node_ids`` (all of them when fewer) chosen uniformly at random, sorted (secure
    aggregation's cohort: its bits and shares are planned for that many)."""
    if len(node_ids) <= size:
        return sorted(node_ids)
    return sorted(int(n) for n in rng.choice(node_ids, size=size, replace=False))


__all__ = ["eligible", "fixed_sample", "os_sampler", "poisson_sample"]
