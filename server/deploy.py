"""``fedlora deploy up``: a real Flower 1.41 deployment on this machine.

One ``flower-superlink`` (SQLite state in the work directory), N ``flower-supernode`` processes
(node k: ``partition-id=k num-partitions=N state-dir='<work>/nodes/node-k'``), a Flower connection
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
The small functions below (:func:`prepare`, :func:`start_superlink`, :func:`register_node`,
:func:`start_supernode`, :func:`flwr_run`, :func:`wait_for_run`, :func:`shutdown`) are what
tests/test_deploy.py composes.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field, replace
from pathlib import Path

import psutil
import tomli_w

from common.config import from_flat
from common.errors import FedloraError

REPO = Path(__file__).resolve().parents[1]
CERTS_SCRIPT = REPO / "scripts" / "generate_certs.sh"
CONNECTION = "fedlora-deploy"  # the connection's name in <work>/flwr/config.toml
COMPLETED = "finished:completed"
FLOWER_EXIT = re.compile(r"Exit Code: (\d+)")
NODE_ID = re.compile(r"SuperNode ID: (\d+)")
KEY_VALUE = re.compile(r"(\S+?)=('[^']*'|\"[^\"]*\"|\S+)")  # flwr.common.config.parse_config_args
ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
CLI_TIMEOUT_S = 180.0  # one `flwr` CLI call (it imports for several seconds on a busy machine)


class RunFailed(FedloraError):
    """The run started but did not complete (the ServerApp failed, timed out, a process died)."""

    exit_code = 1


@dataclass(frozen=True)
class Options:
    """What ``fedlora deploy up`` was asked for."""

    nodes: int
    tls: bool = False
    work_dir: Path | None = None
    run_config: tuple[str, ...] = ()
    host: str = "127.0.0.1"
    port: int = 8000
    timeout: float = 3600.0
    grace: float = 10.0
    app_dir: Path = REPO
    quiet: bool = False
    san: tuple[str, ...] = ()  # extra names/IPs for the SuperLink certificate (--tls)


@dataclass(frozen=True)
class Tls:
    """The files scripts/generate_certs.sh writes (node keys are numbered from 1)."""

    certs: Path

    @property
    def ca(self) -> Path:
        return self.certs / "ca.crt"

    @property
    def server_cert(self) -> Path:
        return self.certs / "server.pem"

    @property
    def server_key(self) -> Path:
        return self.certs / "server.key"

    def node_key(self, k: int) -> Path:
        return self.certs / f"supernode-{k}.key"

    def node_pub(self, k: int) -> Path:
        return self.certs / f"supernode-{k}.pub"


@dataclass
class Proc:
    """One started process: its output goes to ``log_path`` (and, prefixed, to the console)."""

    name: str
    popen: subprocess.Popen
    log_path: Path
    critical: bool = True  # the run fails if it exits (SuperLink, SuperNodes)
    port: int | None = None  # the HTTP port it serves (SuperLink: Fleet/Control/Runtime; node: Runtime)
    pump: threading.Thread | None = None
    node_id: int | None = None  # a SuperNode's id, once its log says it connected

    @property
    def pid(self) -> int:
        return self.popen.pid

    def poll(self) -> int | None:
        return self.popen.poll()

    def tail(self, lines: int = 15) -> str:
        """The last lines of the log (the pump may still be writing)."""
        try:
            text = self.log_path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def flower_exit_code(self) -> int | None:
        """Flower's own exit code (``Exit Code: 305``) from the log; the OS code is just 1."""
        codes = FLOWER_EXIT.findall(self.log_path.read_text(encoding="utf-8", errors="replace"))
        return int(codes[-1]) if codes else None


