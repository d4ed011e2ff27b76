"""``fedlora simulate``: the real ServerApp and ClientApp, driven in-process by InProcessGrid."""

from __future__ import annotations

import argparse
import json
import shlex
from collections.abc import Callable
from pathlib import Path

from flwr.app import Context, Message, RecordDict

from common.config import RunConfig, to_flat
from common.device import resolve_device
from common.errors import FedloraError
from common.options import add_config_arguments as add_options
from common.options import config_values
from common.presets import PRESETS, preset
from common.runtime import open_split
from common.timing import reset, totals
from server.inprocess import InProcessGrid, load_component
from server.outcome import check_applied
from server.run_dir import default_run_dir, write_json
from server.workers import WorkerPoolGrid, resolve_workers

CLIENT_APP = "client.app:app"  # as in pyproject.toml [tool.flwr.app.components]
SERVER_APP = "server.app:app"
COHORT = "client.cohort_round:train_round"  # the batched engine's handler of a round's train messages


#: what ``--engine auto`` runs on each device type (docs/cohort-engine.md): batched on CUDA, where a
#: cohort fills the device; sequential on the CPU, where ``fedlora bench scale --engine
#: sequential,batched`` measured the batched engine 1.15-1.57x faster per client for MiniLM but
#: 0.81-0.93x for SmolLM2 (a core is already busy with one client's 512 tokens)
AUTO_ENGINE = {"cuda": "batched", "cpu": "sequential"}


def engine_of(cfg: RunConfig) -> str:
    """``cfg.engine``, ``auto`` resolved by the device (:data:`AUTO_ENGINE`)."""
    if cfg.engine != "auto":
        return cfg.engine
    return AUTO_ENGINE[resolve_device(cfg.device).type]


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
    stored = Path(args.out_dir) / "config.json"
    try:
        values = json.loads(stored.read_text(encoding="utf-8"))
        base = RunConfig(**values)
    except (OSError, ValueError, TypeError) as exc:
        raise FedloraError(f"cannot resume: {stored} is missing or unreadable ({exc})") from None
    return base.replace(**{k: v for k, v in overrides.items() if v is not None}).check_federated()


#: (real ClientApp, message, context) -> reply: stands between the server and a node (e.g. audit canaries)
ClientWrapper = Callable[[Callable, Message, Context], Message]


def simulate(cfg: RunConfig, run_dir: Path | None = None, wrap: ClientWrapper | None = None) -> Path:
    """Run a federation of ``cfg.num_clients`` in-process nodes; returns the run directory. Node k
    keeps its state (its sample-level ledger) in ``<run dir>/nodes/node-k``.

    Clients run in ``cfg.workers`` processes (server/workers.py; 1: in this process, and always with
    ``wrap``, which receives every message to a node with the real ClientApp); with the batched
    engine (:func:`engine_of`) each process trains its share of a round's clients as one cohort
    (client/cohort.py). The summary gets
    ``time_split_s``: seconds of the phases that ran in this process (common/timing.py: local
    training and the clients' release only when the clients run here, the server's decode and
    aggregate, evaluation).

    A bad dataset name, a missing asset or too many clients fails here, before any worker starts (the
    split is cached: the ServerApp's Evaluator reuses it); a bad model name fails in the Evaluator,
    before the run directory is created."""
    open_split(cfg)
    run_dir = run_dir or (Path(cfg.out_dir) if cfg.out_dir else default_run_dir(cfg))
    flat = to_flat(cfg.replace(out_dir=str(run_dir)))
    batched = wrap is None and engine_of(cfg) == "batched"
    workers = 1 if wrap is not None else min(resolve_workers(cfg.workers, cfg.device), cfg.num_clients)
    if workers > 1:  # every core (every GPU) trains clients (server/workers.py)
        cohort_ref = COHORT if batched else ""
        grid = WorkerPoolGrid(
            CLIENT_APP, cfg.num_clients, flat, workers, state_root=run_dir / "nodes", cohort_ref=cohort_ref
        )
    else:
        app = load_component(CLIENT_APP)
        handler = app if wrap is None else (lambda msg, ctx: wrap(app, msg, ctx))
        cohort = load_component(COHORT) if batched else None
        grid = InProcessGrid(handler, cfg.num_clients, flat, state_root=run_dir / "nodes", cohort=cohort)
    context = Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config=flat)
    reset()
    try:
        load_component(SERVER_APP)(grid, context)
    except BaseException:  # Ctrl-C or an error: the workers are stopped at once, not waited for
        if isinstance(grid, WorkerPoolGrid):
            grid.close(abort=True)
        raise
    if isinstance(grid, WorkerPoolGrid):
        grid.close()
    summary_path = run_dir / "summary.json"
    if summary_path.exists():
        summary = json.loads(summary_path.read_text(encoding="utf-8"))
        summary["time_split_s"] = totals()
        write_json(summary_path, summary)
    return run_dir


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_config_arguments(parser)


def run(args: argparse.Namespace) -> int:
    """``fedlora simulate``: 0 once the run applied a round; when it applied none, exit 1
    (:class:`server.outcome.NoRoundApplied`) with one line saying why. Ctrl-C (KeyboardInterrupt)
    carries the command that continues the run once its run directory exists (common/cli.py prints
    ``fedlora: interrupted; continue with: fedlora simulate --resume --out DIR``)."""
    cfg = config_from_args(args)
    run_dir = Path(cfg.out_dir) if cfg.out_dir else default_run_dir(cfg)
    try:
        simulate(cfg, run_dir)
    except KeyboardInterrupt:
        if not (run_dir / "config.json").is_file():
            raise  # nothing written yet: nothing to continue
        raise KeyboardInterrupt(f"continue with: {resume_command(run_dir)}") from None
    check_applied(run_dir)
    return 0


def resume_command(run_dir: Path) -> str:
    """The command that continues the run in ``run_dir`` (its stored configuration)."""
    return f"fedlora simulate --resume --out {shlex.quote(str(run_dir))}"
