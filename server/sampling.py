"""Client sampling: Poisson with rate p, each node independently (the amplification DP assumes).

The sampler is seeded from OS entropy and its state is never stored: a sample that could be
replayed from the run's published seed would void the amplification the accountant takes.
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping, Sequence

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


def participations(ledger: Ledger | None) -> dict[int, int]:
    """Secure aggregation: node id -> the rounds it has taken part in, as the ``ledger``'s charges
    name them (none without a ledger)."""
    return ledger.participations() if ledger is not None else {}


def eligible(node_ids: Sequence[int], taken: Mapping[int, int], cap: int) -> list[int]:
    """The nodes that have taken part fewer than ``cap`` times (``taken``: :func:`participations`),
    the rest having spent their per-client budget."""
    return [n for n in node_ids if taken.get(n, 0) < cap]


def balanced_sample(
    node_ids: Sequence[int], taken: Mapping[int, int], size: int, rng: np.random.Generator
) -> list[int]:
    """Secure aggregation's cohort: ``size`` of ``node_ids`` (all of them when fewer), sorted, filled
    from the nodes that have taken part least (``taken``), chosen uniformly at random within the
    last tier that does not fit whole. With a cap of c participations, N nodes and cohorts of K, every
    node's cap is used before any node's last participation and c·N/K rounds run (a uniform draw
    leaves fewer than K under the cap near the end). Against the server each participation is
    charged at p = 1 whoever is drawn, so the order costs nothing."""
    if len(node_ids) <= size:
        return sorted(node_ids)
    tiers: dict[int, list[int]] = {}
    for n in node_ids:
        tiers.setdefault(taken.get(n, 0), []).append(n)
    chosen: list[int] = []
    for count in sorted(tiers):
        tier, room = tiers[count], size - len(chosen)
        if len(tier) <= room:
            chosen += tier
        else:
            chosen += [int(n) for n in rng.choice(tier, size=room, replace=False)]
        if len(chosen) == size:
            break
    return sorted(chosen)


__all__ = ["balanced_sample", "eligible", "os_sampler", "participations", "poisson_sample"]
