"""``fedlora bench {gauge,...,suite}``: each benchmark is a module with ``add_arguments`` and ``run``.

Named here as strings and loaded on demand (common/cli.py ``add_commands``): ``fedlora bench X``
imports X alone, and the client benches need no server code."""

from __future__ import annotations

import argparse
import importlib

#: benchmark -> (module, one-line help); common/cli.py builds one subparser each (``args.bench``)
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "gauge": ("client.bench.gauge", "noise energy of factor-space DP vs PRISM along (cA, B/c)"),
    "prism-step": ("client.bench.prism_step", "step time and peak memory of PRISM vs dp-adamw"),
    "codec": (
        "server.bench.codec",
        "DR-Encoder codecs on real client increments: error, bytes, with/without DP",
    ),
    "compare": (
        "client.bench.compare",
        "DP local optimizers vs non-private: one lr x clip grid on validation, then seeds on test",
    ),
    "subspace": (
        "server.bench.subspace",
        "energy of real client increments kept by a PCA basis fitted on public data vs random projection",
    ),
    "secagg": (
        "server.bench.secagg",
        "secure aggregation's cost: round time against plain dp-fedavg, a client's protocol cost by neighbours",
    ),
    "scale": ("server.bench.scale", "round and per-client time and peak memory at 10 / 100 / 1,000 nodes"),
    "suite": (
        "server.bench.suite.cli",
        "every comparison with fixed seeds: results.json, figures and docs/RESULTS.md",
    ),
}


def run(args: argparse.Namespace) -> int:
    return importlib.import_module(SUBCOMMANDS[args.bench][0]).run(args)
