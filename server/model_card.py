"""The model card (README.md) a run writes beside its adapter: base model, data, metrics and the
privacy guarantee as the run's summary states it (unit, epsilon, delta, accountant, threat model),
or "not private".

The data is the data the run actually used (server/summary.py ``data_used``): which nodes trained on
their own data files or on their partition, and which refused the run. A ``--dataset`` file is named
by its base name only: the card travels with the adapter, and no path of this machine goes with it.

A classification run's card lists its class names by index (the dataset's ``label_names``, as the
adapter's fedlora.json ``id2label`` records them), and its PEFT-alone snippet loads the base with
that ``id2label``/``label2id``, so that ``model.config.id2label`` names the classes either way."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from common.config import RunConfig
from common.data.files import is_file_dataset
from common.models.registry import resolve_model
from server.summary import one_line, plain_data

_NONE = (
    "none"  # how common/privacy/accounting/statement.py starts a line for a guarantee the run does not have
)


def _privacy(summary: dict) -> list[str]:
    client, sample = str(summary["privacy"]), str(summary["sample_privacy"])
    if client.startswith(_NONE) and sample.startswith(_NONE):
        lines = ["**Not private.** This run released updates without differential privacy."]
    else:
        lines = [f"- Client-level: {client}", f"- Sample-level: {sample}"]
    lines += ["", "Outside every guarantee: " + "; ".join(summary["not_covered"]) + "."]
    return lines


def _metrics(summary: dict) -> list[str]:
    metric, before, after = summary["metric"], summary["before"] or {}, summary["after"] or {}
    rows = ["| | " + " | ".join(k for k in after) + " |", "|---|" + "---|" * len(after)]
    for name, values in (("before training", before), ("after training", after)):
        rows.append(f"| {name} | " + " | ".join(_fmt(values.get(k)) for k in after) + " |")
    dataset = _dataset_name(str(summary["dataset"]))
    return [f"Held-out {metric} on {summary['eval_examples']} examples of {dataset}:", "", *rows]


def _dataset_name(dataset: str) -> str:
    """A packaged dataset's name, or a ``--dataset`` file's (directory's) base name: never its path."""
    return Path(dataset.rstrip("/\\")).name or dataset if is_file_dataset(dataset) else dataset


def _partition(cfg: RunConfig) -> str:
    """How the run's dataset was split over its clients, e.g. ``iid partition of rotten-tomatoes``."""
    text = f"{cfg.partition} partition of {_dataset_name(cfg.dataset)}"
    if cfg.partition == "natural" and cfg.users_per_client > 1:
        units = f"values of {cfg.partition_by}" if cfg.partition_by else "users"
        text += f", each client {cfg.users_per_client} whole {units}"
    elif cfg.partition == "natural" and cfg.partition_by:
        text += f", one client per value of {cfg.partition_by}"
    return text


def _file_facts(cfg: RunConfig, summary: dict) -> str:
    """For a ``--dataset`` file: a sentence naming it (base name) with its rows and classes when the
    summary has them; else nothing."""
    if not is_file_dataset(cfg.dataset):
        return ""
    rows, classes = summary.get("dataset_rows"), summary.get("dataset_classes")
    facts = [f"{rows:,} rows" if isinstance(rows, int) else "", f"{classes} classes" if classes else ""]
    facts = ", ".join(f for f in facts if f)
    return f" The dataset is the file {_dataset_name(cfg.dataset)}" + (f" ({facts})." if facts else ".")


def _count(n: int, one: str, many: str) -> str:
    return f"{n} {one if n == 1 else many}"


def _reasons(reasons: list) -> str:
    shown = [one_line(r) for r in reasons[:3]]
    more = f"; {len(reasons) - 3} more in summary.json" if len(reasons) > 3 else ""
    return f" ({'; '.join(shown)}{more})" if shown else ""


def _data_used(cfg: RunConfig, summary: dict) -> str:
    """The sentence on the data the nodes actually used (server/summary.py ``data_used``); nothing
    for a plain simulation (every node on its partition) or a summary written before those keys."""
    if plain_data(summary):
        return ""
    n = summary.get
    own, part = n("nodes_own_data", 0), n("nodes_partition_data", 0)
    parts = [
        _count(n("nodes_sampled", 0), "node sampled", "nodes sampled"),
        f"{own} trained on {'its own data file' if own == 1 else 'their own data files'}, "
        f"{part} on {'its' if part == 1 else 'their'} {_partition(cfg)}"
        + (f", {n('nodes_unstated_data')} did not say on what data" if n("nodes_unstated_data") else ""),
    ]
    refusals = n("refusals") or []
    if n("nodes_refused"):
        policy = refusals and all(str(r).startswith("node policy:") for r in refusals)
        what = "refused the run" if policy else "answered with an error"
        parts.append(f"{n('nodes_refused')} {what}{_reasons(refusals)}")
    if n("nodes_rejected"):
        parts.append(
            f"{n('nodes_rejected')} sent replies the server rejected{_reasons(n('rejections') or [])}"
        )
    if n("nodes_silent"):
        parts.append(f"{n('nodes_silent')} never answered")
    return " Data actually used: " + "; ".join(parts) + "."


def _fmt(value: object) -> str:
    return "" if value is None else f"{value:.4g}" if isinstance(value, float) else str(value)


def _code(text: str) -> str:
    """``text`` as a Markdown code span (a double fence when it holds a backtick)."""
    return f"`` {text} ``" if "`" in text else f"`{text}`"


def _labels(label_names: Sequence[str], num_labels: int | None) -> list[str]:
    """The Labels section: each class index with its name (nothing without names)."""
    if not label_names:
        return []
    listed = ", ".join(f"{i} {_code(name)}" for i, name in enumerate(label_names))
    where = (
        "fedlora.json's `id2label`/`label2id`; both loading routes below set them on `model.config`"
        if num_labels is not None
        else "fedlora.json's `id2label`/`label2id`; the causal LM predicts the class whose name is the "
        "likeliest next word after the run's prompt, common/data/prompts.py"
    )
    return ["", "## Labels", "", f"Classes by index: {listed} ({where})."]


def _loading(
    cfg: RunConfig, base_id: str, num_labels: int | None, label_names: Sequence[str] = ()
) -> list[str]:
    """The Loading section: ``load_adapter``, and PEFT alone on the base (an encoder's base loaded
    with the class names as ``id2label``/``label2id`` when they are known, else ``num_labels``)."""
    if num_labels is None:
        auto = "AutoModelForCausalLM"
        load = [f"base = {auto}.from_pretrained(base_id)"]
    elif len(label_names) == num_labels:
        auto = "AutoModelForSequenceClassification"
        load = [
            f"id2label = {dict(enumerate(label_names))!r}",
            f"base = {auto}.from_pretrained(",
            "    base_id, id2label=id2label, label2id={name: i for i, name in id2label.items()}",
            ")",
        ]
    else:
        auto = "AutoModelForSequenceClassification"
        load = [f"base = {auto}.from_pretrained(base_id, num_labels={num_labels})"]
    lines = [
        "With fedlora-dp installed (resolves the base model offline when it is a packaged one):",
        "",
        "```python",
        "from common.models.portable import load_adapter",
        'model, tokenizer = load_adapter("path/to/adapter")',
        "```",
        "",
        "With PEFT alone (the Hub id needs the network once; offline, give the base's local directory"
        " instead, e.g. fedlora-dp's packaged copy as below):",
        "",
        "```python",
        "from peft import PeftModel",
        f"from transformers import {auto}",
        f'base_id = "{base_id}"',
        "# offline: import common.models.registry; "
        "base_id = str(common.models.registry.resolve_model(base_id).locate())",
        *load,
        'model = PeftModel.from_pretrained(base, "path/to/adapter")',
        "```",
    ]
    if cfg.pooling == "mean":
        lines += [
            "",
            "The head was trained on the masked mean of the token states (`--pooling mean`), not on "
            "BERT's [CLS] pooler: with PEFT alone, replace the base model's pooler accordingly "
            "(`common.models.pooling.use_mean_pooling`); `load_adapter` does it for you.",
        ]
    return lines


def _samples(samples: list[tuple[str, str]]) -> list[str]:
    if not samples:
        return []
    lines = [
        "",
        "## Samples",
        "",
        "Continuations of the first line of held-out texts (temperature 0.8, top-p 0.95):",
        "",
    ]
    for prompt, text in samples:
        lines += [f"> **{prompt.strip()}** {' '.join(text.split())}", ""]
    return lines[:-1]


def model_card(
    cfg: RunConfig,
    summary: dict,
    num_labels: int | None,
    samples: list[tuple[str, str]] = (),
    label_names: Sequence[str] = (),
) -> str:
    """Markdown with Hugging Face front matter for ``summary`` (server/federation.py's run summary);
    ``num_labels``: the classification head's size (None for a causal LM); ``samples``: generated
    ``(prompt, continuation)`` pairs shown under the metrics (language-modelling runs);
    ``label_names``: the dataset's class names in class-index order (none for language modelling)."""
    spec = resolve_model(cfg.model)
    base_id = spec.hub_id or cfg.model
    # the partition in the first sentence only while it is what every node trained on
    partition = "" if summary.get("nodes_own_data") else f" ({_partition(cfg)})"
    training = (
        f"Federated LoRA fine-tuning with fedlora-dp: {summary['num_clients']} clients{partition}, "
        f"Poisson sample rate {cfg.sample_rate:g}, "
        f"{summary['rounds_completed']} rounds of {cfg.local_steps} local step(s) of {cfg.batch_size} "
        f"examples; mechanism `{cfg.mechanism}`, LoRA rank {cfg.rank}, seed {cfg.seed}."
        f"{_file_facts(cfg, summary)}{_data_used(cfg, summary)}"
        + (f" Data format: {summary['data_format']}." if summary.get("data_format") else "")
    )
    lines = [
        "---",
        f"base_model: {base_id}",
        "library_name: peft",
        "tags: [lora, peft, federated-learning, differential-privacy, fedlora-dp]",
        "---",
        "",
        f"# LoRA adapter for {base_id}",
        "",
        "## Training",
        "",
        training,
        f"Base weights: {spec.provenance or spec.locate()}.",
        "The full configuration is the run directory's config.json.",
        "",
        "## Privacy",
        "",
        *_privacy(summary),
        "",
        "## Evaluation",
        "",
        *_metrics(summary),
        *_samples(list(samples)),
        *_labels(label_names, num_labels),
        "",
        "## Loading",
        "",
        *_loading(cfg, base_id, num_labels, label_names),
    ]
    return "\n".join(lines) + "\n"


__all__ = ["model_card"]
