"""Named configurations: a preset is a set of :class:`~common.config.RunConfig` values (a model, a
dataset and the federation to train it in) under one name; options it does not name keep their
declared defaults.

``fedlora simulate --preset NAME`` (and ``preset = "NAME"`` in a Flower run config, see
:func:`from_flat`) starts from the preset and then applies every other option given, so
an option on the command line always wins over the preset's value. Without ``--preset`` the base is
``default``.
"""

from __future__ import annotations

import difflib
from dataclasses import fields

from common.config import RunConfig
from common.errors import FedloraError

#: Cross-device (issue 16): 1,000 clients with ~8 records each, ~100 per round; the head starts from
#: label descriptions (``minilm-rt-xdev``, and under DP the ``default`` preset).
_XDEV: dict[str, object] = {
    "model": "minilm-l6",
    "dataset": "rotten-tomatoes",
    "pooling": "mean",
    "head_init": "zero-shot",
    "partition": "iid",
    "num_clients": 1000,
    "sample_rate": 0.1,
    "rounds": 30,
    "local_steps": 1,
    "batch_size": 8,
    "client_optimizer": "sgd",
    "lr": 1.0,
    "server_optimizer": "adam",
    "server_lr": 1e-2,
    "max_train_examples": 0,
    "eval_examples": 1000,
    "eval_every": 5,
    "delta": 1e-6,
}


#: Issue 33, cross-silo: 4 plays (a seeded choice of the 31 client plays) are 4 nodes, each holding
#: every 128-token block of its training roles (~200), every node every round. A round is 2
#: sample-level DP steps per node (PRISM, which has its own update rule; --mechanism dp-adamw / ffa
#: to compare; expected batch 16, Poisson) and the server averages the increments (FedAvg, post-
#: processing); each node's ε is sample-level (one block, add/remove) against everyone, the server
#: included. Sized for a 2-core CPU: 10 rounds, evaluated on 32 held-out roles (~400 blocks) at
#: rounds 0 and 10; one learning rate for every method, not tuned. Measured on 3 seeds: PRISM's
#: log-perplexity drop 0.047 nats against 0.020-0.024 for each play alone (docs/shakespeare.md).
_SILO: dict[str, object] = {
    "model": "smollm2-135m",
    "dataset": "shakespeare",
    "partition": "natural",
    "partition_by": "play",
    "num_clients": 4,
    "sample_rate": 1.0,
    "rounds": 10,
    "local_steps": 2,
    "batch_size": 16,
    "mechanism": "prism",
    "client_optimizer": "adamw",
    "lr": 3e-3,
    "sample_epsilon": 3.0,
    "delta": 1e-5,
    "max_length": 128,
    "lm_blocks": 0,
    "max_train_examples": 0,
    "eval_examples": 32,
    "eval_every": 10,
}


#: the DP track's cross-device recipe (issue 76; Shakespeare's, smollm2-shakespeare-xdev): each
#: client sends one FedSGD gradient of 2 conversations, the server applies Adam to the mean
_CHAT_XDEV: dict[str, object] = {
    "model": "smollm2-135m",
    "local_steps": 1,
    "batch_size": 2,
    "client_optimizer": "sgd",
    "lr": 1.0,
    "server_optimizer": "adam",
    "server_lr": 1e-2,
    "max_train_examples": 0,
    "delta": 1e-5,
}


