"""The training behind ``fedlora train-local`` (its command line: client/train_local_cli.py): one
client's local (DP) optimizer steps over its shard, charged to its sample-level ledger block by
block, evaluated before and after, written to a new run directory."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from safetensors.torch import save_file
from torch import nn

from client.dp.engine import StepBlocks
from client.dp.optimizers import dp_optimizer
from client.dp.sample_plan import SAMPLE_ACCOUNTANT, SamplePlan, plan_sample_noise
from client.local_update import local_update
from common.atomic import replacing
from common.config import RunConfig
from common.data.federated import FederatedSplit
from common.errors import FedloraError
from common.local_options import check_node, local_record
from common.models import adapter_state
from common.models.dense_delta import dense_deltas
from common.models.loader import ModelBundle
from common.models.lora import lora_layers, lora_norm
from common.privacy.accounting.ledger import Ledger
from common.privacy.mechanisms.release import global_norm
from common.provenance import made
from common.runtime import base_precision, initial_adapter, open_model, open_split
from common.tasks import make_task
from common.tasks.base import Task
from common.tasks.training import Trainee

LEDGER_FILE = "sample-ledger.sqlite"


def train_local(
    cfg: RunConfig, out: Path, charge_every: int = 25, validation: int = 0, node: int = 0
) -> dict:
    """Train node ``node`` of ``cfg``'s split (one node: the whole training split) into the new
    directory ``out``; returns the result record. ``validation`` > 0: that many of its training
    examples are held out and evaluated instead of the test split."""
    if out.exists() and any(out.iterdir()):
        raise FedloraError(f"{out} is not empty; train-local never writes into an existing run")
    if charge_every < 1:
        raise FedloraError("charge-every must be >= 1")
    check_node(cfg, node)
    start = time.time()
    bundle, split, task = open_local(cfg)
    model, device = bundle.model, bundle.device
    pool, held_out = _split_validation(split.clients[node], validation, cfg.seed)
    train = task.encode(split.texts(pool), split.labels(pool))
    held_out = held_out if validation else split.test
    test = task.encode(split.texts(held_out), split.labels(held_out))
    before = task.evaluate(model, test, device, batch_size=32)
    kind = cfg.optimizer_kind
    plan = local_plan(cfg, model, len(train))  # before anything is written
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(
        json.dumps(local_record(cfg, node, validation, charge_every), indent=2) + "\n", encoding="utf-8"
    )
    ledger = Ledger.create(out / LEDGER_FILE, "sample-level", f"{cfg.dataset}/train-local", cfg.delta)
    try:

        def charge(first: int, count: int) -> None:
            ledger.charge(plan.charge(out.name, first // charge_every + 1, count, kind))

        # Its stats stay unpublished: under DP, ``examples-used`` and ``empty-batches`` are realised Poisson
        # batch sizes, which depend on the private data and are not covered by the sample-level guarantee.
        trained = time.time()
        stats = train_one(cfg, bundle, task, train, plan, StepBlocks(charge, charge_every) if plan else None)
        train_seconds = time.time() - trained
        for row in ledger.rows():
            ledger.settle(row["run"], row["round"], "applied")
        privacy = ledger.report()
    finally:
        ledger.close()
    metrics = task.evaluate(model, test, device, batch_size=32)
    deltas = dense_deltas(model)  # a dense update (wishart, sparta-base), else empty
    result = {
        "mechanism": kind,
        "model": cfg.model,
        "dataset": cfg.dataset,
        "seed": cfg.seed,
        "init": cfg.init_kind,
        "node": node,
        "num_clients": cfg.num_clients,
        "partition": cfg.partition,
        "examples": len(train),
        "eval_split": "validation" if validation else "test",
        "eval_examples": len(test),
        "pooling": cfg.pooling,
        "head_init": cfg.head_init,
        "precision": base_precision(cfg, device),  # the frozen base's, as resolved on this machine
        **step_settings(cfg, plan),
        "before": before[task.metric],
        task.metric: metrics[task.metric],
        "top_class_share": metrics.get("top_class_share"),
        "train_seconds": round(train_seconds, 1),
        # planned, not realised: realised Poisson batch sizes depend on the private data
        "examples_per_second": round(cfg.local_steps * cfg.batch_size / max(train_seconds, 1e-9), 2),
        "lora_norm": lora_norm(model),
        **({"dense_norm": global_norm(deltas)} if deltas else {}),  # wishart, sparta-base
        **(dp_optimizer(kind).report(cfg, stats) if plan else {}),  # e.g. prism's floor, sparta's rows
        "privacy": _privacy(plan, privacy, cfg.delta, validation, stats.get("assumptions")),
        "seconds": round(time.time() - start, 1),
        "made": made(),  # when, at which commit and where (a report that adopts the run names it)
    }
    saved = {**adapter_state(model), **{f"{name}.delta": d for name, d in deltas.items()}}
    with replacing(out / "adapter.safetensors") as tmp:
        save_file(saved, str(tmp))
    (out / "result.json").write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    return result


def open_local(cfg: RunConfig) -> tuple[ModelBundle, FederatedSplit, Task]:
    """The model (its run's starting adapter set), ``cfg``'s split and the task."""
    split = open_split(cfg)
    bundle = open_model(cfg, split)
    initial_adapter(cfg, bundle, split)  # the bundle is shared per process: start from its load state
    return bundle, split, make_task(bundle, split.corpus, cfg.max_length, cfg.lm_blocks)


def local_plan(cfg: RunConfig, model: nn.Module, examples: int) -> SamplePlan | None:
    """The sample-level noise plan for ``cfg``'s local steps over ``examples`` examples (None:
    non-private); the optimizer's descriptor checks ``model`` (SPARTA's row count) and gives the
    accountant's projection (wishart)."""
    if cfg.optimizer_kind == "none":
        return None
    descriptor, layers = dp_optimizer(cfg.optimizer_kind), lora_layers(model)
    descriptor.check_model(layers, cfg)
    projection = descriptor.projection(layers, cfg)
    return plan_sample_noise(
        examples,
        cfg.batch_size,
        cfg.local_steps,
        cfg.sample_clip,
        cfg.delta,
        cfg.sample_epsilon,
        cfg.sample_noise_multiplier,
        projection,
    )


