"""A run's learning curves: the held-out metric, the losses and ε by round (client-level, and each
simulated node's sample-level), drawn once per run (``curves.png`` beside ``metrics.jsonl``) and,
with ``--tensorboard``, logged as TensorBoard scalars while the run goes (``<run dir>/tensorboard``;
``tensorboard --logdir runs``).

Both read the rounds' metrics lines (server/federation.py ``_record``), the figure also the nodes'
sample-level ledgers' running ε: it is redrawn from the run directory alone, so a resumed run's
figure holds every round.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path

from common.privacy.accounting.report import EPS_COLOURS, pyplot, round_axis, save_png

#: metrics-line key -> TensorBoard tag, for the scalars of every round that has them
SCALARS: dict[str, str] = {
    "train_loss": "train/loss",
    "eps_tight": "privacy/epsilon_tight",
    "eps_gdp": "privacy/epsilon_gdp_clt",
    "sigma": "privacy/sigma",
    "replied": "round/replies",
    "sampled": "round/sampled",
    "seconds": "round/seconds",
    "clip": "round/clip",
}


def read_rounds(metrics: Path) -> list[dict]:
    """The rounds' metrics lines (round 0's initial evaluation included), last line per round."""
    by_round: dict[int, dict] = {}
    for line in metrics.read_text(encoding="utf-8").splitlines():
        if line.strip():
            record = json.loads(line)
            by_round[int(record["round"])] = record
    return [by_round[r] for r in sorted(by_round)]


def _series(rows: list[dict], key: str) -> tuple[list[int], list[float]]:
    """``(rounds, values)`` of the rows that have a finite ``key``."""
    pairs = [
        (r["round"], float(r[key]))
        for r in rows
        if isinstance(r.get(key), int | float) and math.isfinite(float(r[key]))
    ]
    return [p[0] for p in pairs], [p[1] for p in pairs]


Series = tuple[list[int], list[float]]


#: at most this many nodes' sample-level ε are drawn one by one; more are drawn as their largest
EACH_NODE = 8


def draw_curves(
    metrics: Path,
    path: Path,
    metric: str,
    target_epsilon: float = 0.0,
    nodes: Mapping[int, Series] | None = None,
    sample_target: float = 0.0,
) -> Path:
    """One figure of three panels from ``metrics`` (``metrics.jsonl``), written to ``path``: the
    held-out ``metric`` (round 0: the untrained adapter); the loss: the replies' mean training loss
    (private runs send none) and the held-out loss of each evaluated round; and ε after each round:
    client-level (tight accountant and the CLT μ-GDP approximation) with the budget
    ``target_epsilon``, and the sample-level ε of each node's own ledger (``nodes``: node -> its
    ``(rounds, ε)``; more than :data:`EACH_NODE` nodes as their largest) with ``sample_target``."""
    rows = read_rounds(metrics)
    fig, axes = pyplot().subplots(1, 3, figsize=(12, 3.4), dpi=110)
    client = [
        ("eps_tight", "client-level ε (tight accountant)"),
        ("eps_gdp", "client-level ε (CLT μ-GDP, approx.)"),
    ]
    panels = (
        (axes[0], _drawn(rows, [(metric, f"held-out {metric}")]), f"held-out {metric}", "no evaluation yet"),
        (
            axes[1],
            _drawn(rows, [("train_loss", "train loss (replies' mean)"), ("loss", "held-out loss")]),
            "loss",
            "no loss yet",
        ),
        (axes[2], _drawn(rows, client) + _node_series(nodes or {}), "ε by round", "no privacy guarantee"),
    )
    for ax, series, title, empty in panels:
        for label, (x, y), colour in series:
            ax.plot(x, y, marker="o", markersize=3, label=label, color=colour)
        if not series:
            ax.text(0.5, 0.5, empty, ha="center", va="center", transform=ax.transAxes, color="grey")
        ax.set_title(title, fontsize=10)
        round_axis(ax)
        ax.grid(alpha=0.3)
        if len(series) > 1:
            ax.legend(fontsize=7)
    budgets = ((target_epsilon, "client-level budget", "--"), (sample_target, "sample-level target", ":"))
    for value, what, style in budgets:
        if value > 0:
            axes[2].axhline(value, color="grey", linestyle=style, linewidth=1, label=f"{what} ε = {value:g}")
            axes[2].legend(fontsize=7)
    return save_png(fig, path)


def _drawn(rows: list[dict], keys: list[tuple[str, str]]) -> list[tuple[str, Series, str | None]]:
    """``(label, (rounds, values), colour)`` of each of ``keys`` that ``rows`` have."""
    found = [(label, _series(rows, key), EPS_COLOURS.get(key)) for key, label in keys]
    return [(label, xy, colour) for label, xy, colour in found if xy[0]]


def _node_series(nodes: Mapping[int, Series]) -> list[tuple[str, Series, str | None]]:
    """The nodes' sample-level ε curves: each node's, or beyond :data:`EACH_NODE` nodes their
    largest at each round (a bound for every node)."""
    nodes = {k: xy for k, xy in nodes.items() if xy[0]}
    if len(nodes) <= EACH_NODE:
        return [(f"node {k}, sample-level ε (pld)", xy, None) for k, xy in sorted(nodes.items())]
    largest: dict[int, float] = {}
    for x, y in nodes.values():
        for rnd, eps in zip(x, y, strict=True):
            largest[rnd] = max(largest.get(rnd, 0.0), eps)
    rounds = sorted(largest)
    return [
        (f"largest of {len(nodes)} nodes' sample-level ε (pld)", (rounds, [largest[r] for r in rounds]), None)
    ]


#: numeric metrics-line keys that are neither :data:`SCALARS` nor a held-out metric
NOT_HELDOUT = frozenset({"round", "bytes_down", "bytes_up", "mu", "next_clip", "online", "sigma_released"})


class Board:
    """TensorBoard event files of one run (``torch.utils.tensorboard``; the ``tensorboard`` package,
    ``pip install 'fedlora-dp[tensorboard]'``), stepped by the round: :data:`SCALARS` under their
    tags, every other number of a metrics line (the held-out metrics: accuracy, loss, perplexity
    ...) under ``heldout/<name>``. A resumed run appends to the same directory."""

    def __init__(self, directory: Path) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=str(directory))

    def log(self, record: dict) -> None:
        """Metrics line ``record``'s scalars (a stopped or interrupted round's line has none)."""
        step = int(record["round"])
        for key, value in sorted(record.items()):
            if key in NOT_HELDOUT or isinstance(value, bool) or not isinstance(value, int | float):
                continue
            if math.isfinite(value):
                self.writer.add_scalar(SCALARS.get(key, f"heldout/{key}"), float(value), step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


def check_tensorboard() -> str:
    """Why ``--tensorboard`` cannot run here (empty: it can): the ``tensorboard`` package missing."""
    import importlib.util

    if importlib.util.find_spec("tensorboard") is None:
        return "--tensorboard needs the tensorboard package: pip install 'fedlora-dp[tensorboard]'"
    return ""


__all__ = ["SCALARS", "Board", "check_tensorboard", "draw_curves", "read_rounds"]
