"""What starting Flower's own processes on this machine needs: their executables, a free port, the
``--node-config`` string and their environment. Shared by the client SDK and ``fedlora deploy``."""

from __future__ import annotations

import os
import re
import shutil
import socket
import sys
from collections.abc import Mapping
from pathlib import Path

from common.errors import FedloraError

ConfigValue = str | float | int | bool

#: Flower's colour codes (its console log colours levels even in a log file) and its exit line
ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
FLOWER_EXIT = re.compile(r"Exit Code: (\d+)")


def flower_executable(name: str) -> str:
    """A Flower executable (``flower-supernode``, ``flwr``, ...): next to this Python (a virtual
    environment) first, then on ``PATH``."""
    local = Path(sys.executable).parent / name
    if local.is_file() and os.access(local, os.X_OK):
        return str(local)
    found = shutil.which(name)
    if not found:
        raise FedloraError(f"{name} not found: install flwr 1.41 (pip install 'flwr==1.41.0')")
    return found


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free on ``host`` a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def toml_pairs(values: Mapping[str, ConfigValue]) -> str:
    """``key=value`` pairs as Flower's ``--node-config`` parses them (TOML values, strings quoted)."""
    return " ".join(f"{key}={toml_value(key, value)}" for key, value in values.items())


def toml_value(key: str, value: ConfigValue) -> str:
    """``value`` as a TOML value that Flower's ``k=v`` parser keeps whole (no quote of its kind inside)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(float(value)) if isinstance(value, float) else str(value)
    if '"' not in value and "\\" not in value and "\n" not in value:
        return f'"{value}"'  # TOML basic string (no escapes needed)
    if "'" not in value and "\n" not in value:
        return f"'{value}'"  # TOML literal string
    raise FedloraError(f"{key} {value!r} cannot go into --node-config (both quote kinds, or a newline)")


def flower_env(flwr_home: str | os.PathLike | None, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """``base`` (default: this environment) with this Python's scripts first on ``PATH`` (SuperLink
    and SuperNode start ``flower-superexec`` by name) and ``FLWR_HOME`` set to ``flwr_home`` (None:
    as ``base`` has it, or Flower's default ``~/.flwr``)."""
    env = dict(os.environ if base is None else base)
    scripts = str(Path(sys.executable).parent)
    env["PATH"] = os.pathsep.join([scripts, env.get("PATH", "")]).rstrip(os.pathsep)
    if flwr_home is not None:
        env["FLWR_HOME"] = str(flwr_home)
    return env
