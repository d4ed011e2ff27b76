"""``fedlora audit client|mia``: empirical privacy audits, each a real attack on the real training code.
``client``: canary clients in a federation, against the client-level mechanisms (server/audit/client.py);
``mia``: canary examples in one local training run (or, with ``--models K``, one canary in K runs), against
the sample-level ones (server/audit/mia.py).
``--json`` prints one object per audited arm: ``auc``, ``eps_lower_bound`` (one run, at
``--confidence``), ``eps_estimate`` (one-shot), the claimed ``epsilon`` (PLD) and the settings."""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from pathlib import Path

from common.config import RunConfig
from common.errors import FedloraError
from common.local_optimizers import LOCAL_OPTIMIZERS
from common.presets import preset
from common.privacy.audit import MIN_CANARIES, MIN_MODELS
from common.privacy.threat import THREATS

#: the audited arms: name -> RunConfig overrides (the no-noise arm must lose, the others must hold)
CLIENT_ARMS: dict[str, dict[str, object]] = {
    "no noise (clip only)": {"mechanism": "dp-fedavg", "clip_only": True},
    "dp-fedavg central ε=8": {"mechanism": "dp-fedavg", "threat_model": "central", "target_epsilon": 8.0},
    "dp-fedavg distributed ε=8": {
        "mechanism": "dp-fedavg",
        "threat_model": "distributed",
        "target_epsilon": 8.0,
    },
    # per client, against the server too; min-replies 9/10 of the cohort, canaries included (_client_configs)
    "dp-fedavg secure aggregation ε=8": {
        "mechanism": "dp-fedavg",
        "threat_model": "secure-aggregation",
        "target_epsilon": 8.0,
    },
    # every client every round, each contributing by its own coin: amplified against the server
    "dp-fedavg secure aggregation hidden ε=8": {
        "mechanism": "dp-fedavg",
        "threat_model": "secure-aggregation-hidden",
        "target_epsilon": 8.0,
    },
}
#: sample-level arms: name -> train-local overrides (the no-noise arm must lose, the others must hold)
MIA_ARMS: dict[str, dict[str, object]] = {
    "no noise (non-private AdamW)": {"mechanism": "fedavg"},
    **{
        f"{m} ε=3": {"mechanism": m, "sample_epsilon": 3.0}
        for m, spec in LOCAL_OPTIMIZERS.items()
        if spec.private and spec.audited
    },
}
#: --quick: 20 real clients (+ the canaries), every client every round, 3 rounds (≈ 2 minutes, 2 cores)
QUICK = {
    "num_clients": 20,
    "sample_rate": 1.0,
    "rounds": 3,
    "max_train_examples": 600,
    "eval_examples": 50,
    "eval_every": 3,
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


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="audit", metavar="{client,mia}", required=True)
    p = sub.add_parser("client", help="canary clients (Andrew et al. 2024): client-level DP mechanisms")
    p.add_argument("--preset", default="minilm-rt-xdev", help="federation the canaries join")
    p.add_argument("--quick", action="store_true", help="a small federation (20 clients, 3 rounds)")
    p.add_argument("--clients", type=int, default=0, help="real clients (0: the preset's, 20 with --quick)")
    p.add_argument("--rounds", type=int, default=0, help="rounds (0: the preset's, 3 with --quick)")
    p.add_argument("--clip", type=float, default=0.5, help="client-level clip C (the canaries' norm)")
    _common(p, CLIENT_ARMS, "canary directions, inclusion and the run's seed")
    m = sub.add_parser(
        "mia", help="canary examples in one run (Steinke et al. 2023): sample-level DP optimizers"
    )
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
    _common(m, MIA_ARMS, "canary texts, labels, inclusion and the run's seed")


def _common(p: argparse.ArgumentParser, arms: dict, seeds: str) -> None:
    p.add_argument("--canaries", type=int, default=100, help=f"canaries (>= {MIN_CANARIES})")
    p.add_argument("--confidence", type=float, default=0.95, help="confidence of the ε lower bound")
    p.add_argument("--seed", type=int, default=0, help=seeds)
    p.add_argument("--arms", default=",".join(arms), help="comma-separated arms to audit")
    p.add_argument("--out", default=None, help="directory for the audited runs (must not exist)")
    p.add_argument("--json", action="store_true", help="print one JSON object per arm")


