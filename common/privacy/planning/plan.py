"""Client-level privacy of a run: the noise plan, the noise each client adds, the ε the run plans,
and the budget stop. The server (server/federation.py) and a data owner's node (client/node/policy.py)
judge a run by this one plan.

Distributed noise is sized for the fewest replies a round may be applied with: each of the K
sampled clients adds N(0, σ²C²/m) with m = min(min-replies, K), so every applied round's sum
carries at least σ (dropouts can only add noise), and the planned σ is what the ledger charges.

Adaptive clipping (Andrew et al. 2021) releases the noised count of unclipped clients beside the
update; the pair is one Gaussian mechanism of multiplier σ (the charged one) when the update carries
z_Δ = (σ⁻² − (2σ_b)⁻²)^(−1/2) (common/privacy/mechanisms/adaptive_clip.py). A what-if ``noise-cohort`` K' run
charges the σ a cohort of K' clients per round needs and adds that noise scaled to this simulation's
expected cohort K (the sum's std times K/K', pfl-research's ``noise_cohort_size``): the mean carries
the noise a K'-client round would, and the ε is valid for that deployment, not for this run.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache

from common.config import RunConfig
from common.errors import FedloraError
from common.lazy import load_component
from common.privacy.accounting.accountants import Event
from common.privacy.accounting.calibration import BUDGET_ACCOUNTANTS, calibrate_sigma, events_epsilon
from common.privacy.accounting.ledger import Ledger
from common.privacy.accounting.report import apart
from common.privacy.mechanisms.adaptive_clip import default_count_std, update_noise_multiplier
from common.privacy.participation.participation import Participation, PoissonSampling
from common.privacy.participation.threat import THREATS, Guarantee, ThreatModel
from common.privacy.planning.family import Family, OneEventRounds
from common.privacy.registry import release_kind

STATS_ROUND = 0  # the DR-Encoder statistics round's row in the client-level ledger


@dataclass(frozen=True)
class Gaussian(OneEventRounds):
    """The independent Gaussian release (central, local or distributed noise): one event of (σ, p) a
    round, :data:`BUDGET_ACCOUNTANTS`, Poisson sampling at the run's rate, no cap."""

    accountants: tuple[str, ...] = BUDGET_ACCOUNTANTS
    participations: int = 0

    def round_event(self, plan: NoisePlan) -> Event:
        return Event(plan.sigma, plan.p)

    def participation(self, plan: NoisePlan) -> Participation:
        return PoissonSampling(plan.sample_rate)

    def spent_line(self, plan: NoisePlan, head: str, clip: str, totals: dict) -> str:
        return ""

    def epsilon_after(self, plan: NoisePlan, rounds: int) -> float:
        return plan.events_epsilon(rounds)


GAUSSIAN = Gaussian()


