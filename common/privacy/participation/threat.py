"""What a guarantee means: for each threat model, the neighbouring relation it is accounted for
(adjacency), who it holds against (observer), and what leaves a client outside it.

Client-level releases (``local`` / ``distributed`` / ``central`` noise) and the sample-level local
optimizers each state these in every summary, ledger report and privacy.json.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the accountants import numpy: common/config.py imports this module
    from common.privacy.accounting.accountants import Event


#: the server a secure-aggregation guarantee holds against, and what it assumes (common/secagg/identity.py)
ACTIVE_SERVER = (
    "even one that deviates from the protocol (keys signed by roster identities, a survivor set signed "
    "by a majority, each signature bound to the round's transcript: SecAgg+ against an active server), "
    "assuming no roster identity is the server's or colludes with it (node keys the operator made, as "
    "a simulation or fedlora deploy makes them, are the operator's: then against parties other than "
    "the operator)"
)

#: what the server sees of every sampled client whatever the mechanism: not covered by any epsilon
ALWAYS_VISIBLE = "who was sampled, who replied and when (node ids, counts, dropouts: server-side records)"


#: trust setting -> what it protects (docs/sdk.md, ``fedlora node --trust``)
TRUST = {
    "none": "only releases whose noise this node adds itself (local noise): its epsilon holds against "
    "everyone, the server included",
    "aggregate": "also distributed noise summed by secure aggregation (--threat-model secure-aggregation "
    "and secure-aggregation-hidden: the server sees only the sum of the survivors' noised updates, even "
    "a server that deviates from the protocol, as long as no identity on the node's roster is the "
    "server's or colludes with it; with node identity keys the operator made, which it can sign with, "
    "the epsilon holds only against parties other than the operator)",
    "server": "also central noise, distributed noise without secure aggregation and --encode-at server: "
    "the server sees this node's clipped (or raw) update, and the epsilon holds only against "
    "everyone else",
}


@dataclass(frozen=True)
class Guarantee:
    """``adjacency``: the neighbouring datasets; ``observer``: who cannot tell them apart;
    ``amplified``: whether the accountant may use the sampling rate (the sample is hidden from
    the observer); ``relation``: the neighbouring relation in one word, ``add/remove`` (a client or
    example absent) or ``zero-out`` (a client present, its update replaced by zero), which an
    audit's excluded canary must reproduce."""

    adjacency: str
    observer: str
    amplified: bool
    relation: str = "add/remove"

    def label(self) -> str:
        return f"{self.adjacency}; against {self.observer}"


@dataclass(frozen=True)
class TransportSpec:
    """How a round's replies travel, as far as a config or a node needs to know: ``name``;
    ``server`` / ``client``: its two halves, component references loaded when a run uses them (so
    this module imports neither side); ``sums_only``: the server learns only the survivors' sum, never a
    reply; ``integers_only``: it sums integer vectors mod 2^b, so it carries a release only in its
    integer-valued form (common/privacy/registry.py ``ReleaseKind.integer_valued``), and knows
    nothing of the release's noise; ``adaptive_clip``: whether adaptive clipping's noised clip bit
    can travel through it."""

    name: str
    server: str = ""  # its server half, "module:attr" (server/round.py ``Transport``)
    client: str = ""  # its node half, "module:attr" (client/transport.py ``ClientTransport``)
    sums_only: bool = False
    integers_only: bool = False
    adaptive_clip: bool = True
    check: str = ""  # what a run through it must also hold: ``(run config) -> None``'s reference

    def refuses(self, release: str, adaptive_clip: bool) -> str:
        """Why this transport cannot carry ``release`` (the kind a run of it becomes here, registry
        ``carried_kind``; with adaptive clipping when asked); empty: it can."""
        from common.privacy.registry import RELEASE_KINDS  # (the registry imports nothing of ours)

        integer_valued = RELEASE_KINDS[release].integer_valued
        if self.integers_only and not integer_valued:
            return f"the {self.name} transport carries integer-valued releases only (skellam), not {release}"
        if integer_valued and not self.integers_only:
            return f"the {release} release is integers mod 2^b for a transport that sums them (secure aggregation)"
        if adaptive_clip and not self.adaptive_clip:
            return (
                f"--adaptive-clip: its noised clip bit has no place in the {self.name} transport's sum "
                "(not in its sensitivity plan)"
            )
        return ""


