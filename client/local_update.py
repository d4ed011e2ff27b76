"""A client's local optimisation: non-private AdamW on the mean loss (``none``), or sample-level DP
steps with one of client/dp/optimizers (``prism``, ``dp-adamw``, ``ffa``) through client/dp/engine.py."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import torch
from torch import nn
from tqdm.auto import tqdm

from client.dp.engine import DpSteps, dp_train
from client.dp.optimizers import make_dp_optimizer
from client.dp.sample_plan import SamplePlan
from common.config import RunConfig
from common.models.lora import lora_layers
from common.tasks import Task, sample_batches


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
) -> dict[str, float]:
    """Run ``steps`` steps of ``optimizer`` (AdamW from a fresh state, or plain SGD) on batches of
    ``examples``; returns the mean training loss. ``after_step()`` runs after each step (the
    DR-Encoder statistics)."""
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
        batch = task.collate([examples[i] for i in idx], device)
        loss = task.per_example_loss(model, batch).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.detach())
        if after_step is not None:
            after_step()
    model.eval()
    return {"train-loss": float(torch.stack(losses).mean())}


def local_update(
    model: nn.Module,
    task: Task,
    examples: Sequence[dict],
    cfg: RunConfig,
    *,
    steps: int,
    lr: float,
    seed: int,
    device: torch.device,
    plan: SamplePlan | None,
    before_steps=None,
    block: int = 0,
    desc: str = "local steps",
) -> dict[str, float]:
    """``steps`` steps of ``cfg.optimizer_kind``; a DP optimizer needs the sample-level ``plan``
    (σ, rate, clip) and calls ``before_steps(first, count)`` before each block of steps (the ledger)."""
    kind = cfg.optimizer_kind
    if kind == "none":
        return train_steps(
            model,
            task,
            examples,
            steps=steps,
            batch_size=cfg.batch_size,
            lr=lr,
            seed=seed,
            device=device,
            desc=desc,
            optimizer=cfg.client_optimizer,
        )
    if plan is None:
        raise ValueError(f"local optimizer {kind} needs a sample-level noise plan")
    options = {"floor": cfg.prism_floor} if kind == "prism" else {}
    optimizer = make_dp_optimizer(kind, lora_layers(model), lr, **options)
    dp_plan = DpSteps(steps, plan.sample_rate, plan.clip, plan.sigma, cfg.microbatch_size)
    return dp_train(
        model,
        task,
        examples,
        optimizer,
        dp_plan,
        lr=lr,
        device=device,
        before_steps=before_steps,
        block=block,
        desc=desc,
    )