@dataclass(frozen=True)
class NoisePlan:
    """Client-level Gaussian release of one run. ``p`` is the rate the accountant may use: the
    sampling rate, or 1 where the observer knows who was sampled (``local`` noise). ``prior``:
    events charged before round 1 (the DR-Encoder statistics round, when noised)."""

    sigma: float
    p: float
    clip: float
    threat_model: str
    target_epsilon: float  # 0 = no budget
    delta: float
    calibrated: bool
    min_replies: int = 1
    prior: tuple[Event, ...] = ()
    count_std: float = 0.0  # adaptive clipping: std σ_b of the noised unclipped count (0: fixed clip)
    noise_cohort: int = 0  # what-if: the cohort the noise is sized for (0: this run's)
    cohort_scale: float = 1.0  # K / K' (≤ 1): the sum's noise std relative to a K'-cohort plan
    sample_rate: float = 0.0  # the run's client sampling rate (names a what-if run's population K'/rate)
    # the noise family's own part of the plan (:class:`Family`): the independent Gaussian release's
    # (:data:`GAUSSIAN`), secure aggregation's Skellam release (σ its Gaussian equivalent) or
    # correlated noise's strategy and participation rule
    family: Family = GAUSSIAN

    @property
    def what_if_population(self) -> float:
        """A what-if run's population N' = K'/rate: the deployment whose rounds of K' clients at this
        run's rate the charged σ (and so the ledger's ε) is for; 0 when the run is not what-if."""
        return self.noise_cohort / self.sample_rate if self.noise_cohort and self.sample_rate else 0.0

    @property
    def private(self) -> bool:
        """False for the clip-only diagnostic (σ = 0): no guarantee, no ledger."""
        return self.sigma > 0

    @property
    def event(self) -> Event:
        """One round's planned charge to a client that takes part (the family's)."""
        return self.family.round_event(self)

    def round_events(self, rnd: int) -> tuple[Event, ...]:
        """What round ``rnd`` (1-based) charges (the family's: one event, or correlated noise's of
        that round)."""
        return self.family.round_events(self, rnd)

    @property
    def budget_accountants(self) -> tuple[str, ...]:
        """Accountants whose larger ε budget decisions use (the family's)."""
        return self.family.accountants

    @property
    def budget_keys(self) -> tuple[str, ...]:
        """The ledger totals budget decisions compare (``eps_tight`` is the ledger's RDP for Skellam)."""
        keys = {"gdp": "eps_gdp", "pld": "eps_tight", "rdp": "eps_tight"}
        return tuple(dict.fromkeys(keys[a] for a in self.budget_accountants))

    @property
    def update_sigma(self) -> float:
        """Noise multiplier of the update itself: σ, or z_Δ beside a noised count (adaptive clip)."""
        if self.count_std == 0 or self.sigma == 0:
            return self.sigma
        return update_noise_multiplier(self.sigma, self.count_std)

    @property
    def simulated_sigma(self) -> float:
        """The noise multiplier this run's releases carry (below σ in a what-if noise-cohort run)."""
        return self.threat.simulated_sigma(self.sigma, self.cohort_scale)

    @property
    def threat(self) -> ThreatModel:
        return THREATS[self.threat_model]

    @property
    def guarantee(self) -> Guarantee:
        return self.threat.guarantee

    def shares(self, sampled: int) -> int:
        """m = min(min-replies, K): the replies a distributed-noise share is sized for."""
        return max(1, min(self.min_replies, sampled))

    def client_std(self, sampled: int, clip: float = 0.0) -> float:
        """Noise std one of ``sampled`` clients adds to its increment clipped to ``clip`` (0: C), in
        units of the update (the family's)."""
        return self.family.client_std(self, sampled, clip or self.clip)

    def threat_std(self, sampled: int, clip: float) -> float:
        """A Gaussian client's noise std under the run's threat model: σC (local), σC/√m (distributed),
        0 (central), with adaptive clipping's z_Δ and a what-if run's scale."""
        return self.threat.client_std(self.update_sigma, clip, self.shares(sampled), self.cohort_scale)

    @property
    def server_sigma(self) -> float:
        """Noise multiplier (std / C) of the noise the server adds to the sum under central noise:
        z_Δ (σ without adaptive clipping), scaled in a what-if noise-cohort run."""
        return self.update_sigma * self.cohort_scale

    @property
    def participation(self) -> Participation:
        """Who takes part in a round (common/privacy/participation/participation.py; the family's rule)."""
        return self.family.participation(self)

    @property
    def participation_cap(self) -> int:
        """The rounds one client may take part in (the family's); 0: no cap."""
        return self.family.participations

    def count_stds(self, sampled: int) -> tuple[float, float]:
        """Adaptive clipping: noise std (each client's share, the server's) on the unclipped count."""
        return self.threat.count_share(self.count_std * self.cohort_scale, self.shares(sampled))

    def released_sigma(self, sampled: int, replied: int) -> float:
        """Noise multiplier of the update in the sum of ``replied`` releases (z_Δ with adaptive
        clipping, scaled in a what-if run); at least the planned one once replied ≥ m."""
        return self.threat.released_sigma(self.server_sigma, replied, self.shares(sampled))

    def spent_line(self, head: str, clip: str, totals: dict) -> str:
        """The privacy statement's client-level line for a family with its own accountant; empty:
        the Gaussian ledger's (common/privacy/accounting/statement.py ``client_level``). ``head``: the line's
        opening; ``clip``: how C is set; ``totals``: the ledger's report."""
        return self.family.spent_line(self, head, clip, totals)

    def planned_epsilon(self, rounds: int) -> float:
        """The family's ε after the prior events and ``rounds`` rounds, capped by the target (the
        server stops before exceeding it)."""
        eps = self.family.epsilon_after(self, rounds)
        return min(eps, self.target_epsilon) if self.target_epsilon > 0 else eps

    def events_epsilon(self, rounds: int) -> float:
        """The larger ε of the budget accountants after the prior events and ``rounds`` of the
        plan's round event (uncapped)."""
        events = [*self.prior, replace(self.event, count=rounds)]
        return max(events_epsilon(name, events, self.delta) for name in self.budget_accountants)


