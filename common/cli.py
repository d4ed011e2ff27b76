"""The ``fedlora`` command. Subcommands live in the package that owns them and load on demand,
so ``common`` imports neither ``server`` nor ``client`` (they are named here as strings)."""

from __future__ import annotations

import argparse
import importlib
import logging
import signal
import sys
import threading
from collections.abc import Sequence

from common.errors import FedloraError

#: subcommand -> (module providing add_arguments(parser) and run(args) -> int, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "simulate": (
        "server.simulate_cli",
        "run a federation in-process (real ServerApp/ClientApp, no Ray)",
    ),
    "privacy": (
        "common.privacy.cli",
        "privacy planning: epsilon for a noise level, noise for a budget; ledgers",
    ),
    "train-local": (
        "client.train_local_cli",
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
        "common.privacy.audit_cli",
        "empirical privacy audits: canary clients (client-level) and canary examples (sample-level)",
    ),
    "evaluate": (
        "server.evaluate_cli",
        "score a finished run's adapter again on its held-out split (more examples, or the base model)",
    ),
    "generate": ("common.models.generate", "sample text from a saved causal-LM adapter on its base model"),
    "predict": ("common.models.predict", "label texts (or a CSV/JSONL file) with a saved classifier adapter"),
    "node": ("client.node.cli", "join a federation as a data owner: a flower-supernode over your own data"),
}


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, exit 2 (argparse prints usage too)
        self.exit(2, f"{self.prog}: error: {message}\n")


def add_commands(
    parser: argparse.ArgumentParser,
    table: dict[str, tuple[str, str]],
    argv: Sequence[str] | None,
    dest: str,
    required: bool = False,
) -> None:
    """One subparser of ``parser`` per entry of ``table`` (name -> (module, one-line help)). Only the
    entry ``argv`` names (its first word) imports its module and adds its arguments, so a command pays
    for its own imports alone; ``argv`` None loads every one (for what inspects the whole CLI). A module
    with a ``SUBCOMMANDS`` table instead of ``add_arguments`` nests the same way (``fedlora bench
    suite``: the chosen subcommand lands in ``args.<name>``, its module's ``run`` dispatches)."""
    metavar = "COMMAND" if dest == "command" else "{" + ",".join(table) + "}"
    sub = parser.add_subparsers(dest=dest, metavar=metavar, parser_class=_Parser, required=required)
    chosen = None if argv is None else next((a for a in argv if not a.startswith("-")), None)
    for name, (module, help_text) in table.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        if argv is not None and name != chosen:
            continue
        loaded = importlib.import_module(module)
        nested = getattr(loaded, "SUBCOMMANDS", None)
        if nested is None:
            loaded.add_arguments(p)
        else:
            rest = None if argv is None else argv[list(argv).index(name) + 1 :]
            add_commands(p, nested, rest, dest=name, required=True)


def build_parser(argv: Sequence[str] | None) -> argparse.ArgumentParser:
    """The ``fedlora`` parser, with the arguments of the command ``argv`` names (None: of every one)."""
    parser = _Parser(prog="fedlora", description="Federated LoRA fine-tuning under differential privacy.")
    add_commands(parser, COMMANDS, argv, dest="command")
    return parser


def main(argv: list[str] | None = None) -> int:
    """The ``fedlora`` command (``argv``: the process's own when None). Errors a user can fix are
    one line, exit 2 (or the error's code); Ctrl-C is one line, exit 130."""
    ending = argv is None  # the process's entry point: it ends with this call
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser(argv)
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
        if ending and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C would break into the exit
        hint = " ".join(str(exc).split())
        print(f"fedlora: interrupted{'; ' + hint if hint else ''}", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
