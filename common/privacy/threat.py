"""What a guarantee means: for each threat model, the neighbouring relation it is accounted for
(adjacency), who it holds against (observer), and what leaves a client outside it.

Client-level releases (``local`` / ``distributed`` / ``central`` noise) and the sample-level local
optimizers each state these in every summary, ledger report and privacy.json.
"""

from __future__ import annotations

from dataclasses import dataclass


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


#: client-level release, by threat model
CLIENT_LEVEL: dict[str, Guarantee] = {
    # The server sees who replied, so add/remove of a client is not hidden from it: one client's
    # update replaced by zero (sensitivity C) is the relation the noise covers. Replacing one
    # client's data by any other (sensitivity 2C) is the epsilon of sigma / 2.
    "local": Guarantee(
        "zero-out adjacency (one client's update replaced by zero; participation is visible)",
        "everyone, the server included",
        amplified=False,
        relation="zero-out",
    ),
    # The sum of r replies carries noise variance r*sigma^2*C^2/m, so its energy tells an observer of
    # the aggregate how many replied, hence (at small N) whether a given client took part: sampling
    # cannot be used (p = 1) and only replacing one client's update by zero is hidden.
    "distributed": Guarantee(
        "zero-out adjacency (one client's update replaced by zero; the number of replies is visible "
        "in the aggregate's noise, so participation is not hidden)",
        "an observer of the aggregate only (the global adapter): the server itself sees each reply "
        "with noise std sigma*C/sqrt(m) (no secure aggregation)",
        amplified=False,
        relation="zero-out",
    ),
    "central": Guarantee(
        "add/remove one client",
        "everyone but the server (trusted: it sees who was sampled and every reply: clipped, or the "
        "raw unclipped increment under --encode-at server)",
        amplified=True,
    ),
}

#: sample-level local optimizers (every noisy step, hence the adapter, is covered)
SAMPLE_LEVEL = Guarantee(
    "add/remove one example of a node",
    "everyone, the server included (the node's noisy steps and everything computed from them)",
    amplified=True,
)

#: what the server sees of every sampled client whatever the mechanism: not covered by any epsilon
ALWAYS_VISIBLE = "who was sampled, who replied and when (node ids, counts, dropouts: server-side records)"


def what_if_label(validity: str) -> str:
    """The prefix of every output that prints a what-if ε: ``WHAT-IF, <where it is valid>: `` (the
    ledger's ``validity``, common/privacy/plan.py ``what_if``), or empty for a run's own ε."""
    return f"WHAT-IF, {validity}: " if validity else ""


__all__ = ["ALWAYS_VISIBLE", "CLIENT_LEVEL", "SAMPLE_LEVEL", "Guarantee", "what_if_label"]
