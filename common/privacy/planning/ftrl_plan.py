"""The privacy plan of DP-FTRL with banded correlated noise: a strategy (common/privacy/planning/factorization.py),
the participation rule its ε rests on, σ calibrated for both, and what each round charges the ledger.

Two rules, each a theorem about one release ``Cx + z`` (C unit-norm, ≤ b bands; client-level,
add-or-remove adjacency):

- ``cyclic-poisson`` (Choquette-Choo et al. 2023, Thm 4; jax_privacy ``CyclicPoissonSampling``): every
  client has a fixed group g ∈ {0..b−1}, drawn uniformly and independently; only group t mod b is
  eligible in round t, each member included with probability q = b·p. The run is then as private as
  ⌈(t+1)/b⌉ Poisson-sampled Gaussians at (q, σ): the ledger charges one at every round t ≡ 0 (mod b)
  and nothing at the others. b = 1 is DP-FedAvg exactly.
- ``min-sep`` (no amplification; Gboard's production recipe): no client takes part in two rounds
  less than b apart. Its participations' columns of C are then orthogonal, each of norm ≤ ‖c‖ = 1, so
  a client's rounds are one Gaussian mechanism of μ² = Σ ‖C[:, j]‖² / σ² ≤ m/σ² after m of them: each
  participation charges that client (and only it) a Gaussian of σ at p = 1, and the worst client's
  ε is ε(Gaussian(σ/sens)) with sens² = ⌈n/b⌉ (:func:`~common.privacy.planning.factorization.prefix_sensitivities`
  holds the general case).

Rounds are 0-based here (the federation's round r is t = r − 1).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from functools import cached_property

import numpy as np

from common.privacy.accounting.accountants import Event
from common.privacy.accounting.calibration import BUDGET_ACCOUNTANTS, calibrate_sigma, events_epsilon
from common.privacy.accounting.report import both_epsilons
from common.privacy.participation.participation import CyclicPoisson, MinSeparation, Participation
from common.privacy.planning.factorization import (
    mean_error,
    optimize_banded,
    workload,
)
from common.privacy.planning.family import OneEventRounds, PlanView

#: the participation rules correlated noise may rest on (see the module docstring)
RULES = ("cyclic-poisson", "min-sep")


@dataclass(frozen=True)
class FtrlPlan(OneEventRounds):  # central noise only: its clients' share is the threat model's (0)
    """One run's correlated-noise plan. ``sigma``: noise multiplier of z (per coordinate std σζ of
    z_t, ζ the clip); ``rate``: the population's sampling rate p (a round's expected cohort is pN
    under either rule); ``workload``: the server optimizer the strategy was optimized for."""

    rule: str
    coefs: tuple[float, ...]
    sigma: float
    rate: float
    rounds: int
    delta: float
    target_epsilon: float
    workload: str = "sgd"
    separation: int = 0  # min-sep rounds between one client's participations (0: the bands)
    cohort: int = 0  # min-sep: the nodes a round draws (the run's expected cohort pN)
    accountants: tuple[str, ...] = BUDGET_ACCOUNTANTS  # those σ meets the target under

    @property
    def bands(self) -> int:
        return len(self.coefs)

    @property
    def min_sep(self) -> int:
        return self.separation or self.bands

    @property
    def q(self) -> float:
        """The within-group inclusion probability (cyclic Poisson: b·p), or 1 (min-sep)."""
        return min(1.0, self.bands * self.rate) if self.rule == "cyclic-poisson" else 1.0

    @property
    def per_client(self) -> bool:
        """Whether a round charges its participants alone (min-sep: the server knows who took part
        and each participation is one column of C) or every client (cyclic Poisson: the sample is
        secret, so every client is charged as the worst group's)."""
        return self.rule == "min-sep"

    def events(self, t: int) -> tuple[Event, ...]:
        """What round ``t`` (0-based) charges (see the module docstring): to its participants under
        min-sep, to every client under cyclic Poisson (nothing outside group 0's rounds)."""
        if self.rule == "cyclic-poisson":
            return (Event(self.sigma, self.q, 1 if t % self.bands == 0 else 0),)
        return (Event(self.sigma, 1.0, 1),)

    @property
    def node_event(self) -> Event:
        """What one participation costs the node that takes part (its own release ledger): one
        Gaussian of σ, at p = 1 under min-sep (a column of norm ≤ 1), at q under cyclic Poisson (its
        group's rounds only, by a secret coin)."""
        return Event(self.sigma, self.q, 1)

    @property
    def participations(self) -> int:
        """The most rounds one client may take part in over the planned rounds."""
        return math.ceil(self.rounds / self.min_sep)

    def epsilon(self, rounds: int, accountant: str = "pld") -> float:
        """The worst client's ε after ``rounds`` rounds under ``accountant``, at the plan's δ."""
        if self.per_client:
            return events_epsilon(
                accountant, [Event(self.sigma, 1.0, math.ceil(rounds / self.min_sep))], self.delta
            )
        return events_epsilon(accountant, [e for t in range(rounds) for e in self.events(t)], self.delta)

    # its part of the run's plan (common/privacy/planning/plan.py ``Family``): the node's event, its rule's rounds
    def round_event(self, plan: PlanView) -> Event:
        return self.node_event

    def round_events(self, plan: PlanView, rnd: int) -> tuple[Event, ...]:
        return self.events(rnd - 1)

    def participation(self, plan: PlanView) -> Participation:
        if self.rule == "min-sep":
            return MinSeparation(self.min_sep, self.cohort)
        return CyclicPoisson(self.bands, self.q)

    def spent_line(self, plan: PlanView, head: str, clip: str, totals: dict) -> str:
        """The ledger's ε (the worst client's under min-sep), naming the rule it assumes."""
        spent = (
            f"epsilon {totals['eps_tight']:.4g} (pld, the worst client's) at delta {plan.delta:g}"
            if self.per_client
            else both_epsilons(totals, plan.delta)
        )
        return f"{head}, {clip}, {self.bands}-band correlated noise (banded MF DP-FTRL), assuming {self.guarantee}): {spent}"

    def epsilon_after(self, plan: PlanView, rounds: int) -> float:
        return max(self.epsilon(rounds, name) for name in self.accountants)

    @cached_property
    def error(self) -> float:
        """Mean squared error of the model trajectory per unit (σζ)², prefix sums of the strategy's
        own workload (``‖(A C⁻¹)[t, :]‖²`` averaged over the planned rounds)."""
        return mean_error(np.asarray(self.coefs), _work(self.workload, self.rounds))

    @property
    def guarantee(self) -> str:
        """What the ε assumes, in words (every printed ε of a correlated-noise run names it)."""
        if self.rule == "cyclic-poisson":
            return (
                f"cyclic Poisson participation: each client in one of {self.bands} fixed groups, eligible "
                f"every {self.bands}th round, included with probability {self.q:g} by a secret coin"
            )
        return (
            f"min-separation {self.min_sep}: no client in two rounds less than {self.min_sep} apart "
            "(no amplification by sampling claimed)"
        )


def _work(kind: str, n: int) -> np.ndarray:
    """The workload coefficients named ``sgd`` or ``momentum <β>``."""
    name, _, beta = kind.partition(" ")
    return workload(name, n, float(beta or 0.0))


def workload_name(server_optimizer: str, momentum: float) -> str:
    """The linear workload a server optimizer induces (``sgd``, ``momentum <β>``); adam and yogi
    have none: their strategy is the prefix sum's (correlated noise before them is post-processing,
    privacy unchanged; the error cancellation is not theirs)."""
    return f"momentum {momentum:g}" if server_optimizer == "momentum" else "sgd"


def auto_bands(rate: float) -> int:
    """b = ⌊1/p⌋ (at most 64): the cadence at which a pN-client cohort can cover every client once."""
    return max(1, min(64, int(1.0 / rate + 1e-9)))


@dataclass(frozen=True)
class Target:
    """The client-level budget a plan meets: ε at δ."""

    epsilon: float
    delta: float


def plan_ftrl(
    rule: str,
    rounds: int,
    rate: float,
    target: Target,
    bands: int = 0,
    work: str = "sgd",
    separation: int = 0,
) -> FtrlPlan:
    """A plan whose ε after ``rounds`` meets ``target`` under the ledger's budget accountants (PLD
    alone under min-sep, see below): the strategy of ``bands`` (0: :func:`auto_bands`) optimized for
    ``work`` over ``rounds``, σ the smallest that meets it. ``separation`` (min-sep only; 0: the bands) may exceed the bands: one band
    with a separation of b is DP-FedAvg held to the min-sep rule."""
    if rule not in RULES:
        raise ValueError(f"unknown participation rule '{rule}' (have: {', '.join(RULES)})")
    bands = bands or auto_bands(rate)
    if rule == "cyclic-poisson" and bands * rate > 1 + 1e-12:
        raise ValueError(f"cyclic Poisson needs bands x rate <= 1, got {bands} x {rate:g}")
    if separation and (rule != "min-sep" or separation < bands):
        raise ValueError(f"a separation of {separation} needs the min-sep rule and at least {bands} bands")
    coefs = tuple(float(c) for c in optimize_banded(rounds, bands, _work(work, rounds)))
    target_epsilon, delta = target.epsilon, target.delta
    plan = FtrlPlan(rule, coefs, 1.0, rate, rounds, delta, target_epsilon, work, separation)
    steps = math.ceil(rounds / bands) if rule == "cyclic-poisson" else plan.participations
    accountants = BUDGET_ACCOUNTANTS
    if rule == "min-sep":
        # a client's participations are Gaussians at p = 1, exactly (√m/σ)-GDP together: the PLD bound
        # is tight for them, and the CLT μ-GDP (a Poisson-sampling limit, e^{1/σ²} − 1 a round) does
        # not apply at p = 1 (at 30 rounds, ε 8 it would ask a 16 % larger σ)
        accountants = ("pld",)
    sigma = max(calibrate_sigma(a, target_epsilon, delta, plan.q, steps) for a in accountants)
    return replace(plan, sigma=sigma, accountants=accountants)


def compare_noise(
    rounds: int, rate: float, delta: float, epsilon: float, bands: int = 0, work: str = "sgd"
) -> dict:
    """The noise RMSE of the model trajectory (σ·√mean error, per unit ζ) of banded MF against
    DP-FedAvg at one ε: MF under min-sep b (no amplification), DP-FedAvg held to the same rule (C = I,
    the same separation), today's amplified DP-FedAvg (Poisson at p over every round), and MF under
    cyclic Poisson with the same b."""
    bands = bands or auto_bands(rate)
    target = Target(epsilon, delta)
    mf = plan_ftrl("min-sep", rounds, rate, target, bands, work)
    same_rule = plan_ftrl("min-sep", rounds, rate, target, 1, work, separation=bands)
    cyclic = plan_ftrl("cyclic-poisson", rounds, rate, target, bands, work)
    amplified = plan_ftrl("cyclic-poisson", rounds, rate, target, 1, work)
    rmse = {
        name: p.sigma * math.sqrt(p.error)
        for name, p in [
            ("mf_min_sep", mf),
            ("fedavg_min_sep", same_rule),
            ("mf_cyclic", cyclic),
            ("fedavg", amplified),
        ]
    }
    return {
        "epsilon": epsilon,
        "bands": bands,
        "sigma": {
            "mf_min_sep": mf.sigma,
            "fedavg_min_sep": same_rule.sigma,
            "mf_cyclic": cyclic.sigma,
            "fedavg": amplified.sigma,
        },
        "rmse": rmse,
        "mf_min_sep_over_fedavg_min_sep": rmse["mf_min_sep"] / rmse["fedavg_min_sep"],
        "mf_min_sep_over_fedavg": rmse["mf_min_sep"] / rmse["fedavg"],
        "mf_cyclic_over_fedavg": rmse["mf_cyclic"] / rmse["fedavg"],
    }


__all__ = ["RULES", "FtrlPlan", "Target", "auto_bands", "compare_noise", "plan_ftrl", "workload_name"]
