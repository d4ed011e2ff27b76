"""Sample-level DP local steps on LoRA: Poisson sampling of examples, micro-batched per-example
gradients, one global clip per example, noise on the clipped sum, an optimizer step.

Per step (DP-SGD, Abadi et al. 2016, as Opacus runs it): each example is included independently with
probability ``q`` (a step may draw none: it still releases noise, as the accountant assumes); the
logical batch, in order of length (less padding), is split into micro-batches of at most ``microbatch``
examples; per-example gradients of the LoRA factors and of dense trainables (a classifier head) come from client/dp/grad_sample.py; each
example's whole contribution is clipped to ``C``; the sums get ``N(0, σ²C²)`` noise and are divided by
the expected batch size ``qN``. Dense trainables always take factor-space DP with AdamW; the LoRA
factors go to the chosen optimizer (client/dp/optimizers). DP randomness (sampling and noise) comes from
the OS, never from the run's seed; tests may pass their own generators.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor, nn
from tqdm.auto import tqdm

from client.dp.grad_sample import GradSampler
from client.dp.microbatch import Microbatches
from client.dp.optimizers import LoraDpOptimizer, update_rule
from client.dp.prism import clip_coefficients
from common.models.lora import dense_trainables
from common.tasks.training import Trainee

log = logging.getLogger("fedlora.client")


@dataclass(frozen=True)
class DpSteps:
    """``steps`` DP steps at Poisson rate ``sample_rate`` with per-example clip ``clip`` and noise
    multiplier ``noise_multiplier`` (noise std ``σC`` on the sum). ``expected_batch``: the divisor of
    the noised sum, q·N for the N the noise was planned for (0: q times the examples trained on).
    ``microbatch``: examples per forward/backward; ``fit_memory``: on CUDA, raised after the first
    to what the device's free memory holds (client/dp/microbatch.py; no effect on the CPU).
    An audit that adds canaries plans for every canary, so the divisor, like q and σ, must not
    depend on which ones were included."""

    steps: int
    sample_rate: float
    clip: float
    noise_multiplier: float
    microbatch: int = 16
    expected_batch: float = 0.0
    fit_memory: bool = False


@dataclass(frozen=True)
class DenseUpdate:
    """How DP steps move the dense trainables (a classification head), which every LoRA optimizer
    leaves to the engine: factor-space DP, then ``rule`` (``adamw`` or ``sgd``,
    client/dp/optimizers.update_rule) at learning rate ``lr``."""

    lr: float
    rule: str = "adamw"


@dataclass(frozen=True)
class StepBlocks:
    """DP steps run in blocks of ``size`` steps (0: all in one block); ``before(first, count)`` is
    called before each block with its first step (0-based) and its number of steps: the caller
    charges its ledger there, before the steps release anything."""

    before: Callable[[int, int], None]
    size: int = 0


def poisson_batch(n: int, q: float, rng: np.random.Generator) -> np.ndarray:
    """Indices of ``range(n)``, each kept independently with probability ``q`` (may be empty)."""
    return np.flatnonzero(rng.random(n) < q)


def os_rngs(device: torch.device) -> tuple[np.random.Generator, torch.Generator]:
    """Sampling and noise generators seeded from OS entropy."""
    noise = torch.Generator(device=device).manual_seed(secrets.randbits(63))
    return np.random.default_rng(secrets.randbits(128)), noise


class _DenseDp:
    """Factor-space DP + AdamW (or SGD) for dense trainables (shared by every LoRA optimizer)."""

    def __init__(self, model: nn.Module, lr: float, rule: str = "adamw") -> None:
        self.params = dense_trainables(model)
        self.opt = update_rule(rule, self.params.values(), lr) if self.params else None
        self.sums: dict[str, Tensor] = {}

    def begin(self) -> None:
        self.sums = {k: torch.zeros_like(p) for k, p in self.params.items()}

    def accumulate(self, grads: dict[str, Tensor], alpha: Tensor) -> None:
        for k, g in grads.items():
            self.sums[k] += torch.einsum("b,b...->...", alpha.to(g.dtype), g)

    def step(self, noise_std: float, denom: float, generator: torch.Generator) -> None:
        if self.opt is None:
            return
        for k, p in self.params.items():
            noise = torch.randn(p.shape, generator=generator, dtype=p.dtype, device=p.device)
            p.grad = (self.sums[k] + noise_std * noise) / denom
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)


def dp_train(
    trainee: Trainee,
    optimizer: LoraDpOptimizer,
    plan: DpSteps,
    dense: DenseUpdate,
    *,
    rngs: tuple[np.random.Generator, torch.Generator] | None = None,
    blocks: StepBlocks | None = None,
    desc: str = "DP steps",
) -> dict[str, float]:
    """Run ``plan.steps`` DP steps on ``trainee``; returns ``steps``, ``examples-used`` and
    ``empty-batches``. ``optimizer`` moves the LoRA factors, ``dense`` the dense trainables;
    ``blocks``: a call before each block of steps (None: none)."""
    model, task, examples, device = trainee.model, trainee.task, trainee.examples, trainee.device
    if len(examples) == 0:
        raise ValueError("no training examples")
    rng, generator = rngs or os_rngs(device)
    dense_dp = _DenseDp(model, dense.lr, dense.rule)
    denom = plan.expected_batch or plan.sample_rate * len(examples)  # expected batch size
    noise_std = plan.noise_multiplier * plan.clip
    used, empty = 0, 0
    block = (blocks.size if blocks else 0) or plan.steps
    layer_io = getattr(optimizer, "needs_layer_io", False)  # wishart: inputs and output gradients
    trains_dense = getattr(optimizer, "trains_dense", True)
    cuts = Microbatches(plan.microbatch, examples, device, plan.fit_memory)
    model.train()
    with GradSampler(model, layer_io=layer_io) as sampler:
        for step in tqdm(range(plan.steps), desc=desc, leave=False, disable=None):
            if blocks is not None and step % block == 0:
                blocks.before(step, min(block, plan.steps - step))
            idx = poisson_batch(len(examples), plan.sample_rate, rng)
            selecting = getattr(optimizer, "selecting", False)
            optimizer.begin()
            dense_dp.begin()
            for part in cuts.parts(idx):
                batch = task.collate([examples[i] for i in part], device)
                task.per_example_loss(model, batch).sum().backward()
                grads = sampler.layer_io() if layer_io else sampler.factor_grads()
                dense_grads = sampler.dense_grads() if trains_dense else {}
                model.zero_grad(set_to_none=True)
                sq = optimizer.sq_norms(grads)
                for g in dense_grads.values():
                    sq = sq + g.flatten(1).square().sum(1)
                alpha = clip_coefficients([sq], plan.clip)
                optimizer.accumulate(grads, alpha)
                dense_dp.accumulate(dense_grads, alpha)
            optimizer.step(noise_std, denom, generator)
            if trains_dense and not selecting:  # SPARTA's selection steps move nothing, the head included
                dense_dp.step(noise_std, denom, generator)
            used += len(idx)
            empty += len(idx) == 0
    model.eval()
    if empty:
        log.warning(
            "%d of %d steps drew no examples (Poisson rate %.3g): they released noise only, as accounted",
            empty,
            plan.steps,
            plan.sample_rate,
        )
    summary = getattr(optimizer, "summary", dict)()  # e.g. SPARTA's kept rows (post-processing)
    return {"steps": plan.steps, "examples-used": used, "empty-batches": empty, **summary}