@dataclass
class Deployment:
    """A work directory and the processes started in it."""

    opts: Options
    work_dir: Path
    env: dict[str, str]
    tls: Tls | None = None
    procs: list[Proc] = field(default_factory=list)
    seen_pids: set[int] = field(default_factory=set)  # every PID shutdown() signalled
    echo: Callable[[str], None] = print
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def flwr_home(self) -> Path:
        return self.work_dir / "flwr"

    @property
    def logs(self) -> Path:
        return self.work_dir / "logs"

    @property
    def address(self) -> str:
        """Where local clients reach the SuperLink (a wildcard host means loopback)."""
        host = "127.0.0.1" if self.opts.host in ("0.0.0.0", "::", "") else self.opts.host
        return f"[{host}]:{self.opts.port}" if ":" in host else f"{host}:{self.opts.port}"

    def say(self, line: str) -> None:
        with self._lock:
            self.echo(line)


@dataclass(frozen=True)
class Result:
    """A finished run: Flower's run id and status, the run directory, and the deployment."""

    run_id: int
    status: str
    run_dir: Path
    seconds: float  # from submission to the end of the run
    deployment: Deployment | None = None


# --- preparation ---------------------------------------------------------------------------------


def flower_bin(name: str) -> str:
    """A Flower executable: next to this Python (the venv) first, then on PATH."""
    local = Path(sys.executable).parent / name
    if local.is_file() and os.access(local, os.X_OK):
        return str(local)
    for folder in os.environ.get("PATH", "").split(os.pathsep):
        candidate = Path(folder) / name
        if folder and candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    raise FedloraError(f"'{name}' not found; install flwr 1.41 (`make install`) and use its environment")


def flower_env(work_dir: Path, nodes: int, base: dict[str, str] | None = None) -> dict[str, str]:
    """Environment for every Flower process: this venv's bin first on PATH (SuperLink and
    SuperNodes start ``flower-superexec`` by name), FLWR_HOME in the work dir, no telemetry or
    update check (offline), unbuffered output, and torch threads shared among the processes."""
    env = dict(os.environ if base is None else base)
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    env["FLWR_HOME"] = str(work_dir / "flwr")
    env["PYTHONUNBUFFERED"] = "1"
    env.setdefault("FLWR_TELEMETRY_ENABLED", "0")
    env.setdefault("FLWR_DISABLE_UPDATE_CHECK", "1")
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // (nodes + 1))))
    return env


def toml_quote(value: str) -> str:
    """``value`` as a TOML string that Flower's ``k=v`` parser keeps whole (no quote inside)."""
    if "'" not in value:
        return f"'{value}'"
    if '"' not in value and "\\" not in value:
        return f'"{value}"'
    raise FedloraError(f"cannot pass {value!r} in a Flower key=value config (it has both quote kinds)")


def default_work_dir() -> Path:
    return Path("runs") / f"deploy-{time.strftime('%Y%m%d-%H%M%S')}"


def parse_run_config(items: tuple[str, ...] | list[str]) -> dict[str, object]:
    """``"k=v k2='s'"`` strings (TOML values, as ``flwr run --run-config``) -> a flat dict."""
    import click
    from flwr.common.config import parse_config_args

    if any(item.strip().endswith(".toml") for item in items):
        raise FedloraError("--run-config takes 'key=value ...' here, not a TOML file")
    for item in items:  # Flower silently drops what its pattern does not match
        if rest := KEY_VALUE.sub(" ", item).strip():
            raise FedloraError(f"bad --run-config: cannot read {rest.split()[0]!r} as key=value")
    try:
        return parse_config_args(list(items))
    except (click.ClickException, ValueError) as exc:
        message = exc.format_message() if isinstance(exc, click.ClickException) else str(exc)
        raise FedloraError(f"bad --run-config: {message}") from None


