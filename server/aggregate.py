"""FedAvg of adapter increments."""

from __future__ import annotations

from collections.abc import Sequence

from common.models import AdapterState
from common.privacy.release import add_noise, clip
from common.privacy.threat import ThreatModel


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


def private_mean(
    increments: Sequence[AdapterState], threat: ThreatModel, sigma: float, bound: float, expected: float
) -> AdapterState:
    """Mean of clipped client-level releases (DP-FedAvg, McMahan et al. 2018).

    ``local``: each release already carries its own noise, so the server averages the replies.
    ``distributed`` / ``central``: the sum (plus the server's N(0, σ²C²) when ``central``) is divided
    by the expected number of clients ``expected`` = p·N, a constant, so that one client changes the
    released mean by at most C / (p·N) whatever the others did. Under ``central`` noise the server
    clips every reply to ``bound`` = C itself: the sensitivity must not rest on the clients' clip.
    """
    if threat.each_reply_private:
        return weighted_mean(increments, [1.0] * len(increments))
    if threat.clear_replies:
        increments = [clip(inc, bound)[0] for inc in increments]
    total = {name: sum(inc[name] for inc in increments) for name in increments[0]}
    if threat.clear_replies:
        total = add_noise(total, sigma * bound)
    return {name: t / expected for name, t in total.items()}
