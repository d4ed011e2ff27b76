"""``fedlora audit client``: canary clients in a real federation (Andrew et al., ICLR 2024, "One-shot
empirical privacy estimation for federated learning").

``m`` canary slots are added after the real clients (their partitions hold data like any other).
Canary ``j`` is included with probability ½: an included canary's node, whenever it is sampled,
replies with a fixed random direction ``c_j`` of norm ``C`` in place of a trained increment, admitted
and released as any node's train message is (client/audit/canary.py: the node's checks, coin and
release ledger, then clip, its noise share, encoding). After the last round the attack scores
each canary by the cosine of ``c_j`` with the final model delta (final global adapter minus the
initial one): included canaries' directions are in it, excluded ones' are independent of it. The
scores give the AUC, the one-run ε lower bound and the one-shot estimate (common/privacy/audit.py);
the claimed ε is the run's own ledger's.

An excluded canary reproduces the neighbouring relation that claim is accounted for,
``CLIENT_LEVEL[threat_model].relation`` (common/privacy/participation/threat.py), never a real trained update
(which would measure replace-one, a relation no claim here is stated for):

* ``zero-out`` (local and distributed noise; also the clip-only diagnostic and release ``none``
  under those threat models): the client takes part but its update is replaced by zero. When
  sampled, the node replies with an all-zero increment through the same release an included
  canary uses (clip, its noise share, encoding, meta): the included and excluded worlds differ
  only in ``c_j`` against ``0``, exactly the neighbouring pair the accountant covers.
* ``add/remove`` (central noise): the client is absent. When sampled, the node answers the train
  message with an error reply, as Flower does for a ClientApp that raised, at once (no round
  timeout). The server rejects it like any reply that fails validation (server/round.py: recorded
  in the round's ``rejected`` and never summed). For the observer the claim is against (everyone
  but the trusted server: the global adapter) this is absence: sampling is Poisson, each node
  independently (common/privacy/participation/participation.py), so the slot changes no other client's sample; the server
  clips and sums only the usable replies, adds its N(0, σ²C²) once, and divides by the constant
  p·N (common/privacy/mechanisms/mechanism.py ``GaussianSum``), never by the count of replies; adaptive clipping
  counts only usable replies' bits against the same constant p·N; a round is applied iff the
  usable replies reach ``min-replies``. Each of these is what it would be had the node not been
  sampled, i.e. had the client not existed, with the mechanism's constants p and N fixed as the
  accountant takes them. What differs is seen by the server only: who was sampled and that a
  reply was rejected (metrics.jsonl), which under central noise is trusted and in any case outside
  every guarantee (``ALWAYS_VISIBLE``).

Messages other than ``train`` (the DR-Encoder statistics query) reach every canary node's real
ClientApp, included or not: they are the same in both worlds and carry nothing about inclusion.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from flwr.app import Context, Error, Message
from flwr.common.constant import ErrorCode
from safetensors.torch import load_file

from common.config import RunConfig
from common.lazy import load_component
from common.models import AdapterState
from common.privacy.audit import MIN_CANARIES, summarize
from common.privacy.participation.threat import CLIENT_LEVEL
from common.wire import TrainInstruction
from server.checkpoint import CHECKPOINT_FILE, OPTIMIZER_PREFIX
from server.simulate import simulate

#: a canary node's reply to a train message (its admission and release are every node's)
CANARY_REPLY = "client.audit.canary:canary_reply"
#: the neighbouring relations an excluded canary can reproduce
RELATIONS = ("add/remove", "zero-out")
#: the reason an excluded add/remove canary's error reply gives (the server logs and records it)
ABSENT = "audit canary excluded: absent from this federation (add/remove)"


def relation_of(cfg: RunConfig) -> str:
    """The neighbouring relation ``cfg``'s client-level guarantee is accounted for: its threat
    model's (the clip-only diagnostic and release ``none``, which claim nothing, take it too)."""
    return CLIENT_LEVEL[cfg.threat_model].relation


