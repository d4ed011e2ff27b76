"""``fedlora deploy run`` and ``fedlora deploy wait``: a run on a SuperLink this command did not
start (by hand, by docker compose, on another machine), followed to its end, with the run's own
outcome as the exit status. ``flwr run --stream`` and ``flwr log --stream`` exit 0 whatever the run
did (issue 75 item 6: a run that trained nothing looked like success); Flower's word on a run is
``flwr list --run-id``, which :func:`~server.deploy.control.wait_for_run` reads when the log ends."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from pathlib import Path

from common.flower_processes import flower_env
from server.deploy.control import flwr_run, wait_for_run
from server.deploy.deployment import Deployment, Options, default_work_dir
from server.deploy.processes import shutdown
from server.deploy.run_config import check_run_config, parse_run_config


def attach(
    connection: str,
    *,
    work_dir: Path | None = None,
    app_dir: Path | None = None,
    timeout: float | None = None,
    echo: Callable[[str], None] = print,
) -> Deployment:
    """A deployment of no processes of its own: ``flwr`` calls name ``connection`` in the caller's
    ``FLWR_HOME`` (Flower's ``~/.flwr`` when unset); ``work_dir`` (default ``runs/submit-<time>``)
    keeps the submitted run config and ``logs/run.log``. ``timeout``: seconds the run may take
    (None: no limit; past it the run is stopped)."""
    work = (work_dir or default_work_dir("submit")).resolve()
    (work / "logs").mkdir(parents=True, exist_ok=True)
    limit = math.inf if timeout is None else timeout
    app = {} if app_dir is None else {"app_dir": app_dir.resolve()}
    opts = Options(nodes=0, work_dir=work, timeout=limit, grace=5.0, **app)
    return Deployment(opts, work, flower_env(None), echo=echo, connection=connection)


def submit(dep: Deployment, items: tuple[str, ...]) -> int:
    """``flwr run APP CONNECTION --run-config FILE`` after the run config is checked here (a bad
    value: one line, nothing submitted); returns the run id."""
    flat = parse_run_config(items)
    if flat.get("out-dir"):  # the ServerApp's working directory is Flower's, not the caller's
        flat["out-dir"] = str(Path(str(flat["out-dir"])).expanduser().resolve())
    check_run_config(flat, where_present=True)
    run_id = flwr_run(dep, flat)
    dep.say(f"[deploy] submitted run {run_id} to {dep.connection}")
    return run_id


def follow(dep: Deployment, run_id: int) -> None:
    """Echo the run's log until it finishes, then its status and how long it took from here. Raises
    :class:`~server.deploy.deployment.RunFailed` (exit 1, one line with Flower's details) unless it is
    ``finished:completed``; Ctrl-C stops following, not the run (the message says how to go on)."""
    start = time.monotonic()
    try:
        status = wait_for_run(dep, run_id, start + dep.opts.timeout)
    except KeyboardInterrupt:
        raise KeyboardInterrupt(
            f"run {run_id} goes on at the SuperLink: `fedlora deploy wait {run_id} {dep.connection}` "
            f"follows it again, `flwr stop {run_id} {dep.connection}` stops it"
        ) from None
    finally:
        shutdown(dep)  # the `flwr log` follower
    seconds = time.monotonic() - start
    dep.say(f"[deploy] run {run_id} {status} after {seconds:.0f} s (log: {dep.logs / 'run.log'})")


__all__ = ["attach", "follow", "submit"]
