"""Who takes part in a round, as a fact the privacy plan declares (common/privacy/planning/plan.py
``NoisePlan.participation``), read by the server's sampler and stop rule (server/federation.py) and by
a node deciding whether it contributes (client/app.py):

- :class:`PoissonSampling`: each online node is sampled with probability p, independently (the
  amplification the accountants take); the plain exchange and central, local or distributed noise.
- :class:`MinSeparation`: a cohort of about pN from the nodes that took no part in the last b−1
  rounds (correlated noise without amplification; common/privacy/planning/ftrl_plan.py), each participation
  charged to its node.
- :class:`CyclicPoisson`: each node in a fixed public group g(node) ∈ {0..b−1}; only group
  (round − 1) mod b is eligible, each of its nodes sampled with probability q = b·p (correlated
  noise with amplification, Choquette-Choo et al. 2023 Thm 4).
- :class:`CappedCohorts`: a fixed cohort of the nodes under a participation cap, never fewer than the
  fewest survivors the noise is sized for (secure aggregation: each participation is charged to the
  node at p = 1); with hidden participation the cohort is every online node, and each contributes
  its update by its own coin at p from OS entropy.

Every draw that protects privacy comes from OS entropy (:func:`os_sampler`, :func:`contributes`),
never from the run's published seed, and is never stored.
"""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np


class History(Protocol):
    """What a rule reads of the run's client-level ledger (common/privacy/accounting/ledger.py ``Ledger``)."""

    def participations(self) -> dict[int, int]:
        """node id -> the rounds it was charged for."""

    def last_rounds(self) -> dict[int, int]:
        """node id -> the last round it was charged for."""


def os_sampler() -> np.random.Generator:
    """A fresh generator seeded from OS entropy (never from the run's seed, never checkpointed)."""
    return np.random.default_rng(secrets.randbits(128))


def contributes(rate: float) -> bool:
    """A coin that comes up with probability ``rate`` (to 2^-53), from OS entropy: whether a node
    contributes its update to a round under hidden participation. Never seeded, never stored, never
    sent: the server must not learn it."""
    return secrets.randbelow(2**53) < round(rate * 2**53)


#: ``context.state`` record that only the simulation's grids write, when they create their nodes'
#: contexts (server/inprocess.py, from the run's ``idle-training``); its :data:`SKIP_IDLE` True: a node
#: whose hidden-participation coin did not come up skips its local steps. A deployed node's state is
#: its own (its SuperNode keeps it; no config or message sets it): it trains whatever its coin says,
#: so that no reply's timing shows it
SIMULATION = "fedlora-simulation"
SKIP_IDLE = "skip-idle"
#: the node config key that once carried the flag: a node whose node config holds it (any value)
#: refuses rounds (client/app.py), since node config is the operator's to set
LEGACY_SKIP_IDLE = "simulated-skip-idle"


def skips_idle(state: Mapping[str, object]) -> bool:
    """Whether a node's ``context.state`` says it is simulated with idle training skipped: its
    :data:`SIMULATION` record holds :data:`SKIP_IDLE` as the bool True (strictly: any other value,
    the string ``"true"`` included, is False)."""
    record = state.get(SIMULATION)
    return isinstance(record, Mapping) and record.get(SKIP_IDLE) is True


def poisson_sample(node_ids: Sequence[int], rate: float, rng: np.random.Generator) -> list[int]:
    """Each node is included with probability ``rate``; the result may be empty."""
    if not 0.0 < rate <= 1.0:
        raise ValueError(f"sample rate must be in (0, 1], got {rate}")
    keep = rng.random(len(node_ids)) < rate
    return [n for n, k in zip(node_ids, keep, strict=True) if k]


def eligible(node_ids: Sequence[int], taken: Mapping[int, int], cap: int) -> list[int]:
    """The nodes that have taken part fewer than ``cap`` times (``taken``: node id -> participations),
    the rest having spent their per-client budget."""
    return [n for n in node_ids if taken.get(n, 0) < cap]


def balanced_sample(
    node_ids: Sequence[int], taken: Mapping[int, int], size: int, rng: np.random.Generator
) -> list[int]:
    """A fixed cohort: ``size`` of ``node_ids`` (all of them when fewer), sorted, filled from the nodes
    that have taken part least (``taken``), chosen uniformly at random within the last tier that does
    not fit whole. With a cap of c participations, N nodes and cohorts of K, every node's cap is used
    before any node's last participation and c·N/K rounds run (a uniform draw leaves fewer than K
    under the cap near the end). Against the server each participation is charged at p = 1 whoever
    is drawn, so the order costs nothing."""
    if len(node_ids) <= size:
        return sorted(node_ids)
    tiers: dict[int, list[int]] = {}
    for n in node_ids:
        tiers.setdefault(taken.get(n, 0), []).append(n)
    chosen: list[int] = []
    for count in sorted(tiers):
        tier, room = tiers[count], size - len(chosen)
        if len(tier) <= room:
            chosen += tier
        else:
            chosen += [int(n) for n in rng.choice(tier, size=room, replace=False)]
        if len(chosen) == size:
            break
    return sorted(chosen)