def train_one(
    cfg: RunConfig,
    bundle: ModelBundle,
    task: Task,
    train: list[dict],
    plan: SamplePlan | None,
    blocks: StepBlocks | None = None,
) -> dict[str, float]:
    """``cfg``'s local steps (its steps, lr and seed) on ``train`` with ``plan``: the one client's
    training; ``blocks`` go to :func:`local_update` (the ledger's charge before each block)."""
    return local_update(
        Trainee(bundle.model, task, train, bundle.device),
        cfg,
        plan,
        seed=cfg.seed,
        blocks=blocks,
        desc=f"local {cfg.optimizer_kind}",
    )


def step_settings(cfg: RunConfig, plan: SamplePlan | None) -> dict:
    """The local steps' settings a result reports (clip, rate and σ are None when non-private)."""
    return {
        "steps": cfg.local_steps,
        "batch_size": cfg.batch_size,
        "lr": cfg.lr,
        "clip": cfg.sample_clip if plan else None,
        "sample_rate": plan.sample_rate if plan else None,
        "noise_multiplier": plan.sigma if plan else None,
    }


def _split_validation(pool: Sequence[int], count: int, seed: int) -> tuple[list[int], list[int]]:
    """``pool`` without ``count`` seeded examples, and those examples (``count`` = 0: all, none)."""
    if count < 0 or count >= len(pool):
        raise FedloraError(f"--validation must be in [0, {len(pool)}) (the training examples), got {count}")
    order = np.random.default_rng([seed, 7]).permutation(len(pool))
    kept = sorted(int(i) for i in order[count:])
    held = sorted(int(i) for i in order[:count])
    return [pool[i] for i in kept], [pool[i] for i in held]


def _privacy(plan, report: dict, delta: float, validation: int, assumptions: dict | None = None) -> dict:
    if plan is None:
        return {"unit": "sample-level", "epsilon": None, "note": "non-private: no guarantee"}
    outside = ["wall times (they depend on the realised batch sizes)"]
    if validation:
        outside.append(f"the validation metrics (computed on {validation} of the client's own examples)")
    if plan.projection is not None:
        return {"not_covered": outside, **_wishart_privacy(plan, report, assumptions)}
    return {
        "not_covered": outside,
        "unit": "sample-level (add/remove one of this client's examples)",
        "threat_model": "the client's noisy steps and the adapter they produce are public",
        "accountant": f"{SAMPLE_ACCOUNTANT} (tight); CLT mu-GDP beside it",
        "delta": delta,
        "target_epsilon": plan.target_epsilon or None,
        "epsilon": report["eps_tight"],
        "eps_gdp": report["eps_gdp"],
        "mu": report["mu"],
    }


def _wishart_privacy(plan: SamplePlan, report: dict, assumptions: dict | None) -> dict:
    """The amplified ε if this run met every M2 assumption, else the ledger's baseline, with why."""
    amplified = plan.amplified
    epsilon, claim = plan.claimed_epsilon(assumptions)
    return {
        "unit": "sample-level (add/remove one of this client's examples)",
        "threat_model": "the client's noisy projected steps and the dense update they produce are public",
        "accountant": "wishart (Thm 5 amplification, pld inside); the ledger holds the unamplified pld bound",
        "delta": amplified.delta,
        "epsilon": epsilon,
        "claim": claim,
        "epsilon_baseline": report["eps_tight"],
        "eps_gdp": report["eps_gdp"],
        "mu": report["mu"],
        "wishart": amplified.as_dict(),
    }
