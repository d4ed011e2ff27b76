"""``fedlora audit mia``: canary examples in one local training run (Steinke, Nasr & Jagielski,
NeurIPS 2023, "Privacy auditing with one (1) training run"), against the sample-level mechanisms.

``m`` canaries are random token sequences (decoded from the model's own vocabulary, so no real text
is involved), each with a random label. Each is included in the client's training set with
probability ½; the client then trains exactly as ``fedlora train-local`` does (the same data, noise
plan, engine and steps). The plan is made for N = real examples + all ``m`` canaries whatever the
inclusion (as :func:`models_audit` does with N = real + 1), so q = b/N and σ are the same for every
inclusion vector, the thing the attack guesses: an excluded canary is an example removed under a
fixed mechanism, the add/remove relation the claim is for. The Poisson sampling draws each example
present at the plan's q, and each noised sum is divided by the plan's q·N (client/dp/engine.py
``DpSteps.expected_batch``), so no step depends on the inclusion count. The attack scores canary ``j``
by its loss after training, negated (Yeom et al. 2018's loss attack): an included canary is
memorised; an excluded one is labelled by chance. The scores give the AUC, the one-run ε lower bound
and the one-shot estimate (common/privacy/audit.py); the claimed ε is the plan's (PLD at δ).

``--models K`` runs the classic K-models audit instead (:func:`models_audit`): one canary, K
independent trainings (each its own LoRA init, batches and DP noise), the canary in each with
probability ½, and the threshold bound with Clopper–Pearson rates over the K scores.

The default task has 5 classes (bbc-news): on a 2-class task a trained model labels an unseen random
sequence confidently and right half the time, which weakens the loss attack even without noise
(measured in docs/privacy.md: AUC 0.926 on rotten-tomatoes against 0.994 on bbc-news).
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from torch import nn

from client.train_local import local_plan, open_local, step_settings, train_one
from common.config import RunConfig
from common.privacy.audit import MIN_CANARIES, MIN_MODELS, auc, summarize, threshold_bound
from common.runtime import initial_adapter
from common.tasks.base import Task, chunks

#: tokens per canary sequence
CANARY_TOKENS = 16
PLACEHOLDER = re.compile(r"\[.*\]|<.*>")


def canary_texts(tokenizer, count: int, classes: int, seed: int) -> tuple[list[str], list[int]]:
    """``count`` random texts of :data:`CANARY_TOKENS` non-special vocabulary tokens, and a random
    label in ``[0, classes)`` for each (seeded)."""
    rng = np.random.default_rng([seed, 0xCA7])
    special = set(tokenizer.all_special_ids)
    tokens = tokenizer.convert_ids_to_tokens(list(range(tokenizer.vocab_size)))
    vocab = np.asarray(  # no special or placeholder tokens ("[unused7]", "<|im_start|>")
        [i for i, t in enumerate(tokens) if i not in special and not PLACEHOLDER.fullmatch(t)]
    )
    texts = [tokenizer.decode(rng.choice(vocab, CANARY_TOKENS).tolist()) for _ in range(count)]
    return texts, rng.integers(0, classes, count).tolist()


@torch.no_grad()
def losses(model: nn.Module, task: Task, examples: Sequence[dict], device: torch.device) -> np.ndarray:
    """Per-example loss of every example, in eval mode: ``(len(examples),)``."""
    was_training = model.training
    model.eval()
    parts = [
        task.per_example_loss(model, task.collate(p, device)).float().cpu() for p in chunks(examples, 32)
    ]
    model.train(was_training)
    return torch.cat(parts).numpy().astype(float)


def audit_run(cfg: RunConfig, canaries: int, out: Path, seed: int, confidence: float) -> dict:
    """One audited local training run per ``cfg`` (train-local's data and steps) with ``canaries``
    canary examples, each included with probability ½, under the plan for N = real + ``canaries``
    (``plan_examples``; ``examples``: those trained on); writes ``canaries.json`` into ``out``."""
    if canaries < MIN_CANARIES:
        raise ValueError(f"need at least {MIN_CANARIES} canaries")
    start = time.time()
    bundle, split, task = open_local(cfg)
    model, device = bundle.model, bundle.device
    pool = split.clients[0]
    classes = max(2, len(split.corpus.label_names))
    texts, labels = canary_texts(bundle.tokenizer, canaries, classes, seed)
    canary_set = task.encode(texts, labels)
    included = np.random.default_rng([seed, 2]).random(canaries) < 0.5
    members = [canary_set[j] for j in np.flatnonzero(included)]
    real = task.encode(split.texts(pool), split.labels(pool))
    train = real + members
    planned = len(real) + canaries  # N: independent of the inclusion vector
    plan = local_plan(cfg, model, planned)
    stats = train_one(cfg, bundle, task, train, plan)
    scores = -losses(model, task, canary_set, device)
    out.mkdir(parents=True)
    (out / "canaries.json").write_text(
        json.dumps({"scores": scores.tolist(), "included": included.tolist(), "labels": labels}) + "\n"
    )
    return {
        "mechanism": cfg.optimizer_kind if plan else "none",
        "epsilon": plan.claimed_epsilon(stats.get("assumptions"))[0] if plan else None,
        "eps_gdp": plan.epsilon("gdp") if plan else None,
        "accountant": "pld (claimed ε; wishart: its amplified ε); CLT mu-GDP beside it",
        "unit": "sample-level (add/remove one example)",
        **summarize(scores, included, cfg.delta, confidence),
        "model": cfg.model,
        "dataset": cfg.dataset,
        "examples": len(train),
        "plan_examples": planned,
        **step_settings(cfg, plan),
        "run_dir": str(out),
        "seconds": round(time.time() - start, 1),
    }


def models_audit(cfg: RunConfig, models: int, out: Path, seed: int, confidence: float) -> dict:
    """K-models audit of ``cfg``'s local training: ``models`` runs on the same real examples, the one
    canary added to each with probability ½; scores (negated canary loss) into ``out/models.json``.
    Every run uses the plan for N = real + 1 (the same q and σ with or without the canary)."""
    if models < MIN_MODELS:
        raise ValueError(f"need at least {MIN_MODELS} models")
    start = time.time()
    bundle, split, task = open_local(cfg)
    classes = max(2, len(split.corpus.label_names))
    texts, labels = canary_texts(bundle.tokenizer, 1, classes, seed)
    canary = task.encode(texts, labels)
    real = task.encode(split.texts(split.clients[0]), split.labels(split.clients[0]))
    plan = local_plan(cfg, bundle.model, len(real) + 1)
    included = np.random.default_rng([seed, 3]).random(models) < 0.5
    scores, claims = [], []
    for j in range(models):
        run_cfg = cfg.replace(seed=seed * 1000 + j)  # its own LoRA init and batches
        initial_adapter(run_cfg, bundle, split)
        stats = train_one(run_cfg, bundle, task, real + (canary if included[j] else []), plan)
        scores.append(float(-losses(bundle.model, task, canary, bundle.device)[0]))
        claims.append(plan.claimed_epsilon(stats.get("assumptions"))[0] if plan else None)
    initial_adapter(cfg, bundle, split)  # leave the shared model as loaded
    out.mkdir(parents=True)
    (out / "models.json").write_text(
        json.dumps({"scores": scores, "included": included.tolist(), "canary": texts[0], "label": labels[0]})
        + "\n"
    )
    s_in, s_out = np.asarray(scores)[included], np.asarray(scores)[~included]
    return {
        "mechanism": cfg.optimizer_kind if plan else "none",
        "epsilon": max(claims) if plan else None,
        "accountant": "pld (claimed ε; wishart: its amplified ε)",
        "unit": "sample-level (add/remove one example)",
        "auc": auc(s_in, s_out),
        **threshold_bound(s_in, s_out, cfg.delta, confidence),
        "models": models,
        "model": cfg.model,
        "dataset": cfg.dataset,
        "examples": len(real) + 1,
        **step_settings(cfg, plan),
        "run_dir": str(out),
        "seconds": round(time.time() - start, 1),
    }