def has_statistics_round(cfg: RunConfig) -> bool:
    """A run whose release encodes (``dr-encoder``) asks every client for statistics before round 1,
    except when its codec's prior comes from the server's public data (``pca``, or ``ae`` with
    ``--ae-prior public``)."""
    return release_kind(cfg.release_kind).encodes and not cfg.public_prior


def statistics_events(cfg: RunConfig) -> tuple[Event, ...]:
    """The DR-Encoder statistics round as a client-level event (every connected client, local
    noise: p = 1), or nothing when there is none or it is sent in the clear (see :func:`uncovered`)."""
    if has_statistics_round(cfg) and cfg.stats_noise_multiplier > 0:
        return (Event(cfg.stats_noise_multiplier, 1.0, 1),)
    return ()


def uncovered(cfg: RunConfig) -> list[tuple[int, str]]:
    """``(round, what)`` for client data a run releases outside its client-level guarantee (empty
    for most runs); round 0 is the statistics round."""
    if has_statistics_round(cfg) and cfg.stats_noise_multiplier == 0:
        return [
            (
                STATS_ROUND,
                "DR-Encoder statistics sent in the clear (mean and std of every connected client's "
                "local increment per LoRA factor, as in the paper)",
            )
        ]
    return []


@lru_cache(maxsize=8)
def plan_noise(cfg: RunConfig, dim: int = 0) -> NoisePlan | None:
    """The run's noise plan, or None without a client-level release. With ``noise_multiplier`` 0 and
    a target ε, σ is calibrated so that the statistics round (if noised) and ``rounds`` rounds meet
    the target under both accountants. The Skellam release's plan (common/privacy/mechanisms/skellam_mechanism.py)
    depends on the adapter's size ``dim`` (coordinates); other plans ignore it. Cached per
    configuration (a node checks it every round)."""
    if cfg.release_kind == "none":
        return None
    own = release_kind(cfg.release_kind).planner  # a release kind that plans its own noise
    return (load_component(own) if own else _gaussian_noise)(cfg, dim)