#: the plain exchange: the server receives each reply
EXCHANGE = TransportSpec("exchange", "server.round:exchange_replies", "client.transport:PLAIN")
#: SecAgg+ (common/secagg): the server learns only the survivors' sum of modular encodings
SECAGG = TransportSpec(
    "secagg+",
    "server.secure_round:secagg_round",
    "client.transport:SECAGG_PLUS",
    sums_only=True,
    integers_only=True,
    adaptive_clip=False,
    check="common.privacy.planning.secure_plan:check_run",
)
#: every transport a threat model may declare, by name
TRANSPORTS_DECLARED: dict[str, TransportSpec] = {t.name: t for t in (EXCHANGE, SECAGG)}


class ThreatModel:
    """Where a client-level release's noise is added, and so what each observer sees of one client.

    One subclass per threat model (:data:`THREATS`); callers ask it, never compare its name.
    ``guarantee``: the ε's adjacency and observer; ``server_sees``: one client's reply as the server
    receives it; ``trust``: the least a node must trust (client/node/policy.py ``TRUST``) to take part
    with less noise than it adds itself. Stds are in units of the update (σ·C); ``m`` is the number
    of replies a distributed share is sized for (common/privacy/planning/plan.py ``NoisePlan.shares``).
    """

    name: str = ""
    guarantee: Guarantee
    server_sees: str = ""
    trust: str = "server"
    each_reply_private: bool = False  # every reply carries the whole noise on its own
    clear_replies: bool = False  # the server receives clipped replies without noise (it adds the noise)
    transport: TransportSpec = EXCHANGE  # how the replies travel (:class:`TransportSpec`)
    # every client online takes part in every round; each contributes by its own coin (secure aggregation)
    hides_participation: bool = False
    # what the server sees of every client whatever the noise: not covered by any epsilon
    visible: str = ALWAYS_VISIBLE

    @property
    def summed_securely(self) -> bool:
        """Whether the server learns only the sum (its transport's declared fact)."""
        return self.transport.sums_only

    def client_std(self, update_sigma: float, clip: float, m: int, cohort_scale: float) -> float:
        """Noise std one client adds to its update clipped to ``clip`` (0: the server adds it)."""
        return 0.0

    def count_share(self, std: float, m: int) -> tuple[float, float]:
        """Adaptive clipping's count noise std ``std`` split as (each client's, the server's)."""
        return 0.0, std

    def released_sigma(self, server_sigma: float, replied: int, m: int) -> float:
        """Noise multiplier of the update in the sum of ``replied`` releases."""
        return server_sigma

    def simulated_sigma(self, sigma: float, cohort_scale: float) -> float:
        """σ as a what-if run's releases carry it: the sum's noise std scales by K/K'."""
        return sigma * cohort_scale

    def node_event(self, planned: Event, noise_std: float, clip: float) -> Event:
        """The event a node charges for one release: the run's plan, unless it added it all itself."""
        return planned

    def noise_note(self, min_replies: int, sigma: float) -> str:
        """A line the server prints when the run starts, if this noise needs explaining."""
        return ""

    def __repr__(self) -> str:
        return f"ThreatModel({self.name})"


