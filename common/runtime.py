"""Build a run's pieces from a :class:`RunConfig`, identically on the server and on every client."""

from __future__ import annotations

from functools import lru_cache

from common.config import RunConfig
from common.data import FederatedSplit, SplitSettings, federated_split
from common.data.files import Columns
from common.device import resolve_device
from common.errors import FedloraError
from common.models import AdapterState, LoraSpec, ModelBundle, adapter_state, load_adapter_state, load_model
from common.models.dense_delta import restore_base
from common.models.head_init import apply_zero_shot_head, descriptions
from common.models.lora_init import apply_lora_init
from common.models.precision import resolve_precision


def lora_spec(cfg: RunConfig) -> LoraSpec:
    targets = tuple(cfg.target_modules) if cfg.target_modules else None
    return LoraSpec(cfg.rank, cfg.lora_alpha, cfg.lora_dropout, targets)


def open_split(cfg: RunConfig, num_clients: int | None = None) -> FederatedSplit:
    """The seeded test set and client shards (``num_clients`` defaults to the config's); computed
    once per process for the same settings (every client of a simulation asks for the same split)."""
    settings = SplitSettings(
        method=cfg.partition,
        alpha=cfg.dirichlet_alpha,
        test_fraction=cfg.test_fraction,
        max_train=cfg.max_train_examples,
        max_test=cfg.eval_examples,
        seed=cfg.seed,
        public_fraction=cfg.public_fraction,
        columns=columns_of(cfg),
        users_per_client=cfg.users_per_client,
    )
    return _split(cfg.dataset, num_clients or cfg.num_clients, settings)


def columns_of(cfg: RunConfig) -> Columns:
    """How to read a data owner's own ``--dataset`` file: its columns, the declared label set
    (``--labels``, comma-separated), ``--skip-bad-rows``, and ``--instruction-format`` with the
    prompt and response columns of instruction data."""
    labels = tuple(name.strip() for name in cfg.labels.split(",") if name.strip())
    return Columns(
        cfg.text_column,
        cfg.label_column,
        cfg.partition_by,
        labels,
        cfg.skip_bad_rows,
        cfg.instruction_format,
        cfg.prompt_column,
        cfg.response_column,
    )


@lru_cache(maxsize=8)
def _split(dataset: str, num_clients: int, settings: SplitSettings) -> FederatedSplit:
    split = federated_split(dataset, num_clients, settings)
    for array in (split.test, split.public, *split.clients):  # shared by every caller: read-only
        array.setflags(write=False)
    return split


def open_model(cfg: RunConfig, split: FederatedSplit) -> ModelBundle:
    """The model with LoRA; a classification head gets one output per label."""
    num_labels = max(2, len(split.corpus.label_names))
    device = resolve_device(cfg.device)
    return load_model(
        cfg.model, lora_spec(cfg), device, num_labels, cfg.seed, cfg.pooling, base_precision(cfg, device)
    )


def base_precision(cfg: RunConfig, device) -> str:
    """The frozen base's precision for ``cfg`` on ``device``: fp32 for the local optimizers that merge a
    dense update into the base weights (sparta-base, wishart), else ``--precision`` resolved."""
    return "fp32" if cfg.optimizer_spec.merges_base else resolve_precision(cfg.precision, device)


def initial_adapter(cfg: RunConfig, bundle: ModelBundle, split: FederatedSplit) -> AdapterState:
    """The run's starting adapter, set on ``bundle.model``: the model as loaded, LoRA re-initialised
    per ``lora-init`` (seeded: every process computes the same factors), the head per ``head-init``
    (zero-shot: from public label descriptions, no privacy cost)."""
    restore_base(bundle.model)  # a wishart run before this one merged a dense update
    load_adapter_state(bundle.model, bundle.initial)
    apply_lora_init(bundle.model, cfg.init_kind, cfg.seed)
    if cfg.head_init == "zero-shot":
        if bundle.kind != "seq-cls":
            raise FedloraError(
                f"--head-init zero-shot is for encoder classifiers; {cfg.model} scores label words"
            )
        texts = descriptions(split.corpus.name, split.corpus.label_names)
        apply_zero_shot_head(bundle.model, bundle.tokenizer, texts, bundle.device)
    return adapter_state(bundle.model)
