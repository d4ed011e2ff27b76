"""A run's privacy statement: each guarantee with its unit, accountants, δ, adjacency and observer,
and what leaves a client outside every guarantee. The run summary prints it line by line and
summary.json keeps it whole."""

from __future__ import annotations

from common.config import RunConfig
from common.privacy.plan import NoisePlan, uncovered, what_if
from common.privacy.threat import SAMPLE_LEVEL, THREATS, what_if_label


def client_level(plan: NoisePlan | None, totals: dict | None) -> str:
    """The client-level guarantee in one line; ``totals``: the ledger's report (ε spent)."""
    if plan is not None and not plan.private:
        return f"NOT PRIVATE: clip-only diagnostic (increments clipped to C {plan.clip:g}, no noise)"
    if plan is None or totals is None:
        return "none (no client-level release)"
    g = plan.guarantee
    clip = f"adaptive C from {plan.clip:g}" if plan.count_std else f"C {plan.clip:g}"
    head = f"client-level ({plan.threat_model} noise, sigma {plan.sigma:.4g}{' calibrated' if plan.calibrated else ''}, {clip}"
    if plan.secure:  # Skellam noise: RDP is its accountant (the CLT mu-GDP is no bound for it)
        line = (
            f"{head}, at most {plan.secure.participations} rounds per client at p = {plan.p:g}): epsilon "
            f"{totals['eps_tight']:.4g} ({totals.get('tight_accountant', 'rdp')}, the worst client's)"
        )
    else:
        line = (
            f"{head}): epsilon {totals['eps_gdp']:.4g} (gdp, mu {totals['mu']:.4g}) / "
            f"{totals['eps_tight']:.4g} ({totals.get('tight_accountant', 'pld')})"
        )
    line += f" at delta {plan.delta:g}; {g.adjacency}; against {g.observer}"
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


__all__ = ["client_level", "outside", "sample_level", "statement"]