class LocalNoise(ThreatModel):
    name = "local"
    # The server sees who replied, so add/remove of a client is not hidden from it: one client's
    # update replaced by zero (sensitivity C) is the relation the noise covers. Replacing one
    # client's data by any other (sensitivity 2C) is the epsilon of sigma / 2.
    guarantee = Guarantee(
        "zero-out adjacency (one client's update replaced by zero; participation is visible)",
        "everyone, the server included",
        amplified=False,
        relation="zero-out",
    )
    server_sees = "each reply with the whole noise, std sigma*C (local noise)"
    trust = "none"
    each_reply_private = True

    def client_std(self, update_sigma: float, clip: float, m: int, cohort_scale: float) -> float:
        # the mean of K replies of std s has std s/sqrt(K): a K'-cohort's mean needs s*sqrt(K/K')
        return update_sigma * clip * math.sqrt(cohort_scale)

    def simulated_sigma(self, sigma: float, cohort_scale: float) -> float:
        return sigma * math.sqrt(cohort_scale)

    def node_event(self, planned: Event, noise_std: float, clip: float) -> Event:
        from common.privacy.accounting.accountants import Event

        return Event(noise_std / clip, 1.0)  # as added, at p = 1: the server saw it was sampled


class DistributedNoise(ThreatModel):
    name = "distributed"
    # The sum of r replies carries noise variance r*sigma^2*C^2/m, so its energy tells an observer of
    # the aggregate how many replied, hence (at small N) whether a given client took part: sampling
    # cannot be used (p = 1) and only replacing one client's update by zero is hidden.
    guarantee = Guarantee(
        "zero-out adjacency (one client's update replaced by zero; the number of replies is visible "
        "in the aggregate's noise, so participation is not hidden)",
        "an observer of the aggregate only (the global adapter): the server itself sees each reply "
        "with noise std sigma*C/sqrt(m) (no secure aggregation)",
        amplified=False,
        relation="zero-out",
    )
    server_sees = "each reply with noise std sigma*C/sqrt(m), a share of the noise (distributed noise)"
    trust = "server"  # the server sees each reply with a share of the noise only

    def client_std(self, update_sigma: float, clip: float, m: int, cohort_scale: float) -> float:
        return update_sigma * clip / math.sqrt(m) * cohort_scale

    def count_share(self, std: float, m: int) -> tuple[float, float]:
        return std / math.sqrt(m), 0.0

    def released_sigma(self, server_sigma: float, replied: int, m: int) -> float:
        return server_sigma * math.sqrt(replied / m)  # r shares of variance sigma^2/m each

    def noise_note(self, min_replies: int, sigma: float) -> str:
        return (
            f"distributed noise: each of the K sampled clients adds std sigma*C/sqrt(m), m = min(min-replies "
            f"{min_replies}, K), so any applied round carries sigma >= {sigma:.4g}; "
            "the server sees each reply with that std (no secure aggregation)"
        )


class SecureAggregation(DistributedNoise):
    """Distributed discrete noise summed by secure aggregation (docs/secure-aggregation.md): each
    client adds a Skellam share to its encoded update and the server learns only the survivors' sum.
    The server runs the protocol, so it knows who took part: sampling does not amplify against it,
    and each participation is charged at p = 1 (a participation cap bounds their number)."""

    name = "secure-aggregation"
    guarantee = Guarantee(
        "zero-out adjacency (one client's update replaced by zero; who participated is visible)",
        f"the server, {ACTIVE_SERVER}, and every other observer (secure aggregation: the server "
        "learns only the sum of the survivors' updates)",
        amplified=False,
        relation="zero-out",
    )
    server_sees = (
        "a vector uniform mod 2^b from each client, and the sum of the survivors' encoded updates "
        "with their Skellam shares (secure aggregation)"
    )
    trust = "aggregate"
    transport = SECAGG
    note = (
        "secure aggregation: each sampled client adds a Skellam share of 1/m of the noise, m = "
        "min-replies {m}; a sum is unmasked only with at least m masked inputs, so it carries sigma >= "
        "{sigma:.4g}; the server sees only that sum"
    )

    def noise_note(self, min_replies: int, sigma: float) -> str:
        return self.note.format(m=min_replies, sigma=sigma)


