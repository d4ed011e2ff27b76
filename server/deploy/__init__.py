"""``fedlora deploy up``: a real Flower 1.41 deployment on this machine.

One ``flower-superlink`` (SQLite state in the work directory), N ``flower-supernode`` processes
(node k: ``partition-id=k num-partitions=N state-dir="<work>/nodes/node-k"``), a Flower connection
in ``<work>/flwr/config.toml`` (``FLWR_HOME``), then ``flwr run`` of this checkout (the FAB is
built from the app directory, so the ServerApp and ClientApps run this code) and ``flwr log
--stream`` until the run finishes. Every process' output is echoed with a ``[name]`` prefix and
written to ``<work>/logs/<name>.log``; everything is shut down by PID (SIGTERM, SIGKILL after a
grace period) on success, failure or Ctrl-C.

With ``--tls``: ``scripts/generate_certs.sh`` writes a CA, the SuperLink certificate and one key
pair per node into ``<work>/certs``; the SuperLink serves HTTPS with
``--enable-supernode-auth``, each node's public key is registered with ``flwr supernode
register``, and nodes connect with ``--root-certificates`` and ``--auth-supernode-private-key``.

Isolation is Flower's default, ``subprocess``: the SuperLink and each SuperNode start their own
``flower-superexec``, which starts ``flwr-serverapp`` / ``flwr-clientapp`` per run or message.

Modules: ``deployment`` (options, work directory, result), ``run_config``, ``tls``,
``processes`` (start, log, shut down by PID), ``interrupts``, ``flower`` (SuperLink and
SuperNodes), ``control`` (the ``flwr`` CLI), ``up`` (the whole deployment) and ``cli``. The small
functions re-exported here are what tests/server/test_deploy.py composes.
"""

from server.deploy.control import (
    CONNECTION,
    flwr_cli,
    flwr_run,
    follow_run,
    list_nodes,
    register_node,
    run_status,
    wait_for_run,
    write_connection,
)
from server.deploy.deployment import (
    REPO,
    Deployment,
    Options,
    Result,
    RunFailed,
    load_deployment,
    save_deployment,
)
from server.deploy.flower import start_superlink, start_supernode, wait_for_nodes
from server.deploy.processes import Proc, leftovers, shutdown, spawn
from server.deploy.run_config import parse_run_config, resolve_run_config
from server.deploy.tls import Tls, generate_certs
from server.deploy.up import bring_up, deploy_resume, deploy_up, prepare, run_and_wait

__all__ = [
    "CONNECTION",
    "REPO",
    "Deployment",
    "Options",
    "Proc",
    "Result",
    "RunFailed",
    "Tls",
    "bring_up",
    "deploy_resume",
    "deploy_up",
    "flwr_cli",
    "flwr_run",
    "follow_run",
    "generate_certs",
    "leftovers",
    "list_nodes",
    "load_deployment",
    "parse_run_config",
    "prepare",
    "register_node",
    "resolve_run_config",
    "run_and_wait",
    "run_status",
    "save_deployment",
    "shutdown",
    "spawn",
    "start_superlink",
    "start_supernode",
    "wait_for_nodes",
    "wait_for_run",
    "write_connection",
]