def resolve_run_config(items: tuple[str, ...], nodes: int, work_dir: Path) -> dict[str, object]:
    """The run config ``flwr run`` gets: ``num-clients`` = nodes and an absolute ``out-dir``
    (default ``<work>/run``), checked here so a bad value fails before anything starts."""
    flat = parse_run_config(items)
    clients = flat.setdefault("num-clients", nodes)
    if clients != nodes:
        raise FedloraError(f"num-clients={clients} in --run-config, but --nodes {nodes}: they must agree")
    flat["out-dir"] = str(Path(str(flat.get("out-dir") or work_dir / "run")).resolve())
    cfg = from_flat(dict(flat)).check()
    out = Path(cfg.out_dir)
    if not cfg.resume and ((out / "config.json").exists() or (out / "ledger.sqlite").exists()):
        raise FedloraError(f"run directory {out} already holds a run; give another out-dir or resume=true")
    return flat


def generate_certs(out: Path, nodes: int, san: tuple[str, ...] = ()) -> Tls:
    """CA, SuperLink certificate (for localhost, 127.0.0.1, ::1 and ``san``) and ``nodes`` node
    key pairs via scripts/generate_certs.sh; a directory that already holds them all is reused."""
    tls = Tls(out)
    wanted = [tls.ca, tls.server_cert, tls.server_key]
    wanted += [p for k in range(1, nodes + 1) for p in (tls.node_key(k), tls.node_pub(k))]
    if all(p.exists() for p in wanted):
        return tls
    if not CERTS_SCRIPT.is_file():
        raise FedloraError(f"{CERTS_SCRIPT} not found (--tls needs this checkout's scripts/)")
    argv = ["bash", str(CERTS_SCRIPT), "--out", str(out), "--nodes", str(nodes)]
    argv += [arg for name in san for arg in ("--san", name)]
    done = subprocess.run(
        argv,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHON": sys.executable},
    )
    if done.returncode != 0:
        raise FedloraError(f"generate_certs.sh failed: {done.stderr.strip() or done.stdout.strip()}")
    return tls


def write_connection(dep: Deployment) -> Path:
    """``$FLWR_HOME/config.toml`` with one connection, the default, to this SuperLink."""
    conn: dict[str, object] = {"address": dep.address}
    if dep.tls is None:
        conn["insecure"] = True
    else:
        conn["root-certificates"] = str(dep.tls.ca)
    path = dep.flwr_home / "config.toml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(tomli_w.dumps({"superlink": {"default": CONNECTION, CONNECTION: conn}}), "utf-8")
    return path


def check_port_free(host: str, port: int) -> None:
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn: TIME_WAIT is no conflict
        try:
            sock.bind((host, port))
        except OSError:
            raise FedloraError(f"port {port} on {host} is in use; choose another with --port") from None


def free_port(host: str = "127.0.0.1") -> int:
    """A port that was free a moment ago (for a SuperNode's own Runtime API)."""
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


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
    dep = Deployment(opts, work, flower_env(work, opts.nodes), echo=echo)
    if opts.tls:
        dep.tls = generate_certs(work / "certs", opts.nodes, opts.san)
    write_connection(dep)
    return dep


# --- processes -----------------------------------------------------------------------------------


def spawn(
    dep: Deployment,
    name: str,
    argv: list[str],
    *,
    echo: bool = True,
    critical: bool = True,
    port: int | None = None,
) -> Proc:
    """Start ``argv`` in its own session (Ctrl-C reaches only us; we stop it in order), with
    output pumped to ``<work>/logs/<name>.log`` and, prefixed ``[name]``, to the console."""
    log_path = dep.logs / f"{name}.log"
    with holding_interrupts():  # an interrupt now acts once the process is tracked
        popen = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            errors="replace",
            bufsize=1,
            env=dep.env,
            cwd=dep.opts.app_dir,
            start_new_session=True,
        )
        proc = Proc(name, popen, log_path, critical, port)
        dep.procs.append(proc)
        proc.pump = threading.Thread(target=_pump, args=(dep, proc, echo), daemon=True, name=f"pump-{name}")
        proc.pump.start()
    return proc


