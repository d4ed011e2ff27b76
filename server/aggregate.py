"""FedAvg of adapter increments (the private means are the mechanisms', common/privacy/mechanisms/mechanism.py)."""

from __future__ import annotations

from collections.abc import Sequence

from common.models import AdapterState


def weighted_mean(increments: Sequence[AdapterState], weights: Sequence[float]) -> AdapterState:
    """``Σ_k w_k Δ_k / Σ_k w_k`` per tensor; ``weights`` are example counts."""
    if not increments or len(increments) != len(weights):
        raise ValueError("need one weight per increment and at least one increment")
    total = float(sum(weights))
    return {
        name: sum(w / total * inc[name] for inc, w in zip(increments, weights, strict=True))
        for name in increments[0]
    }


def apply_increment(state: AdapterState, increment: AdapterState, lr: float) -> AdapterState:
    """``state + lr · increment`` (server learning rate ``lr``)."""
    return {name: state[name] + lr * increment[name] for name in state}
