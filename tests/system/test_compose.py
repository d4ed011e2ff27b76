"""Deployment files: docker-compose v1 validates docker-compose.yml (alone and with the TLS
override), every command line in them parses with the installed Flower 1.41 CLI, and
scripts/generate_certs.sh writes a CA, a SuperLink certificate and SuperNode keys that Flower
accepts, and refuses to overwrite them.

No Docker engine is needed. docker-compose 1.29.2 lives in .venv/compose-v1 (`make
compose-install`; `make test` installs it); these tests fail, never skip, when it is missing."""

from __future__ import annotations

import hashlib
import importlib
import os
import re
import shutil
import stat
import subprocess
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.process

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = Path(
    os.environ.get("FEDLORA_DOCKER_COMPOSE", ROOT / ".venv" / "compose-v1" / "bin" / "docker-compose")
)
CERTS_SCRIPT = ROOT / "scripts" / "generate_certs.sh"
PLAIN = ("docker-compose.yml",)
TLS = ("docker-compose.yml", "docker-compose.tls.yml")
LOCAL = ("docker-compose.yml", "docker-compose.local.yml")  # make compose-test's host-network override
NODES = 3
# Variables the compose files read: unset them so the defaults are what is checked.
COMPOSE_VARS = (
    "FLWR_VERSION",
    "FEDLORA_IMAGE",
    "SUPERLINK_PUBLISH",
    "COMPOSE_FILE",
    "COMPOSE_PROJECT_NAME",
    "FLWR_LOCAL_IMAGE",
    "LOCAL_SUPERLINK_PORT",
)


@pytest.fixture(scope="module")
def compose() -> Path:
    if not os.access(COMPOSE, os.X_OK):
        pytest.fail(
            f"docker-compose v1 is not installed at {COMPOSE}. Run `make compose-install` "
            "(`make test` does it), or set FEDLORA_DOCKER_COMPOSE to a docker-compose 1.29 binary."
        )
    return COMPOSE


