"""A node's record of its client-level releases: each (run, round) released at most once, charged
against the observer it goes to, within the node's budget across runs and restarts.

Why: fresh noise on the same increment, answered to a repeated round, averages out (k replies of
local noise σC are one release of σC/√k), and a round past the run's plan is a release nobody
accounted for. So before a client-level release leaves, the node

1. refuses a round outside the run's plan (``1 <= round <= rounds``; round 0 is the DR-Encoder
   statistics query) and a (run, round) it has already answered: a retry gets a refusal, never
   fresh noise on the same update;
2. refuses when its client-level history plus this release and the rounds the run still plans
   would exceed its ``client-epsilon`` (client/node/policy.py);
3. refuses a round the run's participation rule does not allow it (correlated noise's min-separation
   or cyclic group: the run's ε assumes them, so the node enforces them itself);
4. commits the charge to ``client-ledger.sqlite`` in its state directory before replying.

What a release is charged as (:func:`release_event`): noise the node adds itself (``local``) is
charged as the node added it, std / C at p = 1 (the server knows who replied), so it holds against
the server; a release the node sends to a server it trusts (``central``, ``distributed`` without
secure aggregation, ``--encode-at server``: accepted only with ``trust = server``) is charged as the
run's plan, which holds against everyone but the server.
"""

from __future__ import annotations

from dataclasses import replace

from client.node.policy import NodePolicy
from client.node.state import CLIENT_LEDGER_FILE, held_ledger
from common.config import RunConfig
from common.errors import FedloraError
from common.privacy.accounting.accountants import Event
from common.privacy.accounting.ledger import Charge, Ledger
from common.privacy.participation.participation import Participation
from common.privacy.planning.plan import STATS_ROUND, NoisePlan


def release_event(plan: NoisePlan, noise_std: float, clip: float) -> Event:
    """One client-level release as the node charges it: ``noise_std`` (the std the node added to an
    update clipped to ``clip``) at p = 1 under local noise, else the plan's (σ, p)."""
    return plan.threat.node_event(plan.event, noise_std, clip)


class ReleaseLedger:
    """The node's client-level ledger, open for one run; use :meth:`open`, then :meth:`check`
    before any work and :meth:`charge` right before the release leaves."""

    def __init__(self, ledger: Ledger, policy: NodePolicy, cfg: RunConfig, run: str) -> None:
        self.ledger, self.policy, self.cfg, self.run = ledger, policy, cfg, run

    @classmethod
    def open(
        cls, node_config: dict, owner: str, policy: NodePolicy, cfg: RunConfig, run: str
    ) -> ReleaseLedger:
        """The node's client-level ledger, held open by this process (client/node/state.py
        :func:`held_ledger`: nobody closes it)."""
        return cls(
            held_ledger(node_config, CLIENT_LEDGER_FILE, "client-level", owner, cfg.delta), policy, cfg, run
        )

    def check(self, rnd: int, event: Event, planned: int) -> None:
        """Refuse round ``rnd`` outside the plan, answered before, or over the budget with
        ``planned`` more releases like ``event`` after it."""
        last = self.cfg.rounds
        if not (rnd == STATS_ROUND or 1 <= rnd <= last):
            raise FedloraError(
                f"node policy: round {rnd} is outside the run's plan of {last} rounds; not released"
            )
        if self.ledger.row(self.run, rnd) is not None:
            raise FedloraError(
                f"node policy: round {rnd} of run {self.run} was already answered; a node releases each "
                "round once (fresh noise on the same update would average out)"
            )
        self.policy.check_client_budget(self.ledger, replace(event, count=event.count * (1 + planned)))

    def future(self, rnd: int, cap: int = 0) -> int:
        """Releases the run may still ask of this node after round ``rnd``: every later round, or,
        under a participation ``cap`` (secure aggregation), what is left of it after this one;
        refuses a round beyond the cap."""
        later = self.cfg.rounds - rnd
        if not cap:
            return later
        taken = sum(1 for r in self.ledger.rows() if r["run"] == self.run and r["round"] != STATS_ROUND)
        if taken >= cap:
            raise FedloraError(
                f"node policy: this node has taken part in {taken} rounds of run {self.run}, the run's "
                "participation cap; not released"
            )
        return min(later, cap - 1 - taken)

    def check_rule(self, rule: Participation, node: int, rnd: int) -> None:
        """Refuse round ``rnd`` when this node taking part breaks the run's participation rule, as far
        as the node can tell from its own releases of the run (min-separation: one within the last
        b−1 rounds; cyclic Poisson: a round of another group)."""
        released = [
            r["round"] for r in self.ledger.rows() if r["run"] == self.run and r["round"] != STATS_ROUND
        ]
        if why := rule.refuses(node, rnd, released):
            raise FedloraError(why)

    def charge(self, rnd: int, event: Event, clip: float, threat_model: str) -> None:
        """Commit round ``rnd``'s release (a concurrent duplicate fails here: refused)."""
        self.ledger.charge(
            Charge(
                run=self.run,
                round=rnd,
                sigma=event.sigma,
                p=event.p,
                count=event.count,
                sample_rate=self.cfg.sample_rate,
                sampled=1,
                clip=clip,
                threat_model=threat_model,
                mechanism=self.cfg.mechanism,
                events=(event,),  # its kind too (a Skellam release is accounted by RDP)
            )
        )


__all__ = ["ReleaseLedger", "release_event"]
