"""DR-Encoder statistics on a client (Algorithm 1), answered to a ``query.gradstats`` message.

The client runs the round's local steps from the global adapter (non-private AdamW, as in a train
round) and feeds Algorithm 1 (:mod:`autoencoder.synthetic`) after every step with ``X_t`` = each
factor's increment so far, ``θ_t − θ_0`` in the run's increment form (client/increment.py). The
autoencoder encodes round increments, so these are the statistics of the object it will see (the paper
feeds per-step gradients, whose scale differs from an increment's). The exported moments are debiased (Adam's ``1 − β^t``; after a round's few steps the
raw EMA is shrunk towards 0) and reduced per ``matrix`` or per ``column``.

Privatised statistics: the vector of all exported numbers is clipped to L2 norm ``clip`` and gets
N(0, std²) per number; stds are then folded to ``|std|`` (post-processing). The paper sends them in
the clear; that is ``std = 0``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from autoencoder.synthetic import H1, export_all, pack_stats, track, update_all
from client.increment import increment
from common.models import adapter_state
from common.privacy.mechanisms.release import clip_and_noise
from common.tasks.training import StepSchedule, Trainee, train_steps


def local_stats(
    trainee: Trainee,
    schedule: StepSchedule,
    *,
    factors: Sequence[str],
    granularity: str,
    form: str = "raw",
    floor: float = H1,
) -> Tensor:
    """Moments ``(F, 2, w)`` of ``factors`` (increments in ``form``, Algorithm 1 floor h1 = ``floor``) in
    sorted-name order (:func:`autoencoder.synthetic.pack_stats`) after the clients' local steps
    ``schedule`` (its optimizer adamw or sgd: the increments their train rounds make); the model is
    left trained (a train round reloads the global state)."""
    model = trainee.model
    names = sorted(factors)
    start = {k: adapter_state(model)[k].detach().clone() for k in names}
    stats = track({k: tuple(v.shape) for k, v in start.items()}, floor=floor)

    def record() -> None:
        now = adapter_state(model)
        update_all(stats, increment({k: now[k].detach() for k in start}, start, form))

    train_steps(trainee, schedule, desc="statistics", after_step=record)
    return pack_stats(export_all(stats, granularity, debias=True), names).cpu()


def privatise(moments: Tensor, bound: float, std: float) -> Tensor:
    """``moments (F, 2, w)`` clipped to L2 norm ``bound`` as one vector, plus N(0, std²) on every
    number; the stds (``[:, 1]``) folded to ``|std|``."""
    noised = clip_and_noise({"m": moments}, bound, std)["m"]
    return torch.stack([noised[:, 0], noised[:, 1].abs()], dim=1)


__all__ = ["local_stats", "privatise"]
