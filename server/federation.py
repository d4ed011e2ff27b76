"""The ServerApp's round loop over a Flower ``Grid``: sample, send, validate, aggregate, evaluate.

Kept independent of how the grid is provided (in-process, Flower simulation or a real SuperLink).
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import numpy as np
from flwr.app import Message
from flwr.serverapp import Grid
from tqdm.auto import tqdm

from common.config import RunConfig
from common.errors import FedloraError
from common.models import adapter_shapes
from common.wire import InvalidReply, parse_train_reply, train_instruction
from server.aggregate import apply_increment, weighted_mean
from server.evaluation import Evaluator
from server.report import RunDir, format_summary
from server.sampling import poisson_sample

log = logging.getLogger("fedlora.server")


def wait_for_nodes(grid: Grid, count: int, timeout: float) -> list[int]:
    """Node ids once ``count`` are connected; a clear error after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        nodes = sorted(grid.get_node_ids())
        if len(nodes) >= count:
            return nodes
        if time.monotonic() > deadline:
            raise FedloraError(f"only {len(nodes)} of {count} nodes connected after {timeout:.0f} s")
        time.sleep(1.0)


def run_federation(grid: Grid, cfg: RunConfig, run_dir: Path, echo=tqdm.write) -> dict:
    """Run ``cfg.rounds`` rounds of FedAvg over LoRA increments; returns the summary dict."""
    start = time.monotonic()
    evaluator = Evaluator(cfg)  # validates model, data and split before anything is written
    out = RunDir(run_dir, cfg)
    state = evaluator.initial_state()
    shapes = adapter_shapes(evaluator.bundle.model)
    metric = evaluator.task.metric
    before = evaluator(state)
    out.log({"round": 0, "phase": "initial", **before})
    echo(f"round 0: held-out {metric} {before[metric]:.4f} (untrained adapter)")
    nodes = wait_for_nodes(grid, cfg.min_nodes or cfg.num_clients, cfg.round_timeout)
    rng = np.random.default_rng([cfg.seed, 0x5A3])
    completed, skipped, down, up = 0, 0, 0, 0
    after = before
    for rnd in tqdm(range(1, cfg.rounds + 1), desc="rounds", disable=None):
        t0 = time.monotonic()
        sampled = poisson_sample(nodes, cfg.sample_rate, rng)
        if not sampled:
            skipped += 1
            out.log({"round": rnd, "phase": "skipped", "sampled": 0})
            echo(f"round {rnd}: nobody sampled, skipped")
            continue
        round_cfg = {"local-steps": cfg.local_steps, "lr": cfg.lr, "seed": cfg.seed}
        messages = [
            Message(
                train_instruction(state, rnd, round_cfg),
                dst_node_id=node,
                message_type="train",
                group_id=str(rnd),
            )
            for node in sampled
        ]
        bytes_down = sum(m.content["global"].count_bytes() for m in messages)
        replies = list(grid.send_and_receive(messages, timeout=cfg.round_timeout))
        increments, weights, losses, rejected, bytes_up = [], [], [], [], 0
        for reply in replies:
            try:
                if reply.metadata.group_id != str(rnd):
                    raise InvalidReply(f"late reply from round {reply.metadata.group_id}")
                inc, weight, extra = parse_train_reply(reply, rnd, shapes, cfg.mechanism)
            except InvalidReply as exc:
                rejected.append(str(exc))
                log.warning(
                    "round %d: rejected reply from node %s: %s",
                    rnd,
                    reply.metadata.src_node_id,
                    exc,
                )
                continue
            bytes_up += reply.content["increment"].count_bytes()
            increments.append(inc)
            weights.append(weight)
            losses.append(extra.get("train-loss", float("nan")))
        if increments:
            state = apply_increment(state, weighted_mean(increments, weights), cfg.server_lr)
            after = evaluator(state)
            completed += 1
        down, up = down + bytes_down, up + bytes_up
        record = {
            "round": rnd,
            "phase": "train",
            "sampled": len(sampled),
            "replied": len(increments),
            "rejected": rejected,
            "train_loss": float(np.mean(losses)) if losses else None,
            "bytes_down": bytes_down,
            "bytes_up": bytes_up,
            "seconds": round(time.monotonic() - t0, 3),
            **after,
        }
        out.log(record)
        echo(
            f"round {rnd}: {len(increments)}/{len(sampled)} replies, train loss "
            f"{record['train_loss'] if losses else float('nan'):.4f}, held-out {metric} {after[metric]:.4f}, "
            f"{(bytes_down + bytes_up) / 1e6:.2f} MB, {record['seconds']:.1f} s"
        )
    adapter = out.save_adapter(evaluator.bundle, state)
    summary = {
        "model": cfg.model,
        "dataset": cfg.dataset,
        "mechanism": cfg.mechanism,
        "metric": metric,
        "num_clients": len(nodes),
        "sample_rate": cfg.sample_rate,
        "rounds_completed": completed,
        "rounds_skipped": skipped,
        "before": before,
        "after": after,
        "eval_examples": len(evaluator.examples),
        "bytes_down_per_round": down / max(completed, 1),
        "bytes_up_per_round": up / max(completed, 1),
        "privacy": "none (mechanism fedavg: no sample-level or client-level DP)",
        "wall_time_s": round(time.monotonic() - start, 1),
        "adapter": str(adapter),
        "metrics_file": str(out.metrics_path),
    }
    out.write_summary(summary)
    echo(format_summary(summary))
    return summary