PRESETS: dict[str, dict[str, object]] = {
    # Four nodes, no DP: a few seconds a round on a 2-core CPU; the head starts untrained.
    "small": {
        "model": "minilm-l6",
        "dataset": "rotten-tomatoes",
        "partition": "iid",
        "num_clients": 4,
        "sample_rate": 0.5,
        "rounds": 5,
        "local_steps": 20,
        "batch_size": 16,
        "lr": 1e-3,
        "eval_examples": 500,
    },
    # The causal LM through a verbalizer (zero-shot is already ~0.78, so it needs more steps).
    "smollm2-rt": {
        "model": "smollm2-135m",
        "dataset": "rotten-tomatoes",
        "partition": "iid",
        "num_clients": 2,
        "rounds": 5,
        "local_steps": 20,
        "lr": 3e-4,
        "eval_examples": 500,
    },
    "minilm-rt": {
        "model": "minilm-l6",
        "dataset": "rotten-tomatoes",
        "rounds": 5,
        "local_steps": 20,
        "batch_size": 16,
        "lr": 1e-3,
        "eval_examples": 500,
    },
    "minilm-bbc": {
        "model": "minilm-l6",
        "dataset": "bbc-news",
        "rounds": 5,
        "local_steps": 20,
        "batch_size": 16,
        "lr": 1e-3,
        "max_length": 128,
    },
    "minilm-rt-xdev": _XDEV,
    # `make run` and `fedlora simulate` without --preset: the cross-device federation above, private.
    # Client-level DP (central noise, the server trusted), epsilon 8 (PLD) at delta 1e-6, add/remove one
    # client, over 15 rounds of ~100 clients: learns visibly in under 3 minutes on a 2-core CPU.
    "default": {
        **_XDEV,
        "mechanism": "dp-fedavg",
        "threat_model": "central",
        "target_epsilon": 8.0,
        "clip": 0.5,
        "rounds": 15,
    },
    "minilm-bbc-xdev": {
        "model": "minilm-l6",
        "dataset": "bbc-news",
        "pooling": "mean",
        "head_init": "zero-shot",
        "partition": "iid",
        "num_clients": 400,
        "sample_rate": 0.25,
        "rounds": 30,
        "local_steps": 1,
        "batch_size": 4,
        "client_optimizer": "sgd",
        "lr": 1.0,
        "server_optimizer": "adam",
        "server_lr": 1e-2,
        "eval_every": 5,
        "max_train_examples": 0,
        "max_length": 128,
        "eval_examples": 445,
        "delta": 1e-6,
    },
    # Cross-silo (issue 18): 4 nodes with ~2,500 records each (the whole train split, label skew),
    # every node every round, each under its own sample-level budget (no client-level release). A
    # round is one DP-SGD step of ffa per node (expected batch 128); the server applies Adam to the
    # mean of the noisy steps (post-processing), so the federation is one DP optimizer over all nodes'
    # data and label skew cannot pull it apart. The summary prints each node's epsilon.
    "minilm-rt-silo": {
        "model": "minilm-l6",
        "dataset": "rotten-tomatoes",
        "pooling": "mean",
        "head_init": "zero-shot",
        "partition": "dirichlet",
        "num_clients": 4,
        "sample_rate": 1.0,
        "rounds": 100,
        "local_steps": 1,
        "batch_size": 128,
        # ffa from its own init, PEFT's (random A, frozen; B = 0), at the server rate validated for it:
        # re-measured against the balanced init, 3 seeds (docs/prism.md, "Cross-silo preset")
        "mechanism": "ffa",
        "client_optimizer": "sgd",
        "lr": 1.0,
        "server_optimizer": "adam",
        "server_lr": 1e-2,
        "server_tau": 1e-6,
        "sample_epsilon": 3.0,
        "delta": 1e-5,
        "max_train_examples": 0,
        "eval_examples": 1000,
        "eval_every": 25,
    },
    # GPU-sized; on a CPU pass --rounds 5 (a round of 100 SmolLM2 clients takes minutes there).
    "smollm2-rt-xdev": {
        "model": "smollm2-135m",
        "dataset": "rotten-tomatoes",
        "partition": "iid",
        "num_clients": 1000,
        "sample_rate": 0.1,
        "rounds": 40,
        "local_steps": 2,
        "batch_size": 8,
        "lr": 3e-4,
        "max_train_examples": 0,
        "eval_examples": 1000,
        "delta": 1e-6,
    },
    # Issue 33: next-token prediction on Shakespeare with one client per speaking role (517 training
    # roles, 129 held-out roles evaluated by perplexity), ~10 % sampled per round; a client's update
    # is one gradient of its first 4 blocks of 128 tokens (FedSGD, --lr 1) and the server applies
    # Adam to the mean (the recipe minilm-rt-xdev uses for DP). First measured run (seed 0, 20 rounds,
    # fedavg): held-out perplexity 84.8 -> 67.4 (docs/shakespeare.md).
    "smollm2-shakespeare-xdev": {
        "model": "smollm2-135m",
        "dataset": "shakespeare",
        "partition": "natural",
        "num_clients": 517,
        "sample_rate": 0.1,
        "rounds": 20,
        "local_steps": 1,
        "batch_size": 4,
        "client_optimizer": "sgd",
        "lr": 1.0,
        "server_optimizer": "adam",
        "server_lr": 3e-3,
        "max_length": 128,
        "max_train_examples": 0,
        "eval_examples": 300,
        "eval_every": 10,
        "delta": 1e-5,
    },
    # Issue 76, the federated instruction benchmark (docs/instruction-tuning.md): SmolLM2-Instruct
    # tuned on the 13 packaged multiple-choice sets as instructions, scored on their held-out items.
    # Cross-device, each client a Dirichlet mix of about 10 items (task heterogeneity, as FedIT
    # splits Dolly by category), ~3 % of 1,300 clients a round: a cohort large enough for client-level
    # DP (FlowerTune's shape, fraction 0.1 of 20-50 clients, leaves a cohort of 2-5: any client-level
    # noise drowns it). Shakespeare's recipe: one FedSGD gradient of 2 items, server Adam.
    "smollm2-instruct-xdev": {
        **_CHAT_XDEV,
        "dataset": "instruct-mc",
        "partition": "dirichlet",
        "dirichlet_alpha": 0.5,
        "num_clients": 1300,
        "sample_rate": 0.03,
        "rounds": 12,
        "max_length": 384,
        "eval_examples": 195,
        "eval_every": 12,
    },
    # Issue 76, chat with natural users (docs/instruction-tuning.md): SmolLM2-Instruct on the
    # Chit-Chat Challenge conversations (common/data/chitchat.py), one client per sender (821
    # training senders, each conversation from the sender's side: their turns are the assistant's),
    # scored by the perplexity of held-out senders' turns. Shakespeare's cross-device recipe (one
    # FedSGD gradient of 2 pieces, server Adam), ~5 % of the senders a round.
    "smollm2-chitchat-xdev": {
        **_CHAT_XDEV,
        "dataset": "chitchat",
        "partition": "natural",
        "num_clients": 821,
        "sample_rate": 0.05,
        "rounds": 10,
        "max_length": 192,
        "eval_examples": 300,
        "eval_every": 10,
    },
    # The same benchmark cross-silo: 4 nodes, each holding 3 whole sets (--partition-by set), with
    # sample-level DP at each node (its own ledger).
    "smollm2-instruct-silo": {
        **_SILO,
        "dataset": "instruct-mc",
        "partition_by": "set",
        "users_per_client": 3,
        "mechanism": "dp-adamw",
        "lora_init": "peft",
        "lr": 1e-2,
        "max_length": 384,
        "lm_blocks": 4,
        "eval_examples": 260,
        # per-example gradients of 4 examples at a time (on a CPU the whole batch of 16 at 384 tokens
        # was killed at 13 GB resident; 4: a whole run peaks at 9.6 GB, docs/instruction-tuning.md)
        "microbatch": 4,
    },
    "smollm2-shakespeare-silo": _SILO,
    # Issue 52, silos that have data: the same 4 nodes, each holding 7 plays (a seeded choice of 28 of
    # the training pool's plays: 90-119 roles a node on seed 0, against 11-24): at the same ε and
    # expected batch a node's sampling rate, hence its noise against its signal, is several times
    # lower. Everything else as smollm2-shakespeare-silo; the measured settings are each method's own
    # (docs/shakespeare.md: dp-adamw --lr 1e-2 --lora-init peft keeps 52 % of the non-private drop).
    "smollm2-shakespeare-bigsilo": {
        **_SILO,
        "users_per_client": 7,
    },
    "smollm2-news": {"model": "smollm2-135m", "dataset": "news-articles", "eval_examples": 50},
    "smollm2-boolq": {"model": "smollm2-135m", "dataset": "boolq", "max_length": 128},
}


