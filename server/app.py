"""Flower ServerApp: an explicit round loop over the Grid (see server.federation)."""

from __future__ import annotations

from pathlib import Path

from flwr.app import Context
from flwr.serverapp import Grid, ServerApp

from common.presets import from_flat
from server.federation import run_federation
from server.outcome import check_applied
from server.run_dir import default_run_dir

app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    cfg = from_flat(dict(context.run_config)).check_federated()
    run_dir = Path(cfg.out_dir) if cfg.out_dir else default_run_dir(cfg)
    run_federation(grid, cfg, run_dir)
    # a run that applied no round fails, on every route (`flwr list`: finished:failed, with the line
    # saying why; `flwr run --stream` itself exits 0 whatever the run did)
    check_applied(run_dir)
