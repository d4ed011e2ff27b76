"""A client's local optimisation: non-private AdamW or SGD on the mean loss (``none``,
common/tasks/training.py), or sample-level DP steps with one of client/dp/optimizers (its descriptor in
client/dp/optimizers/registry.py builds it) through client/dp/engine.py."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from client.dp.engine import DpSteps, dp_train
from client.dp.optimizers import dp_optimizer
from client.dp.sample_plan import SamplePlan
from common.config import RunConfig
from common.models.lora import lora_layers
from common.tasks import Task
from common.tasks.training import train_steps


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
    descriptor = dp_optimizer(kind)
    optimizer = descriptor.factory(lora_layers(model), lr, **descriptor.options(cfg, steps))
    dp_plan = DpSteps(
        steps, plan.sample_rate, plan.clip, plan.sigma, cfg.microbatch_size, plan.expected_batch
    )
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
        dense_rule=cfg.client_optimizer,
    )