class HiddenParticipation(SecureAggregation):
    """Secure aggregation that hides who contributed (docs/secure-aggregation.md): the server contacts
    every client online in every round, and each contributes its update with probability p by its own
    coin from OS entropy, else a zero update; all add their Skellam shares. The server learns the sum
    and who was contacted, not who contributed, so Poisson sampling amplifies against it too (the
    zero-out neighbour is the client that never contributes: Steinke's Poisson bound for RDP applies)."""

    name = "secure-aggregation-hidden"
    guarantee = Guarantee(
        "zero-out adjacency (one client's update replaced by zero); each client contributes with "
        "probability p by its own coin, which the server does not see",
        f"the server, {ACTIVE_SERVER}, and every other observer (secure aggregation: every client "
        "online takes part in every round's protocol, trains whatever its coin says, and the server "
        "learns only the sum; neither reply timing nor size depends on the coin)",
        amplified=True,
        relation="zero-out",
    )
    hides_participation = True
    visible = (
        "who was contacted (every client online, every round), who replied and when (node ids, counts, "
        "dropouts: server-side records); every node trains every round, so timing does not show the coin"
    )
    note = (
        "secure aggregation, hidden participation: every client online adds a Skellam share of 1/m of "
        "the noise, m = min-replies {m}, and contributes its update with probability p by its own coin; "
        "a sum of at least m masked inputs carries sigma >= {sigma:.4g}"
    )


class CentralNoise(ThreatModel):
    name = "central"
    guarantee = Guarantee(
        "add/remove one client",
        "everyone but the server (trusted: it sees who was sampled and every reply: clipped, or the "
        "raw unclipped increment under --encode-at server)",
        amplified=True,
    )
    server_sees = "the clipped update with no noise (central noise: the server adds it)"
    clear_replies = True


#: every client-level threat model, by name (``--threat-model``)
THREATS: dict[str, ThreatModel] = {
    t.name: t() for t in (LocalNoise, DistributedNoise, SecureAggregation, HiddenParticipation, CentralNoise)
}

#: client-level release guarantee, by threat model
CLIENT_LEVEL: dict[str, Guarantee] = {name: t.guarantee for name, t in THREATS.items()}

#: sample-level local optimizers (every noisy step, hence the adapter, is covered)
SAMPLE_LEVEL = Guarantee(
    "add/remove one example of a node",
    "everyone, the server included (the node's noisy steps and everything computed from them)",
    amplified=True,
)


def register_threat(threat: ThreatModel) -> None:
    """Add a threat model (``--threat-model threat.name``) and the transport it declares: a new
    transport is its two halves, named by its :class:`TransportSpec`, and one threat model that uses it."""
    if threat.name in THREATS:
        raise ValueError(f"threat model '{threat.name}' is already registered")
    THREATS[threat.name] = threat
    TRANSPORTS_DECLARED.setdefault(threat.transport.name, threat.transport)
    CLIENT_LEVEL[threat.name] = threat.guarantee


def unregister_threat(name: str) -> None:
    """Undo :func:`register_threat` (a test's teardown); the built-in ones stay."""
    threat = THREATS.pop(name)
    CLIENT_LEVEL.pop(name, None)
    if all(t.transport.name != threat.transport.name for t in THREATS.values()):
        del TRANSPORTS_DECLARED[threat.transport.name]


def what_if_label(validity: str) -> str:
    """The prefix of every output that prints a what-if ε: ``WHAT-IF, <where it is valid>: `` (the
    ledger's ``validity``, common/privacy/planning/plan.py ``what_if``), or empty for a run's own ε."""
    return f"WHAT-IF, {validity}: " if validity else ""


__all__ = [
    "ACTIVE_SERVER",
    "ALWAYS_VISIBLE",
    "CLIENT_LEVEL",
    "EXCHANGE",
    "SAMPLE_LEVEL",
    "SECAGG",
    "THREATS",
    "TRANSPORTS_DECLARED",
    "CentralNoise",
    "DistributedNoise",
    "Guarantee",
    "HiddenParticipation",
    "LocalNoise",
    "SecureAggregation",
    "ThreatModel",
    "TransportSpec",
    "register_threat",
    "unregister_threat",
    "what_if_label",
]
