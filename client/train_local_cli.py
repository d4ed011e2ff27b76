"""``fedlora train-local``: train one client centrally with a local optimizer and report held-out
accuracy and the sample-level ε its steps spent.

The client's data is the training split of ``--dataset`` (capped at ``--max-train-examples``); the
held-out split is the one the federation evaluates on. σ is calibrated with PLD for ``--sample-epsilon`` at
``--delta`` over ``--local-steps`` Poisson steps of expected size ``--batch-size``. Options have
``fedlora simulate``'s names and meanings (``--sample-clip`` is the per-example clip). The run directory gets
``sample-ledger.sqlite`` (one row per block of steps, charged before the block runs), ``result.json``
and ``adapter.safetensors``; it must not exist yet, so nothing is ever overwritten.

This module is the command line (the printed result; its options, their defaults and the resolved
configuration are common/local_options.py's); it loads no model framework until a run starts
(client/train_local.py trains).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from common.local_options import add_arguments, config_of

__all__ = ["add_arguments", "run"]


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
