"""The model card (README.md) a run writes beside its adapter: base model, data, metrics and the
privacy guarantee as the run's summary states it (unit, epsilon, delta, accountant, threat model),
or "not private"."""

from __future__ import annotations

from common.config import RunConfig
from common.models.registry import resolve_model

_NONE = "none"  # how common/privacy/statement.py starts a line for a guarantee the run does not have


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
    return [f"Held-out {metric} on {summary['eval_examples']} examples of {summary['dataset']}:", "", *rows]


def _fmt(value: object) -> str:
    return "" if value is None else f"{value:.4g}" if isinstance(value, float) else str(value)


def _loading(cfg: RunConfig, base_id: str, num_labels: int | None) -> list[str]:
    if num_labels is None:
        auto, extra = "AutoModelForCausalLM", ""
    else:
        auto, extra = "AutoModelForSequenceClassification", f", num_labels={num_labels}"
    lines = [
        "With fedlora-dp installed (resolves the base model offline when it is a packaged one):",
        "",
        "```python",
        "from common.models.portable import load_adapter",
        'model, tokenizer = load_adapter("path/to/adapter")',
        "```",
        "",
        "With PEFT alone:",
        "",
        "```python",
        "from peft import PeftModel",
        f"from transformers import {auto}",
        f'base = {auto}.from_pretrained("{base_id}"{extra})',
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
    cfg: RunConfig, summary: dict, num_labels: int | None, samples: list[tuple[str, str]] = ()
) -> str:
    """Markdown with Hugging Face front matter for ``summary`` (server/federation.py's run summary);
    ``num_labels``: the classification head's size (None for a causal LM); ``samples``: generated
    ``(prompt, continuation)`` pairs shown under the metrics (language-modelling runs)."""
    spec = resolve_model(cfg.model)
    base_id = spec.hub_id or cfg.model
    training = (
        f"Federated LoRA fine-tuning with fedlora-dp: {summary['num_clients']} clients "
        f"({cfg.partition} partition of {cfg.dataset}), Poisson sample rate {cfg.sample_rate:g}, "
        f"{summary['rounds_completed']} rounds of {cfg.local_steps} local step(s) of {cfg.batch_size} "
        f"examples; mechanism `{cfg.mechanism}`, LoRA rank {cfg.rank}, seed {cfg.seed}."
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
        "",
        "## Loading",
        "",
        *_loading(cfg, base_id, num_labels),
    ]
    return "\n".join(lines) + "\n"


__all__ = ["model_card"]
