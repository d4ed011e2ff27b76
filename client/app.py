"""Flower ClientApp: receive the global adapter, train locally, reply with the increment."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import torch
from flwr.app import Context, Message, RecordDict
from flwr.clientapp import ClientApp

from autoencoder.layout import is_factor
from client.cohort import Member
from client.dp.sample_plan import SamplePlan, plan_sample_noise, replan
from client.drencoder.gradstats import local_stats, privatise
from client.increment import increment as local_increment
from client.local_update import local_update
from client.node.policy import NodePolicy
from client.node.release_ledger import ReleaseLedger, release_event
from client.node.shard import DATA_PATH, MODEL_PATH, Shard, load_global, node_shard, partition_of
from client.node.state import LEDGER_FILE, encoder_cache_dir, held_ledger
from client.transport import Reply, client_half, client_transport
from common.config import RunConfig
from common.errors import FedloraError
from common.models import AdapterState, adapter_size, adapter_state
from common.presets import from_flat
from common.privacy.accounting.accountants import Event
from common.privacy.accounting.ledger import Ledger
from common.privacy.mechanisms.mechanism import mechanism_for
from common.privacy.participation.participation import LEGACY_SKIP_IDLE, skips_idle
from common.privacy.participation.threat import TRANSPORTS_DECLARED
from common.privacy.planning.plan import STATS_ROUND, NoisePlan, plan_noise
from common.tasks.training import StepSchedule
from common.timing import phase
from common.wire import DATA_SOURCE, StatsQuery, TrainInstruction, stats_reply

app = ClientApp()


def _run(context: Context, global_state: AdapterState) -> tuple[RunConfig, int, int]:
    """``(cfg, partition id, partitions)``: the run config, checked against what the node accepts
    (client/node/policy.py) before anything else: a run its policy refuses raises before any training.
    A node config holding :data:`LEGACY_SKIP_IDLE` (which once turned constant work off) is refused."""
    node = dict(context.node_config)
    if LEGACY_SKIP_IDLE in node:
        raise FedloraError(
            f"node config {LEGACY_SKIP_IDLE!r} is not accepted: a node trains whatever its participation "
            "coin says (only a simulation skips idle training); remove it. Nothing sent"
        )
    cfg = _run_config(tuple(sorted(context.run_config.items())))
    NodePolicy.from_node_config(node).check_run(cfg, adapter_size(global_state))
    return cfg, *partition_of(node, cfg)


@lru_cache(maxsize=8)
def _run_config(items: tuple[tuple[str, object], ...]) -> RunConfig:
    """The run config of Flower's flat ``run_config`` items, checked for a federation: parsed once per
    run, not once per message (~0.4 ms, four messages a node-round under secure aggregation)."""
    return from_flat(dict(items)).check_federated()


def _shard(context: Context, cfg: RunConfig, global_state: AdapterState) -> Shard:
    """The node's shard (the node config says where its data and model come from,
    client/node/shard.py) with ``global_state`` loaded into its model."""
    node = dict(context.node_config)
    _, _, shard = node_shard(node, cfg)
    load_global(shard, global_state, cfg, str(node.get(MODEL_PATH) or ""))
    return shard


@app.query("gradstats")
def gradstats(msg: Message, context: Context) -> Message:
    """DR-Encoder Algorithm 1 statistics of one round's local steps (client/drencoder/gradstats.py), with the
    run config's settings (noised when ``stats-noise-multiplier`` > 0)."""
    query = StatsQuery.from_record(msg.content)
    cfg, pid, parts = _run(context, query.global_state)
    shard = _shard(context, cfg, query.global_state)
    stats = local_stats(
        shard.trainee,
        StepSchedule.of(cfg, local_seed(cfg, 0, pid)),
        factors=[k for k in query.global_state if is_factor(k)],
        granularity=cfg.stats_granularity,
        form=cfg.increment_form,
        floor=cfg.stats_floor,
    )
    noise_std = cfg.stats_noise_std
    if noise_std > 0:  # a client-level release (local noise, p = 1): recorded once, like a round
        event = Event(cfg.stats_noise_multiplier, 1.0)
        releases = _releases(context, cfg, pid, parts)
        releases.check(STATS_ROUND, event, 0)
        stats = privatise(stats, cfg.stats_clip, noise_std)
        releases.charge(STATS_ROUND, event, cfg.stats_clip, "local")
    reply = stats_reply(stats, {"granularity": cfg.stats_granularity, "noise-std": noise_std})
    return Message(reply, reply_to=msg)


