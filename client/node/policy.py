"""A data owner's node: the privacy policy its ClientApp enforces (``fedlora node``: client/node/cli.py).

The policy lives in the node config (``flower-supernode --node-config``, written by client/node/sdk.py):

``mechanism``        the only mechanism the node takes part in (as the preset defines it: a run
                     that overrides its local optimizer or release is another mechanism)
``dataset``          the dataset the node's labels belong to
``delta``            the largest δ the node accepts
``sample-epsilon``   sample-level budget: the node's whole history in its sample-level ledger
                     (state directory) plus what the run still plans must stay within it (PLD ε)
``client-epsilon``   client-level budget: the run's planned client-level ε (the statistics round
                     included) must stay within it, and so must the node's whole history in its
                     client-level release ledger plus what the run still plans
``run-epsilon``      the most one run may spend of that budget: its planned ε (sample-level: its
                     target; client-level: its plan, the statistics round included)
``trust``            which observers the node trusts with less than its own noise (:data:`TRUST`):
                     ``none`` (a data owner's default), ``aggregate`` or ``server``
``clear-statistics`` true: take part in DR-Encoder runs whose statistics go out in the clear
                     (outside every guarantee); a node with a policy refuses them otherwise

A key that is absent imposes nothing (simulation nodes have none: they trust the server they run
in). A refused run gets an error reply starting ``node policy:``, which the server records as a
rejected reply.
"""

from __future__ import annotations

from dataclasses import dataclass

from common.config import MECHANISMS, RunConfig
from common.errors import FedloraError
from common.privacy.accounting.accountants import Event
from common.privacy.accounting.ledger import Ledger
from common.privacy.accounting.report import apart
from common.privacy.participation.threat import THREATS, TRUST
from common.privacy.planning.plan import plan_noise, uncovered

TOLERANCE = 1e-6  # relative: a calibrated plan lands on its target up to round-off

_TRUST_ORDER = {name: rank for rank, name in enumerate(TRUST)}  # none < aggregate < server


