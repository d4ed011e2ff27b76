"""FLOPs of one client's local update, counted by torch on the real client code (``fedlora bench
scale`` states its throughput in them; server/bench/scale.py names this function as a component)."""

from __future__ import annotations

from common.models.registry import RANDOM


def client_flops(preset: str, device: str = "cpu", shape: str = "") -> float:
    """FLOPs of one client's local update (one step, as the bench runs it), counted by torch."""
    from torch.utils.flop_counter import FlopCounterMode

    from client.local_update import local_update
    from client.node.shard import node_shard
    from common.presets import preset as make_preset

    model = {"model": RANDOM + shape} if shape else {}
    cfg = make_preset(preset, local_steps=1, precision="fp32", device=device, **model).check()
    _, _, shard = node_shard({"partition-id": 0, "num-partitions": cfg.num_clients}, cfg)
    counter = FlopCounterMode(display=False)
    with counter:
        local_update(shard.trainee, cfg, None, seed=0, desc="flops")  # cfg: one local step
    return float(counter.get_total_flops())