@dataclass
class Admitted:
    """A train message admitted by this node (:func:`admit`): everything checked before any training.

    ins / cfg: the round's instruction and the run config; pid / parts: the node's partition;
    noise: the run's client-level plan (None: no release); prepared: the run's transport's checks
    of this round (client/transport.py ``prepare``); released: the noised release's (event, clip) the node
    charges, None when nothing private is released; releases: the node's release ledger (None with
    nothing to charge); cap: the participation cap (0: none); contributes: this node's coin (hidden
    participation; otherwise True); shard: its data and model with the global adapter loaded;
    plan: its sample-level DP plan (None without a sample-level optimizer), re-planned against the
    node's ledger; charge: that ledger and the run key this round's steps were charged under (None
    when no steps are charged: no sample-level optimizer, or a simulated idle node)."""

    ins: TrainInstruction
    cfg: RunConfig
    pid: int
    parts: int
    noise: NoisePlan | None
    prepared: object
    released: tuple[Event, float] | None
    releases: ReleaseLedger | None
    cap: int
    contributes: bool
    shard: Shard
    plan: SamplePlan | None
    charge: tuple[Ledger, str] | None = None

    def check_budget(self) -> None:
        """The node's release ledger: this round's charge and every later one the run may make fit."""
        if self.releases is not None:
            self.releases.check(
                self.ins.round, self.released[0], self.releases.future(self.ins.round, self.cap)
            )


def admit(msg: Message, context: Context) -> Admitted:
    """Admission of a train message, before any training: the global adapter's values
    (common/wire.py :func:`~common.wire.global_of`) and the run's config against the node's policy,
    both before the participation coin is drawn, the round against the node's own plan (noise,
    transport, the coin), its data and model loaded, its release ledger checked (a one-line refusal
    otherwise), and last, under sample-level DP, the round's steps checked against and charged to the
    node's own ledger (:func:`_charge_steps`), before any of them runs."""
    ins = TrainInstruction.from_record(msg.content)
    cfg, pid, parts = _run(context, ins.global_state)
    noise = plan_noise(cfg, adapter_size(ins.global_state))
    prepared = client_transport(cfg).prepare(ins, cfg, context)
    released = None  # a noised client-level release: (event, clip)
    if cfg.release_kind != "none":
        clip = mechanism_for(noise, cfg).round_clip(ins.clip)  # the server's C under adaptive clipping
        _check_noise(noise, cfg.min_replies, ins.noise_std, clip)
        if noise is not None and noise.private:
            released = release_event(noise, ins.noise_std, clip), clip
    # hidden participation: this node's own coin, which neither the reply's timing nor its size may
    # show: every node loads its data and trains whatever the coin says (constant work)
    contributes = takes_part(noise)
    shard = _shard(context, cfg, ins.global_state)
    plan = _sample_plan(cfg, len(shard.examples)) if cfg.optimizer_kind != "none" else None
    admitted = Admitted(
        ins,
        cfg,
        pid,
        parts,
        noise,
        prepared,
        released,
        _releases(context, cfg, pid, parts) if released else None,
        noise.participation_cap if noise is not None else 0,
        contributes,
        shard,
        plan,
    )
    if admitted.releases is not None:
        admitted.releases.check_rule(noise.participation, context.node_id, ins.round)
    admitted.check_budget()
    if plan is not None and not idle(admitted, context):
        admitted.plan, admitted.charge = _charge_steps(context, cfg, ins.round, pid, parts, plan)
    return admitted