def run_compose(compose: Path, files: tuple[str, ...], *args: str, cwd: Path = ROOT):
    env = {k: v for k, v in os.environ.items() if k not in COMPOSE_VARS}
    cmd = [str(compose)]
    for f in files:
        cmd += ["-f", f]
    return subprocess.run([*cmd, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=60)


@pytest.fixture(scope="module")
def configs(compose) -> dict[str, dict]:
    """The normalized configuration docker-compose prints, for the plain and the TLS setup."""
    out = {}
    for name, files in (("plain", PLAIN), ("tls", TLS), ("local", LOCAL)):
        proc = run_compose(compose, files, "config")
        assert proc.returncode == 0, proc.stderr
        out[name] = yaml.safe_load(proc.stdout)
    return out


def opt(command: list[str], flag: str) -> str:
    """The value after ``flag`` in a command list."""
    assert flag in command, f"{flag} missing from {command}"
    return command[command.index(flag) + 1]


def mounts(service: dict) -> dict[str, str]:
    """Container path -> source (volume name or host path) of a normalized service."""
    pairs = [v.split(":") for v in service.get("volumes", [])]
    return {p[1]: p[0] for p in pairs}


# --- docker-compose v1 -------------------------------------------------------------------------


@pytest.mark.parametrize("files", [PLAIN, TLS, LOCAL], ids=["plain", "tls", "local"])
def test_compose_v1_config_is_valid(compose, files):
    proc = run_compose(compose, files, "config", "-q")
    assert proc.returncode == 0, f"docker-compose {' '.join(files)} config -q failed:\n{proc.stderr}"


def test_compose_v1_rejects_an_invalid_file(compose, tmp_path):
    """The validator really validates (an unknown key and a dangling depends_on)."""
    (tmp_path / "docker-compose.yml").write_text(
        "services:\n  a:\n    image: busybox\n    depends_on: [missing]\n    bogus_key: 1\n"
    )
    proc = run_compose(compose, ("docker-compose.yml",), "config", "-q", cwd=tmp_path)
    assert proc.returncode != 0
    assert "bogus_key" in proc.stderr or "missing" in proc.stderr


# --- what the compose files describe ---------------------------------------------------------


def test_plain_topology(configs):
    from flwr.common.config import parse_config_args

    cfg = configs["plain"]
    services = cfg["services"]
    assert set(services) == {
        "superlink",
        "superexec-serverapp",
        *(f"supernode-{k}" for k in range(1, NODES + 1)),
        *(f"superexec-clientapp-{k}" for k in range(1, NODES + 1)),
    }
    link = services["superlink"]
    cmd = link["command"]
    assert "--insecure" in cmd and "--disable-runtime-dependency-installation" in cmd
    assert opt(cmd, "--isolation") == "process" and opt(cmd, "--host") == "0.0.0.0"
    port = opt(cmd, "--port")
    assert port == "8000"
    published = [str(p).removesuffix("/tcp") for p in link["ports"]]
    assert published == [f"127.0.0.1:{port}:{port}"], published  # reachable from this host only
    # The state database lies on a named volume.
    db = Path(opt(cmd, "--database"))
    volume_of = {path: src for path, src in mounts(link).items() if src in cfg["volumes"]}
    assert any(db.is_relative_to(path) for path in volume_of), (db, volume_of)

    server = services["superexec-serverapp"]
    assert opt(server["command"], "--runtime-api-address") == f"superlink:{port}"
    assert mounts(server).get("/app/runs") in cfg["volumes"]

    parts = set()
    for k in range(1, NODES + 1):
        node = services[f"supernode-{k}"]["command"]
        assert opt(node, "--superlink") == f"superlink:{port}"
        assert opt(node, "--isolation") == "process" and opt(node, "--host") == "0.0.0.0"
        conf = parse_config_args([opt(node, "--node-config")])
        assert conf["num-partitions"] == NODES
        parts.add(conf["partition-id"])
        app = services[f"superexec-clientapp-{k}"]
        assert opt(app["command"], "--runtime-api-address") == f"supernode-{k}:{opt(node, '--port')}"
        # The node's state-dir is read by the ClientApp, which runs in the SuperExec container.
        assert mounts(app).get(conf["state-dir"]) == f"node-{k}-state"
    assert parts == set(range(NODES))


def _flower_parsers():
    # import_module: `flwr.superlink.cli.flower_superlink` as an attribute is the function of that
    # name (the package re-exports it), not the module.
    superlink = importlib.import_module("flwr.superlink.cli.flower_superlink")
    supernode = importlib.import_module("flwr.supernode.cli.flower_supernode")
    superexec = importlib.import_module("flwr.supercore.cli.flower_superexec")
    return {
        "superlink": superlink._parse_args_run_superlink(),
        "supernode": supernode._parse_args_run_supernode(),
        "superexec": superexec._parse_args(),
    }


@pytest.mark.parametrize("setup", ["plain", "tls", "local"])
def test_commands_parse_with_installed_flower(configs, setup):
    """Every command line is accepted by the installed flwr 1.41 parsers and uses no flag that
    Flower marks deprecated (the trap Flower's own pre-1.40 compose files fell into)."""
    parsers = _flower_parsers()
    for name, service in configs[setup]["services"].items():
        kind = next(k for k in parsers if k in name)
        parser, cmd = parsers[kind], service["command"]
        try:
            parser.parse_args(cmd)
        except SystemExit:
            pytest.fail(f"{setup}/{name}: flower-{kind} rejects {cmd}")
        helps = {s: a.help or "" for a in parser._actions for s in a.option_strings}
        deprecated = [f for f in cmd if f.startswith("--") and "deprecated" in helps.get(f, "").lower()]
        assert not deprecated, f"{setup}/{name} uses deprecated flags {deprecated}"


def test_tls_override(configs, tmp_path):
    services = configs["tls"]["services"]
    link = services["superlink"]
    cmd = link["command"]
    assert "--insecure" not in cmd and "--enable-supernode-auth" in cmd
    link_mounts = mounts(link)
    needed: dict[str, str] = {}  # host file -> what it is for
    for flag in ("--ssl-ca-certfile", "--ssl-certfile", "--ssl-keyfile"):
        needed[link_mounts[opt(cmd, flag)]] = flag

    server = services["superexec-serverapp"]["command"]
    assert "--insecure" not in server
    needed[mounts(services["superexec-serverapp"])[opt(server, "--root-certificates")]] = "superexec"

    keys = set()
    for k in range(1, NODES + 1):
        node = services[f"supernode-{k}"]
        ncmd, nmounts = node["command"], mounts(node)
        assert "--insecure" not in ncmd
        ca = nmounts[opt(ncmd, "--root-certificates")]
        key = nmounts[opt(ncmd, "--auth-supernode-private-key")]
        needed[ca], needed[key] = "supernode CA", f"supernode-{k} key"
        keys.add(key)
        assert all(target.endswith(":ro") for target in node["volumes"] if "/certs/" in target)
        # secure aggregation: the node config's identity and roster, where its ClientApp reads them
        config = dict(kv.split("=", 1) for kv in opt(ncmd, "--node-config").split())
        app_mounts = mounts(services[f"superexec-clientapp-{k}"])
        assert app_mounts[config["identity-key"].strip("'")] == key, "the identity is the node's own key"
        needed[app_mounts[config["secagg-roster"].strip("'")]] = "roster"
    assert len(keys) == NODES, "each SuperNode needs its own key"

    # Every certificate file the override mounts is one that generate_certs.sh writes.
    run_script(["--out", str(tmp_path), "--nodes", str(NODES)], check=True)
    written = {p.name for p in tmp_path.iterdir()}
    for host_file, use in needed.items():
        path = Path(host_file)
        assert path.parent == ROOT / "certs", (host_file, use)
        assert path.name in written, f"{use}: {path.name} is not produced by generate_certs.sh"


def test_local_override(configs):
    """docker-compose.local.yml (make compose-test): host networking only, each listener on its own
    loopback port, each ClientApp SuperExec pointed at its own SuperNode, and the base file's
    volumes and node configs unchanged."""
    from flwr.common.config import parse_config_args

    base, local = configs["plain"]["services"], configs["local"]["services"]
    assert set(local) == set(base)
    for name, service in local.items():
        assert service.get("network_mode") == "host", name
        assert "networks" not in service, name
        assert sorted(service.get("volumes", [])) == sorted(base[name].get("volumes", [])), name
    link = local["superlink"]
    assert link["entrypoint"] == ["flower-superlink"] and opt(link["command"], "--host") == "127.0.0.1"
    address = f"127.0.0.1:{opt(link['command'], '--port')}"
    assert opt(local["superexec-serverapp"]["command"], "--runtime-api-address") == address
    ports = {opt(link["command"], "--port")}
    for k in range(1, NODES + 1):
        node = local[f"supernode-{k}"]
        cmd = node["command"]
        assert node["entrypoint"] == ["flower-supernode"]
        assert opt(cmd, "--superlink") == address and opt(cmd, "--host") == "127.0.0.1"
        ports.add(opt(cmd, "--port"))
        app = local[f"superexec-clientapp-{k}"]["command"]
        assert opt(app, "--runtime-api-address") == f"127.0.0.1:{opt(cmd, '--port')}"
        base_conf = opt(base[f"supernode-{k}"]["command"], "--node-config")
        assert parse_config_args([opt(cmd, "--node-config")]) == parse_config_args([base_conf])
    assert len(ports) == NODES + 1, f"listeners share a port on the host network: {ports}"


def test_versions_agree():
    """The Flower version of the images matches the pinned flwr."""
    pin = re.search(r"^flwr==(\S+)$", (ROOT / "constraints.txt").read_text(), re.M).group(1)
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert f"ARG FLWR_VERSION={pin}" in dockerfile
    assert re.search(r"^ARG SUPEREXEC_IMAGE=flwr/superexec:\$\{FLWR_VERSION\}", dockerfile, re.M)
    assert re.search(r"^FROM \$\{SUPEREXEC_IMAGE\}$", dockerfile, re.M)
    compose_text = (ROOT / "docker-compose.yml").read_text()
    assert set(re.findall(r"\$\{FLWR_VERSION:-([^}]+)\}", compose_text)) == {pin}
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert "certs/" in ignored and ".venv/" in ignored


# --- scripts/generate_certs.sh ---------------------------------------------------------------


def run_script(args: list[str], check: bool = False) -> subprocess.CompletedProcess:
    if shutil.which("openssl") is None:
        pytest.fail("openssl is not installed; scripts/generate_certs.sh needs it")
    proc = subprocess.run(["bash", str(CERTS_SCRIPT), *args], capture_output=True, text=True, timeout=60)
    if check:
        assert proc.returncode == 0, proc.stderr
    return proc


def snapshot(folder: Path) -> dict[str, tuple[str, int]]:
    return {
        p.name: (hashlib.sha256(p.read_bytes()).hexdigest(), p.stat().st_mtime_ns)
        for p in sorted(folder.iterdir())
    }


def expected_files(n: int) -> set[str]:
    nodes = {f"supernode-{k}.{ext}" for k in range(1, n + 1) for ext in ("key", "pub")}
    return {"ca.key", "ca.crt", "server.key", "server.pem", *nodes, *(["roster.pub"] if n else [])}


@pytest.mark.parametrize("keygen", ["auto", "python"])
def test_generate_certs(tmp_path, keygen):
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from flwr.cli.supernode.register import try_load_public_key

    out = tmp_path / "certs"
    run_script(["--out", str(out), "--nodes", "2", "--keygen", keygen], check=True)
    assert {p.name for p in out.iterdir()} == expected_files(2)  # no leftovers (temp dir, csr)

    verify = subprocess.run(
        ["openssl", "verify", "-CAfile", str(out / "ca.crt"), str(out / "server.pem")],
        capture_output=True,
        text=True,
    )
    assert verify.returncode == 0 and verify.stdout.strip().endswith("OK"), verify.stderr
    san = subprocess.run(
        ["openssl", "x509", "-in", str(out / "server.pem"), "-noout", "-ext", "subjectAltName"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    for name in ("DNS:superlink", "DNS:localhost", "IP Address:127.0.0.1"):
        assert name in san, san

    for p in out.iterdir():
        mode = stat.S_IMODE(p.stat().st_mode)
        assert mode == (0o600 if p.suffix == ".key" else 0o644), (p.name, oct(mode))

    for k in (1, 2):
        # What flower-supernode --auth-supernode-private-key and `flwr supernode register` load.
        key = serialization.load_ssh_private_key((out / f"supernode-{k}.key").read_bytes(), None)
        assert isinstance(key, ec.EllipticCurvePrivateKey) and key.curve.name == "secp384r1"
        pub = serialization.load_ssh_public_key((out / f"supernode-{k}.pub").read_bytes())
        assert pub.public_numbers() == key.public_key().public_numbers()
        assert try_load_public_key(out / f"supernode-{k}.pub")
    # the secure-aggregation roster: both nodes' keys, read as a node reads it
    from common.secagg import identity

    roster = identity.load_roster(str(out / "roster.pub"))
    assert roster == {identity.load_identity(str(out / f"supernode-{k}.key")).public for k in (1, 2)}


def test_generate_certs_refuses_to_overwrite(tmp_path):
    out = tmp_path / "certs"
    run_script(["--out", str(out), "--nodes", "2"], check=True)
    before = snapshot(out)

    again = run_script(["--out", str(out), "--nodes", "2"])
    assert again.returncode != 0
    assert "--force" in again.stderr
    assert snapshot(out) == before  # same bytes, not even rewritten

    # One existing file is enough to refuse (e.g. a third node's key added later by hand).
    (out / "supernode-3.key").write_text("precious")
    assert run_script(["--out", str(out), "--nodes", "3"]).returncode != 0
    assert (out / "supernode-3.key").read_text() == "precious"

    forced = run_script(["--out", str(out), "--nodes", "2", "--force"], check=True)
    assert forced.returncode == 0
    after = snapshot(out)
    assert (
        after["ca.crt"][0] != before["ca.crt"][0]
        and after["supernode-1.key"][0] != before["supernode-1.key"][0]
    )


def test_generate_certs_rejects_bad_arguments(tmp_path):
    assert run_script(["--out", str(tmp_path), "--nodes", "x"]).returncode != 0
    assert run_script(["--out", str(tmp_path), "--bogus"]).returncode != 0
    assert not any(tmp_path.iterdir())
