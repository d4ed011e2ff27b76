"""``--run-config`` as ``flwr run`` will get it, checked before anything starts."""

from __future__ import annotations

import re
from pathlib import Path

from common.data.files import is_file_dataset, load_file_corpus
from common.errors import FedloraError
from common.presets import from_flat

KEY_VALUE = re.compile(r"(\S+?)=('[^']*'|\"[^\"]*\"|\S+)")  # flwr.common.config.parse_config_args


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
    return check_run_config(flat)


def check_run_config(flat: dict[str, object], *, where_present: bool = False) -> dict[str, object]:
    """``flat`` if the ServerApp will accept it: a valid configuration, a run directory that holds
    no run (or, with ``resume``, the same run), and a data file dataset whose columns and rows read
    (issue 75 item 8: it failed 58 s in, exit 1); else a one-line error before anything starts.
    ``where_present``: for a SuperLink that may run elsewhere (``deploy run``), the run directory
    and the data file are checked only where their paths exist on this machine."""
    from common.runtime import columns_of
    from server.run_dir import RunDir

    cfg = from_flat(dict(flat)).check_federated()
    if cfg.out_dir and (Path(cfg.out_dir).exists() or not where_present):
        RunDir(Path(cfg.out_dir), cfg)  # its checks only: it writes nothing
    data = is_file_dataset(cfg.dataset) and (Path(cfg.dataset).exists() or not where_present)
    if data:  # its columns, rows and labels, as the ServerApp will read them
        load_file_corpus(cfg.dataset, columns_of(cfg))
    return flat
