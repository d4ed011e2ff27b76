"""A node's local view: its model (with LoRA) and its tokenised training shard, cached per process."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from common.config import RunConfig
from common.errors import FedloraError
from common.models import ModelBundle
from common.runtime import open_model, open_split
from common.tasks import Task, make_task


@dataclass
class Shard:
    bundle: ModelBundle
    task: Task
    examples: list[dict]


def partition_of(node_config: dict, cfg: RunConfig) -> tuple[int, int]:
    """``(partition-id, num-partitions)`` from the node config (Flower sets both in simulation)."""
    try:
        pid = int(node_config.get("partition-id", 0))
        parts = int(node_config.get("num-partitions", cfg.num_clients))
    except (TypeError, ValueError):
        raise FedloraError("node config partition-id / num-partitions must be integers") from None
    if not 0 <= pid < parts:
        raise FedloraError(f"partition-id {pid} outside [0, {parts})")
    return pid, parts


@lru_cache(maxsize=4)
def load_shard(cfg: RunConfig, partition_id: int, num_partitions: int) -> Shard:
    """Model + this node's tokenised examples (the same seeded split the server computes)."""
    split = open_split(cfg, num_partitions)
    bundle = open_model(cfg, split)
    idx = split.clients[partition_id]
    task = make_task(bundle.kind, split.corpus, bundle.tokenizer, cfg.max_length)
    return Shard(bundle, task, task.encode(split.texts(idx), split.labels(idx)))
