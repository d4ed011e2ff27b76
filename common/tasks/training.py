"""Non-private local training: the clients' recipe (and the server's, on public data)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn
from tqdm.auto import tqdm

from common.config import RunConfig
from common.tasks.base import Task, by_length, chunks, sample_batches


@dataclass(frozen=True)
class Trainee:
    """What local steps train, on what and where (the non-private steps here, the DP steps of
    client/dp/engine.py, the DR-Encoder statistics of client/drencoder/gradstats.py).

    model: the model; its trainable parameters (``requires_grad``) are updated in place.
    task: collates examples into a batch on ``device`` and gives the per-example loss.
    examples: the training examples (the task's encoded dicts), drawn by index.
    device: the model's device, where every batch is placed.
    """

    model: nn.Module
    task: Task
    examples: Sequence[dict]
    device: torch.device


@dataclass(frozen=True)
class StepSchedule:
    """Non-private local steps: ``steps`` steps of ``optimizer`` (``adamw``: AdamW from a fresh
    state, no weight decay; ``sgd``: plain SGD) at learning rate ``lr``, each on ``batch_size``
    examples (at most all of them) drawn by :func:`common.tasks.base.sample_batches` from ``seed``
    (which also seeds torch), computed in length-sorted micro-batches of ``microbatch`` examples."""

    steps: int
    batch_size: int
    lr: float
    seed: int
    optimizer: str = "adamw"
    microbatch: int = 32

    @classmethod
    def of(cls, cfg: RunConfig, seed: int) -> StepSchedule:
        """The clients' local recipe of ``cfg`` (its local steps, batch size, lr,
        ``--client-optimizer`` and ``--microbatch``, 0 keeping the default) from ``seed``."""
        microbatch = cfg.microbatch or cls.microbatch
        return cls(cfg.local_steps, cfg.batch_size, cfg.lr, seed, cfg.client_optimizer, microbatch)


def train_steps(
    trainee: Trainee,
    schedule: StepSchedule,
    *,
    desc: str = "local steps",
    after_step: Callable[[], None] | None = None,
) -> dict[str, float]:
    """Run ``schedule`` on ``trainee``; returns the mean training loss. ``after_step()`` runs after
    each step (the DR-Encoder statistics). A batch is computed in length-sorted pieces of
    ``schedule.microbatch`` examples (the same gradient as one padded batch, less padding and memory)."""
    model, examples, s = trainee.model, trainee.examples, schedule
    opt = step_optimizer([p for p in model.parameters() if p.requires_grad], s)
    rng = np.random.default_rng(s.seed)
    torch.manual_seed(s.seed)
    model.train()
    losses = []
    batches = sample_batches(len(examples), min(s.batch_size, len(examples)), s.steps, rng)
    for idx in tqdm(batches, total=s.steps, desc=desc, leave=False, disable=None):
        opt.zero_grad(set_to_none=True)
        losses.append(mean_loss_backward(model, trainee.task, examples, idx, trainee.device, s.microbatch))
        opt.step()
        if after_step is not None:
            after_step()
    model.eval()
    return {"train-loss": float(torch.stack(losses).mean())}


def step_optimizer(params: Sequence[torch.Tensor], schedule: StepSchedule) -> torch.optim.Optimizer:
    """``schedule``'s update rule over ``params``: plain SGD, or AdamW from a fresh state without
    weight decay (both elementwise: over parameters stacked for a cohort, each client's own)."""
    if schedule.optimizer == "sgd":
        return torch.optim.SGD(params, lr=schedule.lr)
    return torch.optim.AdamW(params, lr=schedule.lr, weight_decay=0.0)


def mean_loss_backward(
    model: nn.Module, task: Task, examples: Sequence[dict], idx: Sequence[int], device, microbatch: int
) -> torch.Tensor:
    """Accumulate the gradient of the batch's mean loss over length-sorted micro-batches of ``idx``;
    returns that mean loss (detached)."""
    total = torch.zeros((), device=device)
    for part in chunks(by_length(list(idx), examples), microbatch):
        batch = task.collate([examples[i] for i in part], device)
        loss = task.per_example_loss(model, batch).sum() / len(idx)
        loss.backward()
        total += loss.detach()
    return total


__all__ = ["StepSchedule", "Trainee", "mean_loss_backward", "step_optimizer", "train_steps"]
