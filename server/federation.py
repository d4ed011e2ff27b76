"""The ServerApp's round loop over a Flower ``Grid``: sample, charge, send, validate, aggregate,
evaluate, checkpoint.

Kept independent of how the grid is provided (in-process, Flower simulation or a real SuperLink).
Crash safety (DESIGN §5): a round's client-level charge is committed to the ledger before its
instructions go out; its result is applied, checkpointed, then the charge is settled. A restart with
``resume`` continues after the last charged round: a round that was charged but never checkpointed
stays charged (its releases may have happened) and is recorded as interrupted, never run twice.
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
from common.models import AdapterState, adapter_shapes
from common.privacy.ledger import Charge, Ledger
from common.privacy.plan import NoisePlan, budget_stop, plan_noise
from common.privacy.release import global_norm
from common.privacy.report import write_report
from common.privacy.statement import statement
from common.wire import InvalidReply, parse_train_reply, train_instruction
from server import checkpoint
from server.aggregate import apply_increment, private_mean, weighted_mean
from server.checkpoint import LoopState
from server.drencoder import ServerCodec, prepare_codec
from server.evaluation import Evaluator
from server.report import RunDir, fingerprint, format_summary
from server.sampling import os_sampler, poisson_sample

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
    """Run (or, with ``cfg.resume``, continue) ``cfg.rounds`` rounds; returns the summary dict."""
    start = time.monotonic()
    out = RunDir(run_dir, cfg)  # refuses an existing run, or a resume with another configuration
    plan = plan_noise(cfg)
    run_id = fingerprint(cfg)
    ledger = _open_ledger(out, cfg, plan, run_id) if cfg.resume else None  # a bad ledger fails fast
    evaluator = Evaluator(cfg)  # validates model, data and split before anything is written
    out.create()
    ledger = ledger or _open_ledger(out, cfg, plan, run_id)
    shapes = adapter_shapes(evaluator.bundle.model)
    metric = evaluator.task.metric
    if cfg.resume and out.checkpoint_path.exists():
        state, loop = checkpoint.load(out.checkpoint_path, shapes)
        echo(f"resuming {run_dir} after round {loop.round}")
    else:
        state, loop = evaluator.initial_state(), LoopState()
        loop.before = loop.after = evaluator(state)
        if not cfg.resume or not out.logged_rounds():
            out.log({"round": 0, "phase": "initial", **loop.before})
        echo(f"round 0: held-out {metric} {loop.before[metric]:.4f} (untrained adapter)")
    first = _reconcile(out, ledger, run_id, loop, echo) + 1
    nodes = wait_for_nodes(grid, cfg.min_nodes or cfg.num_clients, cfg.round_timeout)
    coder, coder_info = None, None
    if cfg.release_kind == "dr-encoder":  # statistics round, autoencoder, codec (server/drencoder.py)
        coder, coder_info = prepare_codec(grid, cfg, out.path, nodes, state, ledger, run_id, out.log, echo)
    if plan and plan.threat_model == "distributed":
        echo(
            f"distributed noise: each of the K sampled clients adds std sigma*C/sqrt(m), m = min(min-replies "
            f"{cfg.min_replies}, K), so any applied round carries sigma >= {plan.sigma:.4g}; the server sees "
            f"each reply with that std (no secure aggregation)"
        )
    rng = os_sampler()  # never from cfg.seed, never checkpointed: the sample must stay secret
    stopped = None
    for rnd in tqdm(range(first, cfg.rounds + 1), desc="rounds", disable=None):
        if ledger and (stopped := budget_stop(ledger, plan)):
            out.log({"round": rnd, "phase": "stopped", "reason": stopped})
            echo(f"round {rnd}: not run: {stopped}")
            break
        t0 = time.monotonic()
        sampled = poisson_sample(nodes, cfg.sample_rate, rng)
        if ledger:  # committed before any instruction (and so any release) goes out
            ledger.charge(_charge(cfg, plan, run_id, rnd, len(sampled)))
        record: dict = {"round": rnd, "sampled": len(sampled)}
        if sampled:
            state, replied = _train_round(
                grid, cfg, plan, ledger, run_id, rnd, sampled, state, shapes, record, coder
            )
            if replied:
                loop.after = evaluator(state)
                loop.completed += 1
            elif record["replied"]:
                loop.withheld += 1
            if record["dropouts"]:
                loop.dropouts.append({"round": rnd, "nodes": record["dropouts"]})
        else:
            loop.skipped += 1
            record.update(phase="skipped", replied=0)
        loop.bytes_down += record.get("bytes_down", 0)
        loop.bytes_up += record.get("bytes_up", 0)
        if ledger:
            row = ledger.row(run_id, rnd)
            record.update({k: row[k] for k in ("sigma", "mu", "eps_gdp", "eps_tight")})
        record.update(seconds=round(time.monotonic() - t0, 3), **loop.after)
        loop.round, loop.record = rnd, record
        checkpoint.save(out.checkpoint_path, state, loop)
        if ledger:
            status = "withheld" if record.get("applied") is False else "applied"
            ledger.settle(run_id, rnd, status, replied=record["replied"])
        out.log(record)
        echo(_round_line(record, metric, ledger))
    summary = _summary(cfg, out, evaluator, state, loop, ledger, plan, len(nodes), stopped, start)
    if coder_info:
        summary["dr_encoder"] = coder_info
        out.write_summary(summary)
    echo(format_summary(summary))
    return summary


def _train_round(
    grid: Grid,
    cfg: RunConfig,
    plan: NoisePlan | None,
    ledger: Ledger | None,
    run_id: str,
    rnd: int,
    sampled: list[int],
    state: AdapterState,
    shapes: dict,
    record: dict,
    coder: ServerCodec | None = None,
) -> tuple[AdapterState, int]:
    """Send, validate, aggregate and apply one round; fills ``record``; returns (state, replied).
    ``coder``: the dr-encoder codec (replies are coded updates, decoded here)."""
    release = cfg.release_kind if plan else "none"
    std = plan.client_std(len(sampled)) if plan else 0.0
    round_cfg = {
        "local-steps": cfg.local_steps,
        "lr": cfg.lr,
        "seed": cfg.seed,
        "release": release,
        "clip": plan.clip if plan else 0.0,
        "noise-std": std,
        **(coder.round_config if coder else {}),
    }
    expected = {"mechanism": cfg.mechanism, "release": release, "noise-std": std}
    if coder:
        expected["ae-version"] = coder.version
        shapes = coder.reply_shapes(shapes)
    messages = [
        Message(
            train_instruction(state, rnd, round_cfg, coder.records_for(node) if coder else None),
            dst_node_id=node,
            message_type="train",
            group_id=str(rnd),
        )
        for node in sampled
    ]
    bytes_down = sum(
        r.count_bytes() for m in messages for r in m.content.values() if hasattr(r, "count_bytes")
    )
    increments, weights, losses, rejected, bytes_up = [], [], [], [], 0
    answered = set()
    for reply in grid.send_and_receive(messages, timeout=cfg.round_timeout):
        if reply.metadata.group_id == str(rnd):
            answered.add(reply.metadata.src_node_id)
        try:
            inc, weight, extra = accept_reply(reply, rnd, shapes, expected, plan, counts=not cfg.private)
        except InvalidReply as exc:
            rejected.append(str(exc))
            log.warning("round %d: rejected reply from node %s: %s", rnd, reply.metadata.src_node_id, exc)
            if coder:
                coder.replied(reply.metadata.src_node_id, False)
            continue
        if coder:
            coder.replied(reply.metadata.src_node_id, True)
        bytes_up += reply.content["increment"].count_bytes()
        increments.append(inc)
        weights.append(weight)
        losses.append(extra.get("train-loss", float("nan")))
    dropouts = sorted(set(sampled) - answered)
    if dropouts:
        log.warning("round %d: no reply from sampled node(s) %s", rnd, dropouts)
    usable = len(increments) >= cfg.min_replies
    if increments and not usable:
        log.warning(
            "round %d: %d usable replies < min-replies %d: withheld", rnd, len(increments), cfg.min_replies
        )
    if usable and plan:  # distributed shares are sized for min-replies: dropouts only add noise
        record["sigma_released"] = plan.released_sigma(len(sampled), len(increments))
        expected_count = cfg.sample_rate * cfg.num_clients
        if coder:
            mean = coder.aggregate(increments, cfg.decode_order, plan, expected_count)
        else:
            mean = private_mean(increments, plan.threat_model, plan.sigma, plan.clip, expected_count)
        state = apply_increment(state, mean, cfg.server_lr)
    elif usable:  # FedAvg weights by example counts, which only a non-private run sends
        weights = [1.0] * len(increments) if cfg.private else weights
        state = apply_increment(state, weighted_mean(increments, weights), cfg.server_lr)
    finite = [x for x in losses if np.isfinite(x)]
    record.update(
        phase="train",
        replied=len(increments),
        rejected=rejected,
        dropouts=dropouts,
        applied=usable,
        train_loss=float(np.mean(finite)) if finite else None,
        bytes_down=bytes_down,
        bytes_up=bytes_up,
    )
    return state, len(increments) if usable else 0


def accept_reply(
    reply: Message,
    rnd: int,
    shapes: dict,
    expected: dict,
    plan: NoisePlan | None,
    counts: bool = True,
) -> tuple[AdapterState, int | None, dict[str, float]]:
    """One train reply, validated for round ``rnd`` (common.wire.parse_train_reply, plus: not late, and
    within the clip under central noise); :class:`InvalidReply` says why it must not be used.
    ``counts`` False (a private run): no example count or metric may come with it."""
    if reply.metadata.group_id != str(rnd):
        raise InvalidReply(f"late reply from round {reply.metadata.group_id!r}")
    inc, weight, extra = parse_train_reply(reply, rnd, shapes, expected, counts)
    if plan and plan.threat_model == "central" and global_norm(inc) > plan.clip * (1 + 1e-4):
        raise InvalidReply(f"increment norm {global_norm(inc):.4g} exceeds the clip {plan.clip:g}")
    return inc, weight, extra


def _charge(cfg: RunConfig, plan: NoisePlan, run_id: str, rnd: int, sampled: int) -> Charge:
    return Charge(
        run=run_id,
        round=rnd,
        sigma=plan.sigma,
        p=plan.p,
        count=1,
        sample_rate=cfg.sample_rate,
        sampled=sampled,
        clip=plan.clip,
        threat_model=plan.threat_model,
        mechanism=cfg.mechanism,
    )


def _open_ledger(out: RunDir, cfg: RunConfig, plan: NoisePlan | None, run_id: str) -> Ledger | None:
    """The run's client-level ledger: created with a new run, reopened (and checked) on resume."""
    if plan is None:
        return None
    owner = f"run {run_id}"
    if cfg.resume and out.ledger_path.exists():
        return Ledger.open(out.ledger_path, "client-level", owner)
    return Ledger.create(out.ledger_path, "client-level", owner, cfg.delta, plan.target_epsilon)


