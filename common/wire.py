"""Wire format between ServerApp and ClientApp: named Flower records, validated, never pickled.

Train instruction (server -> client), message type ``train``:
  ``global``  ArrayRecord   the round's global adapter state (absolute; see common.models.lora)
  ``config``  ConfigRecord  ``schema``, ``round``, ``local-steps``, ``lr``, ``seed``, and the
                            client-level release: ``release``, ``clip``, ``noise-std``; a
                            ``dr-encoder`` release adds ``codec``, ``ae-version``, ``latent-size``,
                            ``codec-seed``, ``layout`` (JSON)
  ``encoder`` ArrayRecord   (``dr-encoder`` with codec ``ae`` only) the encoder's parameters and scale
  ``encoder-meta`` ConfigRecord  its metadata (autoencoder/broadcast.py)
Train reply (client -> server):
  ``increment`` ArrayRecord   client state minus global state, same names and shapes; under a
                              ``dr-encoder`` release its code: ``latent`` (k,) and the dense entries
                              (e.g. a classification head) that the codec does not cover
  ``metrics``   MetricRecord  ``num-examples`` (FedAvg weight), ``train-loss``, ``local-steps``
  ``meta``      ConfigRecord  ``schema``, ``round``, ``mechanism``, ``release``, ``noise-std``
                              (must equal what the round asked for; ``ae-version`` too
                              under ``dr-encoder``)
Statistics query (server -> client), message type ``query.gradstats`` (DR-Encoder Algorithm 1):
  ``global``  ArrayRecord   as in ``train``
  ``config``  ConfigRecord  ``schema``, ``local-steps``, ``lr``, ``seed``, ``granularity``,
                            ``stats-clip``, ``noise-std`` (0 = statistics in the clear)
Statistics reply: ``stats`` ArrayRecord with one array ``moments`` ``(F, 2, w)``: mean and std of the
F factors in sorted-name order, ``w = 1`` (``matrix``) or r (``column``); ``meta`` ConfigRecord
``schema``, ``granularity``, ``noise-std``.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import torch
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict

from common.models.lora import AdapterState

SCHEMA = "fedlora/1"
MAX_REPLY_BYTES = 512 * 2**20


class InvalidReply(ValueError):
    """A reply that must not be used; the message says why in one line."""


def to_record(state: AdapterState) -> ArrayRecord:
    return ArrayRecord.from_torch_state_dict({k: v.detach().float() for k, v in state.items()})


def from_record(record: ArrayRecord) -> AdapterState:
    return {k: t.clone() for k, t in record.to_torch_state_dict().items()}


def train_instruction(
    global_state: AdapterState, server_round: int, config: Mapping, extra: Mapping | None = None
) -> RecordDict:
    """``extra``: further named records (the encoder broadcast)."""
    cfg = ConfigRecord({"schema": SCHEMA, "round": server_round, **config})
    return RecordDict({"global": to_record(global_state), "config": cfg, **(extra or {})})


def stats_query(global_state: AdapterState, config: Mapping) -> RecordDict:
    cfg = ConfigRecord({"schema": SCHEMA, **config})
    return RecordDict({"global": to_record(global_state), "config": cfg})


def stats_width(granularity: str, shapes: Mapping[str, tuple[int, ...]]) -> int:
    """Numbers per moment and factor: 1 (``matrix``) or the rank r (``column``)."""
    return 1 if granularity == "matrix" else max(int(s[1]) for s in shapes.values())


def stats_reply(moments: torch.Tensor, meta: Mapping) -> RecordDict:
    """``moments: (F, 2, w)`` float32: mean and std of each factor in sorted-name order."""
    record = ArrayRecord.from_torch_state_dict({"moments": moments.detach().float().cpu()})
    return RecordDict({"stats": record, "meta": ConfigRecord({"schema": SCHEMA, **meta})})


def parse_stats_reply(
    msg: Message, shapes: Mapping[str, tuple[int, ...]], expected: Mapping
) -> tuple[torch.Tensor, int]:
    """Validated ``(moments (F, 2, w), payload bytes)`` for the factors ``shapes`` (sorted names) or
    :class:`InvalidReply`; ``expected`` holds ``granularity`` and ``noise-std``. Stds must be >= 0."""
    wire = {"moments": (len(shapes), 2, stats_width(expected["granularity"], shapes))}
    moments = _parse_arrays(msg, "stats", wire, expected, server_round=None)["moments"]
    if (moments[:, 1] < 0).any():
        raise InvalidReply("negative std")
    return moments, msg.content["stats"].count_bytes()


def train_reply(
    increment: AdapterState, server_round: int, num_examples: int, metrics: Mapping, meta: Mapping
) -> RecordDict:
    """``meta``: ``mechanism``, ``release``, ``noise-std`` (``ae-version``) as the client applied them."""
    return RecordDict(
        {
            "increment": to_record(increment),
            "metrics": MetricRecord({"num-examples": num_examples, **metrics}),
            "meta": ConfigRecord({"schema": SCHEMA, "round": server_round, **meta}),
        }
    )


def parse_train_reply(
    msg: Message, server_round: int, shapes: Mapping[str, tuple[int, ...]], expected: Mapping
) -> tuple[AdapterState, int, dict[str, float]]:
    """Validated ``(increment, num_examples, metrics)`` or :class:`InvalidReply`.

    Checks, in order: error reply, records present, schema, round, the ``expected`` meta values
    (mechanism and release parameters), names, declared dtype and shape (before decoding), byte
    size, decoded shape, finiteness, weight.
    """
    values = _parse_arrays(msg, "increment", shapes, expected, server_round)
    try:
        metrics = msg.content["metrics"]
    except KeyError as exc:
        raise InvalidReply(f"missing record {exc}") from None
    if not isinstance(metrics, MetricRecord):
        raise InvalidReply("wrong record types")
    weight = metrics.get("num-examples")
    if not isinstance(weight, int) or isinstance(weight, bool) or weight < 1:
        raise InvalidReply(f"num-examples must be a positive int, got {weight!r}")
    extra = {k: float(v) for k, v in metrics.items() if isinstance(v, int | float) and k != "num-examples"}
    return values, weight, extra


def _parse_arrays(
    msg: Message,
    key: str,
    shapes: Mapping[str, tuple[int, ...]],
    expected: Mapping,
    server_round: int | None,
) -> dict[str, torch.Tensor]:
    """The float32 tensors of record ``key``, exactly ``shapes``, after the checks of
    :func:`parse_train_reply` (``server_round`` None: the message carries no round)."""
    if msg.has_error():
        raise InvalidReply(f"client error: {msg.error.reason[:200]}")
    content = msg.content
    try:
        record, meta = content[key], content["meta"]
    except KeyError as exc:
        raise InvalidReply(f"missing record {exc}") from None
    if not isinstance(record, ArrayRecord) or not isinstance(meta, ConfigRecord):
        raise InvalidReply("wrong record types")
    if meta.get("schema") != SCHEMA:
        raise InvalidReply(f"schema {meta.get('schema')!r} != {SCHEMA!r}")
    if server_round is not None and meta.get("round") != server_round:
        raise InvalidReply(f"reply for round {meta.get('round')!r}, expected {server_round}")
    for name, value in expected.items():
        if meta.get(name) != value:
            raise InvalidReply(f"{name} {meta.get(name)!r} != {value!r}")
    if set(record.keys()) != set(shapes):
        raise InvalidReply(f"tensor names differ from the expected ({len(record)} vs {len(shapes)})")
    total = 0
    state: dict[str, torch.Tensor] = {}
    for name, arr in record.items():
        if arr.dtype != "float32" or tuple(arr.shape) != tuple(shapes[name]):
            raise InvalidReply(f"{name}: {arr.dtype}{tuple(arr.shape)} != float32{shapes[name]}")
        total += len(arr.data)
        if total > MAX_REPLY_BYTES:
            raise InvalidReply(f"reply larger than {MAX_REPLY_BYTES} bytes")
        try:
            value = arr.numpy()
        except (ValueError, TypeError, OSError) as exc:
            raise InvalidReply(f"{name}: undecodable array ({exc})") from None
        if value.shape != tuple(shapes[name]) or value.dtype != np.float32:
            raise InvalidReply(f"{name}: payload does not match its declared shape/dtype")
        if not np.isfinite(value).all():
            raise InvalidReply(f"{name}: non-finite values")
        state[name] = torch.from_numpy(value.copy())
    return state
