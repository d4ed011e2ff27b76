"""Run privacy report: a ledger exported as JSON and as a PNG plot of ε against rounds."""

from __future__ import annotations

import json
import math
from pathlib import Path

from common.atomic import replacing, write_text
from common.privacy.accounting.ledger import Ledger


def apart(value: float, bound: float) -> tuple[str, str]:
    """``value`` and ``bound`` printed with the fewest significant digits (4 to 12) that tell them
    apart, so that a refusal never reads "0.001 > 0.001"."""
    for digits in range(4, 13):
        shown = f"{value:.{digits}g}", f"{bound:.{digits}g}"
        if shown[0] != shown[1]:
            return shown
    return shown


def both_epsilons(totals: dict, delta: float | None = None) -> str:
    """The Gaussian ledger's ε, led by the one the run holds to: the larger of the pld bound and the
    CLT μ-GDP approximation (the budget and the calibration take the larger; ``totals['epsilon']``),
    with what the other one is (``delta``, when given, follows the lead). Wording only: the numbers
    are the ledger's."""
    gdp, pld, mu = totals["eps_gdp"], totals["eps_tight"], totals["mu"]
    at = "" if delta is None else f" at delta {delta:g}"
    if pld >= gdp:
        return (
            f"epsilon {pld:.4g} (pld, the guarantee: a tight upper bound){at}; gdp {gdp:.4g} (mu {mu:.4g}) "
            f"is the CLT mu-GDP approximation, not a bound"
        )
    return (
        f"epsilon {gdp:.4g} (gdp, mu {mu:.4g}: the CLT mu-GDP approximation, above the pld bound here, "
        f"so the run holds to it){at}; pld {pld:.4g} is the tight upper bound"
    )


def write_report(ledger: Ledger, directory: Path, stem: str = "privacy") -> tuple[Path, Path]:
    """Write ``<stem>.json`` and ``<stem>.png`` into ``directory``; returns both paths."""
    report = ledger.report()
    json_path, png_path = directory / f"{stem}.json", directory / f"{stem}.png"
    write_text(json_path, json.dumps(report, indent=2, default=str) + "\n")
    plot(report, png_path)
    return json_path, png_path


def title(report: dict) -> str:
    """The plot's title: unit and threat models; a what-if ledger's starts with WHAT-IF and names
    the population its ε is for on a second line."""
    threats = sorted({r["threat_model"] for r in report["rounds"]}) or ["-"]
    text = f"{report['unit']} privacy spent ({', '.join(threats)} noise)"
    return f"WHAT-IF, {text}\nfor {report.get('population', '')}" if report.get("what_if") else text


def pyplot():
    """matplotlib's pyplot on the Agg backend (no display needed), imported when first drawn."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_png(fig, path: Path) -> Path:
    """Lay out ``fig`` and write it to ``path`` as a PNG, atomically (a reader never sees half a
    file), then close it."""
    fig.tight_layout()
    try:
        with replacing(path) as tmp:
            fig.savefig(tmp, format="png")
    finally:
        pyplot().close(fig)
    return path


#: each ε curve's colour, the same in every figure (privacy.png, curves.png)
EPS_COLOURS = {"eps_tight": "C0", "eps_gdp": "C1"}


def round_axis(ax) -> None:
    """Label ``ax``'s x axis "round", with whole-number ticks only (a 1-round run has no round 0.5);
    call it after plotting. A span under two rounds is widened to half a round beyond its ends."""
    from matplotlib.ticker import MaxNLocator

    ax.set_xlabel("round")
    lo, hi = ax.get_xlim()
    if hi - lo < 2:
        ax.set_xlim(math.floor(lo + 0.5) - 0.5, math.ceil(hi - 0.5) + 0.5)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True, min_n_ticks=1))


def plot(report: dict, path: Path) -> None:
    """ε_tight and ε_gdp after each charged round (∞ values are left out of the plot)."""
    plt = pyplot()
    rows = report["rounds"]
    x = [r["round"] for r in rows]
    fig, ax = plt.subplots(figsize=(6, 3.6), dpi=120)
    for key, label in (("eps_tight", "PLD (tight)"), ("eps_gdp", "CLT μ-GDP (paper)")):
        y = [r[key] if math.isfinite(r[key]) else math.nan for r in rows]
        ax.plot(x, y, marker="o", markersize=3, label=label, color=EPS_COLOURS[key])
    target = float(report.get("target_epsilon") or 0)
    if target > 0:
        ax.axhline(target, color="grey", linestyle="--", linewidth=1, label=f"budget ε = {target:g}")
    round_axis(ax)
    ax.set_ylabel(f"ε at δ = {float(report['delta']):g}")
    ax.set_title(title(report), fontsize=8 if report.get("what_if") else 10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    save_png(fig, path)
