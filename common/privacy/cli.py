"""``fedlora privacy epsilon|sigma``: plan a federation's noise and budget; ``epsilon --accountant
wishart``: the Wishart-amplified ε of noise before a random projection (M2) beside the baseline;
``secagg``: the numbers of a secure-aggregation release (common/privacy/planning/secure_plan.py); ``ftrl``: the
noise of banded matrix-factorization DP-FTRL against DP-FedAvg's (common/privacy/planning/ftrl_plan.py)."""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

from common.errors import FedloraError
from common.privacy.accounting import gdp
from common.privacy.accounting.accountants import ACCOUNTANTS
from common.privacy.accounting.calibration import calibrate_sigma, epsilon_for
from common.privacy.mechanisms.wishart import DEFAULT_FAIL_FRAC, wishart_epsilon
from common.privacy.participation.threat import ACTIVE_SERVER
from common.privacy.planning.ftrl_plan import compare_noise, workload_name

GUARANTEES = {
    "gdp": "CLT mu-GDP (DR-Encoder paper): an approximation, not a bound",
    "rdp": "Renyi DP of the Poisson-subsampled Gaussian: an upper bound",
    "pld": "privacy-loss distribution (dp_accounting's algorithm, pessimistic): a tight upper bound",
    "wishart": (
        "noise before a fresh Gaussian rank-r projection (M2; Wishart paper Thm 5 + App. F.2) on the pld "
        "accountant: an upper bound only for a mechanism meeting M2's assumptions, else only the baseline holds"
    ),
}
#: options only --accountant wishart takes (argparse dest -> flag)
WISHART_OPTIONS = {"rank": "--rank", "dim": "--dim", "grad_rank": "--grad-rank", "fail_frac": "--fail-frac"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(
        dest="privacy_command", metavar="{epsilon,sigma,secagg,ftrl,ledger}", required=True
    )
    eps = sub.add_parser("epsilon", help="epsilon spent by T rounds at noise multiplier sigma")
    eps.add_argument("--noise-multiplier", type=float, required=True, metavar="S")
    sig = sub.add_parser("sigma", help="noise multiplier that meets a target epsilon")
    sig.add_argument("--epsilon", type=float, required=True, metavar="E")
    eps.add_argument("--accountant", choices=[*sorted(ACCOUNTANTS), "wishart"], default="pld")
    sig.add_argument("--accountant", choices=sorted(ACCOUNTANTS), default="pld")
    wish = eps.add_argument_group("wishart (noise before a fresh Gaussian rank-r projection, M2)")
    wish.add_argument("--rank", type=int, metavar="R", help="projection rank r (LoRA rank), 1 <= r < dim")
    wish.add_argument("--dim", type=int, metavar="D", help="projected dimension d (the layer's in_features)")
    wish.add_argument(
        "--grad-rank",
        type=int,
        metavar="S",
        help="bound on the rank of one participant's clipped full-weight gradient (default: dim, always "
        "safe for one layer); for L projected layers of the same rank and dim, the sum of their bounds",
    )
    wish.add_argument(
        "--fail-frac",
        type=float,
        metavar="F",
        help=f"share of delta for projection failure, in (0, 1) (default {DEFAULT_FAIL_FRAC}, the paper's)",
    )
    for p in (eps, sig):
        p.add_argument(
            "--sample-rate", type=float, required=True, metavar="P", help="Poisson rate p in (0, 1]"
        )
        p.add_argument("--rounds", type=int, required=True, metavar="T")
        p.add_argument("--delta", type=float, required=True, metavar="D")
        p.add_argument("--json", action="store_true", help="print one JSON object")
    sec = sub.add_parser(
        "secagg",
        help="plan a secure-aggregation release: Skellam noise, bits per coordinate, bytes per client",
    )
    sec.add_argument("--epsilon", type=float, required=True, metavar="E", help="client-level target")
    sec.add_argument("--delta", type=float, required=True, metavar="D")
    sec.add_argument(
        "--participations",
        type=int,
        required=True,
        metavar="Z",
        help="rounds a client may take part in (each charged at p = 1: the server sees who takes part)",
    )
    sec.add_argument("--dim", type=int, required=True, metavar="N", help="coordinates of the update")
    sec.add_argument("--clip", type=float, required=True, metavar="C")
    sec.add_argument("--min-survivors", type=int, required=True, metavar="M", help="fewest clients unmasked")
    sec.add_argument("--cohort", type=int, required=True, metavar="K", help="most clients summed in a round")
    sec.add_argument(
        "--neighbours", type=int, required=True, metavar="K", help="SecAgg+ neighbours per client"
    )
    sec.add_argument(
        "--threshold", type=int, required=True, metavar="T", help="shares that reconstruct a seed"
    )
    sec.add_argument(
        "--bits", type=int, default=0, metavar="B", help="bits per coordinate (default: the fewest)"
    )
    sec.add_argument(
        "--sample-rate",
        type=float,
        metavar="P",
        help="with --rounds: also the ε against observers of the released adapter only (sampling hidden)",
    )
    sec.add_argument("--rounds", type=int, metavar="T", help="the run's rounds, with --sample-rate")
    sec.add_argument(
        "--hidden",
        action="store_true",
        help="hidden participation (--threat-model secure-aggregation-hidden): every client in every "
        "round, contributing by its own coin at --sample-rate; the plan is for --rounds at that rate and "
        "--participations is not used",
    )
    sec.add_argument("--json", action="store_true", help="print one JSON object")
    ftrl = sub.add_parser(
        "ftrl",
        help="noise RMSE of banded MF (DP-FTRL) against DP-FedAvg, with and without amplification",
    )
    ftrl.add_argument("--epsilon", required=True, metavar="E[,E...]", help="client-level targets")
    ftrl.add_argument("--rounds", type=int, required=True, metavar="T")
    ftrl.add_argument(
        "--sample-rate", type=float, required=True, metavar="P", help="expected cohort / population"
    )
    ftrl.add_argument("--delta", type=float, required=True, metavar="D")
    ftrl.add_argument("--bands", type=int, default=0, metavar="B", help="bands = min-sep (0: floor(1/p))")
    ftrl.add_argument("--server-optimizer", choices=("sgd", "momentum"), default="sgd")
    ftrl.add_argument("--server-momentum", type=float, default=0.9, metavar="BETA")
    ftrl.add_argument("--json", action="store_true", help="print one JSON object per epsilon")
    led = sub.add_parser("ledger", help="show a privacy ledger; write its report (JSON + PNG plot)")
    led.add_argument("path", type=Path, help="ledger file (a run's ledger.sqlite or a node's)")
    led.add_argument("--json", action="store_true", help="print the report as one JSON object")
    led.add_argument("--report-dir", type=Path, help="write privacy.json and privacy.png here")


def _check(args: argparse.Namespace) -> None:
    if not 0 < args.sample_rate <= 1:
        raise FedloraError(f"sample rate p must be in (0, 1], got {args.sample_rate}")
    if not 0 < args.delta < 1:
        raise FedloraError(f"delta must be in (0, 1), got {args.delta}")
    if args.rounds < 1:
        raise FedloraError(f"rounds must be >= 1, got {args.rounds}")
    sigma = getattr(args, "noise_multiplier", None)
    if sigma is not None and not (sigma >= 0 and math.isfinite(sigma)):
        raise FedloraError(f"noise multiplier must be finite and >= 0, got {sigma}")
    target = getattr(args, "epsilon", None)
    if target is not None and not (target > 0 and math.isfinite(target)):
        raise FedloraError(f"epsilon must be > 0, got {target}")


def run(args: argparse.Namespace) -> int:
    if args.privacy_command == "ledger":
        return _ledger(args)
    if args.privacy_command == "secagg":
        return _secagg(args)
    if args.privacy_command == "ftrl":
        return _ftrl(args)
    _check(args)
    if args.privacy_command == "epsilon":
        given = [flag for dest, flag in WISHART_OPTIONS.items() if getattr(args, dest) is not None]
        if args.accountant == "wishart":
            return _wishart(args)
        if given:
            raise FedloraError(
                f"{', '.join(given)} {'apply' if len(given) > 1 else 'applies'} only to --accountant wishart"
            )
    if args.privacy_command == "sigma":
        try:
            sigma = calibrate_sigma(args.accountant, args.epsilon, args.delta, args.sample_rate, args.rounds)
        except ValueError as exc:
            raise FedloraError(str(exc)) from None
    else:
        sigma = args.noise_multiplier
    eps = epsilon_for(args.accountant, sigma, args.sample_rate, args.rounds, args.delta)
    result = {
        "accountant": args.accountant,
        "guarantee": GUARANTEES[args.accountant],
        "unit": "per participant of the sampled population (client-level in a federation)",
        "epsilon": eps,
        "delta": args.delta,
        "noise_multiplier": sigma,
        "sample_rate": args.sample_rate,
        "rounds": args.rounds,
    }
    if args.accountant == "gdp":
        result["mu"] = gdp.mu_poisson(sigma, args.sample_rate, args.rounds)
    _print(result, args.json)
    return 0


def _wishart(args: argparse.Namespace) -> int:
    missing = [WISHART_OPTIONS[d] for d in ("rank", "dim") if getattr(args, d) is None]
    if missing:
        raise FedloraError(f"--accountant wishart needs {' and '.join(missing)}")
    if args.rank < 1:
        raise FedloraError(f"--rank must be >= 1, got {args.rank}")
    if args.rank >= args.dim:
        raise FedloraError(
            f"--rank must be below --dim (a rank-r projection of d dims), got {args.rank} >= {args.dim}"
        )
    if args.grad_rank is not None and args.grad_rank < 1:
        raise FedloraError(f"--grad-rank must be >= 1, got {args.grad_rank}")
    fail_frac = DEFAULT_FAIL_FRAC if args.fail_frac is None else args.fail_frac
    if not 0 < fail_frac < 1:
        raise FedloraError(f"--fail-frac must be in (0, 1), got {fail_frac}")
    w = wishart_epsilon(
        args.noise_multiplier,
        args.sample_rate,
        args.rounds,
        args.delta,
        args.rank,
        args.dim,
        grad_rank=args.grad_rank,
        fail_frac=fail_frac,
    )
    result = {
        "accountant": "wishart",
        "guarantee": GUARANTEES["wishart"],
        "unit": "per participant whose clipped full-weight gradient is projected (example-level for "
        "local steps, client-level for server rounds)",
        "epsilon": w.epsilon,
        "claimed": w.claimed,
        "reason": w.reason,
        "epsilon_amplified": w.amplified,
        "epsilon_baseline": w.baseline,
        "baseline_accountant": w.baseline_accountant,
        "delta": w.delta,
        "projection_delta": w.projection_delta,
        "alpha": w.alpha,
        "noise_multiplier": w.noise_multiplier,
        "effective_noise_multiplier": w.effective_noise_multiplier,
        "sample_rate": w.sample_rate,
        "rounds": w.rounds,
        "rank": w.rank,
        "dim": w.dim,
        "grad_rank": w.grad_rank,
    }
    _print(result, args.json)
    return 0


def _secagg(args: argparse.Namespace) -> int:
    from common.privacy.planning.secure_plan import SecureTarget, contributor_bound, plan_secure

    if (args.sample_rate is None) != (args.rounds is None):
        raise FedloraError("--sample-rate and --rounds go together")
    if args.hidden and args.sample_rate is None:
        raise FedloraError("--hidden needs --sample-rate and --rounds")
    target = (
        SecureTarget(args.epsilon, args.delta, args.rounds, args.sample_rate)
        if args.hidden
        else SecureTarget(args.epsilon, args.delta, args.participations)
    )
    plan = plan_secure(
        target,
        args.dim,
        args.clip,
        (args.min_survivors, args.cohort),
        (args.neighbours, args.threshold),
        args.bits,
        contributor_bound(args.cohort, args.sample_rate) if args.hidden else 0,
    )
    result = {
        "accountant": "rdp (Skellam: Agarwal et al. 2021), "
        + (
            f"every round at p = {args.sample_rate:g} (Steinke 2022)"
            if args.hidden
            else "p = 1 per participation"
        ),
        "guarantee": f"client-level, zero-out adjacency; against the server, {ACTIVE_SERVER}, and every "
        "other observer (secure aggregation); "
        + (
            "who contributed is hidden (each client's own coin)"
            if args.hidden
            else "who participated is visible"
        ),
        **plan.as_dict(),
    }
    if args.sample_rate is not None and not args.hidden:
        result["epsilon_adapter_observers"] = plan.observers_epsilon(args.sample_rate, args.rounds)
        result["adapter_observers"] = (
            f"against observers of the released adapter only, had the {args.rounds} rounds been "
            f"Poisson-sampled at p = {args.sample_rate:g} (hidden from them): not against the server, and "
            "not for runs, whose cohorts are fixed and balanced (docs/secure-aggregation.md)"
        )
    _print(result, args.json)
    return 0


def _ftrl(args: argparse.Namespace) -> int:
    try:
        targets = [float(e) for e in str(args.epsilon).split(",")]
    except ValueError:
        raise FedloraError(f"--epsilon takes numbers separated by commas, got '{args.epsilon}'") from None
    for eps in targets:
        args.epsilon = eps
        _check(args)
    if args.bands < 0 or args.bands > args.rounds:
        raise FedloraError(f"--bands must be in [0, rounds], got {args.bands}")
    work = workload_name(args.server_optimizer, args.server_momentum)
    try:
        rows = [
            compare_noise(args.rounds, args.sample_rate, args.delta, e, args.bands, work) for e in targets
        ]
    except ValueError as exc:
        raise FedloraError(str(exc)) from None
    if args.json:
        for row in rows:
            print(json.dumps({**row, "rounds": args.rounds, "delta": args.delta, "workload": work}))
        return 0
    print(
        f"noise RMSE of the model trajectory over {args.rounds} rounds, server {work}, p {args.sample_rate:g}, "
        f"delta {args.delta:g}, {rows[0]['bands']} bands (sigma: each accountant of the ledger meets the target)"
    )
    print(
        "epsilon  sigma MF  sigma FedAvg  MF / FedAvg, min-sep  MF min-sep / amplified FedAvg  MF cyclic / amplified"
    )
    for r in rows:
        print(
            f"{r['epsilon']:<8g} {r['sigma']['mf_min_sep']:<9.4g} {r['sigma']['fedavg']:<13.4g} "
            f"{r['mf_min_sep_over_fedavg_min_sep']:<21.3f} {r['mf_min_sep_over_fedavg']:<30.3f} "
            f"{r['mf_cyclic_over_fedavg']:.3f}"
        )
    print(
        "min-sep: no client in two rounds less than the bands apart, no amplification claimed; amplified FedAvg: "
        "Poisson sampling at p every round; cyclic: a fixed group per client, q = bands x p"
    )
    return 0


def _print(result: dict, as_json: bool) -> None:
    if as_json:
        print(json.dumps(result))
        return
    width = max(map(len, result))
    for key, value in result.items():
        shown = f"{value:.6g}" if isinstance(value, float) else value
        print(f"{key:<{width}}  {shown}")


def _ledger_path(path: Path) -> Path:
    """The ledger file ``path`` names: itself, or a run directory's ledger.sqlite. A run directory
    without one says why (the run released nothing under client-level DP); any other directory, that
    it is not a run's."""
    if not path.is_dir():
        return path
    if (path / "ledger.sqlite").is_file():
        return path / "ledger.sqlite"
    config = path / "config.json"
    if not config.is_file():
        raise FedloraError(f"no ledger at {path} (not a run directory: no config.json, no ledger.sqlite)")
    from dataclasses import fields

    from common.config import RunConfig

    try:
        stored = json.loads(config.read_text(encoding="utf-8"))
        cfg = RunConfig(**{f.name: stored[f.name] for f in fields(RunConfig) if f.name in stored})
        private, release, clip_only = cfg.private, cfg.release_kind, cfg.clip_only
    except (ValueError, TypeError, KeyError, AttributeError):
        raise FedloraError(f"no ledger in {path} (its config.json is unreadable)") from None
    if not private:
        why = "the run was not private (no DP mechanism), so it charged no epsilon"
    elif clip_only:
        why = "the run was not private (clip-only diagnostic: increments clipped, no noise), so it charged no epsilon"
    elif release == "none":
        nodes = sorted(path.glob("nodes/node-*/sample-ledger.sqlite"))
        where = f": {', '.join(map(str, nodes))}" if nodes else " (in each node's state directory)"
        why = f"the run had no client-level release; its sample-level ledgers are the nodes'{where}"
    else:
        why = "the run charged nothing yet (no round started)"
    raise FedloraError(f"no ledger in {path}: {why}")


def _ledger(args: argparse.Namespace) -> int:
    from common.privacy.accounting.ledger import Ledger
    from common.privacy.accounting.report import both_epsilons, write_report

    path = _ledger_path(args.path)
    ledger = Ledger.open(path)
    try:
        report = ledger.report()
        if args.report_dir:
            args.report_dir.mkdir(parents=True, exist_ok=True)
            for path in write_report(ledger, args.report_dir):
                print(f"wrote {path}", file=sys.stderr)
    finally:
        ledger.close()
    if args.json:
        print(json.dumps(report))
        return 0
    if report["tight_accountant"] == "rdp":  # Skellam noise: the CLT mu-GDP is no bound, RDP alone holds
        spent = f"epsilon {report['epsilon']:.4g} (rdp; the CLT gdp {report['eps_gdp']:.4g} is no bound here)"
    elif report.get("budget") == "pld":  # Gaussians at p = 1 (dp-ftrl under min-sep)
        spent = (
            f"epsilon {report['epsilon']:.4g} (pld, the bound the run holds to; the CLT gdp "
            f"{report['eps_gdp']:.4g} does not apply at p = 1)"
        )
    else:
        spent = both_epsilons(report)
    print(
        f"{report['what_if']}{report['unit']} ledger {path} (owner {report['owner']}), "
        f"delta {float(report['delta']):g}: {spent}"
    )
    for guarantee in report["guarantees"]:
        print(f"  guarantee: {guarantee}")
    for note in report["uncovered"]:
        print(f"  NOT covered by this epsilon: run {note['run']} round {note['round']}: {note['what']}")
    columns = (
        "round",
        "status",
        "sigma",
        "p",
        "sampled",
        "replied",
        "clip",
        "threat_model",
        "eps_gdp",
        "eps_tight",
    )
    print("  ".join(f"{c:>11}" for c in columns))
    for row in report["rounds"]:
        print(
            "  ".join(f"{row[c]:>11.4g}" if isinstance(row[c], float) else f"{row[c]!s:>11}" for c in columns)
        )
    return 0
