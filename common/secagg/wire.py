"""The SecAgg+ stages as Flower records: what the server and a client send each other, validated,
never pickled. Vectors travel as their b-bit words packed end to end, keys and sealed shares as bytes.

Messages (server -> client, then the reply), each a ``RecordDict`` with one ``ConfigRecord``
``secagg`` (schema :data:`SCHEMA`, ``round``):

``train`` (the round's instruction)    + ``params`` (:func:`params_record`)
    reply                              ``node``, ``cipher``, ``mask``, ``identity``, ``signature``:
                                       the node's public keys, signed by its identity
``train.secagg_share``                 ``nodes``, ``cipher``, ``mask``, ``identity``, ``signature``:
                                       its neighbours' signed keys; ``t-nodes``, ``t-entries``: the
                                       round's transcript (every node's entry digest, 32 bytes each)
    reply                              ``nodes``, ``tokens``: one sealed pair of shares per neighbour
``train.secagg_mask``                  ``nodes``, ``tokens``: the shares sealed for it
    reply                              ``masked``: y_u, d words of b bits packed end to end
``train.secagg_check``                 ``survivors``
    reply                              ``node``, ``signature``: its signature of that set
``train.secagg_unmask``                ``survivors``, ``signers``, ``identity``, ``cipher``, ``mask``,
                                       ``signature``: each signer's round keys and its signature
    reply                              ``self-nodes``, ``self-shares``, ``key-nodes``, ``key-shares``

Lists of node ids (``p-nodes``, ``nodes``, ``t-nodes``, ``survivors``, ``signers``, ``self-nodes``, ``key-nodes``)
travel as 8-byte little-endian words packed end to end: the round's node list goes to every node
in every stage, and read as Python lists it cost each node O(N) interpreted steps per message.

A parse error is an :class:`common.wire.InvalidReply` (one line); the protocol's own checks
(common/secagg/protocol.py) run after it.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
from flwr.app import ConfigRecord, Message, RecordDict

from common.secagg import keys
from common.secagg.protocol import Client, Held, Params, PublicKeys, UnmaskReply, UnmaskRequest
from common.wire import InvalidReply, check_not_error

SCHEMA = "fedlora-secagg/4"
RECORD = "secagg"
STAGES = ("train.secagg_share", "train.secagg_mask", "train.secagg_check", "train.secagg_unmask")


def config_record(values: Mapping[str, object]) -> ConfigRecord:
    """``values`` as a ConfigRecord, empty lists and byte strings left out (Flower's ConfigRecord
    cannot size them); a reader takes a missing list or id list as empty."""
    return ConfigRecord({k: v for k, v in values.items() if not (isinstance(v, list | bytes) and not v)})


def record(round_number: int, **values: object) -> RecordDict:
    """A stage message's content: one ``secagg`` :func:`config_record` of ``values``."""
    return RecordDict({RECORD: config_record({"schema": SCHEMA, "round": round_number, **values})})


def fields(msg: Message | RecordDict, round_number: int | None = None) -> dict:
    """The ``secagg`` record's values of a stage message or reply, schema and round checked."""
    if isinstance(msg, Message):
        check_not_error(msg)
    content = msg.content if isinstance(msg, Message) else msg
    got = content.get(RECORD) if isinstance(content, RecordDict) else None
    if not isinstance(got, ConfigRecord):
        raise InvalidReply(f"no {RECORD!r} record")
    values = dict(got)
    if values.pop("schema", None) != SCHEMA:
        raise InvalidReply(f"secure-aggregation record of another schema than {SCHEMA!r}")
    rnd = values.pop("round", None)
    if round_number is not None and rnd != round_number:
        raise InvalidReply(f"secure-aggregation record for round {rnd!r}, expected {round_number}")
    return values


def pack_ids(ids) -> bytes:
    """Node ids (non-negative, below 2^64) as 8-byte little-endian words end to end."""
    return np.asarray(list(ids), dtype="<u8").tobytes()


def _ids(values: Mapping, key: str) -> list[int]:
    """The node ids :func:`pack_ids` packed under ``key`` (missing: none)."""
    got = values.get(key, b"")
    if not isinstance(got, bytes) or len(got) % 8:
        raise InvalidReply(f"{key}: not node ids packed in 8-byte words")
    return np.frombuffer(got, dtype="<u8").tolist()


def _blobs(values: Mapping, key: str, count: int) -> list[bytes]:
    got = values.get(key, [])
    if not isinstance(got, list) or len(got) != count or not all(isinstance(v, bytes) for v in got):
        raise InvalidReply(f"{key}: not a list of {count} byte strings")
    return got


