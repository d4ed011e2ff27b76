"""The deployment's processes: started in their own sessions with their output logged, and shut
down by PID with every descendant."""

from __future__ import annotations

import re
import signal
import subprocess
import threading
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path

import psutil

from common.flower_processes import ANSI, FLOWER_EXIT
from server.deploy.deployment import Deployment
from server.deploy.interrupts import holding_interrupts

NODE_ID = re.compile(r"SuperNode ID: (\d+)")


@dataclass
class Proc:
    """One started process: its output goes to ``log_path`` (and, prefixed, to the console)."""

    name: str
    popen: subprocess.Popen
    log_path: Path
    critical: bool = True  # the run fails if it exits (the SuperLink)
    port: int | None = None  # the HTTP port it serves (SuperLink: Fleet/Control/Runtime; node: Runtime)
    pump: threading.Thread | None = None
    node_id: int | None = None  # a SuperNode's id, once its log says it connected
    partition: int | None = None  # a SuperNode's partition id (server/deploy/supervise.py restarts it)

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

    def exit_reason(self) -> str:
        """Why the process ended, in a few words: the signal that killed it (a killed process's log
        ends on whatever it last did, "Received successfully"), else its log's most telling line."""
        code = self.poll()
        if code is not None and code < 0:
            try:
                return f"killed by {signal.Signals(-code).name}"
            except ValueError:
                return f"killed by signal {-code}"
        return self.last_error()

    def last_error(self) -> str:
        """The most telling line of a failed process' log, for a one-line error."""
        lines = [ln.strip() for ln in self.tail(40).splitlines() if ln.strip()]
        for ln in reversed(lines):
            if any(w in ln for w in ("Error", "error", "Exit Code", "Failed")):
                return ln
        return lines[-1] if lines else f"no output; see {self.log_path}"


def start(dep: Deployment, argv: list[str], **popen: object) -> subprocess.Popen:
    """``argv`` in its own session (Ctrl-C reaches only us), in the app directory with the
    deployment's environment; no input, text output on a pipe."""
    return subprocess.Popen(
        argv,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        text=True,
        env=dep.env,
        cwd=dep.opts.app_dir,
        start_new_session=True,
        **popen,
    )


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
        popen = start(dep, argv, stderr=subprocess.STDOUT, errors="replace", bufsize=1)
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


def track(dep: Deployment) -> None:
    """Remember every live descendant of the started processes. Flower starts its SuperExecs in
    sessions of their own, so a descendant whose parent died (a SIGKILLed SuperLink) is no longer
    found from our PIDs; :func:`shutdown` still stops it if it was seen here."""
    for proc in _process_tree([p.pid for p in dep.procs]):
        dep.tracked.setdefault(proc.pid, proc)


def shutdown(dep: Deployment, grace: float | None = None) -> None:
    """SIGTERM every started process and its descendants (SuperExecs, Flower apps), nodes before
    the SuperLink, and every descendant :func:`track` saw that still runs (an orphan); SIGKILL
    what is left after ``grace`` seconds. Idempotent."""
    grace = dep.opts.grace if grace is None else grace
    order = sorted(dep.procs, key=lambda p: p.name == "superlink")
    orphans = [p for p in dep.tracked.values() if p.is_running()]  # is_running: same PID *and* start time
    tree = _process_tree([p.pid for p in order] + [p.pid for p in orphans])
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
