"""Wire format between ServerApp and ClientApp: named Flower records, validated, never pickled.

Train instruction (server -> client), message type ``train``:
  ``global``  ArrayRecord   the round's global adapter state (absolute; see common.models.lora)
  ``config``  ConfigRecord  ``schema``, ``round``, ``local-steps``, ``lr``, ``seed``, and the
                            client-level release: ``release``, ``clip``, ``noise-std``
Train reply (client -> server):
  ``increment`` ArrayRecord   client state minus global state, same names and shapes
  ``metrics``   MetricRecord  ``num-examples`` (FedAvg weight), ``train-loss``, ``local-steps``
  ``meta``      ConfigRecord  ``schema``, ``round``, ``mechanism``, ``release``, ``noise-std``
                              (must equal what the round asked for)
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


def train_instruction(global_state: AdapterState, server_round: int, config: Mapping) -> RecordDict:
    cfg = ConfigRecord({"schema": SCHEMA, "round": server_round, **config})
    return RecordDict({"global": to_record(global_state), "config": cfg})


def train_reply(
    increment: AdapterState, server_round: int, num_examples: int, metrics: Mapping, meta: Mapping
) -> RecordDict:
    """``meta``: ``mechanism``, ``release``, ``noise-std`` as the client applied them."""
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
    if msg.has_error():
        raise InvalidReply(f"client error: {msg.error.reason[:200]}")
    content = msg.content
    try:
        record, meta, metrics = content["increment"], content["meta"], content["metrics"]
    except KeyError as exc:
        raise InvalidReply(f"missing record {exc}") from None
    if not isinstance(record, ArrayRecord) or not isinstance(meta, ConfigRecord):
        raise InvalidReply("wrong record types")
    if not isinstance(metrics, MetricRecord):
        raise InvalidReply("wrong record types")
    if meta.get("schema") != SCHEMA:
        raise InvalidReply(f"schema {meta.get('schema')!r} != {SCHEMA!r}")
    if meta.get("round") != server_round:
        raise InvalidReply(f"reply for round {meta.get('round')!r}, expected {server_round}")
    for key, value in expected.items():
        if meta.get(key) != value:
            raise InvalidReply(f"{key} {meta.get(key)!r} != {value!r}")
    if set(record.keys()) != set(shapes):
        raise InvalidReply(f"tensor names differ from the model's ({len(record)} vs {len(shapes)})")
    total = 0
    state: AdapterState = {}
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
    weight = metrics.get("num-examples")
    if not isinstance(weight, int) or isinstance(weight, bool) or weight < 1:
        raise InvalidReply(f"num-examples must be a positive int, got {weight!r}")
    extra = {k: float(v) for k, v in metrics.items() if isinstance(v, int | float) and k != "num-examples"}
    return state, weight, extra