def _pump(dep: Deployment, proc: Proc, echo: bool) -> None:
    """Copy a process' output line by line (universal newlines: tqdm's ``\\r`` ends a line)."""
    with open(proc.log_path, "a", encoding="utf-8") as log:
        for raw in proc.popen.stdout:
            line = ANSI.sub("", raw.rstrip("\n"))
            log.write(line + "\n")
            log.flush()
            if proc.node_id is None and (m := NODE_ID.search(line)):
                proc.node_id = int(m.group(1))
            if echo and line.strip():
                dep.say(f"[{proc.name}] {line}")


def start_superlink(dep: Deployment) -> Proc:
    """``flower-superlink`` with its state in ``<work>/state.db`` and no runtime ``uv sync`` (the
    environment already has every dependency); TLS and node authentication with ``--tls``."""
    opts = dep.opts
    check_port_free(opts.host, opts.port)
    argv = [flower_bin("flower-superlink"), "--host", opts.host, "--port", str(opts.port)]
    argv += ["--database", str(dep.work_dir / "state.db"), "--disable-runtime-dependency-installation"]
    if dep.tls is None:
        argv.append("--insecure")
    else:
        argv += ["--ssl-ca-certfile", str(dep.tls.ca), "--ssl-certfile", str(dep.tls.server_cert)]
        argv += ["--ssl-keyfile", str(dep.tls.server_key), "--enable-supernode-auth"]
    proc = spawn(dep, "superlink", argv, echo=not opts.quiet, port=opts.port)
    wait_listening(proc, dep.address, deadline=time.monotonic() + CLI_TIMEOUT_S)
    return proc


def wait_listening(proc: Proc, address: str, deadline: float) -> None:
    """Until ``address`` accepts TCP connections; a clear error if ``proc`` exits first."""
    host, _, port = address.rpartition(":")
    while True:
        if proc.poll() is not None:
            raise FedloraError(f"{proc.name} exited with code {proc.poll()}: {_last_error(proc)}")
        try:
            with socket.create_connection((host.strip("[]"), int(port)), timeout=1.0):
                return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise FedloraError(f"{proc.name} is not listening on {address}; see {proc.log_path}")
        time.sleep(0.3)


def start_supernode(
    dep: Deployment,
    partition_id: int,
    num_partitions: int,
    *,
    key: Path | None = None,
    name: str | None = None,
    critical: bool = True,
) -> Proc:
    """``flower-supernode`` for one partition, with its own Runtime API port and state dir; with
    TLS it authenticates with ``key`` (default: node key ``partition_id + 1``). A node that is not
    ``critical`` may exit without failing the run."""
    name = name or f"node-{partition_id}"
    state_dir = dep.work_dir / "nodes" / name
    state_dir.mkdir(parents=True, exist_ok=True)
    node_config = (
        f"partition-id={partition_id} num-partitions={num_partitions} state-dir={toml_quote(str(state_dir))}"
    )
    port = free_port()
    argv = [flower_bin("flower-supernode"), "--superlink", dep.address]
    argv += ["--port", str(port), "--node-config", node_config]
    if dep.tls is None:
        argv.append("--insecure")
    else:
        argv += ["--root-certificates", str(dep.tls.ca)]
        argv += ["--auth-supernode-private-key", str(key or dep.tls.node_key(partition_id + 1))]
    return spawn(dep, name, argv, echo=not dep.opts.quiet, critical=critical, port=port)


def wait_for_nodes(dep: Deployment, nodes: list[Proc], deadline: float) -> list[int]:
    """Node ids once every SuperNode's log says it connected; fails when one exits (an
    unregistered key exits with Flower code 305)."""
    while True:
        for proc in nodes:
            if proc.poll() is not None:
                code = proc.flower_exit_code()
                hint = " (Flower 305: it could not connect; is its key registered?)" if code == 305 else ""
                raise FedloraError(f"{proc.name} exited with code {proc.poll()}{hint}: {_last_error(proc)}")
        if all(p.node_id is not None for p in nodes):
            return [int(p.node_id) for p in nodes]
        if time.monotonic() > deadline:
            late = ", ".join(p.name for p in nodes if p.node_id is None)
            raise FedloraError(f"{late} did not connect to the SuperLink in time; see {dep.logs}")
        time.sleep(0.3)


