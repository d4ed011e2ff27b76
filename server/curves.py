"""A run's learning curves: the held-out metric, the training loss and the client-level ε by round,
drawn once per run (``curves.png`` beside ``metrics.jsonl``) and, with ``--tensorboard``, logged as
TensorBoard scalars while the run goes (``<run dir>/tensorboard``; ``tensorboard --logdir runs``).

Both read only the rounds' metrics lines (server/federation.py ``_record``): the figure is redrawn
from ``metrics.jsonl`` alone, so a resumed run's figure holds every round.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from common.privacy.report import EPS_COLOURS, pyplot, round_axis, save_png

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


def draw_curves(metrics: Path, path: Path, metric: str, target_epsilon: float = 0.0) -> Path:
    """One figure of three panels from ``metrics`` (``metrics.jsonl``), written to ``path``: the
    held-out ``metric`` (round 0: the untrained adapter), the mean training loss of the replies
    (private runs send none: the panel says so) and the client-level ε after each round (tight
    accountant and the CLT μ-GDP approximation; none for a non-private run), with the budget
    ``target_epsilon`` when there is one."""
    rows = read_rounds(metrics)
    fig, axes = pyplot().subplots(1, 3, figsize=(12, 3.4), dpi=110)
    panels = (
        (axes[0], [(metric, f"held-out {metric}")], f"held-out {metric}", "no evaluation yet"),
        (
            axes[1],
            [("train_loss", "train loss")],
            "mean train loss of the replies",
            "not sent (a private run)",
        ),
        (
            axes[2],
            [("eps_tight", "ε (tight accountant)"), ("eps_gdp", "ε (CLT μ-GDP, approximation)")],
            "client-level ε",
            "no client-level guarantee",
        ),
    )
    for ax, keys, title, empty in panels:
        drawn = False
        for key, label in keys:
            x, y = _series(rows, key)
            if x:
                ax.plot(x, y, marker="o", markersize=3, label=label, color=EPS_COLOURS.get(key))
                drawn = True
        if not drawn:
            ax.text(0.5, 0.5, empty, ha="center", va="center", transform=ax.transAxes, color="grey")
        ax.set_title(title, fontsize=10)
        round_axis(ax)
        ax.grid(alpha=0.3)
        if drawn and len(keys) > 1:
            ax.legend(fontsize=7)
    if target_epsilon > 0:
        axes[2].axhline(
            target_epsilon, color="grey", linestyle="--", linewidth=1, label=f"budget ε = {target_epsilon:g}"
        )
        axes[2].legend(fontsize=7)
    return save_png(fig, path)


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
