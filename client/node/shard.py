"""A node's local view: its model (with LoRA) and its tokenised training shard, cached per process.

Where they come from is the node's choice (its node config, set by ``flower-supernode --node-config``
or ``fedlora node``): by default the run's seeded partition ``partition-id`` of ``num-partitions``;
with ``data-path`` a data owner's own JSONL file (common/data/owner.py), labelled in the run
dataset's label space (with ``labels``, the class names the node declares, sorted: the node then
needs no copy of a run's own data file); with ``model-path`` the run's base model is loaded from a local directory or
Hugging Face id of the node's choosing, which must have the run model's architecture (the global
adapter must fit it exactly, see :func:`load_global`).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from common.config import RunConfig
from common.data.conversation import TASK, TASKS
from common.data.corpora import Corpus
from common.data.federated import open_corpus
from common.data.files import is_file_dataset
from common.data.owner import is_conversation_jsonl, owner_corpus, read_conversations, read_jsonl
from common.device import resolve_device
from common.errors import FedloraError
from common.models import AdapterState, LoraSpec, ModelBundle, load_adapter_state, load_model
from common.models.lora import LoraTargetsError
from common.models.registry import MODELS
from common.runtime import base_precision, columns_of, lora_spec, open_model, open_split
from common.tasks import Task, make_task
from common.tasks.training import Trainee

DATA_PATH, MODEL_PATH, LABELS = "data-path", "model-path", "labels"


@dataclass
class Shard:
    bundle: ModelBundle
    task: Task
    examples: list[dict]

    @property
    def trainee(self) -> Trainee:
        """The shard's model trained on its examples, on the model's device."""
        return Trainee(self.bundle.model, self.task, self.examples, self.bundle.device)


def partition_of(node_config: dict, cfg: RunConfig) -> tuple[int, int]:
    """``(partition-id, num-partitions)`` from the node config (Flower sets both in simulation).
    A node with its own data (``data-path``) is ``(0, 1)``: the whole of its data is its shard."""
    if node_config.get(DATA_PATH):
        return 0, 1
    try:
        pid = int(node_config.get("partition-id", 0))
        parts = int(node_config.get("num-partitions", cfg.num_clients))
    except (TypeError, ValueError):
        raise FedloraError("node config partition-id / num-partitions must be integers") from None
    if not 0 <= pid < parts:
        raise FedloraError(f"partition-id {pid} outside [0, {parts})")
    return pid, parts


def node_shard(node_config: dict, cfg: RunConfig) -> tuple[int, int, Shard]:
    """``(partition id, partitions, shard)`` for this node: its own data and model where its node
    config names them, else the run's partition and model."""
    pid, parts = partition_of(node_config, cfg)
    data_path = str(node_config.get(DATA_PATH) or "")
    model_path = str(node_config.get(MODEL_PATH) or "")
    if data_path:
        return pid, parts, load_own_shard(cfg, data_path, model_path, str(node_config.get(LABELS) or ""))
    return pid, parts, load_shard(cfg, pid, parts, model_path)


@lru_cache(maxsize=4)
def load_shard(cfg: RunConfig, partition_id: int, num_partitions: int, model_path: str = "") -> Shard:
    """Model + this node's tokenised examples (the same seeded split the server computes)."""
    split = open_split(cfg, num_partitions)
    bundle = (
        node_model(cfg, len(split.corpus.label_names), model_path) if model_path else open_model(cfg, split)
    )
    idx = split.clients[partition_id]
    task = make_task(bundle, split.corpus, cfg.max_length, cfg.lm_blocks)
    return Shard(bundle, task, task.encode(split.texts(idx), split.labels(idx)))


@lru_cache(maxsize=4)
def load_own_shard(cfg: RunConfig, data_path: str, model_path: str = "", labels: str = "") -> Shard:
    """Model + the data owner's JSONL examples, whose labels must be classes of the run's dataset
    (of the node's declared ``labels``, comma-separated, when it names them)."""
    if not Path(data_path).is_absolute():
        raise FedloraError(f"node config {DATA_PATH} must be an absolute path, got '{data_path}'")
    if is_conversation_jsonl(data_path):  # instruction / chat data (docs/instruction-tuning.md)
        texts = read_conversations(data_path)
        corpus = Corpus(conversation_run(cfg, labels), texts, (0,) * len(texts), (), TASK)
    else:
        base = run_label_space(cfg, labels)
        corpus = owner_corpus(read_jsonl(data_path, base.label_names), base)
    bundle = node_model(cfg, len(corpus.label_names), model_path)
    task = make_task(bundle, corpus, cfg.max_length, cfg.lm_blocks)
    examples = task.encode(corpus.texts, corpus.labels)
    if not examples:
        raise FedloraError(f"{data_path}: no training examples after tokenisation (texts too short?)")
    return Shard(bundle, task, examples)


