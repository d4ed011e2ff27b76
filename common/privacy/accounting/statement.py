"""A run's privacy statement: each guarantee with its unit, accountants, δ, adjacency and observer,
and what leaves a client outside every guarantee. The run summary prints it line by line and
summary.json keeps it whole."""

from __future__ import annotations

from common.config import RunConfig
from common.privacy.accounting.report import both_epsilons
from common.privacy.participation.threat import SAMPLE_LEVEL, THREATS, what_if_label
from common.privacy.planning.plan import NoisePlan, uncovered, what_if


def round_epsilons(eps_gdp: float, eps_tight: float) -> str:
    """A round line's ε, as :func:`~common.privacy.accounting.report.both_epsilons` says it, in short."""
    if eps_tight >= eps_gdp:
        return f"pld {eps_tight:.3g} (gdp {eps_gdp:.3g}: CLT approximation, no bound)"
    return f"gdp {eps_gdp:.3g} (CLT approximation, above the pld bound {eps_tight:.3g}; the budget holds to the larger)"


def client_level(plan: NoisePlan | None, totals: dict | None) -> str:
    """The client-level guarantee in one line; ``totals``: the ledger's report (ε spent)."""
    if plan is not None and not plan.private:
        return f"NOT PRIVATE: clip-only diagnostic (increments clipped to C {plan.clip:g}, no noise)"
    if plan is None or totals is None:
        return "none (no client-level release)"
    g = plan.guarantee
    clip = f"adaptive C from {plan.clip:g}" if plan.count_std else f"C {plan.clip:g}"
    head = f"client-level ({plan.threat_model} noise, sigma {plan.sigma:.4g}{' calibrated' if plan.calibrated else ''}"
    line = plan.spent_line(head, clip, totals) or f"{head}, {clip}): {both_epsilons(totals, plan.delta)}"
    line += f"; {g.adjacency}; against {g.observer}"
    return what_if_label(what_if(plan)) + line


def sample_level(cfg: RunConfig) -> str:
    """The sample-level guarantee of the nodes' local optimizer in one line."""
    if cfg.optimizer_kind == "none":
        return "none (no sample-level local optimizer)"
    budget = (
        f"target epsilon {cfg.sample_epsilon:g} (pld)"
        if cfg.sample_epsilon
        else f"noise multiplier {cfg.sample_noise_multiplier:g}"
    )
    return (
        f"sample-level ({cfg.optimizer_kind}, {budget} per node at delta {cfg.delta:g}; "
        f"each node's ledger holds its epsilon); {SAMPLE_LEVEL.label()}"
    )


def outside(cfg: RunConfig) -> list[str]:
    """What leaves a client that no guarantee of the run covers."""
    clear = [] if cfg.private else ["each reply's example count and training loss (non-private run)"]
    visible = THREATS[cfg.threat_model].visible  # (hidden participation: who was contacted, not sampled)
    return [*(f"round {rnd}: {what}" for rnd, what in uncovered(cfg)), *clear, visible]


def statement(cfg: RunConfig, plan: NoisePlan | None, totals: dict | None) -> dict[str, object]:
    """``privacy`` (client-level line), ``sample_privacy`` and ``not_covered`` for summary.json."""
    return {
        "privacy": client_level(plan, totals),
        "sample_privacy": sample_level(cfg),
        "not_covered": outside(cfg),
    }


__all__ = ["client_level", "outside", "round_epsilons", "sample_level", "statement"]
