"""The numbers of a secure-aggregation release, fixed before any round: scale, rounding bound,
Skellam noise, bits per coordinate and what a client sends (common/privacy/mechanisms/discrete.py encodes,
common/privacy/accounting/skellam.py accounts, common/secagg/ carries it).

A client clips its update to C, scales it by s = ``scale_factor``·√D/C (so sC = ``scale_factor``·√D
and conditional rounding inflates the norm by well under 1 %), rotates and rounds it to ‖z‖_2 ≤ Δ2
(Kairouz, Liu & Steinke's bound at failure probability ``beta``), and adds a Skellam share of
variance μ/m, sized for the fewest survivors m a round may be unmasked with: any m or more carry at
least μ, the variance the accountant charges. μ meets the target ε over ``participations``
rounds at p = 1: the server sees who takes part, so sampling does not amplify against it
(docs/secure-aggregation.md); a client that took part fewer times has spent less. With hidden
participation (``--threat-model secure-aggregation-hidden``) every client online takes part in every
round and contributes its update with probability p by its own coin: μ meets the target over all
rounds Poisson-sampled at p, as central noise does.

Bits: b is the smallest modulus with room for the worst-case sum of the most contributors (the
cohort, or with hidden participation a binomial bound exceeded with probability below
:data:`CONTRIBUTOR_TAIL`) plus ``headroom`` standard deviations of the cohort's summed noise, and the
detection margin of :func:`common.privacy.mechanisms.discrete.choose_bits`.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from functools import lru_cache
from typing import ClassVar

from scipy.stats import binom

from common.config import RunConfig, plans_for_target
from common.errors import FedloraError
from common.privacy.accounting.accountants import Event, SkellamEvent
from common.privacy.accounting.skellam import (
    integer_sensitivities,
    rounding_norm_bound,
    skellam_epsilon,
    skellam_mu,
)
from common.privacy.mechanisms import discrete
from common.privacy.mechanisms.skellam_sampler import MAX_TABLE_VARIANCE
from common.privacy.participation.participation import CappedCohorts, Participation
from common.privacy.participation.threat import THREATS
from common.privacy.planning.family import OneEventRounds, PlanView

#: sC = SCALE_FACTOR·√D: rounding inflates the norm by ~1/(8·factor²), 0.5 % at 5
SCALE_FACTOR = 5.0
#: conditional rounding's failure probability per draw (a failed draw is re-drawn, never sent)
ROUNDING_BETA = 1e-3
#: standard deviations of the summed noise kept inside the modulus
HEADROOM_SDS = 6.0
#: hidden participation: the bits hold the sum of up to the contributors a round exceeds with at most this probability
CONTRIBUTOR_TAIL = 1e-9


@dataclass(frozen=True)
class SecureTarget:
    """The guarantee a plan must meet: client-level ``epsilon`` at ``delta`` over ``participations``
    rounds a client may take part in, each charged at ``sample_rate`` (1: the server sees who
    contributes; below 1 only with hidden participation, each client's own coin)."""

    epsilon: float
    delta: float
    participations: int
    sample_rate: float = 1.0


@dataclass(frozen=True)
class SecurePlan(OneEventRounds):
    """One run's secure-aggregation release. Integer units: s per unit of the update.

    dim / padded: the update's coordinates d and the rotation's length D (:func:`discrete.padded_dim`);
    scale: s; l2 / l1: the sensitivities Δ2 (the rounding bound) and Δ1 = min(Δ2², √D·Δ2);
    mu: the Skellam variance the charge assumes (m shares); share_variance: μ/m, each client's;
    sigma: the Gaussian equivalent √μ/Δ2; epsilon: what ``participations`` rounds at ``sample_rate``
    spend (RDP, Agarwal et al.'s bound, amplified by Steinke's below 1); cohort: the most nodes
    in a round; contributors: the most updates its sum holds bits for; bits: b; limit: the decode
    limit L (integer units); vector_bytes: one client's masked vector (D words of b bits, packed:
    common/secagg/wire.py)."""

    epsilon_target: float
    delta: float
    participations: int
    dim: int
    padded: int
    clip: float
    scale: float
    l2: float
    l1: float
    mu: float
    min_survivors: int
    share_variance: float
    sigma: float
    epsilon: float
    cohort: int
    bits: int
    limit: float
    vector_bytes: int
    neighbours: int
    threshold: int
    sample_rate: float = 1.0
    contributors: int = 0

    @property
    def share_std(self) -> float:
        """Std of each client's Skellam share in units of the update: √(μ/m) / s."""
        return math.sqrt(self.share_variance) / self.scale

    def as_dict(self) -> dict:
        return asdict(self)

    # its part of the run's plan (common/privacy/planning/plan.py ``Family``): RDP alone (Agarwal et al.'s
    # bound; the CLT μ-GDP is no bound for Skellam noise), capped cohorts, each client's Skellam share
    accountants: ClassVar[tuple[str, ...]] = ("rdp",)

    def round_event(self, plan: PlanView) -> Event:
        """Skellam noise of μ (the fewest survivors'), σ its Gaussian equivalent, at the plan's p."""
        return SkellamEvent(plan.sigma, plan.p, 1, self.l1, self.l2)

    def client_std(self, plan: PlanView, sampled: int, clip: float) -> float:
        """Each client's Skellam share of μ/m, in units of the update (√(μ/m) / s)."""
        return self.share_std

    def participation(self, plan: PlanView) -> Participation:
        """Capped cohorts: every node by its own coin with hidden participation, at most the cap."""
        return CappedCohorts(self.cohort, self.participations, self.min_survivors, self.sample_rate)

    def spent_line(self, plan: PlanView, head: str, clip: str, totals: dict) -> str:
        """RDP, per client, for the fewest survivors, and why it is below the target if it is."""
        return (
            f"{head} for the fewest survivors m = {self.min_survivors} (a round with r > m survivors "
            f"carries sigma x sqrt(r/m), the ledger's), {clip}, at most {self.participations} rounds "
            f"per client at p = {plan.p:g}): epsilon {totals['eps_tight']:.4g} "
            f"({totals.get('tight_accountant', 'rdp')}, the worst client's{self._below_target(plan, totals)})"
            f" at delta {plan.delta:g}"
        )

    def epsilon_after(self, plan: PlanView, rounds: int) -> float:
        """A client takes part in at most the cap of ``rounds``."""
        return plan.events_epsilon(min(rounds, self.participations))

    def _below_target(self, plan: PlanView, totals: dict) -> str:
        """Why the worst client spent less than the target (empty when it did not): rounds with more
        survivors than m (the ledger's σ above the plan's), or fewer participations than the cap."""
        eps, target = totals["eps_tight"], plan.target_epsilon
        if target <= 0 or f"{eps:.4g}" == f"{target:.4g}":
            return ""
        why = []
        realised = max((r["sigma"] for r in totals.get("rounds", ())), default=plan.sigma)
        if realised > plan.sigma * (1 + 1e-9):
            m = self.min_survivors
            why.append(f"rounds had more survivors than m = {m}, so more noise (sigma up to {realised:.4g})")
        most = totals.get("most_participations")
        if most is not None and most < self.participations:
            why.append(f"the worst client took part in {most} of at most {self.participations} rounds")
        return f"; below the target {target:g}: {' and '.join(why)}" if why else ""

    def observers_epsilon(self, sample_rate: float, rounds: int) -> float:
        """ε against observers of the released adapter only, who do not see who was sampled:
        ``rounds`` rounds Poisson-sampled at ``sample_rate``, each sum carrying at least μ (Agarwal
        et al.'s bound amplified by Steinke's). Not a guarantee against the server."""
        if not 0 < sample_rate <= 1 or rounds < 1:
            raise FedloraError(f"sample rate must be in (0, 1] and rounds >= 1, got {sample_rate}, {rounds}")
        return skellam_epsilon(self.mu, self.l1, self.l2, sample_rate, rounds, self.delta)


def check_graph(k: int, t: int, least: int) -> int:
    """The threshold of ``k`` neighbours (``t``, or ⌊k/2⌋ + 1 when 0), or a one-line error: t must be
    in (k/2, k] (no two disjoint groups of t neighbours) and at most ``least``, the fewest survivors
    a round may be unmasked with (``--min-replies``)."""
    t = t or k // 2 + 1
    if not 2 * t > k >= t >= 1:
        raise FedloraError(f"threshold {t} must be above half the {k} neighbours and at most {k}")
    if least < t:
        raise FedloraError(
            f"min survivors {least} (--min-replies) must be at least the threshold {t}: a round is "
            "unmasked with at least t masked inputs"
        )
    return t


def plan_secure(
    target: SecureTarget,
    dim: int,
    clip: float,
    survivors: tuple[int, int],
    graph: tuple[int, int],
    bits: int = 0,
    contributors: int = 0,
) -> SecurePlan:
    """The plan that meets ``target`` for an update of ``dim`` coordinates clipped to ``clip``;
    ``survivors`` = (m, n): the fewest clients
    a round may be unmasked with and the most that may be summed (the sampled cohort's bound);
    ``graph`` = (k, t): SecAgg+ neighbours and threshold; ``bits``: b, 0 to choose it;
    ``contributors``: the most non-zero updates in a sum (0: n). Raises a one-line
    :class:`FedloraError` for a plan that cannot hold: t outside (k/2, k], m < t, or b too small for
    the contributors' n·Δ2 plus the noise headroom."""
    (least, most), (k, t) = survivors, graph
    epsilon, delta, participations = target.epsilon, target.delta, target.participations
    rate, contributors = target.sample_rate, min(contributors or most, most)
    if not (epsilon > 0 and math.isfinite(epsilon)) or not 0 < delta < 1:
        raise FedloraError(
            f"secure aggregation needs epsilon > 0 and delta in (0, 1), got {epsilon}, {delta}"
        )
    if participations < 1 or dim < 1 or not clip > 0 or not 0 < rate <= 1:
        raise FedloraError(
            f"participations and dim must be >= 1, the clip > 0 and the sample rate in (0, 1], got "
            f"{participations}, {dim}, {clip}, {rate}"
        )
    check_graph(k, t, least)
    if least > most:
        raise FedloraError(f"min survivors {least} must be at most the cohort {most}")
    padded = discrete.padded_dim(dim)
    scale = SCALE_FACTOR * math.sqrt(padded) / clip
    l2 = rounding_norm_bound(scale * clip, padded, ROUNDING_BETA)
    l1, l2 = integer_sensitivities(l2, padded)
    mu = skellam_mu(epsilon, l1, l2, rate, participations, delta)
    summed = most * mu / least  # the most noise a sum may carry: n shares of μ/m
    needed = discrete.choose_bits(contributors, l2, summed, HEADROOM_SDS)
    if bits and bits < needed:
        raise FedloraError(
            f"{bits} bits per coordinate are too few for {contributors} clients of norm {l2:.0f} (scale {scale:.4g} "
            f"x clip {clip:g}) and the noise headroom: at least {needed} needed"
        )
    bits = bits or needed
    if bits > discrete.MAX_BITS:
        raise FedloraError(f"{bits} bits per coordinate exceed the {discrete.MAX_BITS} the encoding allows")
    return SecurePlan(
        epsilon_target=epsilon,
        delta=delta,
        participations=participations,
        dim=dim,
        padded=padded,
        clip=clip,
        scale=scale,
        l2=l2,
        l1=l1,
        mu=mu,
        min_survivors=least,
        share_variance=mu / least,
        sigma=math.sqrt(mu) / l2,
        epsilon=skellam_epsilon(mu, l1, l2, rate, participations, delta),
        cohort=most,
        bits=bits,
        limit=discrete.decode_limit(contributors, l2, summed, HEADROOM_SDS),
        vector_bytes=(padded * bits + 7) // 8,
        neighbours=k,
        threshold=t,
        sample_rate=rate,
        contributors=contributors,
    )


def hides_participation(cfg: RunConfig) -> bool:
    """Whether every client online takes part in every round, contributing by its own coin."""
    return THREATS[cfg.threat_model].hides_participation


def cohort_bound(cfg: RunConfig) -> int:
    """The clients a secure round samples: ``--max-cohort``, or the expected cohort p·N (rounded), at
    most N. Secure rounds draw exactly this many from the clients under the participation cap (fewer
    only when fewer are left): the server sees who takes part, so Poisson sampling buys no privacy
    against it, and a fixed cohort fixes the bits and the shares. With hidden participation: all N."""
    if hides_participation(cfg):
        return cfg.num_clients
    if cfg.max_cohort:
        return min(cfg.max_cohort, cfg.num_clients)
    return min(cfg.num_clients, max(1, round(cfg.expected_cohort)))


def participation_cap(cfg: RunConfig) -> int:
    """``--max-participations``, or the mean participations of a run, ⌈rounds · cohort / N⌉: every
    client can take part that often, and the run's rounds use up all clients' participations. With
    hidden participation every round (a client's coin, not the server, decides if it contributes)."""
    if hides_participation(cfg):
        return cfg.rounds
    if cfg.max_participations:
        return min(cfg.max_participations, cfg.rounds)
    return min(cfg.rounds, math.ceil(cfg.rounds * cohort_bound(cfg) / cfg.num_clients))


#: the most Skellam tables (each of variance at most MAX_TABLE_VARIANCE) a share may sum per
#: coordinate: ~1 s of one core per round at MiniLM's 77,824 words (realistic plans need 1 to 7)
MAX_SHARE_PARTS = 1024


@lru_cache(maxsize=8)
def run_secure_plan(cfg: RunConfig, dim: int) -> SecurePlan:
    """The secure plan of a run (``--threat-model secure-aggregation``) for an adapter of ``dim``
    coordinates: ``--target-epsilon`` over the participation cap, survivors from ``--min-replies`` to
    the cohort bound, the run's neighbours, threshold and bits; with hidden participation, every
    round at the sample rate and bits for :func:`contributor_bound` contributors. Both halves derive
    it from the run config alone, so a node needs nothing from the server to check it."""
    hidden, cohort = hides_participation(cfg), cohort_bound(cfg)
    rate = cfg.sample_rate if hidden else 1.0
    plan = plan_secure(
        SecureTarget(cfg.target_epsilon, cfg.delta, participation_cap(cfg), rate),
        dim,
        cfg.clip,
        (cfg.min_replies, cohort),
        run_graph(cfg),
        cfg.secagg_bits,
        contributor_bound(cohort, rate) if hidden else 0,
    )
    parts = math.ceil(plan.share_variance / MAX_TABLE_VARIANCE)
    if parts > MAX_SHARE_PARTS:
        raise FedloraError(
            f"--threat-model {cfg.threat_model}: each client's Skellam share (variance "
            f"{plan.share_variance:.3g} integer units) would take {parts:,} table draws a coordinate, "
            f"over {MAX_SHARE_PARTS:,} (sigma {plan.sigma:.3g}: noise that swamps any update); raise "
            "--target-epsilon or --min-replies, or lower --max-participations"
        )
    return plan


def contributor_bound(clients: int, rate: float) -> int:
    """The most of ``clients`` coins at ``rate`` that come up in a round, except with probability
    below :data:`CONTRIBUTOR_TAIL` (the binomial's upper quantile). A round with more could only
    overflow if their rotated updates aligned, and decoding reports that, never wraps silently."""
    return min(clients, int(binom.isf(CONTRIBUTOR_TAIL, clients, rate)) + 1)


def run_graph(cfg: RunConfig) -> tuple[int, int]:
    """(k, t) of a run: ``--secagg-neighbours``, at most every other client of the largest cohort, and
    its threshold (``--secagg-threshold`` or ⌊k/2⌋ + 1), checked (:func:`check_graph`); one line
    unless ``--min-replies`` is a majority of that cohort."""
    cohort = cohort_bound(cfg)
    k = min(cfg.secagg_neighbours, max(1, cohort - 1))
    graph = k, check_graph(k, cfg.secagg_threshold, cfg.min_replies)
    if 2 * cfg.min_replies <= cohort:
        raise FedloraError(
            f"--min-replies {cfg.min_replies} must exceed half of the {cohort} clients a round asks: a "
            "survivor set is unmasked only with a majority's signatures (common/secagg/identity.py)"
        )
    return graph


@dataclass(frozen=True)
class IntegerFormat:
    """What a transport that sums a release planned here must hold (the Skellam mechanism's, common/privacy/mechanisms/skellam_mechanism.py), and nothing of its noise: words
    of ``bits`` bits, ``length`` of them; at least ``min_survivors`` and at most ``cohort`` summands
    (else the sum carries less noise than planned, or may overflow); the neighbour graph the plan
    sized its dropout tolerance for (``neighbours``, ``threshold``)."""

    bits: int
    length: int
    min_survivors: int
    cohort: int
    neighbours: int
    threshold: int


def round_graph(plan: SecurePlan | IntegerFormat, sampled: int) -> tuple[int, int]:
    """(k, t) of a round of ``sampled`` clients: the plan's (its ``neighbours`` and ``threshold``, or
    those its release asks of the transport), or, when fewer than k + 1 clients were
    sampled, every other client as a neighbour (k = n − 1) with t = ⌊k/2⌋ + 1 if the plan's t no
    longer fits. Both sides compute it; a node refuses any other."""
    k = min(plan.neighbours, sampled - 1)
    t = plan.threshold if 2 * plan.threshold > k >= plan.threshold else k // 2 + 1
    return k, t


def check_run(cfg: RunConfig) -> None:
    """What a run through secure aggregation must also hold (its transport's check,
    common/privacy/participation/threat.py ``TransportSpec.check``): the Skellam release plans its
    noise for the target; hidden participation asks every client every round; a valid graph."""
    flag = f"--threat-model {cfg.threat_model}"
    plans_for_target(cfg, flag, adaptive_clip=False)
    hidden = THREATS[cfg.threat_model].hides_participation
    for option_flag, on in (
        ("--max-participations", cfg.max_participations),
        ("--max-cohort", cfg.max_cohort),
    ):
        if hidden and on:
            raise FedloraError(f"{flag} asks every client every round; drop {option_flag}")
    if hidden and cfg.min_replies > cfg.num_clients:
        raise FedloraError(f"--min-replies {cfg.min_replies} exceeds the {cfg.num_clients} clients")
    run_graph(cfg)


__all__ = [
    "HEADROOM_SDS",
    "ROUNDING_BETA",
    "SCALE_FACTOR",
    "IntegerFormat",
    "SecurePlan",
    "SecureTarget",
    "check_graph",
    "check_run",
    "cohort_bound",
    "contributor_bound",
    "hides_participation",
    "participation_cap",
    "plan_secure",
    "round_graph",
    "run_graph",
    "run_secure_plan",
]
