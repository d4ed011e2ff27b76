"""Non-private local training: the clients' recipe (and the server's, on public data)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import torch
from torch import nn
from tqdm.auto import tqdm

from common.tasks.base import Task, by_length, chunks, sample_batches


def train_steps(
    model: nn.Module,
    task: Task,
    examples: Sequence[dict],
    *,
    steps: int,
    batch_size: int,
    lr: float,
    seed: int,
    device: torch.device,
    desc: str = "local steps",
    after_step: Callable[[], None] | None = None,
    optimizer: str = "adamw",
    microbatch: int = 32,
) -> dict[str, float]:
    """Run ``steps`` steps of ``optimizer`` (AdamW from a fresh state, or plain SGD) on batches of
    ``examples``; returns the mean training loss. ``after_step()`` runs after each step (the
    DR-Encoder statistics). A batch is computed in length-sorted pieces of ``microbatch`` examples
    (the same gradient as one padded batch, less padding and memory)."""
    params = [p for p in model.parameters() if p.requires_grad]
    if optimizer == "sgd":
        opt = torch.optim.SGD(params, lr=lr)
    else:
        opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    rng = np.random.default_rng(seed)
    torch.manual_seed(seed)
    model.train()
    losses = []
    batches = sample_batches(len(examples), min(batch_size, len(examples)), steps, rng)
    for idx in tqdm(batches, total=steps, desc=desc, leave=False, disable=None):
        opt.zero_grad(set_to_none=True)
        losses.append(mean_loss_backward(model, task, examples, idx, device, microbatch))
        opt.step()
        if after_step is not None:
            after_step()
    model.eval()
    return {"train-loss": float(torch.stack(losses).mean())}


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


__all__ = ["mean_loss_backward", "train_steps"]
