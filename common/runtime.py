"""Build a run's pieces from a :class:`RunConfig`, identically on the server and on every client."""

from __future__ import annotations

from common.config import RunConfig
from common.data import FederatedSplit, federated_split
from common.device import resolve_device
from common.models import LoraSpec, ModelBundle, load_model


def lora_spec(cfg: RunConfig) -> LoraSpec:
    targets = tuple(cfg.target_modules) if cfg.target_modules else None
    return LoraSpec(cfg.rank, cfg.lora_alpha, cfg.lora_dropout, targets)


def open_split(cfg: RunConfig, num_clients: int | None = None) -> FederatedSplit:
    """The seeded test set and client shards (``num_clients`` defaults to the config's)."""
    return federated_split(
        cfg.dataset,
        num_clients or cfg.num_clients,
        method=cfg.partition,
        alpha=cfg.dirichlet_alpha,
        test_fraction=cfg.test_fraction,
        max_train=cfg.max_train_examples,
        max_test=cfg.eval_examples,
        seed=cfg.seed,
    )


def open_model(cfg: RunConfig, split: FederatedSplit) -> ModelBundle:
    """The model with LoRA; a classification head gets one output per label."""
    num_labels = max(2, len(split.corpus.label_names))
    return load_model(
        cfg.model, lora_spec(cfg), resolve_device(cfg.device), num_labels, cfg.seed, cfg.pooling
    )
