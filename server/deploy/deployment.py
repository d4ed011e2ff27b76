"""What a deployment is: the options it was asked for, its work directory and processes, and the
finished run."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING

import psutil

from common.atomic import write_text
from common.errors import FedloraError

if TYPE_CHECKING:
    from server.deploy.processes import Proc
    from server.deploy.tls import Tls

REPO = Path(__file__).resolve().parents[2]
CONNECTION = "fedlora-deploy"  # the connection's name in <work>/flwr/config.toml (deploy up)


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
    restart_nodes: bool = False  # restart a SuperNode that exits during the run


@dataclass
class Deployment:
    """A work directory and the processes started in it."""

    opts: Options
    work_dir: Path
    env: dict[str, str]
    tls: Tls | None = None
    procs: list[Proc] = field(default_factory=list)
    seen_pids: set[int] = field(default_factory=set)  # every PID shutdown() signalled
    tracked: dict[int, psutil.Process] = field(default_factory=dict)  # descendants seen (processes.track)
    echo: Callable[[str], None] = print
    connection: str = CONNECTION  # the SuperLink connection every `flwr` call names (FLWR_HOME's config)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def flwr_home(self) -> Path:
        return self.work_dir / "flwr"

    @property
    def address(self) -> str:
        """Where local clients reach the SuperLink (a wildcard host means loopback)."""
        host = "127.0.0.1" if self.opts.host in ("0.0.0.0", "::", "") else self.opts.host
        return f"[{host}]:{self.opts.port}" if ":" in host else f"{host}:{self.opts.port}"

    @property
    def logs(self) -> Path:
        return self.work_dir / "logs"

    def say(self, line: str) -> None:
        with self._lock:
            self.echo(line)


@dataclass(frozen=True)
class Result:
    """A finished run: Flower's run id and status, the run directory, the deployment, and why the
    run applied no round (``no_round``, one line: server/outcome.py; None when it applied one)."""

    run_id: int
    status: str
    run_dir: Path
    seconds: float  # from submission to the end of the run
    deployment: Deployment | None = None
    no_round: str | None = None


DEPLOYMENT_FILE = "deployment.json"  # in the work dir: what `fedlora deploy resume` starts again
_PATHS = ("work_dir", "app_dir")


def save_deployment(dep: Deployment, flat: dict[str, object]) -> Path:
    """``<work>/deployment.json``: the options and the run config, for ``deploy resume``."""
    opts = {k: str(v) if k in _PATHS else v for k, v in asdict(dep.opts).items()}
    path = dep.work_dir / DEPLOYMENT_FILE
    write_text(path, json.dumps({"options": opts, "run-config": flat}, indent=1))
    return path


def load_deployment(work_dir: Path) -> tuple[Options, dict[str, object]]:
    """The options (with ``work_dir``) and run config ``deploy up`` stored in ``work_dir``."""
    path = work_dir / DEPLOYMENT_FILE
    if not path.is_file():
        raise FedloraError(
            f"{work_dir} is not a deployment's work dir (no {DEPLOYMENT_FILE}); nothing to resume"
        )
    try:
        stored = json.loads(path.read_text(encoding="utf-8"))
        values = {
            k: stored["options"][k] for k in (f.name for f in fields(Options)) if k in stored["options"]
        }
        values.update({k: Path(values[k]) for k in _PATHS if k in values})
        values.update({k: tuple(values[k]) for k in ("run_config", "san") if k in values})
        return replace(Options(**values), work_dir=work_dir), dict(stored["run-config"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise FedloraError(f"{path} is unreadable ({type(exc).__name__}: {exc})") from None


def default_work_dir(kind: str = "deploy") -> Path:
    return Path("runs") / f"{kind}-{time.strftime('%Y%m%d-%H%M%S')}"