def train_admitted(a: Admitted, context: Context) -> tuple[AdapterState, dict]:
    """The round's local steps on an admitted message: ``(increment, metrics)`` (:func:`trained`);
    none for a simulated idle node (:func:`idle`), whose increment is the same zero update."""
    if idle(a, context):
        return trained(a, a.ins.global_state, {})
    metrics = _train_steps(a, context)
    return trained(a, adapter_state(a.shard.bundle.model), metrics)


def _train_steps(a: Admitted, context: Context) -> dict:
    """The round's local steps (under the plan :func:`admit` charged them for); the charge settled
    ``applied`` once they ran. Returns the local metrics."""
    with phase("local-training"):
        metrics = local_update(
            a.shard.trainee,
            a.cfg,
            a.plan,
            seed=local_seed(a.cfg, a.ins.round, a.pid),
            desc=f"client {a.pid} round {a.ins.round}",
        )
    if a.charge is not None:
        ledger, run_key = a.charge
        ledger.settle(run_key, a.ins.round, "applied")
    return metrics


def trained(a: Admitted, local: AdapterState, metrics: dict) -> tuple[AdapterState, dict]:
    """``(increment, metrics)`` of an admitted message whose local steps ended at ``local``: the
    increment the adapter's change (:func:`contribution`: zero when the node's coin did not come up
    or its training diverged), the metrics empty in a private run (neither the loss nor counts of
    Poisson-sampled examples are private). Every engine's local steps end here (client/cohort_round.py)."""
    increment = local_increment(local, a.ins.global_state, a.cfg.increment_form)
    return contribution(increment, a.contributes), ({} if a.cfg.private else metrics)


def idle(a: Admitted, context: Context) -> bool:
    """Whether a simulated node skips the local steps of an admitted message: its hidden-participation
    coin did not come up and the simulation's grid set ``skip-idle`` in its ``context.state``
    (``--idle-training skip``; common/privacy/participation/participation.py :func:`skips_idle`: never node config).
    Its reply then carries the zero update that training would have been multiplied into."""
    return not a.contributes and skips_idle(context.state)


def batchable(a: Admitted) -> bool:
    """Whether an admitted message's local steps can run in a cohort (client/cohort.py): its
    optimizer is non-private (a sample-level DP optimizer runs one client at a time)."""
    return a.plan is None


def cohort_member(a: Admitted) -> Member:
    """An admitted message's local steps as a member of a cohort: its examples, the schedule
    :func:`train_admitted` would run, from the round's global adapter."""
    return Member(
        a.shard.examples, StepSchedule.of(a.cfg, local_seed(a.cfg, a.ins.round, a.pid)), a.ins.global_state
    )


def local_seed(cfg: RunConfig, rnd: int, pid: int) -> int:
    """The seed of partition ``pid``'s local batches in round ``rnd`` (round 0: the statistics round)."""
    return int(np.random.SeedSequence([cfg.seed, rnd, pid]).generate_state(1)[0])


def release_admitted(a: Admitted, context: Context, increment: AdapterState, metrics: dict) -> RecordDict:
    """The reply of an admitted message: the node's release ledger charged (committed before the
    release leaves), then the release through the run's transport."""
    if a.releases is not None:
        a.check_budget()
        a.releases.charge(a.ins.round, *a.released, a.noise.threat_model)
    out = reply_of(increment, a.ins, a.cfg, a.shard.bundle.device, context, len(a.shard.examples), metrics)
    return release_reply(a.ins, a.cfg, context, out, a.prepared)


@app.train()
def train(msg: Message, context: Context) -> Message:
    """A round's train message: admitted (:func:`admit`), trained (:func:`train_admitted`) and
    released (:func:`release_admitted`): the three steps a batched engine would run for a cohort."""
    admitted = admit(msg, context)
    increment, metrics = train_admitted(admitted, context)
    return Message(release_admitted(admitted, context, increment, metrics), reply_to=msg)


