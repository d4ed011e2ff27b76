"""Flower's servers: ``flower-superlink`` and ``flower-supernode`` started for a deployment, and
waited for until they serve."""

from __future__ import annotations

import socket
import time
from pathlib import Path

from common.errors import FedloraError
from common.flower_processes import flower_executable, free_port, toml_pairs
from common.secagg import identity
from server.deploy.control import CLI_TIMEOUT_S
from server.deploy.deployment import Deployment
from server.deploy.processes import Proc, spawn


def check_port_free(host: str, port: int) -> None:
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn: TIME_WAIT is no conflict
        try:
            sock.bind((host, port))
        except OSError:
            raise FedloraError(f"port {port} on {host} is in use; choose another with --port") from None


def start_superlink(dep: Deployment) -> Proc:
    """``flower-superlink`` with a fresh state in ``<work>/state.db`` (:func:`fresh_state`) and no
    runtime ``uv sync`` (the environment already has every dependency); TLS and node
    authentication with ``--tls``."""
    opts = dep.opts
    check_port_free(opts.host, opts.port)
    argv = [flower_executable("flower-superlink"), "--host", opts.host, "--port", str(opts.port)]
    argv += ["--database", str(fresh_state(dep)), "--disable-runtime-dependency-installation"]
    if dep.tls is None:
        argv.append("--insecure")
    else:
        argv += ["--ssl-ca-certfile", str(dep.tls.ca), "--ssl-certfile", str(dep.tls.server_cert)]
        argv += ["--ssl-keyfile", str(dep.tls.server_key), "--enable-supernode-auth"]
    proc = spawn(dep, "superlink", argv, echo=not opts.quiet, port=opts.port)
    wait_listening(proc, dep.address, deadline=time.monotonic() + CLI_TIMEOUT_S)
    return proc


def fresh_state(dep: Deployment) -> Path:
    """``<work>/state.db``, empty: the state an earlier SuperLink left in this work dir (its nodes,
    which a reused work dir would otherwise bring back and sample; its runs) moves to
    ``<work>/logs/state-<time>.db``."""
    db = dep.work_dir / "state.db"
    if db.exists():
        stamp = time.strftime("%Y%m%d-%H%M%S")
        for suffix in ("", "-wal", "-shm"):
            if (old := Path(f"{db}{suffix}")).exists():
                old.rename(dep.logs / f"state-{stamp}.db{suffix}")
        dep.say(f"[deploy] the earlier SuperLink state is in {dep.logs / f'state-{stamp}.db'}")
    return db


def wait_listening(proc: Proc, address: str, deadline: float) -> None:
    """Until ``address`` accepts TCP connections; a clear error if ``proc`` exits first."""
    host, _, port = address.rpartition(":")
    while True:
        if proc.poll() is not None:
            raise FedloraError(f"{proc.name} exited with code {proc.poll()}: {proc.last_error()}")
        try:
            with socket.create_connection((host.strip("[]"), int(port)), timeout=1.0):
                return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise FedloraError(f"{proc.name} is not listening on {address}; see {proc.log_path}")
        time.sleep(0.3)


def identity_key(dep: Deployment, partition_id: int) -> Path:
    """The identity key node ``partition_id`` signs its secure-aggregation keys with: its SuperNode
    authentication key under TLS (Flower's registered P-384 key), else an Ed25519 key of its own."""
    if dep.tls is not None:
        return dep.tls.node_key(partition_id + 1)
    return dep.work_dir / "nodes" / f"node-{partition_id}" / "identity"


def roster_path(dep: Deployment) -> Path:
    """The deployment's roster: every node's identity public key (common/secagg/identity.py)."""
    return dep.work_dir / "roster.pub"


def provision_identities(dep: Deployment, nodes: int) -> None:
    """The operator's step before the nodes start: an identity for each of ``nodes`` nodes (their
    TLS keys when there are some) and the roster that lists them all."""
    identity.provision([identity_key(dep, k) for k in range(nodes)], roster_path(dep))


def start_supernode(
    dep: Deployment,
    partition_id: int,
    num_partitions: int,
    *,
    key: Path | None = None,
    name: str | None = None,
    critical: bool = False,
) -> Proc:
    """``flower-supernode`` for one partition, with its own Runtime API port and state dir; with
    TLS it authenticates with ``key`` (default: node key ``partition_id + 1``). A node may exit
    without failing the run (server/deploy/supervise.py) unless it is ``critical``."""
    name = name or f"node-{partition_id}"
    state_dir = dep.work_dir / "nodes" / name
    state_dir.mkdir(parents=True, exist_ok=True)
    node_config = toml_pairs(
        {
            "partition-id": partition_id,
            "num-partitions": num_partitions,
            "state-dir": str(state_dir),
            identity.IDENTITY_KEY: str(key or identity_key(dep, partition_id)),
            identity.ROSTER: str(roster_path(dep)),
        }
    )
    port = free_port()
    argv = [flower_executable("flower-supernode"), "--superlink", dep.address]
    argv += ["--port", str(port), "--node-config", node_config]
    if dep.tls is None:
        argv.append("--insecure")
    else:
        argv += ["--root-certificates", str(dep.tls.ca)]
        argv += ["--auth-supernode-private-key", str(key or dep.tls.node_key(partition_id + 1))]
    proc = spawn(dep, name, argv, echo=not dep.opts.quiet, critical=critical, port=port)
    proc.partition = partition_id
    return proc


def wait_for_nodes(dep: Deployment, nodes: list[Proc], deadline: float) -> list[int]:
    """Node ids once every SuperNode's log says it connected; fails when one exits (an
    unregistered key exits with Flower code 305)."""
    while True:
        for proc in nodes:
            if proc.poll() is not None:
                code = proc.flower_exit_code()
                hint = " (Flower 305: it could not connect; is its key registered?)" if code == 305 else ""
                raise FedloraError(f"{proc.name} exited with code {proc.poll()}{hint}: {proc.last_error()}")
        if all(p.node_id is not None for p in nodes):
            return [int(p.node_id) for p in nodes]
        if time.monotonic() > deadline:
            late = ", ".join(p.name for p in nodes if p.node_id is None)
            raise FedloraError(f"{late} did not connect to the SuperLink in time; see {dep.logs}")
        time.sleep(0.3)
