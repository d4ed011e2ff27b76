"""The ServerApp's run loop over a Flower ``Grid``: sample, charge, run the round (server/round.py,
with the run's release from server/releases), evaluate, checkpoint, settle.

:func:`run_federation` reads as setup (:func:`_setup`: run directory, noise plan, ledger, evaluator,
release, server optimizer, the resumed or initial state, nodes, the release's preparation, the public
subspace), one :func:`_round` per round, then :func:`_finish` (final evaluation, summary); the three
share one :class:`FederationRun`. Kept independent of how the grid is provided (in-process, Flower
simulation or a real SuperLink).

Crash safety (docs/privacy.md, "Crash safety"): a round's client-level charge is committed to the
ledger before its instructions go out; its result is applied, checkpointed, then the charge is
settled. A restart with ``resume`` continues after the last charged round: a round that was charged
but never checkpointed stays charged (its releases may have happened) and is recorded as
interrupted, never run twice.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from flwr.serverapp import Grid
from tqdm.auto import tqdm

from autoencoder.layout import Layout
from common.config import RunConfig
from common.device import resolve_device
from common.errors import FedloraError
from common.models import AdapterState, adapter_shapes, adapter_size
from common.privacy.accounting.accountants import Event
from common.privacy.accounting.ledger import Charge, Ledger, tight_accountant
from common.privacy.accounting.report import write_report
from common.privacy.accounting.statement import round_epsilons, statement
from common.privacy.participation.participation import Participation, PoissonSampling, os_sampler
from common.privacy.planning.plan import NoisePlan, budget_stop, plan_noise, population, what_if
from common.privacy.registry import release_kind
from common.progress import eta_line
from common.runtime import base_precision
from server import checkpoint
from server.checkpoint import LoopState
from server.evaluation import Evaluator
from server.model_card import model_card
from server.optimizers import ServerOptimizer, ServerOptimizerSpec
from server.public_prior import PublicSubspace
from server.releases import Release, RunHandles, make_release
from server.round import RoundContext, RoundRecord, run_round
from server.run_dir import RunDir
from server.summary import data_used, format_summary
from server.transport import transport_for

log = logging.getLogger("fedlora.server")


@dataclass
class FederationRun:
    """One run of the round loop: what :func:`_setup` builds, and where the loop stands.

    grid: the Flower grid the rounds go through.
    cfg: the run's configuration.
    echo: writes a console line.
    start: ``time.monotonic()`` when the run started, moved back on resume by the wall seconds its
        earlier sessions took to their last committed round (the summary's wall time is the whole run's).
    out: the run directory (metrics, checkpoint, ledger, adapter, summary).
    plan: the client-level noise plan; None without a client-level release.
    ledger: the client-level ledger; None without a client-level guarantee.
    evaluator: the server's model, public split and held-out evaluation.
    shapes: name -> shape of the adapter's tensors.
    optimizer: the server optimizer (its moments and step count are checkpointed).
    release: the run's client-level release (its state is checkpointed).
    state: the global adapter state (replaced by every round that runs).
    loop: where the loop stands (counters, metrics, the last round's record; checkpointed).
    first: the first round to run (after the last finished one, on resume).
    nodes: the node ids connected at the start (their count is the summary's ``num_clients``).
    prepared: what the release's preparation reported (in the summary under the release's name).
    subspace: the public subspace each aggregate is projected onto; None without one.
    rng: the client sampler: OS entropy, never ``cfg.seed``, never checkpointed (the sample is secret).
    stopped: why the budget stopped the run early; None while it was not.
    evaluation_s: seconds round 0's held-out evaluation took (0 on resume: not measured).
    """

    grid: Grid
    cfg: RunConfig
    echo: Callable[[str], None]
    start: float
    out: RunDir
    plan: NoisePlan | None
    ledger: Ledger | None
    evaluator: Evaluator
    shapes: dict[str, tuple[int, ...]]
    optimizer: ServerOptimizer
    release: Release
    state: AdapterState = field(default_factory=dict)
    loop: LoopState = field(default_factory=LoopState)
    first: int = 1
    nodes: list[int] = field(default_factory=list)
    prepared: dict = field(default_factory=dict)
    subspace: PublicSubspace | None = None
    rng: np.random.Generator | None = None
    stopped: str | None = None
    evaluation_s: float = 0.0

    @property
    def run_id(self) -> str:
        return self.out.run_id

    @property
    def participation(self) -> Participation:
        """Who takes part in a round: the plan's rule, or Poisson sampling at the run's rate."""
        return self.plan.participation if self.plan else PoissonSampling(self.cfg.sample_rate)

    @property
    def metric(self) -> str:
        """The held-out metric's name (the task's)."""
        return self.evaluator.task.metric

    def round_context(self) -> RoundContext:
        """What :func:`server.round.run_round` needs of the run (the aggregate projected onto the
        public subspace, if any)."""
        post = self.subspace.project if self.subspace else None
        transport = transport_for(self.cfg.threat_model)
        gate = self.unmask_gate if self.ledger is not None else None
        return RoundContext(
            self.grid, self.release, self.cfg, self.shapes, self.optimizer, post, gate, transport
        )

    def unmask_gate(self, rnd: int, survivors: list[int], event: Event) -> str:
        """Secure aggregation, before round ``rnd``'s sum is unmasked: narrow its charge to the
        ``survivors`` and the noise their shares carry (``event``), and refuse the unmask when that
        would bring any of them past the budget (the RDP ε of their own participations)."""
        totals = self.ledger.narrow(self.run_id, rnd, (event,), tuple(survivors))
        worst = max(totals[k] for k in self.plan.budget_keys)
        if worst > self.plan.target_epsilon * (1 + 1e-9):
            return f"a survivor would reach epsilon {worst:.4g} > the budget {self.plan.target_epsilon:g}; not unmasked"
        return ""


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
    run = _setup(grid, cfg, run_dir, echo)
    for rnd in tqdm(range(run.first, cfg.rounds + 1), desc="rounds", disable=None):
        t0 = time.monotonic()
        if not _round(run, rnd):
            break  # the budget stopped the run
        if rnd == run.first and rnd < cfg.rounds:  # the first estimate of the time left, measured
            evaluated = _evaluated(cfg, rnd)  # then the round's time holds an evaluation already
            evaluations = 0 if evaluated else sum(_evaluated(cfg, r) for r in range(rnd + 1, cfg.rounds + 1))
            run.echo(eta_line(1, time.monotonic() - t0, cfg.rounds - rnd, evaluations, run.evaluation_s))
    return _finish(run)


def _setup(grid: Grid, cfg: RunConfig, run_dir: Path, echo: Callable[[str], None]) -> FederationRun:
    """Everything before round ``first``: a new run directory (or the one to resume), its ledger,
    state and metrics reconciled after a crash, the nodes connected and the release prepared."""
    start = time.monotonic()
    out = RunDir(run_dir, cfg)  # refuses an existing run, or a resume with another configuration
    evaluator = Evaluator(cfg)  # validates model, data and split before anything is written
    shapes = adapter_shapes(evaluator.bundle.model)
    plan = plan_noise(cfg, adapter_size(shapes))
    ledger = _open_ledger(out, cfg, plan) if cfg.resume else None  # a bad ledger fails before a write
    out.create()
    ledger = ledger or _open_ledger(out, cfg, plan)
    spec = ServerOptimizerSpec(
        cfg.server_optimizer, cfg.server_lr, cfg.server_momentum, cfg.server_beta2, cfg.server_tau
    )
    run = FederationRun(
        grid=grid,
        cfg=cfg,
        echo=echo,
        start=start,
        out=out,
        plan=plan,
        ledger=ledger,
        evaluator=evaluator,
        shapes=shapes,
        optimizer=ServerOptimizer(spec),
        release=make_release(cfg, plan),
    )
    _resume_or_begin(run)
    run.first = _reconcile(run) + 1
    run.nodes = wait_for_nodes(grid, cfg.min_nodes or cfg.num_clients, cfg.round_timeout)
    handles = RunHandles(out.path, ledger, run.run_id, out.log, echo, evaluator, run.first)
    run.prepared = run.release.prepare(grid, run.nodes, run.state, handles)
    run.subspace = _public_subspace(run)
    run.rng = os_sampler()  # never from cfg.seed, never checkpointed: the sample must stay secret
    return run


def _evaluated(cfg: RunConfig, rnd: int) -> bool:
    """Whether round ``rnd`` (once applied) is evaluated on the held-out set."""
    return rnd % cfg.eval_every == 0 or rnd == cfg.rounds


def _resume_or_begin(run: FederationRun) -> None:
    """``run.state`` and ``run.loop`` from the checkpoint (resume; the server optimizer and the
    release restored with them), or the initial adapter, evaluated (and logged as round 0)."""
    cfg, out, evaluator = run.cfg, run.out, run.evaluator
    if cfg.resume and out.checkpoint_path.exists():
        run.state, run.loop, moments = checkpoint.load(out.checkpoint_path, run.shapes)
        run.optimizer.load_state(moments, run.loop.optimizer_steps)
        run.release.restore(run.loop.release)
        run.start -= run.loop.elapsed_s  # (a checkpoint from before 2026-11-29 holds 0: this session only)
        run.echo(f"resuming {out.path} after round {run.loop.round}")
        return
    run.state, run.loop = evaluator.initial_state(), LoopState()
    # said first: evaluating a large held-out set takes minutes on a CPU, and a log file shows no bar
    run.echo(f"round 0: evaluating the untrained adapter on {len(evaluator.examples)} held-out examples")
    run.loop.before, run.evaluation_s, cached = evaluator.timed(run.state)  # (s: when computed, if cached)
    run.loop.cached_evaluation_s = run.evaluation_s if cached else 0.0  # checkpointed: kept on resume
    run.loop.after = run.loop.before
    if not cfg.resume or not out.logged_rounds():
        out.log(
            {
                "round": 0,
                "phase": "initial",
                **({"evaluation": "cached"} if cached else {}),
                **run.loop.before,
            }
        )
    source = f"; read from --eval-cache {cfg.eval_cache}" if cached else ""
    run.echo(f"round 0: held-out {run.metric} {run.loop.before[run.metric]:.4f} (untrained adapter{source})")


def _public_subspace(run: FederationRun) -> PublicSubspace | None:
    """The public subspace aggregates are projected onto (``--public-subspace``), if any."""
    cfg = run.cfg
    in_subspace = release_kind(cfg.release_kind).encodes and cfg.codec_spec.needs_public_subspace
    if not cfg.public_subspace or in_subspace:
        return None  # (a codec whose latent is the public subspace, pca, releases within it already)
    return PublicSubspace(cfg, run.evaluator, Layout.from_shapes(run.shapes, 1), run.out.path)


def _round(run: FederationRun, rnd: int) -> bool:
    """Round ``rnd``: sample, charge, run, evaluate, checkpoint, settle, log; False (and nothing run)
    when the client-level budget stops the run before it."""
    who = run.participation
    # the nodes online now: a lost node leaves, a restarted one (a new id) joins
    taken = who.taken(run.ledger, rnd)
    online = who.online(sorted(run.grid.get_node_ids()), taken, rnd)
    if run.ledger and (stopped := _stop_reason(run, online, rnd)):
        run.stopped = stopped
        run.out.log({"round": rnd, "phase": "stopped", "reason": stopped})
        run.echo(f"round {rnd}: not run: {stopped}")
        return False
    t0, clip = time.monotonic(), run.release.clip
    sampled, drawn = who.sample(online, taken, run.rng)  # (fewer than a release needs: nothing sent)
    charged = run.ledger is not None and bool(sampled or who.charges_empty)
    if charged:  # committed before any instruction (and so any release) goes out
        run.ledger.charge(_charge(run, rnd, sampled))
    result = _train(run, rnd, sampled)
    result.sampled = drawn
    run.loop.count(result)
    evaluated = result.applied and _evaluated(run.cfg, rnd)
    if evaluated:
        run.loop.after = run.evaluator(run.state)
    run.loop.stale = (run.loop.stale or result.applied) and not evaluated
    record = _record(run, rnd, result, clip, t0)
    if result.phase == "skipped":
        record["online"] = len(online)  # what the round line and server/outcome.py say it sampled from
    _commit(run, rnd, result, record, charged)
    return True


def _train(run: FederationRun, rnd: int, sampled: list[int]) -> RoundRecord:
    """Round ``rnd`` with the ``sampled`` nodes (skipped when nobody was); moves ``run.state`` on."""
    if not sampled:
        return RoundRecord.skipped(rnd)
    run.release.before_round(rnd, run.state)
    if run.subspace:
        run.subspace.refresh(rnd, run.state, run.echo)
    run.state, result = run_round(run.round_context(), rnd, sampled, run.state)
    return result


def _stop_reason(run: FederationRun, online: list[int], rnd: int) -> str | None:
    """Why the run must stop before the next round: too few ``online`` nodes left to the participation
    rule (a cap spent), or the budget, else None."""
    who = run.participation
    nodes = tuple(online) if who.per_client else ()  # a charge that names its nodes: theirs alone
    return who.stop_reason(online, lambda: budget_stop(run.ledger, run.plan, run.release.events(rnd), nodes))


def _record(run: FederationRun, rnd: int, result: RoundRecord, clip: float, t0: float) -> dict:
    """The round's metrics line: its result, its privacy charge, the clip before and after it (under
    adaptive clipping), the seconds since ``t0`` and the held-out metrics (unless stale)."""
    record = result.to_json()
    if run.ledger and (row := run.ledger.row(run.run_id, rnd)):  # (a secure round nobody joined: none)
        record.update({k: row[k] for k in ("sigma", "mu", "eps_gdp", "eps_tight")})
        record["tight_accountant"] = tight_accountant([run.plan.event])[0]().name  # pld, or rdp (Skellam)
    if run.cfg.adaptive_clip:
        record.update(clip=clip, next_clip=run.release.clip)
    record.update(seconds=round(time.monotonic() - t0, 3), **({} if run.loop.stale else run.loop.after))
    return record


def _commit(run: FederationRun, rnd: int, result: RoundRecord, record: dict, charged: bool) -> None:
    """Checkpoint round ``rnd``, then settle its charge (if it was ``charged``), then log and echo its
    metrics line."""
    loop = run.loop
    loop.round, loop.record = rnd, record
    loop.release, loop.optimizer_steps = run.release.state(), run.optimizer.steps
    loop.elapsed_s = round(time.monotonic() - run.start, 3)
    checkpoint.save(run.out.checkpoint_path, run.state, loop, run.optimizer.state_tensors())
    if charged:
        status = "applied" if result.applied or result.phase == "skipped" else "withheld"
        run.ledger.settle(run.run_id, rnd, status, replied=result.replied)
    run.out.log(record)
    run.echo(_round_line(record, run.metric, run.ledger, run.participation.per_client, run.cfg.sample_rate))


def _finish(run: FederationRun) -> dict:
    """After the last round: the final evaluation (if the adapter changed since the last one), the
    summary written and echoed (with the adapter and its model card); returns the summary dict."""
    if run.loop.stale:  # stopped by the budget between evaluations
        run.loop.after, run.loop.stale = run.evaluator(run.state), False
    run.release.finish()
    summary = _summary(run)
    if run.prepared:
        summary[run.release.name.replace("-", "_")] = run.prepared
        run.out.write_summary(summary)
    run.echo(format_summary(summary))
    return summary


def _charge(run: FederationRun, rnd: int, sampled: list[int]) -> Charge:
    """Round ``rnd``'s client-level charge: the ``sampled`` nodes at the release's current clip
    (secure aggregation: charged to those nodes alone, per client)."""
    cfg, plan = run.cfg, run.plan
    return Charge(
        run=run.run_id,
        round=rnd,
        sigma=plan.sigma,
        p=plan.p,
        count=1,
        sample_rate=cfg.sample_rate,
        sampled=len(sampled),
        clip=run.release.clip,
        threat_model=plan.threat_model,
        mechanism=cfg.mechanism,
        events=run.release.events(rnd),
        participants=tuple(sampled) if run.participation.per_client else (),
    )


def _open_ledger(out: RunDir, cfg: RunConfig, plan: NoisePlan | None) -> Ledger | None:
    """The run's client-level ledger: created with a new run, reopened (and checked) on resume;
    none without a client-level guarantee (no release, or the clip-only diagnostic)."""
    if plan is None or not plan.private:
        return None
    owner = f"run {out.run_id}"
    if cfg.resume and out.ledger_path.exists():
        return Ledger.open(out.ledger_path, "client-level", owner)
    validity, whom = what_if(plan), population(plan) if plan.noise_cohort else ""
    ledger = Ledger.create(
        out.ledger_path, "client-level", owner, cfg.delta, plan.target_epsilon, (validity, whom)
    )
    ledger.hold_to(plan.budget_accountants)
    return ledger


def _reconcile(run: FederationRun) -> int:
    """Bring the ledger and metrics in line with the checkpoint after a crash; returns the last
    round that is finished (committed, or charged and interrupted)."""
    out, ledger, run_id, loop = run.out, run.ledger, run.run_id, run.loop
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
                run.echo(f"round {row['round']}: interrupted by a crash; its privacy charge stands")
    return last


def _round_line(
    record: dict,
    metric: str,
    ledger: Ledger | None,
    per_client: bool = False,
    sample_rate: float | None = None,
) -> str:
    """Round ``record``'s console line. A skipped round says that nothing was trained and why
    (nobody sampled at ``sample_rate`` from the nodes online, or, under secure aggregation, fewer
    than min-replies), and that its charge stands if it was charged."""
    rnd = record["round"]
    if record["phase"] == "skipped" and record["sampled"]:  # secure aggregation: fewer than m sampled
        line = f"round {rnd}: {record['sampled']} sampled, fewer than min-replies: nothing sent or trained"
    elif record["phase"] == "skipped":
        online = record.get("online")
        over = "" if online is None else f" over {online} node{'' if online == 1 else 's'}"
        why = "" if sample_rate is None else f" (sample rate {sample_rate:g}{over})"
        line = f"round {rnd}: nobody sampled{why}, nothing trained"
        if ledger and "eps_tight" in record:
            line += "; charged all the same"  # (whom the sampler picks, nobody included, is secret)
    else:
        loss, score = record["train_loss"], record.get(metric)
        line = (
            f"round {rnd}: {record['replied']}/{record['sampled']} replies, "
            f"train loss {'n/a' if loss is None else f'{loss:.4f}'}, "
            f"held-out {metric} {'not evaluated' if score is None else f'{score:.4f}'}, "
            f"{(record['bytes_down'] + record['bytes_up']) / 1e6:.2f} MB, {record['seconds']:.1f} s"
        )
    if ledger and "eps_tight" in record:
        what_if = f" (WHAT-IF: for {ledger.population})" if ledger.validity else ""
        if per_client:  # each client's own charges, by the plan's bound (Skellam: rdp; min-sep: pld)
            acct = record.get("tight_accountant", "rdp")
            line += f", client-level eps (worst client) {acct} {record['eps_tight']:.3g}"
        else:
            line += f", client-level eps{what_if} {round_epsilons(record['eps_gdp'], record['eps_tight'])}"
    return line


def _summary(run: FederationRun) -> dict:
    """The run summary (written to the run directory), with the adapter saved beside it and its
    model card."""
    cfg, out, evaluator, loop, ledger = run.cfg, run.out, run.evaluator, run.loop, run.ledger
    summary = {
        "model": cfg.model,
        "dataset": cfg.dataset,
        "mechanism": cfg.mechanism,
        "precision": base_precision(cfg, resolve_device(cfg.device)),  # the frozen base's, as resolved
        "metric": evaluator.task.metric,
        "num_clients": len(run.nodes),
        "sample_rate": cfg.sample_rate,
        "rounds_completed": loop.completed,
        "rounds_skipped": loop.skipped,
        "rounds_withheld": loop.withheld,
        "dropouts": loop.dropouts,
        **data_used(out.records()),  # own data, partitions, refusals (model card)
        "dataset_rows": len(evaluator.split.corpus),
        "dataset_classes": len(evaluator.split.corpus.label_names),
        "data_format": getattr(evaluator.task, "data_format", ""),  # (conversations: common/tasks/chat.py)
        "stopped": run.stopped,
        "before": loop.before,
        "after": loop.after,
        "eval_examples": len(evaluator.examples),
        "eval_texts": len(evaluator.split.test),  # (a language model's texts are cut into more blocks)
        "bytes_down_per_round": loop.bytes_down / max(loop.completed, 1),
        "bytes_up_per_round": loop.bytes_up / max(loop.completed, 1),
        **statement(cfg, run.plan, ledger.report() if ledger else None),
        "wall_time_s": round(time.monotonic() - run.start, 1),
        "cached_evaluation_s": round(run.loop.cached_evaluation_s, 1),  # not in wall_time_s (--eval-cache)
        "adapter": str(out.adapter_path),
        "metrics_file": str(out.metrics_path),
        "curves": str(out.draw_curves(evaluator.task.metric, run.plan.target_epsilon if run.plan else 0.0)),
    }
    if ledger:
        report_json, report_png = write_report(ledger, out.path)
        totals = ledger.report()
        interrupted = [r["round"] for r in totals["rounds"] if r["status"] == "interrupted"]
        summary.update(
            rounds_interrupted=interrupted,
            client_privacy={
                **{
                    k: totals[k]
                    for k in ("mu", "eps_gdp", "eps_tight", "epsilon", "delta", "what_if", "tight_accountant")
                },
                "relation": run.plan.guarantee.relation,
            },
            ledger=str(ledger.path),
            privacy_report=[str(report_json), str(report_png)],
        )
    nodes = out.node_privacy()
    if nodes:
        summary["node_privacy"] = nodes
    bundle = evaluator.bundle
    head = bundle.model.base_model.model.num_labels if bundle.kind == "seq-cls" else None
    labels = evaluator.split.corpus.label_names  # class i is labels[i], as the data loader mapped them
    card = model_card(cfg, summary, head, evaluator.samples(run.state), labels)
    out.save_adapter(bundle, run.state, cfg.pooling, card, labels)
    out.write_summary(summary)
    return summary


__all__ = ["FederationRun", "run_federation", "wait_for_nodes"]
