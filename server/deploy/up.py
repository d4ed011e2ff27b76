"""``fedlora deploy up`` as one call: prepare the work directory, bring the SuperLink and the
SuperNodes up, run the app, and always shut down."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path

from common.cores import threads_each
from common.errors import FedloraError
from common.flower_processes import flower_env
from server.deploy.control import FAILED, flwr_run, register_node, wait_for_run, write_connection
from server.deploy.deployment import (
    Deployment,
    Options,
    Result,
    RunFailed,
    default_work_dir,
    load_deployment,
    save_deployment,
)
from server.deploy.flower import provision_identities, start_superlink, start_supernode, wait_for_nodes
from server.deploy.processes import Proc, leftovers, shutdown
from server.deploy.run_config import check_run_config, resolve_run_config
from server.deploy.supervise import supervisor
from server.deploy.tls import generate_certs
from server.outcome import NoRoundApplied, ended_without_a_round, no_round_applied


def deploy_env(work_dir: Path, nodes: int, base: dict[str, str] | None = None) -> dict[str, str]:
    """Environment for every Flower process: this venv's bin first on PATH, FLWR_HOME in the work
    dir, no telemetry or update check (offline), unbuffered output, and torch threads shared among
    the processes."""
    env = flower_env(work_dir / "flwr", base)
    env["PYTHONUNBUFFERED"] = "1"
    env.setdefault("FLWR_TELEMETRY_ENABLED", "0")
    env.setdefault("FLWR_DISABLE_UPDATE_CHECK", "1")
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    env.setdefault("OMP_NUM_THREADS", str(threads_each(nodes + 1)))
    return env


def prepare(opts: Options, echo: Callable[[str], None] = print) -> Deployment:
    """Work directory, environment, certificates (``--tls``) and the connection config; starts
    nothing."""
    if opts.nodes < 1:
        raise FedloraError("--nodes must be at least 1")
    if not (opts.app_dir / "pyproject.toml").is_file():
        raise FedloraError(f"{opts.app_dir} holds no pyproject.toml (the Flower app to run)")
    work = (opts.work_dir or default_work_dir()).resolve()
    for sub in ("logs", "nodes", "flwr"):
        (work / sub).mkdir(parents=True, exist_ok=True)
    dep = Deployment(opts, work, deploy_env(work, opts.nodes), echo=echo)
    if opts.tls:
        dep.tls = generate_certs(work / "certs", opts.nodes, opts.san)
    write_connection(dep)
    return dep


def bring_up(dep: Deployment) -> list[Proc]:
    """SuperLink, node registration (TLS), N SuperNodes, all connected; returns the nodes."""
    n = dep.opts.nodes
    deadline = time.monotonic() + dep.opts.timeout
    dep.say(f"[deploy] work dir {dep.work_dir}; SuperLink on {dep.address}{' (TLS)' if dep.tls else ''}")
    start_superlink(dep)
    if dep.tls is not None:
        with ThreadPoolExecutor(max_workers=n) as pool:
            ids = list(pool.map(lambda k: register_node(dep, dep.tls.node_pub(k)), range(1, n + 1)))
        new = [str(i) for i in ids if i is not None]
        dep.say(
            f"[deploy] registered {len(new)} node keys ({', '.join(new) or '-'}); {n - len(new)} were already"
        )
    provision_identities(dep, n)
    nodes = [start_supernode(dep, k, n) for k in range(n)]  # not critical: supervise.py
    wait_for_nodes(dep, nodes, deadline)
    dep.say(f"[deploy] {n} SuperNodes connected")
    return nodes


def run_and_wait(dep: Deployment, flat: dict[str, object]) -> Result:
    """Submit the run, follow it to the end; the result with the run directory."""
    start = time.monotonic()
    run_id = flwr_run(dep, flat)
    dep.say(f"[deploy] started run {run_id}")
    run_dir = Path(str(flat["out-dir"]))
    try:
        status = wait_for_run(dep, run_id, start + dep.opts.timeout, supervisor(dep))
    except RunFailed:
        if not ended_without_a_round(run_dir):
            raise
        status = FAILED  # the ServerApp failed because no round was applied: check_result says why
    return Result(run_id, status, run_dir, time.monotonic() - start, dep)


def deploy_up(opts: Options, echo: Callable[[str], None] = print) -> Result:
    """The whole deployment: prepare, bring up, run, and always shut down."""
    opts = replace(opts, work_dir=(opts.work_dir or default_work_dir()).resolve())
    flat = resolve_run_config(opts.run_config, opts.nodes, opts.work_dir)  # before anything is written
    return _deploy(opts, flat, echo)


def deploy_resume(
    work_dir: Path, overrides: Mapping[str, object], echo: Callable[[str], None] = print
) -> Result:
    """Continue the run of the deployment in ``work_dir`` (after its ServerApp, SuperLink or this
    machine died): its stored options and run config with ``resume=true``, a fresh SuperLink state
    (no node of the dead deployment comes back), the run directory's ledger and checkpoint.
    ``overrides``: options that may change on resuming (``timeout``, ``grace``, ``quiet``,
    ``restart_nodes``)."""
    opts, flat = load_deployment(work_dir.resolve())
    opts = replace(opts, **overrides)
    flat = check_run_config({**flat, "resume": True})  # nothing to resume, or another run: fails here
    return _deploy(opts, flat, echo)


def check_result(result: Result) -> None:
    """How ``deploy up`` / ``resume`` ends for a completed run: exit 0 once it applied a round;
    :class:`~server.outcome.NoRoundApplied` (exit 1, one line saying why) when it applied none."""
    if result.no_round:
        raise NoRoundApplied(result.no_round)


def _deploy(opts: Options, flat: dict[str, object], echo: Callable[[str], None]) -> Result:
    dep = prepare(opts, echo)
    save_deployment(dep, flat)
    try:
        bring_up(dep)
        result = run_and_wait(dep, flat)
    finally:
        dep.say("[deploy] shutting down")
        shutdown(dep)
        if stray := leftovers(dep):
            dep.say(f"[deploy] warning: processes still running after shutdown: {stray}")
    result = replace(result, no_round=no_round_applied(result.run_dir))
    applied = "; no round was applied" if result.no_round else ""
    echo(f"[deploy] run {result.run_id} {result.status} in {result.seconds:.0f} s{applied}")
    echo(f"[deploy] run directory {result.run_dir}  (summary: {result.run_dir / 'summary.json'})")
    echo(f"[deploy] logs in {dep.logs}")
    return result
