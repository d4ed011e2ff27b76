"""The ``flwr`` CLI against the deployment's SuperLink (its Control API): the connection config,
node registration, and submitting, following and stopping the run."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import tomli_w

from common.errors import FedloraError
from common.flower_processes import flower_executable
from server.deploy.deployment import Deployment, RunFailed
from server.deploy.interrupts import holding_interrupts
from server.deploy.processes import Proc, spawn, start

COMPLETED = "finished:completed"
FAILED = "finished:failed"
CLI_TIMEOUT_S = 180.0  # one `flwr` CLI call (it imports for several seconds on a busy machine)


def write_connection(dep: Deployment) -> Path:
    """``$FLWR_HOME/config.toml`` with one connection, the default, to this SuperLink."""
    conn: dict[str, object] = {"address": dep.address}
    if dep.tls is None:
        conn["insecure"] = True
    else:
        conn["root-certificates"] = str(dep.tls.ca)
    path = dep.flwr_home / "config.toml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(tomli_w.dumps({"superlink": {"default": dep.connection, dep.connection: conn}}), "utf-8")
    return path


def flwr_cli(dep: Deployment, *args: str, timeout: float = CLI_TIMEOUT_S) -> dict:
    """``flwr ARGS --format json`` against this deployment's FLWR_HOME; the parsed JSON."""
    what = f"`flwr {' '.join(args[:2])}`"
    returncode, out, err = _call(dep, [flower_executable("flwr"), *args, "--format", "json"], timeout)
    try:
        data = json.loads(out[out.index("{") : out.rindex("}") + 1])
    except ValueError:
        detail = " ".join((err or out).split())[-400:]
        raise FedloraError(f"{what} failed (exit {returncode}): {detail}") from None
    if returncode != 0 or not data.get("success", False):
        detail = data.get("error-message") or data.get("error") or data
        raise FedloraError(f"{what} failed: {' '.join(str(detail).split())}")
    return data


def _call(dep: Deployment, argv: list[str], timeout: float) -> tuple[int, str, str]:
    """Run a short command in its own session; killed on timeout or interrupt (a Ctrl-C here
    must not leave, say, a half-submitted ``flwr run`` behind)."""
    popen = None
    try:
        with holding_interrupts():
            popen = start(dep, argv, stderr=subprocess.PIPE)
        out, err = popen.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        raise FedloraError(
            f"`{Path(argv[0]).name} {argv[1]}` did not answer within {timeout:.0f} s"
        ) from None
    finally:
        if popen is not None and popen.poll() is None:
            popen.kill()
            popen.wait()
    return popen.returncode, out, err


def register_node(dep: Deployment, public_key: Path) -> int | None:
    """``flwr supernode register KEY``: the node id the SuperLink assigned to that key; None if
    the key was registered before (a reused work dir keeps the SuperLink's state)."""
    try:
        data = flwr_cli(dep, "supernode", "register", str(public_key), dep.connection)
    except FedloraError as exc:
        if "already in use" in str(exc):
            return None
        raise
    return int(data["node-id"])


def list_nodes(dep: Deployment) -> list[dict]:
    """``flwr supernode list``: one dict per node the SuperLink knows (``node-id``, ``status``)."""
    return list(flwr_cli(dep, "supernode", "list", dep.connection)["nodes"])


def run_config_file(dep: Deployment, flat: dict[str, object]) -> Path:
    """The run config as a TOML file (no quoting pitfalls on the command line)."""
    path = dep.work_dir / "run-config.toml"
    path.write_text(tomli_w.dumps(flat), encoding="utf-8")
    return path


def flwr_run(dep: Deployment, flat: dict[str, object]) -> int:
    """``flwr run APP CONNECTION --run-config FILE``: builds the FAB from the app directory and
    submits it; returns the run id."""
    config = run_config_file(dep, flat)
    data = flwr_cli(dep, "run", str(dep.opts.app_dir), dep.connection, "--run-config", str(config))
    return int(data["run-id"])


def run_status(dep: Deployment, run_id: int) -> tuple[str, str]:
    """``(status, details)`` of a run, e.g. ``("finished:completed", "N/A")``."""
    runs = flwr_cli(dep, "list", dep.connection, "--run-id", str(run_id))["runs"]
    return str(runs[0]["status"]), str(runs[0].get("status-details", ""))


def follow_run(dep: Deployment, run_id: int) -> Proc:
    """``flwr log RUN --stream``: the ServerApp's output (rounds, the summary) as ``[run]``; it
    exits when the run finishes."""
    argv = [flower_executable("flwr"), "log", str(run_id), dep.connection, "--stream"]
    return spawn(dep, "run", argv, critical=False)


def wait_for_run(
    dep: Deployment, run_id: int, deadline: float, check: Callable[[], None] | None = None
) -> str:
    """Until the run finishes; its final status. Stops the run on timeout; ``check`` is called
    every half second (server/deploy/supervise.py: it raises when the SuperLink dies)."""
    follower = follow_run(dep, run_id)
    while True:
        if check is not None:
            check()
        if time.monotonic() > deadline:
            _stop_quietly(dep, run_id)
            raise RunFailed(f"run {run_id} did not finish within --timeout; stopped it")
        if follower.poll() is not None:
            status, details = run_status(dep, run_id)
            if status.startswith("finished"):
                if status != COMPLETED:
                    raise RunFailed(f"run {run_id} {status}: {details}")
                return status
            follower = follow_run(dep, run_id)  # the stream ended early: follow again
        time.sleep(0.5)


def _stop_quietly(dep: Deployment, run_id: int) -> None:
    try:
        flwr_cli(dep, "stop", str(run_id), dep.connection, timeout=60)
    except FedloraError as exc:
        dep.say(f"[deploy] could not stop run {run_id}: {exc}")
