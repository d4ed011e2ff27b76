"""The suite's PNG figures, drawn from its sections (matplotlib, no display needed)."""

from __future__ import annotations

import statistics
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt


def _save(fig, path: Path) -> str:
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path.name


def accuracy_vs_epsilon(sections: dict[str, dict], path: Path) -> str | None:
    """Mean held-out accuracy (± std over seeds) against the claimed ε, one panel per unit; a
    non-private arm is a dashed line."""
    panels = [sections[n] for n in ("client-level", "sample-level") if sections.get(n, {}).get("rows")]
    if not panels:
        return None
    fig, axes = plt.subplots(1, len(panels), figsize=(5.5 * len(panels), 3.8), squeeze=False)
    for ax, sec in zip(axes[0], panels, strict=True):
        series: dict[str, list[tuple[float, float, float]]] = {}
        for row in sec["rows"]:
            after = row["_after"]
            if not after:
                continue
            mean = statistics.mean(after)
            std = statistics.stdev(after) if len(after) > 1 else 0.0
            if row["_target"] is None:
                ax.axhline(mean, ls="--", color="grey", label=row["arm"])
            else:
                name = row["arm"].split(" ε=")[0]
                series.setdefault(name, []).append((row["_target"], mean, std))
        for name, points in series.items():
            points.sort()
            ax.errorbar(
                *zip(*[(e, m) for e, m, _ in points], strict=True),
                yerr=[s for *_, s in points],
                marker="o",
                capsize=3,
                label=name,
            )
        ax.set_xscale("log")
        ax.set_xlabel("claimed ε")
        ax.set_ylabel("held-out accuracy")
        ax.set_title(sec["name"])
        ax.legend(fontsize=7)
    return _save(fig, path)


def epsilon_by_round(privacy: dict, path: Path) -> str | None:
    """Client-level ε after each round (the tight accountant solid: PLD, or RDP under secure
    aggregation; CLT μ-GDP dashed), one line per private arm."""
    by_round = {k: v for k, v in privacy.get("by_round", {}).items() if v}
    if not by_round:
        return None
    fig, ax = plt.subplots(figsize=(5.5, 3.8))
    for label, rows in by_round.items():
        rounds = [r["round"] for r in rows]
        tight = rows[-1].get("tight", "PLD")
        (line,) = ax.plot(rounds, [r["eps_tight"] for r in rows], marker=".", label=f"{label} ({tight})")
        ax.plot(
            rounds, [r["eps_gdp"] for r in rows], ls="--", color=line.get_color(), label=f"{label} (μ-GDP)"
        )
    ax.set_xlabel("round")
    ax.set_ylabel("client-level ε spent")
    ax.legend(fontsize=6)
    return _save(fig, path)


def bytes_per_codec(communication: dict, path: Path) -> str | None:
    """Bytes a client sends per round, per arm and per codec (log scale)."""
    rows = [r for r in communication.get("rows", []) if r["bytes per client per round"] not in ("", "n/a")]
    if not rows:
        return None
    values = [float(r["bytes per client per round"].replace(",", "")) for r in rows]
    fig, ax = plt.subplots(figsize=(6.5, 0.35 * len(rows) + 1.5))
    ax.barh([r["what"] for r in rows], [max(v, 1.0) for v in values])
    ax.set_xscale("log")
    ax.set_xlabel("bytes per client per round")
    ax.tick_params(axis="y", labelsize=7)
    ax.invert_yaxis()
    return _save(fig, path)


def time_vs_clients(scale: dict, path: Path) -> str | None:
    """Round and per-client wall time against the number of nodes."""
    rows = scale.get("rows", [])
    if not rows:
        return None
    nodes = [int(r["nodes"].replace(",", "")) for r in rows]
    fig, ax = plt.subplots(figsize=(5.5, 3.8))
    ax.plot(nodes, [float(r["round s"]) for r in rows], marker="o", label="round")
    ax.plot(nodes, [float(r["per-client s"]) for r in rows], marker="s", label="per client")
    ax.set_xscale("log")
    ax.set_xlabel("nodes in the federation")
    ax.set_ylabel("seconds")
    ax.legend()
    return _save(fig, path)


def draw(sections: dict[str, dict], out: Path) -> None:
    """Draw every figure the sections support into ``out``; each is listed under its section."""
    figures = (
        ("client-level", accuracy_vs_epsilon, (sections,), "accuracy-vs-epsilon.png"),
        ("privacy", epsilon_by_round, (sections.get("privacy", {}),), "epsilon-by-round.png"),
        ("communication", bytes_per_codec, (sections.get("communication", {}),), "bytes-per-round.png"),
        ("scale", time_vs_clients, (sections.get("scale", {}),), "time-vs-clients.png"),
    )
    for owner, fn, args, name in figures:
        drawn = fn(*args, out / name)
        if drawn and owner in sections:
            sections[owner]["figures"].append(drawn)
