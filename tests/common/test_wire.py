"""Reply validation: every field is checked before anything is decoded or used; a node's checks of
what the server sends it."""

import numpy as np
import pytest
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict

from common.errors import FedloraError
from common.wire import (
    MAX_GLOBAL_VALUE,
    SCHEMA,
    InvalidReply,
    StatsQuery,
    TrainInstruction,
    parse_train_reply,
    train_reply,
)
from tests.harness import message_identity

SHAPES = {"l.A": (4, 2), "l.B": (3, 2)}
META = {"mechanism": "dp-fedavg", "release": "gaussian", "noise-std": 0.25}


def _state(fill=0.5):
    return {k: torch.full(s, fill) for k, s in SHAPES.items()}


def _reply(content: RecordDict) -> Message:
    message_identity()
    ins = Message(RecordDict(), dst_node_id=1001, message_type="train", group_id="3")
    ins.metadata.__dict__["_message_id"] = "x"
    return Message(content, reply_to=ins)


def _valid(**overrides):
    content = train_reply(_state(), 3, 10, {"train-loss": 0.5}, META)
    for key, value in overrides.items():
        content[key] = value
    return content


def test_valid_reply_parses():
    inc, weight, metrics = parse_train_reply(_reply(_valid()), 3, SHAPES, META)
    assert weight == 10 and metrics == {"train-loss": 0.5}
    torch.testing.assert_close(inc["l.A"], torch.full((4, 2), 0.5))


def test_private_reply_carries_no_count_and_no_metric():
    """Under a DP mechanism (``counts=False``) the weight is None, and a reply that sends an example
    count or any metric is refused: a clear count is not covered by the guarantee."""
    inc, weight, metrics = parse_train_reply(
        _reply(train_reply(_state(), 3, None, {}, META)), 3, SHAPES, META, counts=False
    )
    assert weight is None and metrics == {} and set(inc) == set(SHAPES)
    for leaky in ({"num-examples": 10}, {"train-loss": 0.5}):
        with pytest.raises(InvalidReply, match="sent under a DP mechanism"):
            parse_train_reply(_reply(_valid(metrics=MetricRecord(leaky))), 3, SHAPES, META, counts=False)
    with pytest.raises(InvalidReply, match="num-examples"):  # a non-private run still needs its weight
        parse_train_reply(_reply(train_reply(_state(), 3, None, {}, META)), 3, SHAPES, META)


@pytest.mark.parametrize(
    ("override", "reason"),
    [
        ({"meta": ConfigRecord({**META, "schema": "other/9", "round": 3})}, "schema"),
        ({"meta": ConfigRecord({**META, "schema": SCHEMA, "round": 2})}, "round"),
        ({"meta": ConfigRecord({**META, "schema": SCHEMA, "round": 3, "mechanism": "prism"})}, "mechanism"),
        ({"meta": ConfigRecord({**META, "schema": SCHEMA, "round": 3, "noise-std": 0.0})}, "noise-std"),
        ({"meta": ConfigRecord({"schema": SCHEMA, "round": 3, "mechanism": "dp-fedavg"})}, "release"),
        ({"metrics": MetricRecord({"num-examples": 0})}, "num-examples"),
        ({"metrics": MetricRecord({"num-examples": 2.5})}, "num-examples"),
        ({"increment": ArrayRecord.from_torch_state_dict({"l.A": torch.zeros(4, 2)})}, "names"),
        (
            {
                "increment": ArrayRecord.from_torch_state_dict(
                    {"l.A": torch.zeros(4, 3), "l.B": torch.zeros(3, 2)}
                )
            },
            "float32",
        ),
        (
            {
                "increment": ArrayRecord.from_torch_state_dict(
                    {"l.A": torch.zeros(4, 2, dtype=torch.float64), "l.B": torch.zeros(3, 2)}
                )
            },
            "float32",
        ),
        (
            {
                "increment": ArrayRecord.from_torch_state_dict(
                    {"l.A": torch.full((4, 2), float("nan")), "l.B": torch.zeros(3, 2)}
                )
            },
            "non-finite",
        ),
        ({"meta": MetricRecord({"x": 1})}, "types"),
    ],
)
def test_invalid_replies_are_rejected(override, reason):
    with pytest.raises(InvalidReply, match=reason):
        parse_train_reply(_reply(_valid(**override)), 3, SHAPES, META)


def test_declared_shape_that_lies_about_payload_is_rejected():
    rec = ArrayRecord.from_torch_state_dict({"l.A": torch.zeros(4, 2), "l.B": torch.zeros(3, 2)})
    real = rec["l.A"]
    small = Array(np.zeros((2, 2), dtype=np.float32))
    rec["l.A"] = Array(dtype=real.dtype, shape=real.shape, stype=real.stype, data=small.data)
    with pytest.raises(InvalidReply, match=r"l\.A"):
        parse_train_reply(_reply(_valid(increment=rec)), 3, SHAPES, META)


def test_missing_record_is_rejected():
    content = _valid()
    del content["metrics"]
    with pytest.raises(InvalidReply, match="missing"):
        parse_train_reply(_reply(content), 3, SHAPES, META)


def test_header_length_over_numpys_limit_is_refused_before_it_is_read():
    rec = ArrayRecord.from_torch_state_dict({"l.A": torch.zeros(4, 2), "l.B": torch.zeros(3, 2)})
    real = rec["l.A"]
    claim = b"\x93NUMPY\x02\x00" + (2**32 - 1).to_bytes(4, "little") + b"{" * 64  # a 4 GiB header
    rec["l.A"] = Array(dtype=real.dtype, shape=real.shape, stype=real.stype, data=claim)
    with pytest.raises(InvalidReply, match=r"l\.A: undecodable array \(header of 4294967295 bytes"):
        parse_train_reply(_reply(_valid(increment=rec)), 3, SHAPES, META)


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        (float("nan"), "non-finite values"),
        (float("inf"), "non-finite values"),
        (-float("inf"), "non-finite values"),
        (3e38, r"\|values\| > 10000"),
        (-2 * MAX_GLOBAL_VALUE, r"\|values\| > 10000"),
    ],
)
def test_a_node_refuses_a_global_adapter_out_of_range(value, reason):
    """One coordinate of the broadcast out of range (non-finite, or beyond ±MAX_GLOBAL_VALUE) and
    both instructions that carry it are refused in one line that names the tensor."""
    state = _state()
    state["l.B"][2, 1] = value
    for sent, what in (
        (TrainInstruction(3, state), "train instruction"),
        (StatsQuery(state), "statistics query"),
    ):
        with pytest.raises(FedloraError, match=rf"^{what}: global adapter 'l\.B' holds {reason};") as err:
            type(sent).from_record(sent.to_record())
        assert "\n" not in str(err.value)


def test_a_global_adapter_in_range_is_accepted():
    """Values up to ±MAX_GLOBAL_VALUE pass unchanged (real adapters hold values of order 0.1:
    tests/client/test_coin_outcomes.py)."""
    state = _state(MAX_GLOBAL_VALUE)
    state["l.A"][0, 0] = -MAX_GLOBAL_VALUE
    for sent in (TrainInstruction(3, state), StatsQuery(state)):
        got = type(sent).from_record(sent.to_record()).global_state
        assert set(got) == set(state) and all(torch.equal(got[k], state[k]) for k in state)