def _blob(values: Mapping, key: str) -> bytes:
    got = values.get(key)
    if not isinstance(got, bytes):
        raise InvalidReply(f"{key}: not bytes")
    return got


def params_record(params: Params) -> dict[str, object]:
    """``params``'s values for a ``secagg`` record (prefixed ``p-``)."""
    return {
        "p-nodes": pack_ids(params.node_ids),
        "p-k": params.k,
        "p-threshold": params.threshold,
        "p-bits": params.bits,
        "p-length": params.length,
        "p-seed": params.public_seed,
        "p-run": pack_ids([params.run_id]),  # (Flower's run ids are 64-bit unsigned)
    }


def params_from(values: Mapping, round_number: int) -> Params:
    """The :class:`Params` a message names, validated (a one-line error names the broken rule)."""
    scalars = {}
    for key in ("p-k", "p-threshold", "p-bits", "p-length"):
        value = values.get(key)
        if not isinstance(value, int) or isinstance(value, bool):
            raise InvalidReply(f"{key}: not an integer")
        scalars[key] = value
    return Params(
        round_number,
        tuple(_ids(values, "p-nodes")),
        scalars["p-k"],
        scalars["p-threshold"],
        scalars["p-bits"],
        scalars["p-length"],
        _blob(values, "p-seed"),
        _run_id(values),
    ).validate()


def _run_id(values: Mapping) -> int:
    run = _ids(values, "p-run")
    if len(run) != 1:
        raise InvalidReply("p-run: not one run id")
    return run[0]


def keys_values(keys: PublicKeys) -> dict[str, object]:
    return {
        "node": keys.node_id,
        "cipher": keys.cipher,
        "mask": keys.mask,
        "identity": keys.identity,
        "signature": keys.signature,
    }


def keys_from(values: Mapping, node: int) -> PublicKeys:
    """The signed public keys a node advertised; they must be its own (``node``)."""
    if values.get("node") != node:
        raise InvalidReply(f"keys advertised for node {values.get('node')!r} by node {node}")
    fields = ("cipher", "mask", "identity", "signature")
    return PublicKeys(node, *(_blob(values, key) for key in fields))


_PEER_FIELDS = ("cipher", "mask", "identity", "signature")


def peers_values(peers: Mapping[int, PublicKeys]) -> dict[str, object]:
    nodes = sorted(peers)
    return {
        "nodes": pack_ids(nodes),
        **{key: [getattr(peers[v], key) for v in nodes] for key in _PEER_FIELDS},
    }


def peers_from(values: Mapping) -> dict[int, PublicKeys]:
    nodes = _ids(values, "nodes")
    columns = [_blobs(values, key, len(nodes)) for key in _PEER_FIELDS]
    return {v: PublicKeys(v, *row) for v, *row in zip(nodes, *columns, strict=True)}


_DIGEST = 32  # bytes of one transcript entry (SHA-256)


def transcript_values(entries: Mapping[int, bytes]) -> dict[str, object]:
    """The round's transcript (node -> entry digest, protocol.transcript) for the share stage: the
    ids packed, the digests end to end in the same order."""
    nodes = sorted(entries)
    return {"t-nodes": pack_ids(nodes), "t-entries": b"".join(entries[v] for v in nodes)}


def transcript_from(values: Mapping) -> dict[int, bytes]:
    nodes = _ids(values, "t-nodes")
    data = values.get("t-entries", b"")
    if not isinstance(data, bytes) or len(data) != _DIGEST * len(nodes) or len(set(nodes)) != len(nodes):
        raise InvalidReply(f"t-entries: not {len(nodes)} distinct nodes' {_DIGEST}-byte digests")
    return {v: data[_DIGEST * i : _DIGEST * (i + 1)] for i, v in enumerate(nodes)}


def tokens_values(tokens: Mapping[int, bytes]) -> dict[str, object]:
    nodes = sorted(tokens)
    return {"nodes": pack_ids(nodes), "tokens": [tokens[v] for v in nodes]}


def tokens_from(values: Mapping) -> dict[int, bytes]:
    nodes = _ids(values, "nodes")
    if len(set(nodes)) != len(nodes):
        raise InvalidReply("nodes: repeated ids")
    return dict(zip(nodes, _blobs(values, "tokens", len(nodes)), strict=True))