def _gaussian_noise(cfg: RunConfig, dim: int) -> NoisePlan:
    """The independent Gaussian release's plan: σ given, or calibrated to the target over the
    statistics round (if noised) and ``rounds`` rounds under both accountants."""
    p = cfg.sample_rate if THREATS[cfg.threat_model].guarantee.amplified else 1.0
    prior = statistics_events(cfg)
    sigma, calibrated = cfg.noise_multiplier, False
    if cfg.clip_only:
        return NoisePlan(
            0.0,
            p,
            cfg.clip,
            cfg.threat_model,
            0.0,
            cfg.delta,
            False,
            cfg.min_replies,
            sample_rate=cfg.sample_rate,
        )
    if sigma == 0:
        try:
            sigma = max(
                calibrate_sigma(name, cfg.target_epsilon, cfg.delta, p, cfg.rounds, prior=prior)
                for name in BUDGET_ACCOUNTANTS
            )
        except ValueError as exc:
            raise FedloraError(f"cannot calibrate the noise: {exc}") from None
        calibrated = True
    plan = NoisePlan(
        sigma,
        p,
        cfg.clip,
        cfg.threat_model,
        cfg.target_epsilon,
        cfg.delta,
        calibrated,
        cfg.min_replies,
        prior,
        count_std=_count_std(cfg),
        noise_cohort=cfg.noise_cohort,
        cohort_scale=cfg.expected_cohort / cfg.noise_cohort if cfg.noise_cohort else 1.0,
        sample_rate=cfg.sample_rate,
    )
    plan.update_sigma  # noqa: B018 -- adaptive clipping: refuses 2σ_b <= σ now, in one line
    return plan


def planned_for_target(cfg: RunConfig, sigma: float, p: float, **plan: object) -> NoisePlan:
    """A plan calibrated by construction to ``cfg``'s target (secure aggregation's, correlated
    noise's): ``sigma`` at rate ``p``, and the mechanism's own numbers (``plan``)."""
    return NoisePlan(
        sigma,
        p,
        cfg.clip,
        cfg.threat_model,
        cfg.target_epsilon,
        cfg.delta,
        True,
        cfg.min_replies,
        sample_rate=cfg.sample_rate,
        **plan,
    )


def _count_std(cfg: RunConfig) -> float:
    """σ_b of adaptive clipping: the configured one, or K'/20 for the cohort the noise is sized for."""
    if not cfg.adaptive_clip:
        return 0.0
    return cfg.clip_count_std or default_count_std(cfg.noise_cohort or cfg.expected_cohort)


def population(plan: NoisePlan) -> str:
    """Who a what-if run's ε is for: ``a population of N' clients sampled at rate p (K' per round)``."""
    return (
        f"a population of {plan.what_if_population:,.0f} clients sampled at rate {plan.sample_rate:g} "
        f"({plan.noise_cohort} per round)"
    )


def what_if(plan: NoisePlan) -> str:
    """For a what-if noise-cohort run: the population its ε holds for and what this simulation
    itself carries (its own ε per round at the same p and δ); empty otherwise. Every output that
    prints a what-if ε starts with ``WHAT-IF`` and this text."""
    if not plan.noise_cohort:
        return ""
    own = Event(plan.simulated_sigma, plan.p, 1)
    return (
        f"valid for {population(plan)}, not for this simulation: the ledger "
        f"charges sigma {plan.sigma:.4g} (that deployment's); this simulation's releases carry sigma "
        f"{plan.simulated_sigma:.4g} (epsilon {events_epsilon('pld', [own], plan.delta):.4g} per round, pld)"
    )


def budget_stop(
    ledger: Ledger, plan: NoisePlan, events: tuple[Event, ...] = (), nodes: tuple[int, ...] = ()
) -> str | None:
    """Why the next round must not run (its charge, ``events``, by default the plan's one event, would
    exceed the budget of any of ``nodes``, the ones it may charge; empty: every client), or None."""
    if plan.target_epsilon <= 0:
        return None
    spent = ledger.spent(*(events or (plan.event,)), nodes=nodes)
    worst = max(spent[k] for k in plan.budget_keys)
    if worst <= plan.target_epsilon:
        return None
    shown, target = apart(worst, plan.target_epsilon)
    return (
        f"client-level budget reached: one more round would spend epsilon {shown} "
        f"(gdp {spent['eps_gdp']:.4g}, pld {spent['eps_tight']:.4g}) > {target} "
        f"at delta {plan.delta:g}"
    )


__all__ = [
    "BUDGET_ACCOUNTANTS",
    "STATS_ROUND",
    "NoisePlan",
    "budget_stop",
    "plan_noise",
    "population",
    "statistics_events",
    "uncovered",
    "what_if",
]