def _reconcile(out: RunDir, ledger: Ledger | None, run_id: str, loop: LoopState, echo) -> int:
    """Bring the ledger and metrics in line with the checkpoint after a crash; returns the last
    round that is finished (committed, or charged and interrupted)."""
    last = loop.round
    if loop.record and loop.round not in out.logged_rounds():
        out.log(loop.record)  # the crash fell between checkpoint and metrics line
    for row in ledger.rows() if ledger else []:
        if row["run"] != run_id:
            continue
        last = max(last, row["round"])
        if row["status"] == "charged":
            interrupted = row["round"] > loop.round
            ledger.settle(run_id, row["round"], "interrupted" if interrupted else "applied")
            if interrupted:
                out.log({"round": row["round"], "phase": "interrupted", "sampled": row["sampled"]})
                echo(f"round {row['round']}: interrupted by a crash; its privacy charge stands")
    return last


def _round_line(record: dict, metric: str, ledger: Ledger | None) -> str:
    rnd = record["round"]
    if record["phase"] == "skipped":
        line = f"round {rnd}: nobody sampled, skipped"
    else:
        loss = record["train_loss"]
        line = (
            f"round {rnd}: {record['replied']}/{record['sampled']} replies, "
            f"train loss {'n/a' if loss is None else f'{loss:.4f}'}, held-out {metric} {record[metric]:.4f}, "
            f"{(record['bytes_down'] + record['bytes_up']) / 1e6:.2f} MB, {record['seconds']:.1f} s"
        )
    if ledger:
        line += f", client-level eps gdp {record['eps_gdp']:.3g} / pld {record['eps_tight']:.3g}"
    return line