def run_label_space(cfg: RunConfig, labels: str = "") -> Corpus:
    """The run dataset's classes as this node knows them: a packaged dataset's (the node's declared
    ``labels`` must be those), the node's declared ``labels`` sorted (as a file dataset numbers its
    classes; the run's declared ``--labels``, if any, must be the same set), or, without them, the
    run's file dataset read on this node (which then needs a copy)."""
    declared = tuple(sorted(n.strip() for n in labels.split(",") if n.strip()))
    if not is_file_dataset(cfg.dataset):
        base = open_corpus(cfg.dataset)
        if declared and tuple(sorted(base.label_names)) != declared:
            raise FedloraError(
                f"node policy: this node's labels {', '.join(declared)} are not the classes of "
                f"{cfg.dataset}: {', '.join(base.label_names) or 'none (language modelling)'}"
            )
        return base
    if declared:
        run_labels = tuple(sorted(columns_of(cfg).labels))
        if run_labels and run_labels != declared:
            raise FedloraError(
                f"node policy: this node's labels {', '.join(declared)} are not the run's --labels "
                f"{', '.join(run_labels)}"
            )
        return Corpus(cfg.dataset, (), (), declared, "classification")
    if not Path(cfg.dataset).exists():
        raise FedloraError(
            f"the run's dataset {cfg.dataset} is not on this node: declare its label names "
            "(fedlora node --labels a,b,c, or label_names= in the SDK)"
        )
    return open_corpus(cfg.dataset, columns_of(cfg))


def conversation_run(cfg: RunConfig, labels: str = "") -> str:
    """The run's dataset name, for a node whose data is conversations: refused (one line) when the
    node declares labels, or when the run's dataset, as far as this node can see it (a packaged one,
    or the run's file present here), is not conversations."""
    if labels:
        raise FedloraError("node policy: this node's data is conversations; it declares labels")
    if not is_file_dataset(cfg.dataset) or Path(cfg.dataset).exists():
        task = open_corpus(cfg.dataset, columns_of(cfg)).task
        if task not in TASKS:
            raise FedloraError(
                f"node policy: this node's data is conversations; the run's dataset {cfg.dataset} is {task}"
            )
    return cfg.dataset


def node_model(cfg: RunConfig, label_count: int, model_path: str = "") -> ModelBundle:
    """The run's model with LoRA, loaded from ``model_path`` when given (with the run model's LoRA
    targets, so that the adapters line up), else from the run's own model name."""
    name = model_path or cfg.model
    spec = lora_spec(cfg)
    if model_path and spec.targets is None and cfg.model in MODELS:
        spec = LoraSpec(spec.rank, spec.alpha, spec.dropout, MODELS[cfg.model].default_targets or None)
    device = resolve_device(cfg.device)
    precision = base_precision(cfg, device)
    try:
        return load_model(name, spec, device, max(2, label_count), cfg.seed, cfg.pooling, precision)
    except LoraTargetsError as exc:
        if not model_path:
            raise
        raise _mismatch(cfg, model_path, str(exc)) from None


def _mismatch(cfg: RunConfig, model_path: str, reason: str) -> FedloraError:
    """The documented refusal of a node whose own model cannot take the run's adapter."""
    return FedloraError(
        f"the run's adapter for model '{cfg.model}' does not fit this node's model-path '{model_path}': "
        f"not the same architecture ({reason.splitlines()[0][:160]})"
    )


def load_global(shard: Shard, state: AdapterState, cfg: RunConfig, model_path: str = "") -> None:
    """Load the server's global adapter into the node's model; a model that it does not fit (another
    architecture: other hidden size, layers, targets or head) is a clear error."""
    try:
        load_adapter_state(shard.bundle.model, state)
    except ValueError as exc:
        if model_path:
            raise _mismatch(cfg, model_path, str(exc)) from None
        raise FedloraError(
            f"the run's adapter for model '{cfg.model}' does not fit model '{shard.bundle.name}': "
            f"not the same architecture ({str(exc).splitlines()[0][:160]})"
        ) from None


__all__ = [
    "DATA_PATH",
    "MODEL_PATH",
    "Shard",
    "conversation_run",
    "load_global",
    "load_own_shard",
    "load_shard",
    "node_shard",
    "partition_of",
    "run_label_space",
]
