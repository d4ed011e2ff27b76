"""``fedlora train-local``: train one client centrally with a local optimizer and report held-out
accuracy and the sample-level ε its steps spent.

The client's data is the training split of ``--dataset`` (capped at ``--max-train-examples``); the
held-out split is the one the federation evaluates on. σ is calibrated with PLD for ``--sample-epsilon`` at
``--delta`` over ``--local-steps`` Poisson steps of expected size ``--batch-size``. Options have
``fedlora simulate``'s names and meanings (``--sample-clip`` is the per-example clip). The run directory gets
``sample-ledger.sqlite`` (one row per block of steps, charged before the block runs), ``result.json``
and ``adapter.safetensors``; it must not exist yet, so nothing is ever overwritten.

This module is the command line (options, their defaults, the resolved configuration, the printed
result); it loads no model framework until a run starts (client/train_local.py trains).
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Sequence
from dataclasses import asdict, fields
from pathlib import Path

from common.config import MECHANISMS, RunConfig
from common.errors import FedloraError
from common.options import add_config_arguments, config_values

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


def local_record(cfg: RunConfig, node: int, validation: int, charge_every: int) -> dict:
    """What a train-local run computes, as its ``config.json`` holds it: the resolved configuration
    and train-local's own options (``fedlora bench suite --adopt`` compares it with a plan's)."""
    values = json.loads(json.dumps(asdict(cfg)))
    return {**values, "train_local": {"node": node, "validation": validation, "charge_every": charge_every}}


def _shard(result: dict) -> str:
    if result["num_clients"] == 1:
        return ""
    return f" (node {result['node']} of {result['num_clients']}, {result['partition']} split)"


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
    cfg = config_of(args)  # refused options answer before the model frameworks load
    from client.train_local import train_local

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
