"""A node's side of a secure-aggregation round (SecAgg+, common/secagg/protocol.py) on the Message API.

The round's ``train`` message carries the protocol's parameters; the node trains, encodes its
update to an integer vector x in [0, 2^b)^d and calls :func:`begin`, which keeps its secrets and x in
``context.state`` (the node's own memory: nothing of it leaves except as the protocol sends it) and
answers with its public keys, signed by its identity key. The four ``train.secagg_*`` stages then
read and update that state, each once and in order (a repeated request is refused); the last one
deletes it, so a node answers an unmask request at most once per round.

The node's identity key and the federation's roster (common/secagg/identity.py) come from its node
config: ``identity-key`` (a private key file) and ``secagg-roster`` (one OpenSSH public key per
line). A node without them refuses a secure round in one line before it trains.

Every signature the node makes (its round keys, its survivor set) is committed first to its signing
record (client/node/signed.py), keyed by its identity, the Flower run and the round: it signs no
(run, round) twice, across restarts. The round's parameters name the run; a node refuses a round of
another run than its own.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from flwr.app import ConfigRecord, Context, Message, RecordDict

from client.node import signed
from common.config import RunConfig
from common.errors import FedloraError
from common.models import AdapterState, adapter_size
from common.privacy.mechanisms.mechanism import run_mechanism
from common.privacy.mechanisms.skellam_mechanism import WORDS, SkellamMechanism
from common.privacy.planning.secure_plan import round_graph
from common.secagg import identity, prf, protocol
from common.secagg import wire as sw
from common.secagg.identity import Identity
from common.secagg.protocol import Client, Params
from common.wire import TrainInstruction

STATE = "secagg-state"  # context.state record of the round in progress


def credentials(node_config: dict) -> tuple[Identity, frozenset[bytes]]:
    """This node's identity and the federation's roster, from its node config; a one-line refusal
    when either is missing or unreadable, or when the node's own key is not on the roster."""
    key, roster = node_config.get(identity.IDENTITY_KEY), node_config.get(identity.ROSTER)
    if not key or not roster:
        raise FedloraError(
            f"secure aggregation needs this node's identity key and the federation's roster (node config "
            f"{identity.IDENTITY_KEY} and {identity.ROSTER}; fedlora node --identity-key / --roster); nothing sent"
        )
    return identity.member(str(key), str(roster), "nothing sent")


def _words(bits: int) -> np.dtype:
    """The dtype a node keeps its input's words in (little-endian :func:`prf.word_dtype`)."""
    return prf.word_dtype(bits).newbyteorder("<")


def _save(context: Context, client: Client, x: bytes) -> None:
    """Keep ``client`` and its input ``x`` (its words' bytes, :func:`_words`) in the node's state."""
    context.state[STATE] = sw.config_record({**sw.client_values(client), "x": x})


def _load(context: Context, round_number: int) -> tuple[Client, bytes]:
    record = context.state.get(STATE)
    if not isinstance(record, ConfigRecord) or record.get("round") != round_number:
        raise FedloraError(f"no secure-aggregation state for round {round_number} on this node")
    values = dict(record)
    return sw.client_from(values, round_number), values["x"]  # (x unpacked by the one stage that needs it)


def begin(
    context: Context, values: dict, round_number: int, node: int, x: np.ndarray, least: int = 0
) -> dict[str, object]:
    """Stage 0: the round's parameters (a train message's ``secagg`` values), this node's id and its
    encoded input ``x`` (d,) -> the signed public keys to advertise (the train reply's ``secagg``
    values). ``least``: the fewest survivors the node unmasks for (its plan's min-replies). Checks
    the parameters (one-line error) and the input range before anything is kept."""
    params = _own_run(sw.params_from(values, round_number), context)
    protocol.check_input(params, x)
    me, _ = credentials(dict(context.node_config))
    client, public = protocol.setup(params, node, me, least)
    _record(context, me, params, "keys", params.digest)
    _save(context, client, np.asarray(x).astype(_words(params.bits)).tobytes())
    return sw.keys_values(public)


def _own_run(params: Params, context: Context) -> Params:
    """``params``, or a one-line refusal when they name another run than this node's own."""
    if params.run_id != context.run_id:
        raise FedloraError(
            f"secure aggregation: the round names run {params.run_id}, this node is in run {context.run_id}; "
            "nothing sent"
        )
    return params


def _record(context: Context, me: Identity, params: Params, kind: str, digest: bytes) -> None:
    """Commit to the node's signing record that ``me`` signs ``kind`` for this round (refused if it has)."""
    node = dict(context.node_config)
    signed.record(node, identity.fingerprint(me.public), params.run_id, params.round_number, kind, digest)