for _spec in TRANSPORTS_DECLARED.values():  # the further stages of a transport's round (SecAgg+'s)
    for _stage, _handler in client_half(_spec).stages.items():
        app.train(_stage.removeprefix("train."))(_handler)


def takes_part(noise: NoisePlan | None) -> bool:
    """Whether this node contributes its update this round (else a zero update of the same shapes):
    the plan's participation rule decides (common/privacy/participation/participation.py; hidden participation: the
    node's own coin from OS entropy), always without a plan. Real clients and audit canaries
    (client/audit/canary.py, through :func:`admit`) flip the same coin."""
    return noise is None or noise.participation.contributes()


def contribution(increment: AdapterState, coin: bool) -> AdapterState:
    """``increment`` when this node's coin came up and every value of it is finite (releasable), else
    a zero update of the same shapes (+0.0 everywhere): a node whose training diverged sends zero
    whatever its coin, so nothing after this (encoding, the reply) can fail on the coin's account.
    One flag tensor decides, every tensor kept or zeroed by one ``where`` on it: the same work either
    way, no branch on the data, so that its timing does not show the coin either."""
    if not increment:
        return {}
    device = next(iter(increment.values())).device
    keep = torch.tensor(coin, device=device)
    for value in increment.values():
        keep = keep & value.isfinite().all().to(device)
    return {name: torch.where(keep.to(value.device), value, 0.0) for name, value in increment.items()}


def _charge_steps(
    context: Context, cfg: RunConfig, rnd: int, pid: int, parts: int, plan: SamplePlan
) -> tuple[SamplePlan, tuple[Ledger, str]]:
    """Round ``rnd``'s local steps checked against and charged to the node's own sample-level ledger
    (settled ``applied`` once they ran: :func:`train_admitted`): the plan they run under and
    ``(ledger, run key)``. A run whose history holds more steps than its plan (a round interrupted
    and run again: a resumed server, a restarted node) is re-planned so that it ends at or under its
    target (client/dp/sample_plan.py :func:`replan`)."""
    node = dict(context.node_config)
    policy = NodePolicy.from_node_config(node)
    if policy.run_epsilon:  # the run's whole plan (a PLD over every step: only when capped)
        policy.check_run_epsilon(plan.epsilon(), "sample-level", cfg.delta)
    ledger = held_ledger(node, LEDGER_FILE, "sample-level", _owner(cfg, pid, parts), cfg.delta)
    # this round's steps and every later round's, as if sampled in each
    remaining = (cfg.rounds - rnd + 1) * cfg.local_steps
    plan = replan(plan, _run_history(ledger, str(context.run_id)), remaining)
    policy.check_sample_budget(ledger, plan.sigma, plan.sample_rate, remaining)
    run_key = _charge(ledger, plan, str(context.run_id), rnd, cfg.local_steps, cfg.optimizer_kind)
    return plan, (ledger, run_key)


def _releases(context: Context, cfg: RunConfig, pid: int, parts: int) -> ReleaseLedger:
    """The node's client-level release ledger for this run (client/node/release_ledger.py)."""
    node = dict(context.node_config)
    return ReleaseLedger.open(
        node, _owner(cfg, pid, parts), NodePolicy.from_node_config(node), cfg, str(context.run_id)
    )


def _owner(cfg: RunConfig, pid: int, parts: int) -> str:
    """What a node's ledgers are for: its data, by dataset and partition."""
    return f"{cfg.dataset}/{pid}-of-{parts}"


def release_reply(
    ins: TrainInstruction, cfg: RunConfig, context: Context, out: Reply, prepared: object = None
) -> RecordDict:
    """The train reply carrying ``out`` (:func:`reply_of`) through the run's transport
    (client/transport.py): the run's client-level release applied (clip, noise share, encoding), or
    under SecAgg+ only the node's signed keys (its encoded update kept for the protocol).
    ``prepared``: the transport's checks of this round, made before training (made here if None)."""
    transport = client_transport(cfg)
    if prepared is None:
        prepared = transport.prepare(ins, cfg, context)
    with phase("encode"):
        return transport.reply(prepared, ins, cfg, context, out)


