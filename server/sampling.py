"""Client sampling: Poisson with rate p, each node independently (the amplification DP assumes)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def poisson_sample(node_ids: Sequence[int], rate: float, rng: np.random.Generator) -> list[int]:
    """Each node is included with probability ``rate``; the result may be empty."""
    if not 0.0 < rate <= 1.0:
        raise ValueError(f"sample rate must be in (0, 1], got {rate}")
    keep = rng.random(len(node_ids)) < rate
    return [n for n, k in zip(node_ids, keep, strict=True) if k]
