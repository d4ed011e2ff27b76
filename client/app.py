"""Flower ClientApp: receive the global adapter, train locally, reply with the increment."""

from __future__ import annotations

from functools import lru_cache

import numpy as np
from flwr.app import Context, Message
from flwr.clientapp import ClientApp

from autoencoder.coded import encode_update
from autoencoder.layout import is_factor
from client.codec import round_codec
from client.gradstats import local_stats, privatise
from client.increment import increment as local_increment
from client.local_train import local_update
from client.node import NodePolicy
from client.sample_privacy import SamplePlan, plan_sample_noise
from client.shard import MODEL_PATH, Shard, load_global, node_shard
from client.state import node_state_dir, sample_ledger
from common.config import RunConfig, from_flat
from common.errors import FedloraError
from common.models import AdapterState, adapter_state
from common.privacy.ledger import Ledger
from common.privacy.plan import NoisePlan, plan_noise
from common.privacy.release import clip_and_noise
from common.wire import from_record, stats_reply, train_reply

app = ClientApp()


def _start(msg: Message, context: Context) -> tuple[RunConfig, int, int, Shard, AdapterState]:
    """``(cfg, partition id, partitions, shard, global state)`` with the global adapter loaded.

    The node config says where the data and model come from (client/shard.py) and what the node
    accepts (client/node.py): a run its policy refuses raises before any training."""
    node = dict(context.node_config)
    cfg = from_flat(dict(context.run_config)).check()
    NodePolicy.from_node_config(node).check_run(cfg)
    pid, parts, shard = node_shard(node, cfg)
    global_state = from_record(msg.content["global"])
    load_global(shard, global_state, cfg, str(node.get(MODEL_PATH) or ""))
    return cfg, pid, parts, shard, global_state


@app.query("gradstats")
def gradstats(msg: Message, context: Context) -> Message:
    """DR-Encoder Algorithm 1 statistics of one round's local steps (client/gradstats.py)."""
    cfg, pid, _, shard, global_state = _start(msg, context)
    query = msg.content["config"]
    granularity, noise_std = str(query["granularity"]), float(query["noise-std"])
    planned = (cfg.stats_noise_multiplier * cfg.stats_clip, cfg.stats_clip)
    if cfg.stats_noise_multiplier and (noise_std, float(query["stats-clip"])) != planned:
        raise FedloraError(
            f"statistics query asks noise std {noise_std:g} and clip {query['stats-clip']}; "
            f"the run's configuration plans {planned[0]:g} and {planned[1]:g}"
        )
    stats = local_stats(
        shard.bundle.model,
        shard.task,
        shard.examples,
        factors=[k for k in global_state if is_factor(k)],
        granularity=granularity,
        form=cfg.increment_form,
        floor=float(query["stats-floor"]),
        steps=int(query["local-steps"]),
        batch_size=cfg.batch_size,
        lr=float(query["lr"]),
        seed=int(np.random.SeedSequence([cfg.seed, 0, pid]).generate_state(1)[0]),
        device=shard.bundle.device,
    )
    if noise_std > 0:
        stats = privatise(stats, float(query["stats-clip"]), noise_std)
    reply = stats_reply(stats, {"granularity": granularity, "noise-std": noise_std})
    return Message(reply, reply_to=msg)


@app.train()
def train(msg: Message, context: Context) -> Message:
    cfg, pid, parts, shard, global_state = _start(msg, context)
    model = shard.bundle.model
    round_cfg = msg.content["config"]
    server_round = int(round_cfg["round"])
    steps, kind = int(round_cfg["local-steps"]), cfg.optimizer_kind
    release, noise_std = str(round_cfg["release"]), float(round_cfg["noise-std"])
    if release != "none":
        _check_noise(cfg, release, noise_std, float(round_cfg["clip"]))
    plan = _sample_plan(cfg, len(shard.examples)) if kind != "none" else None
    node = dict(context.node_config)
    ledger = None
    if plan is not None:  # sample-level DP: the node's own ledger, checked and charged before the steps
        ledger = sample_ledger(node_state_dir(node), f"{cfg.dataset}/{pid}-of-{parts}", cfg.delta)
    try:
        if ledger is not None:
            future = (cfg.rounds - server_round) * cfg.local_steps  # as if sampled every later round
            NodePolicy.from_node_config(node).check_sample_budget(ledger, plan.sigma, plan.sample_rate, steps + future)
            run_key = _charge(ledger, plan, str(context.run_id), server_round, steps, kind)
        metrics = local_update(
            model,
            shard.task,
            shard.examples,
            cfg,
            steps=steps,
            lr=float(round_cfg["lr"]),
            seed=int(np.random.SeedSequence([cfg.seed, server_round, pid]).generate_state(1)[0]),
            device=shard.bundle.device,
            plan=plan,
            desc=f"client {pid} round {server_round}",
        )
        if ledger is not None:
            ledger.settle(run_key, server_round, "applied")
    finally:
        if ledger is not None:
            ledger.close()
    if cfg.private:
        metrics = {}  # neither the loss nor counts of (Poisson-sampled) examples are private
    local = adapter_state(model)
    increment = local_increment(local, global_state, cfg.increment_form)
    meta = {"mechanism": cfg.mechanism, "release": release, "noise-std": noise_std}
    if release == "dr-encoder":  # encode; the latent (and any dense entries) is what is released
        cache = node_state_dir(dict(context.node_config))
        increment = encode_update(round_codec(msg.content, shard.bundle.device, cache), increment)
        meta["ae-version"] = str(round_cfg["ae-version"])
    if release in ("gaussian", "dr-encoder"):  # client-level DP: clip, add this client's noise share
        increment = clip_and_noise(increment, float(round_cfg["clip"]), noise_std)
    count = None if cfg.private else len(shard.examples)  # a clear count is not private
    reply = train_reply(increment, server_round, count, metrics, meta)
    return Message(reply, reply_to=msg)


@lru_cache(maxsize=8)
def _client_plan(cfg: RunConfig) -> NoisePlan | None:
    return plan_noise(cfg)


def _check_noise(cfg: RunConfig, release: str, noise_std: float, clip: float) -> None:
    """Refuse a round whose noise is less than the run's plan allows: the client-level guarantee
    must not rest on the noise level the server names. ``local``: σC; ``distributed``: at least
    σC/sqrt(min-replies) (the smallest share, m = min(min-replies, K)); the clip: C."""
    plan = _client_plan(cfg)
    if plan is None or release != cfg.release_kind:
        raise FedloraError(f"round asks release {release}; the run's configuration has {cfg.release_kind}")
    if clip != plan.clip:
        raise FedloraError(f"round asks clip {clip:g}; the run's plan has {plan.clip:g}")
    least = plan.client_std(cfg.min_replies)
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


def _charge(ledger: Ledger, plan: SamplePlan, run: str, rnd: int, steps: int, kind: str) -> str:
    """Charge ``steps`` steps for round ``rnd``; a round run again (a resumed server, a retried
    message) is a new release and is charged again, under ``<run>#<attempt>``. Returns the run key."""
    key, attempt = run, 1
    while True:
        try:
            ledger.charge(plan.charge(key, rnd, steps, kind))
            return key
        except FedloraError:
            if ledger.row(key, rnd) is None:
                raise
            attempt += 1
            key = f"{run}#{attempt}"
