"""The federation behind ``fedlora simulate`` (its command line: server/simulate_cli.py): the real
ServerApp and ClientApp, driven in-process by InProcessGrid or a worker pool."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from flwr.app import Context, Message, RecordDict

from common.config import RunConfig, to_flat
from common.device import resolve_device
from common.errors import FedloraError
from common.lazy import load_component
from common.runtime import open_split
from common.timing import reset, totals
from server.inprocess import InProcessGrid
from server.outcome import NoRoundApplied
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


#: (real ClientApp, message, context) -> reply: stands between the server and a node (e.g. audit canaries)
ClientWrapper = Callable[[Callable, Message, Context], Message]


def _check_batch(cfg: RunConfig, split) -> None:
    """A sample-level DP optimizer samples an expected ``--batch-size`` of each node's examples: a
    node with fewer examples than that is refused here, before round 0, naming the option."""
    if cfg.optimizer_kind == "none" or not split.clients:
        return
    sizes = [len(c) for c in split.clients]
    node = min(range(len(sizes)), key=sizes.__getitem__)
    if cfg.batch_size > sizes[node]:
        raise FedloraError(
            f"--batch-size {cfg.batch_size} exceeds node {node}'s {sizes[node]} training examples (the fewest "
            f"of any node): {cfg.optimizer_kind} samples an expected batch of that size; pass --batch-size "
            f"{sizes[node]} or less"
        )


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
    _check_batch(cfg, open_split(cfg))
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
    except NoRoundApplied:  # the ServerApp fails such a run for Flower; here the caller decides
        pass  # (fedlora simulate: server/outcome.check_applied, exit 1), the run directory stands
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
