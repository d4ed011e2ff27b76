"""``fedlora audit client|mia``: empirical privacy audits, each a real attack on the real training code.

``client``: canary clients in a federation, against the client-level mechanisms (server/audit/cli.py,
the attack in server/audit/client.py, a canary node's reply in client/audit/canary.py); ``mia``: canary
examples in one local training run (or, with ``--models K``, one canary in K runs), against the
sample-level ones (client/audit/cli.py, client/audit/mia.py). Each is named here as a string and loaded
on demand (common/cli.py ``add_commands``), so neither package imports the other.
``--json`` prints one object per audited arm: ``auc``, ``eps_lower_bound`` (one run, at
``--confidence``), ``eps_estimate`` (one-shot), the claimed ``epsilon`` (PLD) and the settings."""

from __future__ import annotations

import argparse
import importlib
import json
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from common.config import RunConfig
from common.errors import FedloraError
from common.privacy.audit import MIN_CANARIES, MIN_MODELS

#: audit -> (module providing add_arguments(parser) and run(args) -> int, one-line help)
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "client": ("server.audit.cli", "canary clients (Andrew et al. 2024): client-level DP mechanisms"),
    "mia": (
        "client.audit.cli",
        "canary examples in one run (Steinke et al. 2023): sample-level DP optimizers",
    ),
}

#: one audited arm: (config, canaries, run directory, seed, confidence) -> its result
AuditOne = Callable[[RunConfig, int, Path, int, float], dict]


def run(args: argparse.Namespace) -> int:
    return importlib.import_module(SUBCOMMANDS[args.audit][0]).run(args)


def add_common(p: argparse.ArgumentParser, arms: dict, seeds: str) -> None:
    """The options every audit takes; ``arms``: its arm table, ``seeds``: what ``--seed`` seeds."""
    p.add_argument("--canaries", type=int, default=100, help=f"canaries (>= {MIN_CANARIES})")
    p.add_argument("--confidence", type=float, default=0.95, help="confidence of the ε lower bound")
    p.add_argument("--seed", type=int, default=0, help=seeds)
    p.add_argument("--arms", default=",".join(arms), help="comma-separated arms to audit")
    p.add_argument("--out", default=None, help="directory for the audited runs (must not exist)")
    p.add_argument("--json", action="store_true", help="print one JSON object per arm")


def chosen_arms(args: argparse.Namespace, known: dict) -> list[str]:
    """``--arms`` checked against ``known``, with the options every audit checks (one line each)."""
    if getattr(args, "models", 0) and args.models < MIN_MODELS:
        raise FedloraError(f"--models must be 0 (one run) or >= {MIN_MODELS}, got {args.models}")
    if args.canaries < MIN_CANARIES:
        raise FedloraError(f"an audit needs at least {MIN_CANARIES} canaries, got {args.canaries}")
    if not 0.5 < args.confidence < 1:
        raise FedloraError(f"--confidence must be in (0.5, 1), got {args.confidence}")
    arms = [a.strip() for a in args.arms.split(",") if a.strip()]
    unknown = [a for a in arms if a not in known]
    if unknown or not arms:
        name = unknown[0] if unknown else ""
        raise FedloraError(f"unknown arm {name!r}; choose from {', '.join(known)}")
    return arms


def out_dir(args: argparse.Namespace) -> Path:
    """The audit's directory (``--out``, else a new one under runs/): never an earlier one."""
    out = Path(args.out or f"runs/audit-{args.audit}-{time.strftime('%Y%m%d-%H%M%S')}")
    if out.exists():
        raise FedloraError(f"{out} exists; an audit never writes into an earlier one")
    return out


def audit_arms(
    args: argparse.Namespace,
    out: Path,
    arms: Sequence[str],
    configs: Sequence[RunConfig],
    audit_one: AuditOne,
) -> int:
    """Audit each arm in turn (``out/arm-K``), print its line (or JSON object) as it ends, then
    write every result to ``out/audit.json``."""
    results = []
    for k, (arm, cfg) in enumerate(zip(arms, configs, strict=True)):
        result = {"arm": arm, **audit_one(cfg, args.canaries, out / f"arm-{k}", args.seed, args.confidence)}
        results.append(result)
        print(json.dumps(result) if args.json else describe(result), flush=True)
    (out / "audit.json").write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    return 0


def describe(r: dict) -> str:
    """One audited arm's result in one line."""
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
