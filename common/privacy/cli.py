"""``fedlora privacy epsilon|sigma``: plan a federation's noise and budget."""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

from common.errors import FedloraError
from common.privacy import gdp
from common.privacy.accountants import ACCOUNTANTS
from common.privacy.calibration import calibrate_sigma, epsilon_for

GUARANTEES = {
    "gdp": "CLT mu-GDP (DR-Encoder paper): an approximation, not a bound",
    "rdp": "Renyi DP of the Poisson-subsampled Gaussian: an upper bound",
    "pld": "privacy-loss distribution (dp_accounting's algorithm, pessimistic): a tight upper bound",
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="privacy_command", metavar="{epsilon,sigma,ledger}", required=True)
    eps = sub.add_parser("epsilon", help="epsilon spent by T rounds at noise multiplier sigma")
    eps.add_argument("--noise-multiplier", type=float, required=True, metavar="S")
    sig = sub.add_parser("sigma", help="noise multiplier that meets a target epsilon")
    sig.add_argument("--epsilon", type=float, required=True, metavar="E")
    for p in (eps, sig):
        p.add_argument("--accountant", choices=sorted(ACCOUNTANTS), default="pld")
        p.add_argument(
            "--sample-rate", type=float, required=True, metavar="P", help="Poisson rate p in (0, 1]"
        )
        p.add_argument("--rounds", type=int, required=True, metavar="T")
        p.add_argument("--delta", type=float, required=True, metavar="D")
        p.add_argument("--json", action="store_true", help="print one JSON object")
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
    _check(args)
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
    if args.json:
        print(json.dumps(result))
    else:
        width = max(map(len, result))
        for key, value in result.items():
            shown = f"{value:.6g}" if isinstance(value, float) else value
            print(f"{key:<{width}}  {shown}")
    return 0


def _ledger(args: argparse.Namespace) -> int:
    from common.privacy.ledger import Ledger
    from common.privacy.report import write_report

    ledger = Ledger.open(args.path)
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
    print(
        f"{report['unit']} ledger {args.path} (owner {report['owner']}), delta {float(report['delta']):g}: "
        f"epsilon {report['eps_gdp']:.4g} (gdp, mu {report['mu']:.4g}) / {report['eps_tight']:.4g} (pld)"
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