def train_reply(
    context: Context,
    release: SkellamMechanism,
    values: dict,
    rnd: int,
    increment: AdapterState,
    meta: dict[str, object],
) -> RecordDict:
    """The train reply of secure-aggregation round ``rnd``: ``increment`` released by the run's
    integer-valued mechanism (bound to the round's public seed: its rotation) and kept by
    :func:`begin`; the reply carries the node's public keys and ``meta``, never the update."""
    words, _ = release.privatize(increment, release.secure.share_std, release.clip)
    x = words[WORDS].numpy()
    keys = begin(context, values, rnd, context.node_id, x, release.words.min_survivors)
    return RecordDict({**sw.record(rnd, **keys), "meta": ConfigRecord(meta)})


def check_params(release: SkellamMechanism, params: Params, node: int, noise_std: float) -> None:
    """Refuse, in one line and before anything is trained or sent, a round whose protocol parameters
    are not what this node's own release needs: the node among the round's nodes, at least the
    release's fewest survivors and at most its cohort bound, the neighbours and threshold of
    :func:`round_graph`; its words and noise share (the release's own check)."""
    words, n = release.words, len(params.node_ids)
    graph = round_graph(words, n)
    for ok, why in (
        (node in params.node_ids, f"this node ({node}) is not among the round's {n} nodes"),
        (n <= words.cohort, f"{n} nodes exceed the plan's cohort bound {words.cohort}"),
        (
            n >= words.min_survivors,
            f"{n} nodes < min-replies {words.min_survivors}: no sum of theirs carries the planned noise",
        ),
        (
            n < 2 or (params.k, params.threshold) == graph,
            f"k {params.k}, t {params.threshold}: the plan's are {graph}",
        ),
        *release.round_checks(params.bits, params.length, noise_std),
    ):
        if not ok:
            raise FedloraError(f"node policy: secure aggregation: {why}; nothing sent")


def prepare(ins: TrainInstruction, cfg: RunConfig, context: Context) -> tuple[SkellamMechanism, dict]:
    """Before any training: the run's release from this node's own plan, bound to the round's public
    seed, and the round's protocol values, checked against it; this node's identity and the
    federation's roster loaded (each a one-line refusal)."""
    mechanism = run_mechanism(cfg, adapter_size(ins.global_state))
    if not isinstance(mechanism, SkellamMechanism):  # (the run config refuses it first: common/config.py)
        raise FedloraError(
            "secure aggregation needs an integer-valued client-level release (--mechanism dp-fedavg)"
        )
    values = sw.fields(RecordDict(dict(ins.records)), ins.round)
    params = _own_run(sw.params_from(values, ins.round), context)
    release = mechanism.for_round(
        params.public_seed, {k: tuple(v.shape) for k, v in ins.global_state.items()}
    )
    check_params(release, params, context.node_id, ins.noise_std)
    credentials(dict(context.node_config))
    return release, values


def _stage(run: Callable[[Client, bytes, dict, Context], dict[str, object]]):
    """A ``train.secagg_*`` handler around ``run(client, x, values, context) -> reply values`` (``x``:
    the bytes of the node's input words, :func:`_words`)."""

    def handler(msg: Message, context: Context) -> Message:
        rnd = int(msg.metadata.group_id)
        values = sw.fields(msg, rnd)
        client, x = _load(context, rnd)
        reply = run(client, x, values, context)
        return Message(sw.record(rnd, **reply), reply_to=msg)

    return handler


def _share(client: Client, x: bytes, values: dict, context: Context) -> dict[str, object]:
    me, roster = credentials(dict(context.node_config))
    client, outbox = protocol.share_keys(
        client, sw.peers_from(values), roster, sw.transcript_from(values), me
    )
    _save(context, client, x)
    return sw.tokens_values(outbox)


def _mask(client: Client, x: bytes, values: dict, context: Context) -> dict[str, object]:
    words = np.frombuffer(x, dtype=_words(client.params.bits))
    client, y = protocol.masked_input(client, sw.tokens_from(values), words)
    _save(context, client, x)
    return sw.vector_values(y, client.params.bits)


def _check(client: Client, x: bytes, values: dict, context: Context) -> dict[str, object]:
    me, _ = credentials(dict(context.node_config))
    client, signature = protocol.check_survivors(client, sw.survivors_from(values), me)
    _record(context, me, client.params, "survivors", client.transcript_digest)
    _save(context, client, x)
    return sw.signature_values(client.node_id, signature)


def _unmask(client: Client, x: bytes, values: dict, context: Context) -> dict[str, object]:
    del context.state[STATE]  # answered at most once, whatever happens next
    _, roster = credentials(dict(context.node_config))
    return sw.unmask_values(protocol.unmask(client, sw.request_from(values), roster))


#: message type -> handler, for a ClientApp to register (``@app.train("secagg_share")`` ...)
HANDLERS: dict[str, Callable[[Message, Context], Message]] = {
    "train.secagg_share": _stage(_share),
    "train.secagg_mask": _stage(_mask),
    "train.secagg_check": _stage(_check),
    "train.secagg_unmask": _stage(_unmask),
}

__all__ = [
    "HANDLERS",
    "STATE",
    "begin",
    "credentials",
    "prepare",
    "train_reply",
]