def _last_error(proc: Proc) -> str:
    """The most telling line of a failed process' log, for a one-line error."""
    lines = [ln.strip() for ln in proc.tail(40).splitlines() if ln.strip()]
    for ln in reversed(lines):
        if any(w in ln for w in ("Error", "error", "Exit Code", "Failed")):
            return ln
    return lines[-1] if lines else f"no output; see {proc.log_path}"


# --- the flwr CLI --------------------------------------------------------------------------------


def flwr_cli(dep: Deployment, *args: str, timeout: float = CLI_TIMEOUT_S) -> dict:
    """``flwr ARGS --format json`` against this deployment's FLWR_HOME; the parsed JSON."""
    what = f"`flwr {' '.join(args[:2])}`"
    returncode, out, err = _call(dep, [flower_bin("flwr"), *args, "--format", "json"], timeout)
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
            popen = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                env=dep.env,
                cwd=dep.opts.app_dir,
                start_new_session=True,
            )
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
        data = flwr_cli(dep, "supernode", "register", str(public_key), CONNECTION)
    except FedloraError as exc:
        if "already in use" in str(exc):
            return None
        raise
    return int(data["node-id"])


def list_nodes(dep: Deployment) -> list[dict]:
    """``flwr supernode list``: one dict per node the SuperLink knows (``node-id``, ``status``)."""
    return list(flwr_cli(dep, "supernode", "list", CONNECTION)["nodes"])


def run_config_file(dep: Deployment, flat: dict[str, object]) -> Path:
    """The run config as a TOML file (no quoting pitfalls on the command line)."""
    path = dep.work_dir / "run-config.toml"
    path.write_text(tomli_w.dumps(flat), encoding="utf-8")
    return path


def flwr_run(dep: Deployment, flat: dict[str, object]) -> int:
    """``flwr run APP CONNECTION --run-config FILE``: builds the FAB from the app directory and
    submits it; returns the run id."""
    config = run_config_file(dep, flat)
    data = flwr_cli(dep, "run", str(dep.opts.app_dir), CONNECTION, "--run-config", str(config))
    return int(data["run-id"])


def run_status(dep: Deployment, run_id: int) -> tuple[str, str]:
    """``(status, details)`` of a run, e.g. ``("finished:completed", "N/A")``."""
    runs = flwr_cli(dep, "list", CONNECTION, "--run-id", str(run_id))["runs"]
    return str(runs[0]["status"]), str(runs[0].get("status-details", ""))


def follow_run(dep: Deployment, run_id: int) -> Proc:
    """``flwr log RUN --stream``: the ServerApp's output (rounds, the summary) as ``[run]``; it
    exits when the run finishes."""
    argv = [flower_bin("flwr"), "log", str(run_id), CONNECTION, "--stream"]
    return spawn(dep, "run", argv, critical=False)


def wait_for_run(dep: Deployment, run_id: int, deadline: float) -> str:
    """Until the run finishes; its final status. Stops the run on timeout and fails if the
    SuperLink or a SuperNode dies meanwhile."""
    follower = follow_run(dep, run_id)
    while True:
        for proc in dep.procs:
            if proc.critical and proc.poll() is not None:
                raise RunFailed(
                    f"{proc.name} exited with code {proc.poll()} during the run: {_last_error(proc)}"
                )
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
        flwr_cli(dep, "stop", str(run_id), CONNECTION, timeout=60)
    except FedloraError as exc:
        dep.say(f"[deploy] could not stop run {run_id}: {exc}")


# --- shutdown ------------------------------------------------------------------------------------