def client_values(client: Client) -> dict[str, object]:
    """A node's round state (its secrets included: kept in the node's own ``context.state``, never
    sent) as record values; :func:`client_from` reads them back."""
    p = client.params
    peers, held = sorted(client.peers), sorted(client.held)
    return {
        "round": p.round_number,
        **params_record(p),
        "node": client.node_id,
        "cipher-key": keys.private_to_scalar(client.cipher_key),
        "mask-key": keys.private_to_scalar(client.mask_key),
        "self-seed": client.self_seed,
        "peers": peers,
        "peer-cipher": [client.peers[v].cipher for v in peers],
        "peer-mask": [client.peers[v].mask for v in peers],
        "pair-keys": [client.share_keys[v] for v in peers if v in client.share_keys],
        "held": held,
        "held-seed": [client.held[v].self_seed for v in held],
        "held-key": [client.held[v].mask_key for v in held],
        "least": client.least,
        "stage": client.stage,
        "signed": pack_ids(sorted(client.signed)),
        **transcript_values(client.transcript),
    }


def client_from(values: Mapping, round_number: int) -> Client:
    """The :class:`Client` that :func:`client_values` wrote for round ``round_number``."""
    v = values
    params = params_from(v, round_number)
    peers, pair_keys, held = v.get("peers", []), v.get("pair-keys", []), v.get("held", [])
    peer_cipher, peer_mask = v.get("peer-cipher", []), v.get("peer-mask", [])
    return Client(
        params,
        int(v["node"]),
        keys.scalar_to_private(v["cipher-key"]),
        keys.scalar_to_private(v["mask-key"]),
        v["self-seed"],
        {u: PublicKeys(u, c, m) for u, c, m in zip(peers, peer_cipher, peer_mask, strict=True)},
        dict(zip(peers, pair_keys, strict=True)) if pair_keys else {},
        {u: Held(s, k) for u, s, k in zip(held, v.get("held-seed", []), v.get("held-key", []), strict=True)},
        least=int(v["least"]),
        stage=str(v["stage"]),
        signed=frozenset(np.frombuffer(v.get("signed", b""), dtype="<u8").tolist()),
        transcript=transcript_from(v),
    )


def packed_size(length: int, bits: int) -> int:
    """Bytes of ``length`` words of ``bits`` bits packed end to end: ⌈length·bits/8⌉."""
    return (length * bits + 7) // 8


