"""The ServerApp's run loop over a Flower ``Grid``: sample, charge, run the round (server/round.py,
with the run's release from server/releases), evaluate, checkpoint, settle.

Kept independent of how the grid is provided (in-process, Flower simulation or a real SuperLink).
Crash safety (docs/privacy.md, "Crash safety"): a round's client-level charge is committed to the
ledger before its instructions go out; its result is applied, checkpointed, then the charge is
settled. A restart with ``resume`` continues after the last charged round: a round that was charged
but never checkpointed stays charged (its releases may have happened) and is recorded as
interrupted, never run twice.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

from flwr.serverapp import Grid
from tqdm.auto import tqdm

from autoencoder.layout import Layout
from common.config import RunConfig
from common.errors import FedloraError
from common.models import adapter_shapes
from common.privacy.ledger import Charge, Ledger
from common.privacy.plan import NoisePlan, budget_stop, plan_noise, population, what_if
from common.privacy.report import write_report
from common.privacy.statement import statement
from server import checkpoint
from server.checkpoint import LoopState
from server.evaluation import Evaluator
from server.model_card import model_card
from server.optimizers import ServerOptimizer, ServerOptimizerSpec
from server.public_prior import PublicSubspace
from server.releases import RunHandles, make_release
from server.round import RoundRecord, run_round
from server.run_dir import RunDir
from server.sampling import os_sampler, poisson_sample
from server.summary import data_used, format_summary, metrics_lines

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
    run_id = out.run_id
    ledger = _open_ledger(out, cfg, plan, run_id) if cfg.resume else None  # a bad ledger fails fast
    evaluator = Evaluator(cfg)  # validates model, data and split before anything is written
    out.create()
    ledger = ledger or _open_ledger(out, cfg, plan, run_id)
    shapes = adapter_shapes(evaluator.bundle.model)
    metric = evaluator.task.metric
    optimizer = ServerOptimizer(
        ServerOptimizerSpec(
            cfg.server_optimizer, cfg.server_lr, cfg.server_momentum, cfg.server_beta2, cfg.server_tau
        )
    )
    release = make_release(cfg, plan)
    if cfg.resume and out.checkpoint_path.exists():
        state, loop, moments = checkpoint.load(out.checkpoint_path, shapes)
        optimizer.load_state(moments, loop.optimizer_steps)
        release.restore(loop.release)
        echo(f"resuming {run_dir} after round {loop.round}")
    else:
        state, loop = evaluator.initial_state(), LoopState()
        loop.before = loop.after = evaluator(state)
        if not cfg.resume or not out.logged_rounds():
            out.log({"round": 0, "phase": "initial", **loop.before})
        echo(f"round 0: held-out {metric} {loop.before[metric]:.4f} (untrained adapter)")
    first = _reconcile(out, ledger, run_id, loop, echo) + 1
    nodes = wait_for_nodes(grid, cfg.min_nodes or cfg.num_clients, cfg.round_timeout)
    handles = RunHandles(out.path, ledger, run_id, out.log, echo, evaluator)
    prepared = release.prepare(grid, nodes, state, handles)
    subspace = None
    in_subspace = cfg.release_kind == "dr-encoder" and cfg.codec_spec.needs_public_subspace
    if cfg.public_subspace and not in_subspace:
        # (a codec whose latent is the public subspace, pca, releases within it already)
        layout = Layout.from_shapes(shapes, 1)
        subspace = PublicSubspace(cfg, evaluator, layout, out.path)
    rng = os_sampler()  # never from cfg.seed, never checkpointed: the sample must stay secret
    stopped = None
    for rnd in tqdm(range(first, cfg.rounds + 1), desc="rounds", disable=None):
        if ledger and (stopped := budget_stop(ledger, plan)):
            out.log({"round": rnd, "phase": "stopped", "reason": stopped})
            echo(f"round {rnd}: not run: {stopped}")
            break
        t0, clip = time.monotonic(), release.clip
        # the nodes online now: a lost node leaves, a restarted one (a new id) joins
        sampled = poisson_sample(sorted(grid.get_node_ids()), cfg.sample_rate, rng)
        if ledger:  # committed before any instruction (and so any release) goes out
            ledger.charge(_charge(cfg, plan, run_id, rnd, len(sampled), release.clip))
        if sampled:
            release.before_round(rnd, state, echo)
            if subspace:
                subspace.refresh(rnd, state, echo)
            post = subspace.project if subspace else None
            state, result = run_round(grid, release, cfg, rnd, sampled, state, shapes, optimizer, post)
        else:
            result = RoundRecord.skipped(rnd)
        loop.count(result)
        evaluated = result.applied and (rnd % cfg.eval_every == 0 or rnd == cfg.rounds)
        if evaluated:
            loop.after = evaluator(state)
        loop.stale = (loop.stale or result.applied) and not evaluated
        record = result.to_json()
        if ledger:
            row = ledger.row(run_id, rnd)
            record.update({k: row[k] for k in ("sigma", "mu", "eps_gdp", "eps_tight")})
        if cfg.adaptive_clip:
            record.update(clip=clip, next_clip=release.clip)
        record.update(seconds=round(time.monotonic() - t0, 3), **({} if loop.stale else loop.after))
        loop.round, loop.record = rnd, record
        loop.release, loop.optimizer_steps = release.state(), optimizer.steps
        checkpoint.save(out.checkpoint_path, state, loop, optimizer.state_tensors())
        if ledger:
            status = "applied" if result.applied or result.phase == "skipped" else "withheld"
            ledger.settle(run_id, rnd, status, replied=result.replied)
        out.log(record)
        echo(_round_line(record, metric, ledger))
    if loop.stale:  # stopped by the budget between evaluations
        loop.after, loop.stale = evaluator(state), False
    summary = _summary(cfg, out, evaluator, state, loop, ledger, plan, len(nodes), stopped, start)
    if prepared:
        summary[release.name.replace("-", "_")] = prepared
        out.write_summary(summary)
    echo(format_summary(summary))
    return summary


def _charge(cfg: RunConfig, plan: NoisePlan, run_id: str, rnd: int, sampled: int, clip: float) -> Charge:
    return Charge(
        run=run_id,
        round=rnd,
        sigma=plan.sigma,
        p=plan.p,
        count=1,
        sample_rate=cfg.sample_rate,
        sampled=sampled,
        clip=clip,
        threat_model=plan.threat_model,
        mechanism=cfg.mechanism,
    )


def _open_ledger(out: RunDir, cfg: RunConfig, plan: NoisePlan | None, run_id: str) -> Ledger | None:
    """The run's client-level ledger: created with a new run, reopened (and checked) on resume;
    none without a client-level guarantee (no release, or the clip-only diagnostic)."""
    if plan is None or not plan.private:
        return None
    owner = f"run {run_id}"
    if cfg.resume and out.ledger_path.exists():
        return Ledger.open(out.ledger_path, "client-level", owner)
    validity, whom = what_if(plan), population(plan) if plan.noise_cohort else ""
    return Ledger.create(
        out.ledger_path, "client-level", owner, cfg.delta, plan.target_epsilon, validity, whom
    )


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
        loss, score = record["train_loss"], record.get(metric)
        line = (
            f"round {rnd}: {record['replied']}/{record['sampled']} replies, "
            f"train loss {'n/a' if loss is None else f'{loss:.4f}'}, "
            f"held-out {metric} {'not evaluated' if score is None else f'{score:.4f}'}, "
            f"{(record['bytes_down'] + record['bytes_up']) / 1e6:.2f} MB, {record['seconds']:.1f} s"
        )
    if ledger:
        what_if = f" (WHAT-IF: for {ledger.population})" if ledger.validity else ""
        line += f", client-level eps{what_if} gdp {record['eps_gdp']:.3g} / pld {record['eps_tight']:.3g}"
    return line


def _summary(cfg, out, evaluator, state, loop, ledger, plan, num_nodes, stopped, start) -> dict:
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
        **data_used(metrics_lines(out.metrics_path)),  # own data, partitions, refusals (model card)
        "dataset_rows": len(evaluator.split.corpus),
        "dataset_classes": len(evaluator.split.corpus.label_names),
        "stopped": stopped,
        "before": loop.before,
        "after": loop.after,
        "eval_examples": len(evaluator.examples),
        "bytes_down_per_round": loop.bytes_down / max(loop.completed, 1),
        "bytes_up_per_round": loop.bytes_up / max(loop.completed, 1),
        **statement(cfg, plan, ledger.report() if ledger else None),
        "wall_time_s": round(time.monotonic() - start, 1),
        "adapter": str(out.adapter_path),
        "metrics_file": str(out.metrics_path),
    }
    if ledger:
        report_json, report_png = write_report(ledger, out.path)
        totals = ledger.report()
        interrupted = [r["round"] for r in totals["rounds"] if r["status"] == "interrupted"]
        summary.update(
            rounds_interrupted=interrupted,
            client_privacy={
                **{k: totals[k] for k in ("mu", "eps_gdp", "eps_tight", "epsilon", "delta", "what_if")},
                "relation": plan.guarantee.relation,
            },
            ledger=str(ledger.path),
            privacy_report=[str(report_json), str(report_png)],
        )
    nodes = out.node_privacy()
    if nodes:
        summary["node_privacy"] = nodes
    bundle = evaluator.bundle
    head = bundle.model.base_model.model.num_labels if bundle.kind == "seq-cls" else None
    card = model_card(cfg, summary, head, evaluator.samples(state))
    out.save_adapter(bundle, state, cfg.pooling, card)
    out.write_summary(summary)
    return summary


__all__ = ["run_federation", "wait_for_nodes"]