def shutdown(dep: Deployment, grace: float | None = None) -> None:
    """SIGTERM every started process and its descendants (SuperExecs, Flower apps), nodes before
    the SuperLink; SIGKILL what is left after ``grace`` seconds. Idempotent."""
    grace = dep.opts.grace if grace is None else grace
    order = sorted(dep.procs, key=lambda p: p.name == "superlink")
    tree = _process_tree([p.pid for p in order])
    dep.seen_pids |= {p.pid for p in tree}
    for proc in tree:
        _signal(proc, signal.SIGTERM)
    _, alive = psutil.wait_procs(tree, timeout=grace)
    alive = [p for p in _process_tree([p.pid for p in alive]) if p.is_running()]
    dep.seen_pids |= {p.pid for p in alive}
    for proc in alive:
        _signal(proc, signal.SIGKILL)
    psutil.wait_procs(alive, timeout=5)
    for proc in order:
        try:
            proc.popen.wait(timeout=5)
        except subprocess.TimeoutExpired:
            dep.say(f"[deploy] {proc.name} (pid {proc.pid}) did not exit")
        if proc.pump is not None:
            proc.pump.join(timeout=5)


def _process_tree(pids: list[int]) -> list[psutil.Process]:
    """The processes and all their live descendants (parents first)."""
    found: dict[int, psutil.Process] = {}
    for pid in pids:
        try:
            root = psutil.Process(pid)
            for proc in [root, *root.children(recursive=True)]:
                found.setdefault(proc.pid, proc)
        except psutil.NoSuchProcess:
            continue
    return list(found.values())


def _signal(proc: psutil.Process, sig: signal.Signals) -> None:
    with suppress(psutil.NoSuchProcess):
        proc.send_signal(sig)


def leftovers(dep: Deployment) -> list[int]:
    """PIDs of live Flower processes of this deployment: those shutdown signalled, and any
    ``flower-*`` / ``flwr*`` process whose command line names the work dir or one of its
    addresses (SuperExecs and Flower apps get ``--runtime-api-address``). For reporting only:
    shutdown signals just the PIDs it started and their descendants."""
    markers = {str(dep.work_dir), dep.address, f"{dep.opts.host}:{dep.opts.port}"}
    markers |= {f"127.0.0.1:{p.port}" for p in dep.procs if p.port}
    pids = []
    for proc in psutil.process_iter(["pid", "cmdline", "status"]):
        argv = proc.info["cmdline"] or []
        if proc.info["status"] == psutil.STATUS_ZOMBIE:
            continue
        flower = any(Path(a).name.startswith(("flower-", "flwr")) for a in argv[:2])
        if proc.pid in dep.seen_pids or (flower and any(m in " ".join(argv) for m in markers)):
            pids.append(proc.pid)
    return pids


# --- the whole thing -----------------------------------------------------------------------------


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
    nodes = [start_supernode(dep, k, n) for k in range(n)]
    wait_for_nodes(dep, nodes, deadline)
    dep.say(f"[deploy] {n} SuperNodes connected")
    return nodes


def run_and_wait(dep: Deployment, flat: dict[str, object]) -> Result:
    """Submit the run, follow it to the end; the result with the run directory."""
    start = time.monotonic()
    run_id = flwr_run(dep, flat)
    dep.say(f"[deploy] started run {run_id}")
    status = wait_for_run(dep, run_id, start + dep.opts.timeout)
    return Result(run_id, status, Path(str(flat["out-dir"])), time.monotonic() - start, dep)


def deploy_up(opts: Options, echo: Callable[[str], None] = print) -> Result:
    """The whole deployment: prepare, bring up, run, and always shut down."""
    opts = replace(opts, work_dir=(opts.work_dir or default_work_dir()).resolve())
    flat = resolve_run_config(opts.run_config, opts.nodes, opts.work_dir)  # before anything is written
    dep = prepare(opts, echo)
    try:
        bring_up(dep)
        result = run_and_wait(dep, flat)
    finally:
        dep.say("[deploy] shutting down")
        shutdown(dep)
        if stray := leftovers(dep):
            dep.say(f"[deploy] warning: processes still running after shutdown: {stray}")
    echo(f"[deploy] run {result.run_id} {result.status} in {result.seconds:.0f} s")
    echo(f"[deploy] run directory {result.run_dir}  (summary: {result.run_dir / 'summary.json'})")
    echo(f"[deploy] logs in {dep.logs}")
    return result