def _lanes(bits: int) -> int:
    """64-bit lanes that hold 8 words of ``bits`` bits end to end (8·bits bits = ``bits`` bytes)."""
    return -(-bits // 8)


def vector_values(vector: np.ndarray, bits: int) -> dict[str, object]:
    """``vector`` (d,) of integers in [0, 2^bits) packed to ``bits`` bits each, least significant
    bit first (:func:`packed_size` bytes: 20 bits per coordinate send 2.5 bytes, not 4).

    Word i occupies bits i·b to i·b + b − 1 of the stream, byte j holding bits 8j to 8j + 7. Eight
    words make exactly b bytes, so the words are packed eight at a time into 64-bit lanes with
    shifts (a few array operations, not one per bit)."""
    words = np.ascontiguousarray(vector).astype(np.uint64)
    if words.size and int(words.max()) >> bits:
        raise ValueError(f"a word of the vector is not below 2^{bits}")
    groups = -(-words.size // 8)
    padded = np.zeros(groups * 8, dtype=np.uint64)
    padded[: words.size] = words
    padded = padded.reshape(groups, 8)
    lanes = np.zeros((groups, _lanes(bits)), dtype="<u8")
    for i in range(8):
        lane, shift = divmod(i * bits, 64)
        lanes[:, lane] |= padded[:, i] << np.uint64(shift)
        if shift + bits > 64:
            lanes[:, lane + 1] |= padded[:, i] >> np.uint64(64 - shift)
    stream = lanes.view(np.uint8).reshape(groups, -1)[:, :bits].reshape(-1)
    return {"masked": stream[: packed_size(words.size, bits)].tobytes()}


def vector_from(values: Mapping, params: Params) -> np.ndarray:
    """The masked vector of a reply: exactly d words of b bits (int64 array (d,), each < 2^b)."""
    data, size = _blob(values, "masked"), packed_size(params.length, params.bits)
    if len(data) != size:
        raise InvalidReply(f"masked: {len(data)} bytes, expected {size}")
    bits, count = params.bits, params.length
    tail = count * bits % 8
    if tail and data[-1] >> tail:
        raise InvalidReply("masked: bits set past the last word")
    groups = -(-count // 8)
    stream = np.zeros(groups * bits, dtype=np.uint8)
    stream[:size] = np.frombuffer(data, dtype=np.uint8)
    raw = np.zeros((groups, 8 * _lanes(bits)), dtype=np.uint8)
    raw[:, :bits] = stream.reshape(groups, bits)
    lanes = raw.view("<u8").astype(np.uint64)
    low = np.uint64((1 << bits) - 1)
    words = np.empty((groups, 8), dtype=np.uint64)
    for i in range(8):
        lane, shift = divmod(i * bits, 64)
        word = lanes[:, lane] >> np.uint64(shift)
        if shift + bits > 64:
            word |= lanes[:, lane + 1] << np.uint64(64 - shift)
        words[:, i] = word & low
    return words.reshape(-1)[:count].astype(np.int64)


def survivors_values(survivors: frozenset[int]) -> dict[str, object]:
    """The consistency check's request: the survivor set U_3."""
    return {"survivors": pack_ids(sorted(survivors))}


def survivors_from(values: Mapping) -> frozenset[int]:
    return frozenset(_ids(values, "survivors"))


def signature_values(node: int, signature: bytes) -> dict[str, object]:
    """A node's answer to the consistency check: its signature of the survivor set."""
    return {"node": node, "signature": signature}


def signature_from(values: Mapping, node: int) -> bytes:
    if values.get("node") != node:
        raise InvalidReply(f"a signature for node {values.get('node')!r} from node {node}")
    return _blob(values, "signature")


_SIGNER_FIELDS = ("identity", "cipher", "mask")


def request_values(request: UnmaskRequest) -> dict[str, object]:
    signers = sorted(request.signatures)
    return {
        "survivors": pack_ids(sorted(request.survivors)),
        "signers": pack_ids(signers),
        **{key: [getattr(request.signatures[v][0], key) for v in signers] for key in _SIGNER_FIELDS},
        "signature": [request.signatures[v][1] for v in signers],
    }


def request_from(values: Mapping) -> UnmaskRequest:
    signers = _ids(values, "signers")
    identities, ciphers, masks, signatures = (
        _blobs(values, key, len(signers)) for key in (*_SIGNER_FIELDS, "signature")
    )
    return UnmaskRequest(
        frozenset(_ids(values, "survivors")),
        {
            v: (PublicKeys(v, c, m, i), s)
            for v, i, c, m, s in zip(signers, identities, ciphers, masks, signatures, strict=True)
        },
    )


def unmask_values(reply: UnmaskReply) -> dict[str, object]:
    own, keys = sorted(reply.self_seed_shares), sorted(reply.mask_key_shares)
    return {
        "node": reply.node_id,
        "self-nodes": pack_ids(own),
        "self-shares": [reply.self_seed_shares[v] for v in own],
        "key-nodes": pack_ids(keys),
        "key-shares": [reply.mask_key_shares[v] for v in keys],
    }


def unmask_from(values: Mapping, node: int) -> UnmaskReply:
    if values.get("node") != node:
        raise InvalidReply(f"unmask reply for node {values.get('node')!r} from node {node}")
    own, keys = _ids(values, "self-nodes"), _ids(values, "key-nodes")
    return UnmaskReply(
        node,
        dict(zip(own, _blobs(values, "self-shares", len(own)), strict=True)),
        dict(zip(keys, _blobs(values, "key-shares", len(keys)), strict=True)),
    )


def stage_message(stage: str, node: int, round_number: int, values: Mapping[str, object]) -> Message:
    """A ``train.secagg_*`` message to ``node``."""
    if stage not in STAGES:
        raise ValueError(f"unknown secure-aggregation stage {stage!r}")
    return Message(
        record(round_number, **values), dst_node_id=node, message_type=stage, group_id=str(round_number)
    )


__all__ = [
    "RECORD",
    "SCHEMA",
    "STAGES",
    "client_from",
    "client_values",
    "config_record",
    "fields",
    "keys_from",
    "keys_values",
    "pack_ids",
    "packed_size",
    "params_from",
    "params_record",
    "peers_from",
    "peers_values",
    "record",
    "request_from",
    "request_values",
    "signature_from",
    "signature_values",
    "stage_message",
    "survivors_from",
    "survivors_values",
    "tokens_from",
    "tokens_values",
    "transcript_from",
    "transcript_values",
    "unmask_from",
    "unmask_values",
    "vector_from",
    "vector_values",
]
