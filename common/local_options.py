"""``fedlora train-local``'s options: which :class:`RunConfig` fields one client trained centrally
takes, their defaults, the configuration they resolve to and the record a run keeps of it.

The option schema sits here, below both packages, because the command (client/train_local_cli.py),
``fedlora bench compare`` and the bench suite's adoption of stored runs (server/bench/suite/adopt.py)
all read it: no model framework is loaded."""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from dataclasses import asdict, fields

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
