"""A round's train messages to many simulated nodes, their local steps trained as one cohort.

Each message is admitted by its own node exactly as :func:`client.app.train` admits it (policy, plan,
transport, coin, budget), the admitted ones' local steps run together (client/cohort.py; a
sample-level DP optimizer's one by one), and each node releases its own reply (its ledger charged,
its transport's reply). A node that fails (a refused budget, a bad shard) is that node's dropout:
its failure is its reply, never the cohort's.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Sequence

from flwr.app import Context, Message

from client.app import (
    Admitted,
    admit,
    batchable,
    cohort_member,
    idle,
    release_admitted,
    train_admitted,
    trained,
)
from client.cohort import DEFAULT_CLIENTS, CohortUnsupported, default_tokens, train_cohort
from common.models import AdapterState
from common.timing import phase

log = logging.getLogger("fedlora.cohort")

#: a node's outcome: its reply, or what it raised (the grid answers it as Flower answers a failure)
Outcome = Message | Exception


def train_round(messages: Sequence[Message], contexts: Sequence[Context]) -> list[Outcome]:
    """Every node's outcome of one round's train ``messages`` (``contexts``: their nodes'), in order."""
    out: list[Outcome | None] = [None] * len(messages)
    admitted: dict[int, Admitted] = {}
    for i, (msg, context) in enumerate(zip(messages, contexts, strict=True)):
        try:
            admitted[i] = admit(msg, context)
        except Exception as exc:  # this node's refusal, answered as its reply
            out[i] = exc
    results = _train(admitted, contexts)
    for i, a in admitted.items():
        result = results[i]
        try:
            if isinstance(result, Exception):
                raise result
            out[i] = Message(release_admitted(a, contexts[i], *result), reply_to=messages[i])
        except Exception as exc:
            out[i] = exc
    return out


def _train(
    admitted: dict[int, Admitted], contexts: Sequence[Context]
) -> dict[int, tuple[AdapterState, dict] | Exception]:
    """``(increment, metrics)`` of every admitted message (or what its training raised): the
    batchable ones of one model as one cohort, the others one by one; a simulated idle node
    (:func:`client.app.idle`) trains nowhere."""
    results: dict[int, tuple[AdapterState, dict] | Exception] = {
        i: train_admitted(a, contexts[i]) for i, a in admitted.items() if idle(a, contexts[i])
    }
    groups: dict[int, list[int]] = {}
    for i, a in admitted.items():
        if i not in results and batchable(a):
            groups.setdefault(id(a.shard.bundle.model), []).append(i)
    alone = [i for i, a in admitted.items() if i not in results and not batchable(a)]
    if alone:
        _say_sequential(admitted[alone[0]].cfg.optimizer_kind)
    for group in groups.values():
        try:
            results.update(_cohort(group, admitted))
        except CohortUnsupported:
            alone.extend(group)
        except Exception as exc:  # the cohort's failure: each of its nodes drops out
            results.update(dict.fromkeys(group, exc))
    for i in sorted(alone):
        try:
            results[i] = train_admitted(admitted[i], contexts[i])
        except Exception as exc:
            results[i] = exc
    return results


@functools.cache
def _say_sequential(optimizer: str) -> None:
    log.warning("engine batched: %s (a sample-level DP optimizer) trains its clients one by one", optimizer)


def _cohort(group: list[int], admitted: dict[int, Admitted]) -> dict[int, tuple[AdapterState, dict]]:
    """``(increment, metrics)`` of each of ``group`` (admitted messages of one model) trained as one
    cohort, each through :func:`client.app.trained` as under the sequential engine: a member whose
    coin did not come up, or whose local steps diverged (a non-finite increment), the zero update."""
    first = admitted[group[0]]
    bundle, members = first.shard.bundle, [cohort_member(admitted[i]) for i in group]
    cuda = bundle.device.type == "cuda"
    tokens = first.cfg.cohort_tokens or default_tokens(bundle.model, bundle.device)
    clients = DEFAULT_CLIENTS[cuda]
    with phase("local-training"):
        states = train_cohort(bundle.model, first.shard.task, bundle.device, members, tokens, clients)
    return {
        i: trained(admitted[i], state, metrics) for i, (state, metrics) in zip(group, states, strict=True)
    }


__all__ = ["Outcome", "train_round"]