@dataclass(frozen=True)
class NodePolicy:
    """What this node accepts; empty / 0 fields impose nothing."""

    mechanism: str = ""
    dataset: str = ""
    delta: float = 0.0
    sample_epsilon: float = 0.0
    client_epsilon: float = 0.0
    run_epsilon: float = 0.0
    clear_statistics: bool = False
    trust: str = ""  # "": "none" for a data owner's policy, "server" for a simulation node

    @property
    def restricted(self) -> bool:
        """Whether this is a data owner's policy (a simulation node has none)."""
        return bool(
            self.mechanism
            or self.dataset
            or self.delta
            or self.sample_epsilon
            or self.client_epsilon
            or self.run_epsilon
            or self.trust
        )

    @property
    def trusts(self) -> str:
        """The effective trust setting: the configured one, else ``none`` for a data owner's policy
        and ``server`` for a node without one."""
        return self.trust or ("none" if self.restricted else "server")

    @classmethod
    def from_node_config(cls, node_config: dict) -> NodePolicy:
        try:
            policy = cls(
                mechanism=str(node_config.get("mechanism", "")),
                dataset=str(node_config.get("dataset", "")),
                delta=float(node_config.get("delta", 0.0)),
                sample_epsilon=float(node_config.get("sample-epsilon", 0.0)),
                client_epsilon=float(node_config.get("client-epsilon", 0.0)),
                run_epsilon=float(node_config.get("run-epsilon", 0.0)),
                clear_statistics=_flag(node_config.get("clear-statistics", False)),
                trust=str(node_config.get("trust", "")),
            )
        except (TypeError, ValueError):
            raise FedloraError(
                "node config delta / sample-epsilon / client-epsilon / run-epsilon must be numbers, "
                "clear-statistics true or false"
            ) from None
        if policy.mechanism and policy.mechanism not in MECHANISMS:
            raise FedloraError(f"node config: unknown mechanism '{policy.mechanism}'")
        if policy.trust and policy.trust not in TRUST:
            raise FedloraError(f"node config: trust must be one of {', '.join(TRUST)}, got '{policy.trust}'")
        if min(policy.delta, policy.sample_epsilon, policy.client_epsilon, policy.run_epsilon) < 0:
            raise FedloraError(
                "node config delta / sample-epsilon / client-epsilon / run-epsilon must be >= 0"
            )
        return policy

    def check_run(self, cfg: RunConfig, dim: int = 0) -> None:
        """Refuse a run this node does not take part in (everything but the sample-level history);
        ``dim``: the adapter's coordinates (a secure-aggregation plan depends on them)."""
        if self.mechanism:
            self._check_mechanism(cfg)
        if why := self.untrusted(cfg):
            raise FedloraError(f"node policy: {why}")
        if self.dataset and cfg.dataset != self.dataset:
            raise FedloraError(
                f"node policy: this node's data is for {self.dataset}; the run is on {cfg.dataset}"
            )
        if self.delta and cfg.delta > self.delta * (1 + TOLERANCE):
            raise FedloraError(
                f"node policy: the run's delta {cfg.delta:g} exceeds this node's {self.delta:g}"
            )
        if self.sample_epsilon and cfg.optimizer_kind == "none":
            raise FedloraError(
                f"node policy: this node needs sample-level DP; mechanism {cfg.mechanism} has none"
            )
        if self.client_epsilon:
            self._check_client_budget(cfg, dim)
        if self.restricted and not self.clear_statistics and (clear := uncovered(cfg)):
            raise FedloraError(
                f"node policy: the run releases {clear[0][1]}; this node has not "
                "opted in to that (clear-statistics = true, fedlora node --allow-clear-statistics)"
            )

    def untrusted(self, cfg: RunConfig) -> str:
        """Why this node's trust setting refuses ``cfg``'s client-level release (empty: it accepts):
        who would see this node's update with less noise than the node adds itself."""
        trust = self.trusts
        if trust == "server" or cfg.release_kind == "none":
            return ""
        threat = THREATS[cfg.threat_model]
        if cfg.encode_at == "server":
            seen = "the raw, unclipped update (--encode-at server)"
        elif cfg.clip_only:
            seen = "the clipped update with no noise (clip-only diagnostic)"
        elif _TRUST_ORDER[threat.trust] <= _TRUST_ORDER[trust]:
            return ""
        else:
            seen = threat.server_sees
        setting = f"this node trusts {'no one' if trust == 'none' else 'a secure aggregate only'}"
        return f"{setting}; the server would see {seen} (trust = server, fedlora node --trust server)"

    def _check_mechanism(self, cfg: RunConfig) -> None:
        if cfg.mechanism != self.mechanism:
            raise FedloraError(
                f"node policy: this node joins only {self.mechanism} runs; this run is {cfg.mechanism}"
            )
        if (cfg.optimizer_kind, cfg.release_kind) != MECHANISMS[self.mechanism]:
            raise FedloraError(
                f"node policy: the run changes {self.mechanism} (local optimizer {cfg.optimizer_kind}, "
                f"release {cfg.release_kind}); this node joins only {self.mechanism} as defined"
            )

    def _check_client_budget(self, cfg: RunConfig, dim: int) -> None:
        if cfg.release_kind == "none":
            raise FedloraError(
                f"node policy: this node needs client-level DP; mechanism {cfg.mechanism} has none"
            )
        if cfg.clip_only or cfg.noise_cohort:
            what = (
                "a clip-only diagnostic (no noise)"
                if cfg.clip_only
                else (
                    f"a what-if run whose epsilon holds for a cohort of {cfg.noise_cohort}, not for this run"
                )
            )
            raise FedloraError(f"node policy: this node needs client-level DP; the run is {what}")
        planned = planned_client_epsilon(cfg, dim)
        if planned > self.client_epsilon * (1 + TOLERANCE):
            shown, budget = apart(planned, self.client_epsilon)
            raise FedloraError(
                f"node policy: the run plans client-level epsilon {shown} > this node's budget "
                f"{budget} (delta {cfg.delta:g})"
            )
        self.check_run_epsilon(planned, "client-level", cfg.delta)

    def check_run_epsilon(self, planned: float, unit: str, delta: float) -> None:
        """Refuse a run that plans to spend more than ``run_epsilon`` (0: no cap) of the budget."""
        if self.run_epsilon and planned > self.run_epsilon * (1 + TOLERANCE):
            shown, cap = apart(planned, self.run_epsilon)
            raise FedloraError(
                f"node policy: the run plans {unit} epsilon {shown} > the {cap} this node lets one run "
                f"spend (run-epsilon; delta {delta:g})"
            )

    def check_sample_budget(self, ledger: Ledger, sigma: float, rate: float, steps: int) -> None:
        """Refuse when the node's sample-level history (every charged round, retries included) plus
        ``steps`` more steps at noise ``sigma`` and rate ``rate`` (this round's and those the run
        still plans) would exceed ``sample_epsilon`` (PLD ε at the ledger's δ)."""
        _check_history(ledger, Event(sigma, rate, steps), self.sample_epsilon)

    def check_client_budget(self, ledger: Ledger, event: Event) -> None:
        """Refuse when the node's client-level release history plus ``event`` (this release and the
        ones the run still plans) would exceed ``client_epsilon`` (the larger of the GDP and PLD ε at
        the ledger's δ, as the server's budget stop uses)."""
        _check_history(ledger, event, self.client_epsilon)


def _check_history(ledger: Ledger, event: Event, budget: float) -> None:
    """Refuse when ``ledger``'s history plus ``event`` spends more than ``budget`` (0: no budget)."""
    if not budget:
        return
    # the tight accountant alone for a sample-level history and for Skellam noise (the CLT μ-GDP is
    # no bound for it), else the larger of the two, as the server's budget stop
    keys = ("eps_tight",) if ledger.unit == "sample-level" or not event.has_pld else ("eps_gdp", "eps_tight")
    before = max(ledger.spent()[k] for k in keys)
    after = max(ledger.spent(event)[k] for k in keys)
    if after > budget * (1 + TOLERANCE):
        shown, limit = apart(after, budget)
        raise FedloraError(
            f"node policy: {ledger.unit} budget {limit} exceeded: this run would bring "
            f"epsilon to {shown} ({before:.4g} spent before it; delta {ledger.delta:g})"
        )


def planned_client_epsilon(cfg: RunConfig, dim: int = 0) -> float:
    """The client-level ε a run plans, by the server's own plan (common/privacy/planning/plan.py): the noised
    statistics round and every round (secure aggregation: the participation cap), capped by the
    target where the server stops; ``dim``: the adapter's coordinates."""
    plan = plan_noise(cfg, dim)
    return plan.planned_epsilon(cfg.rounds) if plan else 0.0


def _flag(value: object) -> bool:
    if isinstance(value, bool):
        return value
    if str(value).lower() in ("true", "false"):
        return str(value).lower() == "true"
    raise ValueError(value)


__all__ = ["NodePolicy", "planned_client_epsilon"]
