"""A client's local optimisation: non-private AdamW or SGD on the mean loss (``none``,
common/tasks/training.py), or sample-level DP steps with one of client/dp/optimizers (its descriptor in
client/dp/optimizers/registry.py builds it) through client/dp/engine.py."""

from __future__ import annotations

from client.dp.engine import DenseUpdate, DpSteps, StepBlocks, dp_train
from client.dp.optimizers import dp_optimizer
from client.dp.sample_plan import SamplePlan
from common.config import RunConfig
from common.models.lora import lora_layers
from common.tasks.training import StepSchedule, Trainee, train_steps


def local_update(
    trainee: Trainee,
    cfg: RunConfig,
    plan: SamplePlan | None,
    *,
    seed: int,
    blocks: StepBlocks | None = None,
    desc: str = "local steps",
) -> dict[str, float]:
    """``cfg.local_steps`` steps of ``cfg.optimizer_kind`` at ``cfg.lr`` on ``trainee``: non-private
    ones from ``seed`` (:meth:`StepSchedule.of`); a DP optimizer needs the sample-level ``plan``
    (σ, rate, clip), draws its randomness from the OS and calls ``blocks.before(first, count)``
    before each block of steps (the ledger)."""
    kind = cfg.optimizer_kind
    if kind == "none":
        return train_steps(trainee, StepSchedule.of(cfg, seed), desc=desc)
    if plan is None:
        raise ValueError(f"local optimizer {kind} needs a sample-level noise plan")
    steps, lr = cfg.local_steps, cfg.lr
    descriptor = dp_optimizer(kind)
    optimizer = descriptor.factory(lora_layers(trainee.model), lr, **descriptor.options(cfg, steps))
    dp_plan = DpSteps(
        steps,
        plan.sample_rate,
        plan.clip,
        plan.sigma,
        cfg.microbatch_size,
        plan.expected_batch,
        fit_memory=cfg.microbatch == 0,  # no --microbatch: on CUDA, what free memory holds
    )
    dense = DenseUpdate(lr, cfg.client_optimizer)
    return dp_train(trainee, optimizer, dp_plan, dense, blocks=blocks, desc=desc)