class Participation(Protocol):
    """Who takes part in a round. ``per_client``: each round's charge names its participants (the
    ledger counts them per client); ``charges_empty``: a round that samples nobody is charged all the
    same (whom a hidden sampler picks, nobody included, is secret)."""

    per_client: bool
    charges_empty: bool

    def taken(self, ledger: History | None, rnd: int) -> dict[int, int]:
        """Node id -> the rounds it has taken part in before round ``rnd``, as far as this rule
        counts them."""
        ...

    def online(self, nodes: Sequence[int], taken: Mapping[int, int], rnd: int) -> list[int]:
        """The ``nodes`` online that may take part in round ``rnd``."""
        ...

    def stop_reason(self, online: Sequence[int], budget: Callable[[], str | None]) -> str | None:
        """Why no further round can run with the ``online`` nodes this rule allows, or None: the run's
        ``budget`` stop (common/privacy/planning/plan.py ``budget_stop``: one more round's charge to every
        client), or, under a per-client cap, the cap itself (what bounds each client's ε)."""
        ...

    def sample(
        self, online: Sequence[int], taken: Mapping[int, int], rng: np.random.Generator
    ) -> tuple[list[int], int]:
        """``(sampled, drawn)``: the round's nodes (empty: nothing is sent) and how many were drawn
        (more than ``sampled`` when a draw too small to be released is dropped whole)."""
        ...

    def contributes(self) -> bool:
        """A node's own decision to contribute its update this round (else a zero update)."""
        ...

    def refuses(self, node: int, rnd: int, released: Sequence[int]) -> str:
        """The node's own check of round ``rnd`` against the rule, given the rounds of this run it
        has ``released`` (its release ledger): why it must not take part (empty: it may)."""
        ...


@dataclass(frozen=True)
class PoissonSampling:
    """Each online node independently with probability ``rate`` (Poisson sampling)."""

    rate: float
    per_client: bool = False
    charges_empty: bool = True

    def taken(self, ledger: History | None, rnd: int) -> dict[int, int]:
        return {}

    def online(self, nodes: Sequence[int], taken: Mapping[int, int], rnd: int) -> list[int]:
        return list(nodes)

    def stop_reason(self, online: Sequence[int], budget: Callable[[], str | None]) -> str | None:
        return budget()

    def sample(
        self, online: Sequence[int], taken: Mapping[int, int], rng: np.random.Generator
    ) -> tuple[list[int], int]:
        sampled = poisson_sample(online, self.rate, rng)
        return sampled, len(sampled)

    def contributes(self) -> bool:
        return True

    def refuses(self, node: int, rnd: int, released: Sequence[int]) -> str:
        return ""


def group_of(node: int, groups: int) -> int:
    """Node ``node``'s fixed group in {0..groups−1}: SHA-256 of its id, uniform and independent across
    nodes, public (the cyclic-Poisson theorem holds for the worst group) and the same on the server
    and the node after any restart."""
    digest = hashlib.sha256(f"fedlora-cyclic-group:{node}".encode()).digest()
    return int.from_bytes(digest[:8], "big") % groups


@dataclass(frozen=True)
class CyclicPoisson:
    """Group (round − 1) mod ``groups`` alone is eligible in a round, each of its nodes sampled
    with probability ``rate`` (q = b·p): every client can be charged as the worst group's, one
    sampled Gaussian per cycle of ``groups`` rounds (common/privacy/planning/ftrl_plan.py)."""

    groups: int
    rate: float
    per_client: bool = False
    charges_empty: bool = True

    def taken(self, ledger: History | None, rnd: int) -> dict[int, int]:
        return {}

    def eligible(self, node: int, rnd: int) -> bool:
        return group_of(node, self.groups) == (rnd - 1) % self.groups

    def online(self, nodes: Sequence[int], taken: Mapping[int, int], rnd: int) -> list[int]:
        return [n for n in nodes if self.eligible(n, rnd)]

    def stop_reason(self, online: Sequence[int], budget: Callable[[], str | None]) -> str | None:
        return budget()

    def sample(
        self, online: Sequence[int], taken: Mapping[int, int], rng: np.random.Generator
    ) -> tuple[list[int], int]:
        sampled = poisson_sample(online, self.rate, rng) if online else []
        return sampled, len(sampled)

    def contributes(self) -> bool:
        return True

    def refuses(self, node: int, rnd: int, released: Sequence[int]) -> str:
        """Refuses a round outside this node's group, and one of another residue than the rounds it
        already took part in (a node whose id changed, on a restart, keeps its first group)."""
        group, cycle = group_of(node, self.groups), (rnd - 1) % self.groups
        other = [r for r in released if (r - 1) % self.groups != cycle]
        if group == cycle and not other:
            return ""
        why = f"round {rnd} is group {cycle}'s and this node is in cyclic group {group} of {self.groups}"
        if group == cycle:  # its id's group is this round's, but its history is another group's
            why = f"this node took part in round {max(other)}, of another cyclic group than round {rnd}'s"
        return (
            f"node policy: {why} (the run's epsilon assumes each client in one group's rounds only); "
            "not released"
        )


