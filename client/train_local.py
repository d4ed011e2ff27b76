"""``fedlora train-local``: train one client centrally with a local optimizer and report held-out
accuracy and the sample-level ε its steps spent.

The client's data is the training split of ``--dataset`` (capped at ``--max-train-examples``); the
held-out split is the one the federation evaluates on. σ is calibrated with PLD for ``--sample-epsilon`` at
``--delta`` over ``--local-steps`` Poisson steps of expected size ``--batch-size``. Options have
``fedlora simulate``'s names and meanings (``--sample-clip`` is the per-example clip). The run directory gets
``sample-ledger.sqlite`` (one row per block of steps, charged before the block runs), ``result.json``
and ``adapter.safetensors``; it must not exist yet, so nothing is ever overwritten.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Sequence
from dataclasses import asdict, fields
from pathlib import Path

import numpy as np
from safetensors.torch import save_file
from torch import nn

from client.dp.engine import StepBlocks
from client.dp.optimizers import dp_optimizer
from client.dp.sample_plan import SAMPLE_ACCOUNTANT, SamplePlan, plan_sample_noise
from client.local_update import local_update
from common.config import MECHANISMS, RunConfig
from common.data.federated import FederatedSplit
from common.errors import FedloraError
from common.models import adapter_state
from common.models.dense_delta import dense_deltas
from common.models.loader import ModelBundle
from common.models.lora import lora_layers, lora_norm
from common.options import add_config_arguments, config_values
from common.privacy.ledger import Ledger
from common.privacy.release import global_norm
from common.provenance import made
from common.runtime import initial_adapter, open_model, open_split
from common.tasks import make_task
from common.tasks.base import Task
from common.tasks.training import Trainee

LEDGER_FILE = "sample-ledger.sqlite"
#: mechanisms train-local runs: those without a client-level release (fedavg: non-private AdamW)
LOCAL_MECHANISMS = tuple(m for m, (_, release) in MECHANISMS.items() if release == "none")
#: the options train-local takes (``simulate``'s names and meanings)
LOCAL_OPTIONS = (
    "model",
    "dataset",
    "sample_epsilon",
    "sample_noise_multiplier",
    "delta",
    "local_steps",
    "batch_size",
    "microbatch",
    "sample_clip",
    "lr",
    "client_optimizer",
    "rank",
    "lora_alpha",
    "lora_init",
    "targets",
    "pooling",
    "head_init",
    "prism_floor",
    "sparta_keep",
    "sparta_selection",
    "max_train_examples",
    "eval_examples",
    "num_clients",
    "partition",
    "dirichlet_alpha",
    "max_length",
    "lm_blocks",
    "partition_by",
    "users_per_client",
    "seed",
    "device",
)
#: train-local's own defaults, only where they differ from :class:`RunConfig`'s (one client trained
#: centrally on its whole split, not a federation); every other option keeps its declared default
LOCAL_DEFAULTS: dict[str, object] = {
    "model": "minilm-l6",
    "sample_epsilon": 3.0,
    "local_steps": 100,
    "batch_size": 32,
    "lr": 1e-3,
    "lora_init": None,  # unset: by mechanism (RunConfig.init_kind), no "(default ...)" in --help
    "eval_examples": 500,
    "num_clients": 1,  # with "partition" (SHARD_OPTIONS): one node, the whole split (--node picks one)
    "partition": "iid",
}


def local_defaults(options: Sequence[str] = LOCAL_OPTIONS) -> dict[str, object]:
    """The effective default of each of ``options`` (all of train-local's by default):
    :data:`LOCAL_DEFAULTS`, else the one :class:`RunConfig` declares."""
    declared = {f.name: f.default for f in fields(RunConfig)}
    return {name: LOCAL_DEFAULTS.get(name, declared[name]) for name in options}


#: the options that pick one node's shard of a federation's split (``--node``)
SHARD_OPTIONS = ("num_clients", "partition", "dirichlet_alpha", "partition_by", "users_per_client")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_config_arguments(
        parser, only=[*LOCAL_OPTIONS, "mechanism"], defaults=local_defaults(), required=["mechanism"]
    )
    add = parser.add_argument
    add("--charge-every", type=int, default=25, help="steps per ledger row")
    add(
        "--node",
        type=int,
        default=0,
        help="train only node K's shard of the --num-clients split (0-based; what that node reaches alone, "
        "evaluated on the federation's test set)",
    )
    add(
        "--validation",
        type=int,
        default=0,
        help="hold out this many training examples (seeded, never trained on) and evaluate on them "
        "instead of the test split: for choosing hyper-parameters (0 = evaluate on the test split)",
    )
    add("--out", default=None, help="run directory (default runs/local-<time>-<mechanism>-<model>)")
    add("--json", action="store_true", help="print the result as one JSON object")


def config_of(args: argparse.Namespace) -> RunConfig:
    """One client's training with the given options (by default one node with the whole training
    split); ``--sample-noise-multiplier`` replaces the ``--sample-epsilon`` calibration."""
    values = local_defaults(SHARD_OPTIONS)  # callers without the shard options (bench compare)
    values.update({k: v for k, v in config_values(args).items() if v is not None})
    if values["mechanism"] not in LOCAL_MECHANISMS:
        raise FedloraError(
            f"train-local runs {', '.join(LOCAL_MECHANISMS)} (no client-level release), not {values['mechanism']}"
        )
    if MECHANISMS[values["mechanism"]][0] == "none" or values["sample_noise_multiplier"]:
        values["sample_epsilon"] = 0.0
    if MECHANISMS[values["mechanism"]][0] == "none":
        values["sample_noise_multiplier"] = 0.0
    return RunConfig(**values).check()


def check_node(cfg: RunConfig, node: int) -> None:
    """Refuse a ``--node`` outside the ``--num-clients`` split (one line)."""
    if not 0 <= node < cfg.num_clients:
        raise FedloraError(
            f"--node must be in [0, {cfg.num_clients}) (--num-clients {cfg.num_clients}), got {node}"
        )


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
    save_file(saved, str(out / "adapter.safetensors.tmp"))
    os.replace(out / "adapter.safetensors.tmp", out / "adapter.safetensors")
    (out / "result.json").write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    return result


def local_record(cfg: RunConfig, node: int, validation: int, charge_every: int) -> dict:
    """What a train-local run computes, as its ``config.json`` holds it: the resolved configuration
    and train-local's own options (``fedlora bench suite --adopt`` compares it with a plan's)."""
    values = json.loads(json.dumps(asdict(cfg)))
    return {**values, "train_local": {"node": node, "validation": validation, "charge_every": charge_every}}


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


def _shard(result: dict) -> str:
    if result["num_clients"] == 1:
        return ""
    return f" (node {result['node']} of {result['num_clients']}, {result['partition']} split)"


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


def _print(result: dict) -> None:
    p = result["privacy"]
    metric = "accuracy" if "accuracy" in result else "perplexity"
    print(
        f"train-local {result['mechanism']} on {result['model']} / {result['dataset']}{_shard(result)}: "
        f"N = {result['examples']}, {result['steps']} steps, batch {result['batch_size']}, lr {result['lr']:g}"
    )
    print(
        f"{result['eval_split']} {metric}: {result['before']:.4f} before -> {result[metric]:.4f} after "
        f"({result['eval_examples']} examples); {result['examples_per_second']:g} examples/s "
        f"({result['steps'] * result['batch_size']} planned in {result['train_seconds']:g} s)"
    )
    if "sparta" in result:
        s = result["sparta"]
        where = "base-weight" if s["rows_of"] == "base" else "LoRA"
        print(
            f"sparta: {s['selection_steps']} selection steps, {s['kept_coordinates']} of "
            f"{s[s['rows_of'] + '_coordinates']} {where} coordinates trained (keep {s['keep']:g} rows per "
            f"{'layer' if s['rows_of'] == 'base' else 'factor'})"
        )
    if p["epsilon"] is None:
        print("sample-level privacy: none (non-private AdamW)")
    elif "wishart" in p:
        print(
            f"sample-level epsilon = {p['epsilon']:.3f} ({p['claim']}); unamplified (PLD, as in the ledger) "
            f"{p['epsilon_baseline']:.3f}; delta = {p['delta']:g}, sigma = {result['noise_multiplier']:.4f}, "
            f"q = {result['sample_rate']:.4g}, C = {result['clip']:g}"
        )
    else:
        print(
            f"sample-level epsilon = {p['epsilon']:.3f} (PLD, delta = {p['delta']:g}; CLT mu-GDP "
            f"{p['eps_gdp']:.3f}), sigma = {result['noise_multiplier']:.4f}, q = {result['sample_rate']:.4g}, "
            f"C = {result['clip']:g}"
        )


def run(args: argparse.Namespace) -> int:
    cfg = config_of(args)
    out = (
        Path(args.out)
        if args.out
        else Path("runs")
        / (f"local-{time.strftime('%Y%m%d-%H%M%S')}-{args.mechanism}-{cfg.model.replace('/', '_')}")
    )
    result = train_local(cfg, out, args.charge_every, args.validation, args.node)
    if args.json:
        print(json.dumps(result))
    else:
        _print(result)
        print(f"run directory: {out}")
    return 0
