"""Privacy accountants behind one interface, composed from (σ, p, count) events.

``gdp``  the DR-Encoder paper's CLT μ-GDP (an approximation, neither upper nor lower bound);
``rdp``  Poisson-subsampled RDP at Opacus's default orders (an upper bound, looser);
``pld``  privacy-loss distribution, pessimistic estimate (a tight upper bound; dp_accounting's algorithm).

An :class:`Event` is a Gaussian mechanism; a :class:`SkellamEvent` the Skellam mechanism of secure
aggregation's distributed discrete noise (common/privacy/accounting/skellam.py), whose σ is its Gaussian
equivalent √μ/Δ2. ``rdp`` composes both (each event gives its own RDP curve); ``gdp`` takes a
Skellam event at its Gaussian equivalent (the same CLT approximation); ``pld`` refuses one (no PLD
of the multi-dimensional Skellam mechanism here: account such a history with ``rdp``).

All three take heterogeneous events and serialise to a plain dict: ``{"name", "events"}``,
where events are ``[σ, p, count]`` triples (``[σ, p, count, Δ1, Δ2]`` for a Skellam event)
replayed on load (like dp_accounting's ledger).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import ClassVar

import numpy as np

from common.privacy.accounting import gdp, pld, rdp, skellam

#: Opacus RDPAccountant.DEFAULT_ALPHAS
RDP_ORDERS = tuple([1 + x / 10.0 for x in range(1, 100)] + list(range(12, 64)))
#: dp_accounting PLD grid (its default); the tight accountant's stated error is of this order.
PLD_DISCRETIZATION = 1e-4
#: coarsest PLD grid (nats) tried when a small σ would need more than pld.MAX_GRID_POINTS points on the
#: requested one; a PLD that does not fit even then spans > 1e6 nats, and its ε is reported as ∞
MAX_PLD_DISCRETIZATION = 1.0


@dataclass(frozen=True)
class Event:
    """``count`` rounds of the Gaussian mechanism with noise multiplier ``sigma``, each
    participant included independently with probability ``p`` (Poisson)."""

    sigma: float
    p: float
    count: int = 1

    kind: ClassVar[str] = "gaussian"
    has_pld: ClassVar[bool] = True  # the pld accountant can compose it

    def __post_init__(self) -> None:
        if not (self.sigma >= 0 and math.isfinite(self.sigma)):
            raise ValueError(f"noise multiplier must be finite and >= 0, got {self.sigma}")
        if not 0 < self.p <= 1:
            raise ValueError(f"sample rate p must be in (0, 1], got {self.p}")
        if self.count < 0 or int(self.count) != self.count:
            raise ValueError(f"count must be a non-negative integer, got {self.count}")

    def rdp(self, orders: tuple[float, ...]) -> np.ndarray:
        """The RDP of all ``count`` rounds at ``orders`` (Mironov et al. 2019's sampled Gaussian)."""
        return rdp.rdp_curve(self.p, self.sigma, self.count, orders)

    def fields(self) -> list[float]:
        """The event as stored: ``[σ, p, count, ...]``."""
        return [self.sigma, self.p, self.count]

    def same_mechanism(self, other: Event) -> bool:
        """``other`` is this event but for its count (they merge into one)."""
        return type(other) is type(self) and replace(other, count=self.count) == self


@dataclass(frozen=True)
class SkellamEvent(Event):
    """``count`` rounds of the Skellam mechanism (Agarwal, Kairouz & Liu 2021) on an integer query of
    sensitivities ``l1`` = Δ1 and ``l2`` = Δ2 (integer units) with summed noise variance μ, each
    participant included with probability ``p``. ``sigma`` is its Gaussian equivalent √μ/Δ2 (so
    μ = (σ·Δ2)², :attr:`mu`), what a report shows beside Gaussian rounds."""

    l1: float = 0.0
    l2: float = 0.0

    kind: ClassVar[str] = "skellam"
    has_pld: ClassVar[bool] = False

    def __post_init__(self) -> None:
        super().__post_init__()
        if not (self.l2 > 0 and self.l1 >= self.l2 and math.isfinite(self.l1)):
            raise ValueError(f"Skellam sensitivities need l1 >= l2 > 0, got l1 {self.l1}, l2 {self.l2}")

    @property
    def mu(self) -> float:
        return (self.sigma * self.l2) ** 2

    def rdp(self, orders: tuple[float, ...]) -> np.ndarray:
        """``count`` times the Skellam RDP at ``orders``; under sampling (p < 1) the amplification bound
        needs integer orders, so a fractional α takes ⌈α⌉'s value (RDP does not decrease in α)."""
        if self.sigma == 0:
            return np.full(len(orders), np.inf)
        if self.p == 1:
            curve = np.asarray(skellam.skellam_rdp(np.asarray(orders), self.mu, self.l1, self.l2))
        else:
            whole = sorted({max(2, math.ceil(a)) for a in orders})
            values = dict(
                zip(whole, skellam.skellam_curve(self.mu, self.l1, self.l2, self.p, whole), strict=True)
            )
            curve = np.array([values[max(2, math.ceil(a))] for a in orders])
        return self.count * curve

    def fields(self) -> list[float]:
        return [self.sigma, self.p, self.count, self.l1, self.l2]


def event_from(fields: list | tuple) -> Event:
    """The event :meth:`Event.fields` stored: 3 numbers a Gaussian one, 5 a Skellam one (a stored
    row's missing sensitivities, None or absent, make it Gaussian)."""
    if len(fields) == 3 or fields[3] is None:
        sigma, p, count = fields[:3]
        return Event(float(sigma), float(p), int(count))
    sigma, p, count, l1, l2 = fields
    return SkellamEvent(float(sigma), float(p), int(count), float(l1), float(l2))


@dataclass
class Accountant:
    """Base: keeps the event history and handles the cases every accountant shares (no rounds:
    ε = 0; a noiseless round: ε = ∞); subclasses turn the history into ε(δ) and δ(ε)."""

    name: str = "base"
    events: list[Event] = field(default_factory=list)

    def compose(self, event: Event) -> None:
        if event.count:
            last = self.events[-1] if self.events else None
            if last and last.same_mechanism(event):
                self.events[-1] = replace(last, count=last.count + event.count)
            else:
                self.events.append(event)

    @property
    def rounds(self) -> int:
        return sum(e.count for e in self.events)

    def epsilon(self, delta: float) -> float:
        if not 0 < delta < 1:
            raise ValueError(f"delta must be in (0, 1), got {delta}")
        if not self.rounds:
            return 0.0
        return math.inf if self._noiseless else self._epsilon(delta)

    def delta(self, epsilon: float) -> float:
        if not self.rounds:
            return 0.0
        return 1.0 if self._noiseless else self._delta(epsilon)

    @property
    def _noiseless(self) -> bool:
        return any(e.sigma == 0 for e in self.events)

    def _epsilon(self, delta: float) -> float:
        raise NotImplementedError

    def _delta(self, epsilon: float) -> float:
        raise NotImplementedError

    def state_dict(self) -> dict:
        return {"name": self.name, "events": [e.fields() for e in self.events]}

    def load_state_dict(self, state: dict) -> None:
        if state.get("name") != self.name:
            raise ValueError(f"state is for accountant {state.get('name')!r}, not {self.name!r}")
        self.events = []
        for fields in state["events"]:
            self.compose(event_from(fields))


class GdpAccountant(Accountant):
    """CLT μ-GDP: μ² = Σ_t p_t²·(e^{1/σ_t²} − 1)."""

    def __init__(self) -> None:
        super().__init__("gdp")

    @property
    def mu(self) -> float:
        return math.sqrt(sum(e.count * gdp.round_mu_squared(e.sigma, e.p) for e in self.events))

    def _epsilon(self, delta: float) -> float:
        return gdp.eps_for_delta(self.mu, delta)

    def _delta(self, epsilon: float) -> float:
        return gdp.delta_for_eps(epsilon, self.mu)


class PldAccountant(Accountant):
    """Tight PLD accountant: ``common.privacy.accounting.pld``, a port of dp_accounting's PLDAccountant
    (pessimistic) that agrees with it to float round-off (tests/common/privacy/test_pld.py) and loads in
    a fraction of the time.

    ``discretization`` is the PLD grid: every grid gives an upper bound on ε, finer ones tighter.
    Small noise multipliers are accounted on a coarser grid where this one would be too large.
    """

    def __init__(self, discretization: float = PLD_DISCRETIZATION) -> None:
        super().__init__("pld")
        self.discretization = discretization

    def compose(self, event: Event) -> None:
        if not event.has_pld:
            raise ValueError(
                f"the pld accountant cannot compose a {event.kind} event: use the rdp accountant"
            )
        super().compose(event)

    def _triples(self) -> list[tuple[float, float, int]]:
        return [(e.sigma, e.p, e.count) for e in self.events]

    def _on_fitting_grid(self, query: Callable[[float], float], no_guarantee: float) -> float:
        """``query(d)`` on the requested grid d, else on the finest grid 2^k·d (a subset of it, so
        still an upper bound, only looser) that fits in pld.MAX_GRID_POINTS; ``no_guarantee`` when
        not even MAX_PLD_DISCRETIZATION does."""
        d, coarsest = self.discretization, max(MAX_PLD_DISCRETIZATION, self.discretization)
        while True:
            try:
                return query(d)
            except pld.GridTooWideError as err:
                factor = err.points / pld.MAX_GRID_POINTS  # grid points scale as 1/d
                if not factor <= coarsest / d:  # also ∞ or NaN points
                    return no_guarantee
                d *= 2 ** max(1, math.ceil(math.log2(factor)))
                if d > coarsest:
                    return no_guarantee

    def _epsilon(self, delta: float) -> float:
        return self._on_fitting_grid(lambda d: pld.epsilon(self._triples(), delta, d), math.inf)

    def _delta(self, epsilon: float) -> float:
        return self._on_fitting_grid(lambda d: pld.delta(self._triples(), epsilon, d), 1.0)


class RdpAccountant(Accountant):
    """RDP at Opacus's default orders, summed over events (each event's :meth:`Event.rdp`)."""

    def __init__(self) -> None:
        super().__init__("rdp")

    def _curve(self):
        total = np.zeros(len(RDP_ORDERS))
        for e in self.events:
            total += e.rdp(RDP_ORDERS)
        return total

    def _epsilon(self, delta: float) -> float:
        return rdp.eps_from_rdp(self._curve(), RDP_ORDERS, delta)

    def _delta(self, epsilon: float) -> float:
        return rdp.delta_from_rdp(self._curve(), RDP_ORDERS, epsilon)


ACCOUNTANTS: dict[str, type[Accountant]] = {"gdp": GdpAccountant, "rdp": RdpAccountant, "pld": PldAccountant}


def make_accountant(name: str) -> Accountant:
    if name not in ACCOUNTANTS:
        raise ValueError(f"unknown accountant '{name}'; choose {', '.join(ACCOUNTANTS)}")
    return ACCOUNTANTS[name]()