def reply_of(
    increment: AdapterState,
    ins: TrainInstruction,
    cfg: RunConfig,
    device: torch.device,
    context: Context,
    examples: int,
    metrics: dict,
) -> Reply:
    """What the train reply carries: ``increment``, its meta, the example count only when the run is
    not private (a clear count is not private), the local ``metrics``. The meta says where the
    examples came from (``data-source``: ``own`` with a node config ``data-path``, else
    ``partition``), never the file's path or name."""
    node_config = dict(context.node_config)
    count = None if cfg.private else examples
    meta = _reply_meta(ins, cfg, node_config)
    return Reply(increment, meta, count, metrics, device, encoder_cache_dir(node_config))


def _reply_meta(ins: TrainInstruction, cfg: RunConfig, node_config: dict) -> dict[str, object]:
    """What every train reply says it applied, and where its examples came from (``data-source``:
    ``own`` with a node config ``data-path``, else ``partition``; never the file's path or name)."""
    source = "own" if node_config.get(DATA_PATH) else "partition"  # as client/node/shard.py chooses
    return {
        "mechanism": cfg.mechanism,
        "release": cfg.release_kind,
        "noise-std": ins.noise_std,
        DATA_SOURCE: source,
    }


def _check_noise(noise: NoisePlan, min_replies: int, noise_std: float, clip: float) -> None:
    """Refuse a round whose noise is less than the run's ``noise`` plan allows: the client-level
    guarantee must not rest on the noise level the server names. ``local``: σC; ``distributed``: at
    least σC/sqrt(min-replies) (the smallest share, m = min(min-replies, K)); secure aggregation: its
    Skellam share (checked for equality with the round's protocol values too); C is the round's
    ``clip``."""
    least = noise.client_std(min_replies, clip)
    if noise_std < least * (1 - 1e-9):
        raise FedloraError(f"round asks noise std {noise_std:.4g} < {least:.4g}, the run's plan")


@lru_cache(maxsize=8)
def _sample_plan(cfg: RunConfig, examples: int) -> SamplePlan:
    """σ for this node's planned steps: every round's local steps, as if sampled every round."""
    return plan_sample_noise(
        examples,
        cfg.batch_size,
        cfg.rounds * cfg.local_steps,
        cfg.sample_clip,
        cfg.delta,
        cfg.sample_epsilon,
        cfg.sample_noise_multiplier,
    )


def _run_history(ledger: Ledger, run: str) -> tuple[Event, ...]:
    """The sample-level events ``ledger`` holds for run ``run``, its rounds' repeated attempts
    (``<run>#<attempt>``) included, oldest first."""
    return tuple(
        Event(r["sigma"], r["p"], r["count"])
        for r in ledger.rows()
        if r["run"] == run or r["run"].startswith(f"{run}#")
    )


def _charge(ledger: Ledger, plan: SamplePlan, run: str, rnd: int, steps: int, kind: str) -> str:
    """Charge ``steps`` steps for round ``rnd``; a round run again (a resumed server, a retried
    message, a restarted node) is a new release and is charged again, under ``<run>#<attempt>``,
    and an earlier attempt left ``charged`` (its process stopped mid-round) is settled
    ``interrupted``: its charge stands. Returns the run key."""
    key, attempt = run, 1
    while True:
        try:
            ledger.charge(plan.charge(key, rnd, steps, kind))
            return key
        except FedloraError:
            row = ledger.row(key, rnd)
            if row is None:
                raise
            if row["status"] == "charged":
                ledger.settle(key, rnd, "interrupted")
            attempt += 1
            key = f"{run}#{attempt}"
