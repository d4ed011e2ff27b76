"""``fedlora evaluate``: score a finished run's global adapter again on its held-out split, on as many
held-out examples as asked (``--eval-examples``: more than the split holds scores all of them), the
same way the run scored it (server/evaluation.py, with the run's stored configuration).

What a run reports is scored on a seeded subset of its held-out examples (``--eval-examples`` of the
run); this scores the same adapter on a larger or fixed set, e.g. every held-out item of the
multiple-choice benchmark, the same for every seed and every arm. ``--base`` scores round 0's adapter
instead: LoRA starts with B = 0, so that is the base model, whatever the seed. Reading the released
adapter is post-processing: it costs no privacy budget. The run directory is only read.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict
from pathlib import Path

from common.config import PRECISIONS
from common.errors import FedloraError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--run", required=True, help="a finished run directory (config.json, checkpoint)")
    parser.add_argument(
        "--eval-examples",
        type=int,
        default=None,
        help="held-out examples to score (default: the run's; a number above the held-out split's size "
        "scores every held-out example, the same set whatever the run's seed)",
    )
    parser.add_argument(
        "--base", action="store_true", help="score round 0's adapter (the base model) instead of the run's"
    )
    parser.add_argument(
        "--precision",
        choices=PRECISIONS,
        default=None,
        help="the frozen base's precision while scoring (default: the run's); fp32 keeps bf16's rounding "
        "of the log-likelihoods (about 0.08 nats an item) from flipping near ties between options",
    )
    parser.add_argument("--eval-cache", default="", help="read and write evaluations here (as simulate's)")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of lines")


def _stored(run_dir: Path):
    """The run's stored :class:`RunConfig` (one clear error when it is not a finished run)."""
    from server.checkpoint import CHECKPOINT_FILE
    from server.simulate_cli import stored_config

    if not (run_dir / "config.json").is_file() or not (run_dir / CHECKPOINT_FILE).is_file():
        raise FedloraError(
            f"{run_dir} is not a run directory with a checkpoint (config.json, {CHECKPOINT_FILE})"
        )
    return stored_config(run_dir)


def evaluate_run(
    run_dir: Path,
    eval_examples: int | None,
    base: bool,
    eval_cache: str = "",
    precision: str | None = None,
) -> dict:
    """The held-out metrics of ``run_dir``'s last committed global adapter (``base``: of round 0's)
    on ``eval_examples`` held-out examples (None: the run's count), the base model at ``precision``
    (None: the run's): ``{"run", "adapter", "round", "eval_examples", "seed", "seconds", "cached",
    "metrics", "made", "config"}`` (``config``: the run's, as scored)."""
    from common.models.lora import adapter_shapes
    from common.provenance import made
    from server import checkpoint
    from server.evaluation import Evaluator

    cfg = _stored(run_dir)
    if eval_examples is not None and eval_examples < 1:
        raise FedloraError(f"--eval-examples must be at least 1 (got {eval_examples})")
    cfg = cfg.replace(
        eval_examples=cfg.eval_examples if eval_examples is None else eval_examples,
        eval_cache=eval_cache,
        precision=precision or cfg.precision,
        out_dir=None,
        resume=False,
    )
    evaluator = Evaluator(cfg)
    state, loop, _ = checkpoint.load(
        run_dir / checkpoint.CHECKPOINT_FILE, adapter_shapes(evaluator.bundle.model)
    )
    if base:
        state = evaluator.initial_state()
    metrics, seconds, cached = evaluator.timed(state)
    return {
        "run": str(run_dir),
        "adapter": "base" if base else "final",
        "round": 0 if base else loop.round,
        "eval_examples": len(evaluator.examples),
        "seed": cfg.seed,
        "seconds": round(seconds, 1),
        "cached": cached,
        "metrics": metrics,
        "made": made(),
        "config": asdict(cfg),
    }


def run(args: argparse.Namespace) -> int:
    result = evaluate_run(Path(args.run), args.eval_examples, args.base, args.eval_cache, args.precision)
    if args.json:
        print(json.dumps(result, sort_keys=True))
        return 0
    which = "round 0 (the base model)" if args.base else f"round {result['round']}"
    print(f"fedlora evaluate: {result['run']}, {which}, {result['eval_examples']} held-out examples")
    for name, value in sorted(result["metrics"].items()):
        if "/" not in name:
            print(f"  {name:<16} {value:.4f}")
    print(f"  ({result['seconds']:.0f} s{', from --eval-cache' if result['cached'] else ''})")
    return 0