def _summary(cfg, out, evaluator, state, loop, ledger, plan, num_nodes, stopped, start) -> dict:
    adapter = out.save_adapter(evaluator.bundle, state)
    summary = {
        "model": cfg.model,
        "dataset": cfg.dataset,
        "mechanism": cfg.mechanism,
        "metric": evaluator.task.metric,
        "num_clients": num_nodes,
        "sample_rate": cfg.sample_rate,
        "rounds_completed": loop.completed,
        "rounds_skipped": loop.skipped,
        "rounds_withheld": loop.withheld,
        "dropouts": loop.dropouts,
        "stopped": stopped,
        "before": loop.before,
        "after": loop.after,
        "eval_examples": len(evaluator.examples),
        "bytes_down_per_round": loop.bytes_down / max(loop.completed, 1),
        "bytes_up_per_round": loop.bytes_up / max(loop.completed, 1),
        **statement(cfg, plan, ledger.report() if ledger else None),
        "wall_time_s": round(time.monotonic() - start, 1),
        "adapter": str(adapter),
        "metrics_file": str(out.metrics_path),
    }
    if ledger:
        report_json, report_png = write_report(ledger, out.path)
        totals = ledger.report()
        interrupted = [r["round"] for r in totals["rounds"] if r["status"] == "interrupted"]
        summary.update(
            rounds_interrupted=interrupted,
            client_privacy={k: totals[k] for k in ("mu", "eps_gdp", "eps_tight", "epsilon", "delta")},
            ledger=str(ledger.path),
            privacy_report=[str(report_json), str(report_png)],
        )
    out.write_summary(summary)
    return summary


__all__ = ["accept_reply", "run_federation", "wait_for_nodes"]
