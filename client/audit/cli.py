"""``fedlora audit mia``: canary examples in one local training run (Steinke et al., NeurIPS 2023), or
with ``--models K`` one canary in K runs, against the sample-level DP optimizers: the arms, their
configurations and the command (the attack: client/audit/mia.py; what every audit shares:
common/privacy/audit_cli.py)."""

from __future__ import annotations

import argparse

from common.config import RunConfig
from common.local_optimizers import LOCAL_OPTIMIZERS
from common.local_options import local_defaults
from common.privacy.audit_cli import add_common, audit_arms, chosen_arms, out_dir

#: sample-level arms: name -> train-local overrides (the no-noise arm must lose, the others must hold)
MIA_ARMS: dict[str, dict[str, object]] = {
    "no noise (non-private AdamW)": {"mechanism": "fedavg"},
    **{
        f"{m} ε=3": {"mechanism": m, "sample_epsilon": 3.0}
        for m, spec in LOCAL_OPTIMIZERS.items()
        if spec.private and spec.audited
    },
}
#: mia --quick: 50 real examples, 60 steps of 32 at lr 5e-3, 32 tokens (each canary in ≈ 17 batches)
QUICK_MIA = {
    "max_train_examples": 50,
    "local_steps": 60,
    "batch_size": 32,
    "lr": 5e-3,
    "max_length": 32,
    "eval_examples": 50,
}


def add_arguments(m: argparse.ArgumentParser) -> None:
    m.add_argument("--model", default="minilm-l6", help="model (a packaged one or a local path)")
    m.add_argument("--dataset", default="bbc-news", help="the client's data (5 classes; see docs/privacy.md)")
    m.add_argument("--quick", action="store_true", help="50 real examples, 60 steps of 32, lr 5e-3")
    m.add_argument("--examples", type=int, default=0, help="real training examples (0: train-local's)")
    m.add_argument("--steps", type=int, default=0, help="local steps (0: train-local's)")
    m.add_argument("--lr", type=float, default=0.0, help="learning rate of every arm (0: train-local's)")
    m.add_argument(
        "--models",
        type=int,
        default=0,
        help="K-models audit instead: K trainings, one canary in each with probability 1/2, "
        "Clopper-Pearson threshold bound (0: the one-run audit; K >= 10)",
    )
    add_common(m, MIA_ARMS, "canary texts, labels, inclusion and the run's seed")


def run(args: argparse.Namespace) -> int:
    arms = chosen_arms(args, MIA_ARMS)
    out = out_dir(args)
    configs = _mia_configs(args, arms)
    from client.audit.mia import audit_run, models_audit  # the model frameworks load only now

    if args.models:
        return audit_arms(
            args, out, arms, configs, lambda cfg, _, *where: models_audit(cfg, args.models, *where)
        )
    return audit_arms(args, out, arms, configs, audit_run)


def _mia_configs(args: argparse.Namespace, arms: list[str]) -> list[RunConfig]:
    defaults = {k: v for k, v in local_defaults().items() if v is not None}  # one node, the whole split
    base = {**defaults, **(QUICK_MIA if args.quick else {}), "seed": args.seed}
    base.update(model=args.model, dataset=args.dataset)
    given = (("max_train_examples", args.examples), ("local_steps", args.steps), ("lr", args.lr))
    base.update({k: v for k, v in given if v})
    return [RunConfig(**{**base, **MIA_ARMS[a]}).check() for a in arms]