def run(args: argparse.Namespace) -> int:
    if getattr(args, "models", 0) and args.models < MIN_MODELS:
        raise FedloraError(f"--models must be 0 (one run) or >= {MIN_MODELS}, got {args.models}")
    if args.canaries < MIN_CANARIES:
        raise FedloraError(f"an audit needs at least {MIN_CANARIES} canaries, got {args.canaries}")
    if not 0.5 < args.confidence < 1:
        raise FedloraError(f"--confidence must be in (0.5, 1), got {args.confidence}")
    known = CLIENT_ARMS if args.audit == "client" else MIA_ARMS
    arms = [a.strip() for a in args.arms.split(",") if a.strip()]
    unknown = [a for a in arms if a not in known]
    if unknown or not arms:
        name = unknown[0] if unknown else ""
        raise FedloraError(f"unknown arm {name!r}; choose from {', '.join(known)}")
    out = Path(args.out or f"runs/audit-{args.audit}-{time.strftime('%Y%m%d-%H%M%S')}")
    if out.exists():
        raise FedloraError(f"{out} exists; an audit never writes into an earlier one")
    if args.audit == "client":
        from server.audit.client import audit_run  # loads the federation stack only when needed

        configs = _client_configs(args, arms)
    else:
        from server.audit.mia import audit_run, models_audit

        configs = _mia_configs(args, arms)
    results = []
    for k, (arm, cfg) in enumerate(zip(arms, configs, strict=True)):
        where = (out / f"arm-{k}", args.seed, args.confidence)
        if getattr(args, "models", 0):
            result = {"arm": arm, **models_audit(cfg, args.models, *where)}
        else:
            result = {"arm": arm, **audit_run(cfg, args.canaries, *where)}
        results.append(result)
        print(json.dumps(result) if args.json else _line(result), flush=True)
    (out / "audit.json").write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    return 0


def _secagg_min_replies(cfg: RunConfig, canaries: int) -> int:
    """SecAgg+'s min-replies m for an audit arm: its shares are sized for m, 9/10 of the cohort the
    plan counts over the federation (canaries included; under hidden participation all of its
    clients), so a full cohort carries 10/9 of the noise the plan needs."""
    from common.privacy.secure_plan import cohort_bound
    from server.audit.client import federation

    cohort = cohort_bound(federation(cfg, canaries))
    return max(cfg.secagg_neighbours // 2 + 1, cohort * 9 // 10)


#: transport name -> an audit arm's min-replies through it (the others keep the preset's)
_MIN_REPLIES: dict[str, Callable[[RunConfig, int], int]] = {"secagg+": _secagg_min_replies}


def _client_configs(args: argparse.Namespace, arms: list[str]) -> list[RunConfig]:
    """Each arm's config (its real clients), checked first, all of them, as the federation it runs:
    the canary slots are clients of it like any other (server/audit/client.py ``federation``)."""
    from server.audit.client import federation

    base = {**(QUICK if args.quick else {}), "clip": args.clip, "seed": args.seed}
    base.update({k: v for k, v in (("num_clients", args.clients), ("rounds", args.rounds)) if v})
    configs = []
    for arm in arms:
        cfg = preset(args.preset, **{**base, **CLIENT_ARMS[arm]})
        if sized := _MIN_REPLIES.get(THREATS[cfg.threat_model].transport.name):
            cfg = cfg.replace(min_replies=sized(cfg, args.canaries))
        federation(cfg, args.canaries).check()
        configs.append(cfg)
    return configs


def _mia_configs(args: argparse.Namespace, arms: list[str]) -> list[RunConfig]:
    from client.train_local_cli import local_defaults

    defaults = {k: v for k, v in local_defaults().items() if v is not None}  # one node, the whole split
    base = {**defaults, **(QUICK_MIA if args.quick else {}), "seed": args.seed}
    base.update(model=args.model, dataset=args.dataset)
    given = (("max_train_examples", args.examples), ("local_steps", args.steps), ("lr", args.lr))
    base.update({k: v for k, v in given if v})
    return [RunConfig(**{**base, **MIA_ARMS[a]}).check() for a in arms]


def _line(r: dict) -> str:
    claimed = "none (no noise)" if r["epsilon"] is None else f"{r['epsilon']:.2f}"
    if "models" in r:
        return (
            f"{r['arm']}: AUC {r['auc']:.3f}, ε lower bound {r['eps_lower_bound']:.2f} ({r['confidence']:.0%}, "
            f"K-models threshold), claimed ε {claimed} (δ {r['delta']:g}, {r['unit']}); {r['models']} models "
            f"({r['models_in']} with the canary), {r['seconds']:.0f} s"
        )
    estimate = "n/a" if r["eps_estimate"] is None else f"{r['eps_estimate']:.2f} (mu {r['mu_estimate']:.2f})"
    return (
        f"{r['arm']}: AUC {r['auc']:.3f}, ε lower bound {r['eps_lower_bound']:.2f} "
        f"({r['correct']}/{r['guesses']} guesses, {r['confidence']:.0%}), one-shot estimate {estimate}, "
        f"claimed ε {claimed} ({r['accountant'].split(' ')[0].upper()}, δ {r['delta']:g}, {r['unit']}); {r['canaries']} canaries "
        f"({r['included']} in), {r['seconds']:.0f} s"
    )
