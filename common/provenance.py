"""Where and from what a run was made: the code's commit, the date and the device, stamped into a
run's ``summary.json`` (``fedlora simulate``) or ``result.json`` (``train-local``) so a report that
takes the run later (``bench suite --adopt``) can say so."""

from __future__ import annotations

import datetime
import importlib.metadata
import os
import platform
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]  # the repository, when the code runs from a checkout
#: outputs the bench suite writes into the repository, which do not make the code differ from its commit
OWN_OUTPUTS = (":!docs/RESULTS.md", ":!docs/results")


def commit(root: Path = ROOT) -> str:
    """The short commit of the checkout at ``root`` (``+uncommitted changes`` when its code differs
    from it); outside a checkout the installed package's version, else ``unknown``."""
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True
        )
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--", ".", *OWN_OUTPUTS],
            cwd=root,
            capture_output=True,
            text=True,
        )
    except OSError:
        head = None
    if head is None or head.returncode != 0:
        try:
            return f"fedlora-dp {importlib.metadata.version('fedlora-dp')}"
        except importlib.metadata.PackageNotFoundError:
            return "unknown"
    return head.stdout.strip() + ("+uncommitted changes" if dirty.stdout.strip() else "")


def device() -> str:
    """The machine in a few words: its GPU's name, or the CPU's core count and architecture."""
    import torch  # here, not at import: a report that stamps no run loads no torch

    if torch.cuda.is_available():
        return f"cuda ({torch.cuda.get_device_name()})"
    return f"cpu ({os.cpu_count()} cores, {platform.machine()})"


def made() -> dict[str, str]:
    """Today's date (UTC), the code's commit and the device: what a run or report is stamped with."""
    return {
        "date": datetime.datetime.now(datetime.UTC).date().isoformat(),
        "commit": commit(),
        "device": device(),
    }
