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
functions re-exported here (loaded on first use: ``fedlora deploy --help`` needs none of
``up``'s imports) are what tests/server/test_deploy.py composes.
"""

from common.lazy import lazy_exports

_EXPORTS = {
    "server.deploy.control": (
        "flwr_cli",
        "flwr_run",
        "follow_run",
        "list_nodes",
        "register_node",
        "run_status",
        "wait_for_run",
        "write_connection",
    ),
    "server.deploy.deployment": (
        "CONNECTION",
        "REPO",
        "Deployment",
        "Options",
        "Result",
        "RunFailed",
        "load_deployment",
        "save_deployment",
    ),
    "server.deploy.flower": ("start_superlink", "start_supernode", "wait_for_nodes"),
    "server.deploy.processes": ("Proc", "leftovers", "shutdown", "spawn"),
    "server.deploy.run_config": ("parse_run_config", "resolve_run_config"),
    "server.deploy.tls": ("Tls", "generate_certs"),
    "server.deploy.up": ("bring_up", "deploy_resume", "deploy_up", "prepare", "run_and_wait"),
}
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
__all__ = sorted(name for names in _EXPORTS.values() for name in names)