#: a preset's options that only an encoder classifier takes: a run that names a causal LM in place
#: of the preset's encoder drops those it did not set itself (to RunConfig's defaults)
ENCODER_ONLY = ("pooling", "head_init")


def preset(name: str, **overrides: object) -> RunConfig:
    """The named preset with ``overrides`` applied (``None`` values are ignored). A ``model`` that is
    a registered causal LM, given in place of the preset's, brings its own defaults for the
    :data:`ENCODER_ONLY` options the overrides leave unset."""
    if name not in PRESETS:
        raise FedloraError(f"unknown preset '{name}'; available: {', '.join(PRESETS)}")
    given = {k: v for k, v in overrides.items() if v is not None}
    base = dict(PRESETS[name])
    if given.get("model", base.get("model")) != base.get("model") and _causal(str(given["model"])):
        for key in ENCODER_ONLY:
            base.pop(key, None)
    return RunConfig(**{**base, **given})


def _causal(model: str) -> bool:
    """Whether ``model`` is a registered causal LM (a Hub id or a directory: unknown here, False)."""
    from common.models.registry import MODELS  # the registry, not the models: nothing heavy loads

    spec = MODELS.get(model)
    return spec is not None and spec.kind == "causal-lm"


def from_flat(flat: dict[str, object]) -> RunConfig:
    """Inverse of :func:`common.config.to_flat`; a ``preset`` key selects the base, unknown keys are an error.

    An empty string means "the preset's value" (pyproject.toml must list every key for Flower's
    ``--run-config`` overrides, and lists them as "")."""
    flat = dict(flat)
    base = str(flat.pop("preset", "default"))
    known = {f.name: f.type for f in fields(RunConfig)}
    values: dict[str, object] = {}
    for key, value in flat.items():
        name = key.replace("-", "_")
        if name not in known:
            close = difflib.get_close_matches(name, known, n=1)
            hint = f"; did you mean '{close[0].replace('_', '-')}'?" if close else ""
            raise FedloraError(f"unknown config key '{key}'{hint}")
        if value == "":
            continue
        kind = type(getattr(RunConfig, name))
        try:
            values[name] = _parse_bool(value) if kind is bool else kind(value)
        except (TypeError, ValueError):
            raise FedloraError(f"config key '{key}' expects {kind.__name__}, got {value!r}") from None
    return preset(base, **values)


def _parse_bool(value: object) -> bool:
    if isinstance(value, bool):
        return value
    if str(value).lower() in ("true", "1", "yes"):
        return True
    if str(value).lower() in ("false", "0", "no"):
        return False
    raise ValueError(value)


__all__ = ["PRESETS", "from_flat", "preset"]
