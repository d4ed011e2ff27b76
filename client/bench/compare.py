"""``fedlora bench compare``: sample-level DP local optimizers against each other and against
non-private fine-tuning, tuned the same way.

Every method gets the same grid (learning rate x clip; the non-private baseline has no clip, so only
its learning rates). Each grid point trains on the training split minus ``--validation`` held-out
examples and is scored on those; the best point per method is then trained on the whole training
split with every ``--seeds`` seed and scored on the test split. Reported per method: the chosen point,
test metric mean ± std over seeds, its starting point (the same adapter before training) and the
sample-level ε (PLD) each run spent. The grid search itself reads the validation examples and is not
accounted: the report says so.
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import time
from pathlib import Path

from client.train_local import train_local
from common.errors import FedloraError
from common.local_options import LOCAL_MECHANISMS, SHARD_OPTIONS, check_node, config_of, local_defaults
from common.options import add_config_arguments

GRID_NOTE = "the grid search reads the validation examples and is not accounted in any epsilon"
TUNED = ("lr", "sample_clip", "seed")


def _floats(text: str) -> list[float]:
    try:
        values = [float(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got '{text}'") from None
    if not values or any(v <= 0 for v in values):
        raise argparse.ArgumentTypeError(f"expected positive numbers, got '{text}'")
    return values


def _ints(text: str) -> list[int]:
    try:
        return [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got '{text}'") from None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    shared = {k: v for k, v in local_defaults().items() if k not in TUNED}
    add_config_arguments(parser, only=list(shared), defaults=shared)
    add = parser.add_argument
    add(
        "--node",
        type=int,
        default=0,
        help="tune on node K's shard of the --num-clients split (a silo's data: its validation examples "
        "carved from that shard); default one node with the whole training split",
    )
    add("--methods", default="prism,dp-adamw,ffa,fedavg", help="comma-separated train-local mechanisms")
    add("--lrs", type=_floats, default=[1e-3, 3e-3], help="learning-rate grid (default 1e-3,3e-3)")
    add("--clips", type=_floats, default=[0.5, 1.0], help="per-example clip grid (default 0.5,1.0)")
    add("--seeds", type=_ints, default=[0, 1, 2], help="test-split seeds of each method's best point")
    add("--validation", type=int, default=500, help="held-out training examples that score the grid")
    add("--out", required=True, help="new directory for every run's directory and results.json")
    add("--json", action="store_true", help="print results.json instead of the table")


def _config(args: argparse.Namespace, method: str, lr: float, clip: float, seed: int):
    one = copy.copy(args)
    one.mechanism, one.lr, one.sample_clip, one.seed = method, lr, clip, seed
    return config_of(one)


def compare(args: argparse.Namespace) -> dict:
    """Run the grid and the seeds into ``args.out``; returns the results record."""
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    unknown = [m for m in methods if m not in LOCAL_MECHANISMS]
    if unknown or not methods:
        raise FedloraError(f"--methods takes {', '.join(LOCAL_MECHANISMS)}; got {args.methods!r}")
    if not args.seeds:
        raise FedloraError("--seeds needs at least one seed")
    if args.validation < 1:
        raise FedloraError(f"--validation must be >= 1 (the grid is scored on it), got {args.validation}")
    out = Path(args.out)
    if out.exists() and any(out.iterdir()):
        raise FedloraError(f"{out} is not empty; bench compare never writes into an existing directory")
    for method in methods:  # every configuration is checked before anything runs
        for lr in args.lrs:
            for clip in args.clips:
                check_node(_config(args, method, lr, clip, args.seeds[0]), args.node)
    start = time.time()
    rows = []
    for method in methods:
        clips = args.clips if method != "fedavg" else args.clips[:1]  # no clip without DP
        grid = []
        for lr in args.lrs:
            for clip in clips:
                cfg = _config(args, method, lr, clip, args.seeds[0])
                name = f"grid/{method}-lr{lr:g}-clip{clip:g}"
                result = train_local(cfg, out / name, validation=args.validation, node=args.node)
                grid.append(
                    {"lr": lr, "clip": clip if method != "fedavg" else None, "score": result[_metric(result)]}
                )
        best = max(grid, key=lambda g: g["score"])
        runs = [
            train_local(
                _config(args, method, best["lr"], best["clip"] or 1.0, seed),
                out / f"test/{method}-s{seed}",
                node=args.node,
            )
            for seed in args.seeds
        ]
        rows.append(_row(method, grid, best, runs))
    results = {
        "methods": rows,
        "settings": {
            "model": args.model,
            "dataset": args.dataset,
            "steps": args.local_steps,
            "batch_size": args.batch_size,
            "sample_epsilon": args.sample_epsilon,
            "delta": args.delta,
            "lrs": args.lrs,
            "clips": args.clips,
            "seeds": args.seeds,
            "validation": args.validation,
            "head_init": args.head_init,
            "pooling": args.pooling,
            "shard": {**{k: getattr(args, k) for k in SHARD_OPTIONS}, "node": args.node},
        },
        "note": GRID_NOTE,
        "wall_time_s": round(time.time() - start, 1),
    }
    (out / "results.json").write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    return results


def _metric(result: dict) -> str:
    return "accuracy" if "accuracy" in result else "perplexity"


def _row(method: str, grid: list[dict], best: dict, runs: list[dict]) -> dict:
    metric = _metric(runs[0])
    scores = [r[metric] for r in runs]
    eps = [r["privacy"]["epsilon"] for r in runs]
    return {
        "method": method,
        "grid": grid,
        "lr": best["lr"],
        "clip": best["clip"],
        "metric": metric,
        "mean": statistics.fmean(scores),
        "std": statistics.stdev(scores) if len(scores) > 1 else 0.0,
        "scores": scores,
        "before": statistics.fmean(r["before"] for r in runs),
        "top_class_share": statistics.fmean(
            r["top_class_share"] for r in runs if r["top_class_share"] is not None
        )
        if any(r["top_class_share"] is not None for r in runs)
        else None,
        "epsilon": None if eps[0] is None else max(eps),
    }


def table(results: dict) -> str:
    """Markdown: one row per method."""
    s = results["settings"]
    lines = [
        f"{s['model']} / {s['dataset']}, {s['steps']} steps of {s['batch_size']}, sample-level target "
        f"epsilon {s['sample_epsilon']:g} at delta {s['delta']:g} (PLD), seeds {s['seeds']}; "
        f"grid lr {s['lrs']} x clip {s['clips']} on {s['validation']} validation examples ({results['note']}).",
        "",
        "| method | lr | clip | before | test (mean ± std) | top-class share | epsilon (PLD) |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in results["methods"]:
        eps = "none (not private)" if r["epsilon"] is None else f"{r['epsilon']:.3g}"
        top = "" if r["top_class_share"] is None else f"{r['top_class_share']:.3f}"
        clip = "" if r["clip"] is None else f"{r['clip']:g}"
        lines.append(
            f"| {r['method']} | {r['lr']:g} | {clip} | {r['before']:.4f} | {r['mean']:.4f} ± {r['std']:.4f} | "
            f"{top} | {eps} |"
        )
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    results = compare(args)
    print(json.dumps(results) if args.json else table(results))
    return 0
