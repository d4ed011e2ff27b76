"""``fedlora simulate``'s command line: its arguments, the :class:`RunConfig` they make, and the run
they start. Imports no model framework until a run starts (server/simulate.py holds the federation),
so ``--help`` and refused input answer at once."""

from __future__ import annotations

import argparse
import json
import shlex
from pathlib import Path

from common.config import RunConfig
from common.errors import FedloraError
from common.options import add_config_arguments as add_options
from common.options import config_values
from common.presets import PRESETS, preset


def add_config_arguments(parser: argparse.ArgumentParser) -> None:
    """``--preset``, one ``--option`` per declared :class:`RunConfig` option (defaults come from the
    preset), ``--out`` and ``--resume``."""
    parser.add_argument("--preset", default="default", choices=sorted(PRESETS), help="base configuration")
    add_options(parser)
    parser.add_argument(
        "--out",
        dest="out_dir",
        default=None,
        help="run directory (default runs/<time>-<model>-<dataset>)",
    )
    parser.add_argument(
        "--resume",
        action="store_true",
        default=None,
        help="continue the run in --out after a crash, from its checkpoint and ledger (its stored configuration)",
    )


def config_from_args(args: argparse.Namespace) -> RunConfig:
    """The preset with the given options; with ``--resume``, the run's stored configuration (options
    given too must agree with it, which the run directory checks)."""
    overrides = {**config_values(args), "out_dir": args.out_dir, "resume": args.resume}
    if not args.resume:
        return preset(args.preset, **overrides).check_federated()
    if not args.out_dir:
        raise FedloraError("--resume needs --out RUN_DIR")
    try:
        base = stored_config(Path(args.out_dir))
    except FedloraError as exc:
        raise FedloraError(f"cannot resume: {exc}") from None
    return base.replace(**{k: v for k, v in overrides.items() if v is not None}).check_federated()


def stored_config(run_dir: Path) -> RunConfig:
    """The configuration a run stored in ``run_dir/config.json`` (one line when it is missing or
    unreadable)."""
    stored = run_dir / "config.json"
    try:
        return RunConfig(**json.loads(stored.read_text(encoding="utf-8")))
    except (OSError, ValueError, TypeError) as exc:
        raise FedloraError(f"{stored} is missing or unreadable ({exc})") from None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_config_arguments(parser)


def run(args: argparse.Namespace) -> int:
    """``fedlora simulate``: 0 once the run applied a round; when it applied none, exit 1
    (:class:`server.outcome.NoRoundApplied`) with one line saying why. Ctrl-C (KeyboardInterrupt)
    carries the command that continues the run once its run directory exists (common/cli.py prints
    ``fedlora: interrupted; continue with: fedlora simulate --resume --out DIR``)."""
    cfg = config_from_args(args)  # refused input answers before the federation stack loads
    from common.models.registry import resolve_model

    resolve_model(cfg.model)  # so does a model that is not there (a Hub id: its config, transformers alone)
    # said at once: the imports, the data and the model take seconds before round 0's first line
    print(
        f"fedlora simulate: {cfg.model} on {cfg.dataset}, {cfg.num_clients} clients, {cfg.rounds} rounds, "
        f"{cfg.mechanism}; loading the data and the model",
        flush=True,
    )
    from server.outcome import check_applied
    from server.run_dir import default_run_dir, release_empty
    from server.simulate import simulate

    run_dir = Path(cfg.out_dir) if cfg.out_dir else default_run_dir(cfg)
    try:
        simulate(cfg, run_dir)
    except BaseException as exc:
        if not (run_dir / "config.json").is_file():  # nothing written yet: nothing to continue
            if not cfg.out_dir:
                release_empty(run_dir)  # the directory this run claimed
            raise
        if isinstance(exc, KeyboardInterrupt):
            raise KeyboardInterrupt(f"continue with: {resume_command(run_dir)}") from None
        raise
    check_applied(run_dir)
    return 0


def resume_command(run_dir: Path) -> str:
    """The command that continues the run in ``run_dir`` (its stored configuration)."""
    return f"fedlora simulate --resume --out {shlex.quote(str(run_dir))}"