_held = {"depth": 0, "pending": False}  # see holding_interrupts()


def _interrupt(signum: int, frame: object) -> None:
    if _held["depth"]:
        _held["pending"] = True
    else:
        raise KeyboardInterrupt


@contextmanager
def interrupts_shut_down() -> Iterator[None]:
    """SIGINT and SIGTERM to ``fedlora`` raise KeyboardInterrupt (so the processes are still shut
    down), except inside :func:`holding_interrupts`."""
    previous = {sig: signal.signal(sig, _interrupt) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


@contextmanager
def holding_interrupts() -> Iterator[None]:
    """Hold an interrupt while a child process is created: raised inside ``Popen()`` it would
    orphan a child whose PID we never learn. It is raised on leaving the block instead."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    _held["depth"] += 1
    try:
        yield
    finally:
        _held["depth"] -= 1
        if not _held["depth"] and _held["pending"]:
            _held["pending"] = False
            raise KeyboardInterrupt


# --- CLI -----------------------------------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True, parser_class=type(parser))
    up = actions.add_parser(
        "up",
        help="start a SuperLink and N SuperNodes here, run the app with `flwr run`, shut down",
        description="Start flower-superlink and N flower-supernodes on this machine, run this "
        "checkout's Flower app with `flwr run`, stream the logs, and shut everything down.",
    )
    up.add_argument(
        "--nodes", type=int, required=True, metavar="N", help="number of SuperNodes (= num-clients)"
    )
    up.add_argument("--tls", action="store_true", help="HTTPS and SuperNode authentication (registered keys)")
    up.add_argument("--work-dir", type=Path, default=None, help="default runs/deploy-<time>")
    up.add_argument(
        "--run-config",
        action="append",
        default=[],
        metavar='"K=V ..."',
        help="run-config overrides as for `flwr run` (TOML values: preset='minilm-rt' rounds=2); repeatable",
    )
    up.add_argument("--host", default="127.0.0.1", help="SuperLink bind address (0.0.0.0 for remote nodes)")
    up.add_argument(
        "--san",
        action="append",
        default=[],
        metavar="NAME",
        help="with --tls: a DNS name or IP remote nodes use for this machine (in the certificate); repeatable",
    )
    up.add_argument(
        "--port", type=int, default=8000, help="SuperLink HTTP(S) port (Fleet, Control, Runtime API)"
    )
    up.add_argument(
        "--timeout",
        type=float,
        default=3600.0,
        metavar="S",
        help="time limit for bringing the nodes up, and again for the run (then it is stopped)",
    )
    up.add_argument(
        "--grace", type=float, default=10.0, metavar="S", help="SIGTERM -> SIGKILL delay at shutdown"
    )
    up.add_argument(
        "--app", type=Path, default=REPO, help="the Flower app directory (default: this checkout)"
    )
    up.add_argument(
        "--quiet", action="store_true", help="echo only the run's log (every log is still written)"
    )


def options_from_args(args: argparse.Namespace) -> Options:
    return Options(
        nodes=args.nodes,
        tls=args.tls,
        work_dir=args.work_dir,
        run_config=tuple(args.run_config),
        host=args.host,
        port=args.port,
        timeout=args.timeout,
        grace=args.grace,
        app_dir=args.app.resolve(),
        quiet=args.quiet,
        san=tuple(args.san),
    )


def run(args: argparse.Namespace) -> int:
    def echo(line: str) -> None:
        print(line, flush=True)

    with interrupts_shut_down():
        deploy_up(options_from_args(args), echo)
    return 0
