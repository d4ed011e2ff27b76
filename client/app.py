"""Flower ClientApp: receive the global adapter, train locally, reply with the increment."""

from __future__ import annotations

import numpy as np
from flwr.app import Context, Message
from flwr.clientapp import ClientApp

from client.local_train import train_steps
from client.shard import load_shard, partition_of
from common.config import from_flat
from common.models import adapter_state, load_adapter_state
from common.privacy.release import add_noise, clip
from common.wire import from_record, train_reply

app = ClientApp()


@app.train()
def train(msg: Message, context: Context) -> Message:
    cfg = from_flat(dict(context.run_config)).check()
    pid, parts = partition_of(dict(context.node_config), cfg)
    shard = load_shard(cfg, pid, parts)
    model = shard.bundle.model
    round_cfg = msg.content["config"]
    server_round = int(round_cfg["round"])
    global_state = from_record(msg.content["global"])
    load_adapter_state(model, global_state)
    metrics = train_steps(
        model,
        shard.task,
        shard.examples,
        steps=int(round_cfg["local-steps"]),
        batch_size=cfg.batch_size,
        lr=float(round_cfg["lr"]),
        seed=int(np.random.SeedSequence([cfg.seed, server_round, pid]).generate_state(1)[0]),
        device=shard.bundle.device,
        desc=f"client {pid} round {server_round}",
    )
    local = adapter_state(model)
    increment = {k: local[k] - global_state[k] for k in global_state}
    release = str(round_cfg["release"])
    noise_std = float(round_cfg["noise-std"])
    if release == "gaussian":  # client-level DP: clip, add this client's share of the noise
        increment = add_noise(clip(increment, float(round_cfg["clip"]))[0], noise_std)
        metrics = {}  # the training loss is not private; only the noised increment leaves
    meta = {"mechanism": cfg.mechanism, "release": release, "noise-std": noise_std}
    reply = train_reply(increment, server_round, len(shard.examples), metrics, meta)
    return Message(reply, reply_to=msg)