@dataclass(frozen=True)
class MinSeparation:
    """A cohort of ``cohort`` nodes a round, drawn uniformly (OS entropy) from those that took no
    part in the last ``separation`` − 1 rounds (all of them when fewer): no node in two rounds less
    than ``separation`` apart. Each participation is charged to its node."""

    separation: int
    cohort: int
    per_client: bool = True
    charges_empty: bool = False

    def taken(self, ledger: History | None, rnd: int) -> dict[int, int]:
        if ledger is None:
            return {}
        return {n: r for n, r in ledger.last_rounds().items() if rnd - r < self.separation}

    def online(self, nodes: Sequence[int], taken: Mapping[int, int], rnd: int) -> list[int]:
        return [n for n in nodes if n not in taken]

    def stop_reason(self, online: Sequence[int], budget: Callable[[], str | None]) -> str | None:
        return budget()

    def sample(
        self, online: Sequence[int], taken: Mapping[int, int], rng: np.random.Generator
    ) -> tuple[list[int], int]:
        if len(online) <= self.cohort:
            return sorted(online), len(online)
        drawn = sorted(int(n) for n in rng.choice(list(online), size=self.cohort, replace=False))
        return drawn, len(drawn)

    def contributes(self) -> bool:
        return True

    def refuses(self, node: int, rnd: int, released: Sequence[int]) -> str:
        close = [r for r in released if abs(rnd - r) < self.separation and r != rnd]
        if not close:
            return ""
        return (
            f"node policy: this node took part in round {max(close)}, less than the run's min-separation "
            f"{self.separation} before round {rnd} (its epsilon assumes every two rounds at least that far "
            "apart); not released"
        )


@dataclass(frozen=True)
class CappedCohorts:
    """A cohort of ``cohort`` nodes a round, each node in at most ``cap`` rounds, never fewer than
    ``least`` (the fewest survivors the noise is sized for): a smaller draw sends nothing. Each node
    drawn contributes its update by its own coin at ``rate`` (:func:`contributes`; below 1: hidden
    participation, the server sees who was contacted, not who contributed)."""

    cohort: int
    cap: int
    least: int
    rate: float = 1.0
    per_client: bool = True
    charges_empty: bool = False

    def taken(self, ledger: History | None, rnd: int) -> dict[int, int]:
        return ledger.participations() if ledger is not None else {}

    def online(self, nodes: Sequence[int], taken: Mapping[int, int], rnd: int) -> list[int]:
        return eligible(nodes, taken, self.cap)

    def stop_reason(self, online: Sequence[int], budget: Callable[[], str | None]) -> str | None:
        if len(online) >= self.least:  # (each is under the cap; the unmask gate checks their ε)
            return None
        return (
            f"client-level budget reached: {len(online)} clients online are under the participation cap of "
            f"{self.cap}, fewer than min-replies {self.least}"
        )

    def sample(
        self, online: Sequence[int], taken: Mapping[int, int], rng: np.random.Generator
    ) -> tuple[list[int], int]:
        drawn = balanced_sample(online, taken, self.cohort, rng)
        return (drawn if len(drawn) >= self.least else []), len(drawn)

    def contributes(self) -> bool:
        return contributes(self.rate)

    def refuses(self, node: int, rnd: int, released: Sequence[int]) -> str:
        return ""  # the cap: client/node/release_ledger.py ``future``


__all__ = [
    "LEGACY_SKIP_IDLE",
    "SIMULATION",
    "SKIP_IDLE",
    "CappedCohorts",
    "CyclicPoisson",
    "MinSeparation",
    "Participation",
    "PoissonSampling",
    "balanced_sample",
    "contributes",
    "eligible",
    "group_of",
    "os_sampler",
    "poisson_sample",
    "skips_idle",
]
