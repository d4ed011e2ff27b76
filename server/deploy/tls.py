"""TLS material for ``--tls``: the CA, the SuperLink's certificate and one key pair per node."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from common.errors import FedloraError
from server.deploy.deployment import REPO

CERTS_SCRIPT = REPO / "scripts" / "generate_certs.sh"


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
