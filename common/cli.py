"""The ``fedlora`` command. Subcommands live in the package that owns them and load on demand,
so ``common`` imports neither ``server`` nor ``client`` (they are named here as strings)."""

from __future__ import annotations

import argparse
import importlib
import logging
import sys

from common.errors import FedloraError

#: subcommand -> (module providing add_arguments(parser) and run(args) -> int, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "simulate": (
        "server.simulate",
        "run a federation in-process (real ServerApp/ClientApp, no Ray)",
    ),
    "privacy": (
        "common.privacy.cli",
        "privacy planning: epsilon for a noise level, noise for a budget; ledgers",
    ),
    "train-local": (
        "client.train_local",
        "train one client centrally with a local (DP) optimizer; held-out accuracy and sample-level epsilon",
    ),
    "bench": (
        "server.bench.cli",
        "measurements: mechanisms, codecs, scale, and the suite that writes docs/RESULTS.md",
    ),
    "deploy": (
        "server.deploy.cli",
        "run a real deployment: flower-superlink + N flower-supernodes + flwr run",
    ),
    "audit": (
        "server.audit.cli",
        "empirical privacy audits: canary clients (client-level) and canary examples (sample-level)",
    ),
    "generate": ("common.models.generate", "sample text from a saved causal-LM adapter on its base model"),
    "node": ("client.node.cli", "join a federation as a data owner: a flower-supernode over your own data"),
}


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, exit 2 (argparse prints usage too)
        self.exit(2, f"{self.prog}: error: {message}\n")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = _Parser(prog="fedlora", description="Federated LoRA fine-tuning under differential privacy.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    chosen = next((a for a in argv if not a.startswith("-")), None)
    for name, (module, help_text) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        if name == chosen:
            importlib.import_module(module).add_arguments(p)
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        return importlib.import_module(COMMANDS[args.command][0]).run(args)
    except FedloraError as exc:
        print(f"fedlora: error: {' '.join(str(exc).split())}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt as exc:  # a subcommand may say how to continue: KeyboardInterrupt(hint)
        hint = " ".join(str(exc).split())
        print(f"fedlora: interrupted{'; ' + hint if hint else ''}", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