@dataclass
class Canaries:
    """``count`` canary slots from partition ``first`` on; ``included``: (count,) bools;
    ``relation``: what an excluded canary's node does when sampled (``zero-out``: replies a zero
    increment through the real release; ``add/remove``: contributes nothing, an error reply)."""

    count: int
    first: int
    included: np.ndarray
    seed: int
    norm: float
    relation: str
    initial: AdapterState | None = None  # the round-1 global adapter, seen on the way to a node

    def __post_init__(self) -> None:
        if self.relation not in RELATIONS:
            raise ValueError(f"unknown neighbouring relation {self.relation!r}; one of {RELATIONS}")

    def direction(self, j: int, template: AdapterState) -> AdapterState:
        """Canary ``j``: i.i.d. Gaussian entries over ``template``'s tensors, scaled to norm ``norm``."""
        gen = torch.Generator().manual_seed(self.seed * 1_000_003 + j)
        draw = {
            k: torch.randn(v.shape, generator=gen, dtype=torch.float32) for k, v in sorted(template.items())
        }
        total = torch.sqrt(sum(v.square().sum() for v in draw.values()))
        return {k: v * (self.norm / total) for k, v in draw.items()}

    def wrapper(self) -> Callable[[Callable, Message, Context], Message]:
        reply = load_component(CANARY_REPLY)

        def handle(app: Callable, msg: Message, ctx: Context) -> Message:
            if msg.metadata.message_type != "train":
                return app(msg, ctx)
            ins = TrainInstruction.from_record(msg.content)
            if ins.round == 1 and self.initial is None:
                self.initial = {k: v.clone() for k, v in ins.global_state.items()}
            j = int(ctx.node_config["partition-id"]) - self.first
            if j < 0:
                return app(msg, ctx)  # a real client
            if not self.included[j] and self.relation == "add/remove":
                return Message(Error(ErrorCode.CLIENT_APP_RAISED_EXCEPTION, ABSENT), reply_to=msg)
            chosen = (lambda template: self.direction(j, template)) if self.included[j] else None
            return reply(msg, ctx, chosen)  # zero-out: the update replaced by zero, participation unchanged

        return handle


def cosines(canaries: Canaries, final: AdapterState) -> np.ndarray:
    """cos(c_j, final − initial) for every canary (over the canaries' tensors)."""
    if canaries.initial is None:
        raise RuntimeError("the federation sent no round-1 train message")
    keys = sorted(canaries.initial)  # an increment has the global adapter's names (client/increment.py)
    delta = torch.cat([(final[k].float() - canaries.initial[k].float()).flatten() for k in keys])
    out = []
    for j in range(canaries.count):
        c = torch.cat([v.flatten() for _, v in sorted(canaries.direction(j, canaries.initial).items())])
        out.append(float(torch.dot(c, delta) / (c.norm() * delta.norm()).clamp(min=1e-30)))
    return np.asarray(out)


def final_state(run_dir: Path) -> AdapterState:
    state = load_file(run_dir / CHECKPOINT_FILE)
    return {k: v for k, v in state.items() if not k.startswith(OPTIMIZER_PREFIX)}


def federation(cfg: RunConfig, canaries: int) -> RunConfig:
    """The federation an audit of ``cfg`` runs: its ``num_clients`` real clients and ``canaries``
    canary slots after them, every slot a client like any other (sampled, counted in p·N and in the
    secure cohort, asked every round under hidden participation). Unchecked: the audit's entry point
    checks it (server/audit/cli.py), :func:`audit_run` again before it runs."""
    return cfg.replace(num_clients=cfg.num_clients + canaries)


def audit_run(cfg: RunConfig, canaries: int, out: Path, seed: int, confidence: float) -> dict:
    """One audited federation: ``cfg`` (its ``num_clients`` real clients) plus ``canaries`` slots,
    the excluded ones reproducing the relation of ``cfg``'s threat model (see the module docstring)."""
    if canaries < MIN_CANARIES:
        raise ValueError(f"need at least {MIN_CANARIES} canaries")
    rng = np.random.default_rng([seed, 1])
    relation = relation_of(cfg)
    slots = Canaries(
        count=canaries,
        first=cfg.num_clients,
        included=rng.random(canaries) < 0.5,
        seed=seed,
        norm=cfg.clip,
        relation=relation,
    )
    run_cfg = federation(cfg, canaries).replace(out_dir=str(out)).check()
    start = time.time()
    run_dir = simulate(run_cfg, out, wrap=slots.wrapper())
    scores = cosines(slots, final_state(run_dir))
    summary = json.loads((run_dir / "summary.json").read_text(encoding="utf-8"))
    claimed = summary.get("client_privacy") or {}
    stats = summarize(scores, slots.included, cfg.delta, confidence)
    canary_file = run_dir / "canaries.json"  # for re-analysis: every canary's score and membership
    canary_file.write_text(
        json.dumps({"scores": scores.tolist(), "included": slots.included.tolist()}) + "\n"
    )
    return {
        "mechanism": cfg.mechanism,
        "release": cfg.release_kind,
        "threat_model": None if cfg.clip_only or cfg.release_kind == "none" else cfg.threat_model,
        "clip_only": cfg.clip_only,
        "epsilon": claimed.get("eps_tight"),
        "eps_gdp": claimed.get("eps_gdp"),
        "accountant": f"{claimed.get('tight_accountant', 'pld')} (claimed ε); CLT mu-GDP beside it",
        "unit": f"client-level ({relation} one client)",
        "relation": relation,
        **stats,
        "real_clients": cfg.num_clients,
        "rounds": cfg.rounds,
        "sample_rate": cfg.sample_rate,
        "clip": cfg.clip,
        "run_dir": str(run_dir),
        "seconds": round(time.time() - start, 1),
    }
