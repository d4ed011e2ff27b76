"""What a noise family owns of a run's plan (pfl-research: a mechanism owns its noise plan), and what
it reads of the plan: the protocols between common/privacy/planning/plan.py's ``NoisePlan`` and the families
(its ``Gaussian``; secure aggregation's ``SecurePlan``, common/privacy/planning/secure_plan.py; correlated
noise's ``FtrlPlan``, common/privacy/planning/ftrl_plan.py). Here, below all of them, so that a family's module
never imports the plan that holds it."""

from __future__ import annotations

from typing import Protocol

from common.privacy.accounting.accountants import Event
from common.privacy.participation.participation import Participation


class PlanView(Protocol):
    """What a family reads of the run's ``NoisePlan``."""

    sigma: float
    p: float
    delta: float
    target_epsilon: float

    @property
    def event(self) -> Event:
        """The plan's round event (the family's own :meth:`Family.round_event`)."""

    def threat_std(self, sampled: int, clip: float) -> float:
        """A Gaussian client's noise std under the run's threat model."""

    def events_epsilon(self, rounds: int) -> float:
        """The budget accountants' larger ε after the prior events and ``rounds`` round events."""


class Family(Protocol):
    """A noise family's own part of a run's plan: what one round charges, which accountants judge the
    budget, who takes part, each client's noise share, the statement's line and the planned ε. Each
    method receives the whole plan."""

    @property
    def accountants(self) -> tuple[str, ...]:
        """The accountants budget decisions use (their larger ε)."""

    @property
    def participations(self) -> int:
        """The most rounds one client may take part in (0: no cap)."""

    def round_event(self, plan: PlanView) -> Event:
        """What one round costs a client that takes part (its node's release ledger)."""

    def round_events(self, plan: PlanView, rnd: int) -> tuple[Event, ...]:
        """What round ``rnd`` (1-based) charges the run's ledger."""

    def client_std(self, plan: PlanView, sampled: int, clip: float) -> float:
        """Noise std one of ``sampled`` clients adds to its increment clipped to ``clip``."""

    def participation(self, plan: PlanView) -> Participation:
        """Who takes part in a round."""

    def spent_line(self, plan: PlanView, head: str, clip: str, totals: dict) -> str:
        """The statement's client-level line, or empty for the Gaussian ledger's."""

    def epsilon_after(self, plan: PlanView, rounds: int) -> float:
        """The ε ``rounds`` rounds plan to spend, uncapped."""


class OneEventRounds:
    """What families share unless they say otherwise: the plan's one event each round, and a
    Gaussian client's noise share under the run's threat model."""

    def round_events(self, plan: PlanView, rnd: int) -> tuple[Event, ...]:
        return (plan.event,)

    def client_std(self, plan: PlanView, sampled: int, clip: float) -> float:
        return plan.threat_std(sampled, clip)


__all__ = ["Family", "OneEventRounds", "PlanView"]
