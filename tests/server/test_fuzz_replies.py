"""Fuzzing reply validation (common.wire) and the server's reply handling (server.federation).

Hypothesis throws malformed train and statistics replies of many kinds at ``parse_train_reply``,
``parse_stats_reply``, ``accept_reply`` and the round loop's reply handling. Each reply starts as a
valid one built by the client's own builders, then one to three mutations damage it. An oracle written
here, independently of common.wire, says which replies must be rejected: those must raise
:class:`InvalidReply` (with a one-line reason), all others (harmless damage: an extra record, an odd
training loss, a Fortran-ordered payload) must parse to exactly the values they carry, so every
property fails both ways. Any other exception, a hang (per-example deadline, pytest-timeout), a large
allocation or a rejected reply reaching the global state fails the test.

Derandomised (stable in CI), no example database; 10,900 examples in all.
"""

from __future__ import annotations

import functools
import io
import logging
import math
import tracemalloc
from dataclasses import dataclass, field
from datetime import timedelta

import numpy as np
import pytest
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, Error, Message, MetricRecord, RecordDict
from hypothesis import given, settings
from hypothesis import strategies as st
from numpy.lib import format as npy

from common import wire
from common.presets import preset
from common.privacy.planning.plan import NoisePlan
from common.wire import (
    SCHEMA,
    InvalidReply,
    parse_stats_reply,
    parse_train_reply,
    stats_reply,
    train_reply,
)
from server.releases import make_release
from server.round import RoundContext, accept_reply, run_round
from tests.harness import message_identity

ROUND = 3
FIRST_NODE = 1001


def fuzz_settings(examples: int) -> settings:
    """``examples`` derandomised examples, each within a generous deadline (a hang or a huge
    allocation blows it long before pytest-timeout would)."""
    return settings(max_examples=examples, derandomize=True, database=None, deadline=timedelta(seconds=3))


@dataclass(frozen=True, eq=False)  # hashed by identity (cache key)
class Scenario:
    kind: str  # "train" or "stats"
    key: str  # the record holding the arrays
    shapes: dict  # array name -> shape on the wire
    expected: dict  # the meta values the round asks for (besides schema and round)


PLAIN = Scenario(
    "train",
    "increment",
    {"l.A": (4, 2), "l.B": (3, 2)},
    {"mechanism": "dp-fedavg", "release": "gaussian", "noise-std": 0.3},
)
CODED = Scenario(  # dr-encoder: the latent code plus a dense head
    "train",
    "increment",
    {"latent": (11,), "head": (1, 3)},
    {
        "mechanism": "dr-encoder",
        "release": "dr-encoder",
        "noise-std": 0.5,
        "ae-version": "ae-0123456789abcdef",
    },
)
FEDAVG = Scenario(  # what server.federation expects when there is no client-level release
    "train",
    "increment",
    {"l.A": (4, 2), "l.B": (3, 2)},
    {"mechanism": "fedavg", "release": "none", "noise-std": 0.0},
)
FACTORS = {"a.A": (6, 3), "a.B": (5, 3)}  # statistics: F = 2 factors of rank 3
STATS_MATRIX = Scenario("stats", "stats", {"moments": (2, 2, 1)}, {"granularity": "matrix", "noise-std": 0.0})
STATS_COLUMN = Scenario("stats", "stats", {"moments": (2, 2, 3)}, {"granularity": "column", "noise-std": 0.5})


@dataclass
class Case:
    """One reply under construction, and what the oracle knows about it."""

    scenario: Scenario
    content: RecordDict
    values: dict[str, np.ndarray]  # what the arrays must decode to if the reply is accepted
    weight: int = 0
    metrics: dict[str, float] = field(default_factory=dict)
    error: Error | None = None
    group_id: str = str(ROUND)
    damage: dict[str, str] = field(default_factory=dict)  # where -> why the reply must be rejected
    harmless: list[str] = field(default_factory=list)
    node: int = FIRST_NODE
    raw_content: object = None  # not None: what the message carries instead of a RecordDict

    @property
    def must_reject(self) -> bool:
        return bool(self.damage)

    @property
    def late(self) -> bool:
        return self.group_id != str(ROUND)

    def arrays(self) -> ArrayRecord | None:
        record = self.content.get(self.scenario.key)
        return record if isinstance(record, ArrayRecord) else None

    def record(self, key: str, kind: type):
        record = self.content.get(key)
        return record if isinstance(record, kind) else None

    def set_array(self, name: str, array: Array, damage: str | None) -> None:
        """Replace array ``name`` wholesale: its earlier damage goes with the old array."""
        self.arrays()[name] = array
        self.damage.pop(f"array:{name}", None)
        if damage:
            self.damage[f"array:{name}"] = damage
        else:
            self.harmless.append(f"array:{name}")

    def labels(self) -> str:
        return f"damage={sorted(self.damage.values())} harmless={self.harmless}"

    def message(self) -> Message:
        message_identity()
        kind = "train" if self.scenario.kind == "train" else "query.gradstats"
        ins = Message(RecordDict(), dst_node_id=self.node, message_type=kind, group_id=self.group_id)
        ins.metadata.__dict__["_message_id"] = "x"
        msg = Message(self.error if self.error else self.content, reply_to=ins)
        if self.raw_content is not None:
            msg.__dict__["_content"] = self.raw_content
        return msg


# -- helpers that make bytes ------------------------------------------------------------------------------


def npy_bytes(value: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, value, allow_pickle=False)
    return buffer.getvalue()


def npy_header(descr: str, fortran: bool, shape: tuple, version=(1, 0)) -> bytes:
    """A ``.npy`` header that may lie (any shape, any descr); no array behind it."""
    buffer = io.BytesIO()
    writer = npy.write_array_header_1_0 if version == (1, 0) else npy.write_array_header_2_0
    writer(buffer, {"descr": descr, "fortran_order": fortran, "shape": shape})
    return buffer.getvalue()


def lying_array(shape: tuple, data: bytes, dtype: str = "float32") -> Array:
    return Array(dtype=dtype, shape=tuple(shape), stype="numpy.ndarray", data=data)


def reject(case: Case, where: str, why: str) -> None:
    case.damage[where] = why


# -- strategies: built once (Hypothesis validates each new strategy object, which is slow) -------------------


def pick(draw, options):
    """One of ``options`` (any objects; shrinks towards the first)."""
    return options[draw(st.integers(0, len(options) - 1))]


SCALES = (0.0, 1e-3, 1.0, 1e3)
WEIGHTS = (1, 7, 10**6)
TRAIN_METRICS = ({}, {"train-loss": 0.5}, {"train-loss": 1.25, "local-steps": 4})  # DP releases send none
VALID_INDEX = st.integers(0, 32 * len(SCALES) * len(WEIGHTS) * len(TRAIN_METRICS) - 1)  # 32 seeds
NAMES = st.text(max_size=10)
SMALL_BINARY = st.binary(max_size=64)
GARBAGE = st.binary(max_size=160)
SHAPES = st.lists(st.integers(0, 5), max_size=4).map(tuple)
REASONS = (
    None,
    "",
    "CUDA out of memory",
    "Traceback (most recent call last):\n  File ...\r\nValueError: \x00boom",
    "x" * 100_000,
    "\n".join(["line"] * 500),
)
ERROR_CODES = st.integers(-(2**40), 2**40)
CONFIG_VALUES = st.one_of(
    st.text(max_size=12),
    st.integers(),
    st.floats(),
    st.booleans(),
    st.binary(max_size=12),
    st.lists(st.integers(), min_size=1, max_size=3),
    st.lists(st.text(max_size=4), min_size=1, max_size=3),
)
BAD_WEIGHTS = st.one_of(
    st.integers(max_value=0),
    st.integers(min_value=2**63),
    st.floats(),
    st.lists(st.integers(1, 9), min_size=1, max_size=2),
)
GOOD_WEIGHTS = st.one_of(st.integers(1, 2**63 - 1), st.sampled_from((1, 2**63 - 1)))
METRIC_KEYS = st.one_of(st.sampled_from(("train-loss", "local-steps")), st.text(max_size=8))
METRIC_VALUES = st.one_of(
    st.floats(),
    st.integers(),
    st.sampled_from((2**1100, -(2**1100), 2**1023, math.nan, -math.inf)),
    st.lists(st.floats(), min_size=1, max_size=3),
    st.lists(st.integers(), min_size=1, max_size=3),
)
# One-line group ids: server/federation.py puts a late reply's raw group id into its reason.
LATE_GROUPS = st.one_of(
    st.sampled_from(("", "stats", str(ROUND - 1), f"{ROUND} ")),
    st.text(st.characters(exclude_categories=("Cc", "Cs", "Zl", "Zp")), max_size=6),
)


# -- valid replies --------------------------------------------------------------------------------------


@functools.cache
def _valid_reply(scenario: Scenario, seed: int, scale: float, weight: int, metrics: int) -> tuple:
    """(values, reply) exactly as the client builds it (common.wire.train_reply / stats_reply)."""
    rng = np.random.default_rng(seed)
    values = {n: (rng.standard_normal(s) * scale).astype(np.float32) for n, s in scenario.shapes.items()}
    if scenario.kind == "stats":
        values["moments"][:, 1] = np.abs(values["moments"][:, 1])  # stds >= 0
        return values, stats_reply(torch.from_numpy(values["moments"].copy()), scenario.expected)
    increment = {n: torch.from_numpy(v.copy()) for n, v in values.items()}
    return values, train_reply(increment, ROUND, weight, TRAIN_METRICS[metrics], scenario.expected)


def valid_case(draw, scenario: Scenario) -> Case:
    """A fresh copy of a valid reply (its records are mutable; Arrays are replaced, never changed)."""
    index = draw(VALID_INDEX)  # one draw (each costs): seed, scale, weight, metrics
    index, seed = divmod(index, 32)
    index, scale = divmod(index, len(SCALES))
    metrics, weight = divmod(index, len(WEIGHTS))
    scale, weight = SCALES[scale], WEIGHTS[weight]
    if scenario.kind == "stats":
        weight = metrics = 0
    values, reply = _valid_reply(scenario, seed, scale, weight, metrics)
    content = RecordDict({key: type(record)(dict(record)) for key, record in reply.items()})
    values = {n: v.copy() for n, v in values.items()}
    return Case(scenario, content, values, weight, {k: float(v) for k, v in TRAIN_METRICS[metrics].items()})


def fresh(name: str, taken) -> str:
    """``name``, changed if it is already ``taken``."""
    while name in taken:
        name += "~"
    return name


# -- mutations: each damages one thing and tells the oracle whether that is fatal ---------------------------

RECORD_MAKERS = {
    ArrayRecord: lambda: ArrayRecord({"l.A": Array(np.zeros((4, 2), np.float32))}),
    ConfigRecord: lambda: ConfigRecord({"schema": SCHEMA, "round": ROUND, "num-examples": 10}),
    MetricRecord: lambda: MetricRecord({"num-examples": 10, "round": ROUND}),
}


def _required(case: Case) -> dict[str, type]:
    """What the validator reads: the arrays, the meta and (train) the metrics."""
    required = {case.scenario.key: ArrayRecord, "meta": ConfigRecord}
    if case.scenario.kind == "train":
        required["metrics"] = MetricRecord
    return required


def m_error(draw, case: Case) -> None:
    case.error = Error(draw(ERROR_CODES), pick(draw, REASONS))
    reject(case, "error", "error reply")


def m_drop_record(draw, case: Case) -> None:
    key = pick(draw, sorted(_required(case)))
    case.content.pop(key, None)
    reject(case, f"record:{key}", f"missing {key}")


def m_retype_record(draw, case: Case) -> None:
    key, kind = pick(draw, sorted(_required(case).items(), key=lambda kv: kv[0]))
    other = pick(draw, [t for t in RECORD_MAKERS if t is not kind])
    case.content.pop(key, None)  # (replacing a record by another type is logged by Flower)
    case.content[key] = RECORD_MAKERS[other]()
    reject(case, f"record:{key}", f"{key} is a {other.__name__}")


RAW_RECORDS = (None, 5, "meta", b"\x00", {"schema": SCHEMA}, [1, 2], np.zeros(3))


def m_raw_record(draw, case: Case) -> None:
    """Something that is no record at all (a deserialiser that skipped Flower's type checks)."""
    key = pick(draw, sorted(_required(case)))
    junk = pick(draw, RAW_RECORDS)
    case.content.__dict__["_data"][key] = junk
    reject(case, f"record:{key}", f"{key} is {type(junk).__name__}")


RAW_CONTENT = ({}, "content", 5, [], ConfigRecord({"schema": SCHEMA}))


def m_raw_content(draw, case: Case) -> None:
    """A message whose content is no RecordDict at all."""
    case.raw_content = pick(draw, RAW_CONTENT)
    reject(case, "content", f"content is {type(case.raw_content).__name__}")


RAW_ARRAYS = (None, b"\x93NUMPY", np.zeros((4, 2), np.float32), torch.zeros(4, 2), ConfigRecord())


def m_raw_array(draw, case: Case) -> None:
    """An array entry that is no Array (a deserialiser that skipped Flower's type checks)."""
    if (name := _pick_array(draw, case)) is None:
        return
    junk = pick(draw, RAW_ARRAYS)
    case.arrays().__dict__["_data"][name] = junk
    case.damage[f"array:{name}"] = f"{name} is {type(junk).__name__}"


def m_extra_record(draw, case: Case) -> None:
    key = fresh(draw(NAMES) or "extra", case.content)
    case.content[key] = RECORD_MAKERS[pick(draw, list(RECORD_MAKERS))]()
    case.harmless.append("extra record")


def _meta_want(case: Case) -> dict:
    want = {"schema": SCHEMA, **case.scenario.expected}
    if case.scenario.kind == "train":
        want["round"] = ROUND
    return want


def meta_ok(name: str, value: object, want: object) -> bool:
    """The oracle's rule: the round must be that int; numbers compare as numbers but bools never
    pass for them; anything else must be the same type and equal."""
    if name == "round":
        return type(value) is int and value == want
    if type(want) in (int, float):
        return type(value) in (int, float) and value == want
    return type(value) is type(want) and value == want


def _near(want: object) -> list:
    """Values close to ``want`` (a typo, another type, a float32 rounding)."""
    if isinstance(want, str):
        return [want.upper(), want + " ", want[:-1], "", want.encode(), [want]]
    if isinstance(want, int):
        return [want - 1, want + 1, -want, float(want), str(want), True, False, 2**63, 0]
    return [
        want * (1 + 1e-12),
        float(np.float32(want)),
        -want,
        0.0 if want else 1e-300,
        math.nan,
        math.inf,
        str(want),
        bool(want),
        int(want),
        [want],
    ]


def m_meta_field(draw, case: Case) -> None:
    meta = case.record("meta", ConfigRecord)
    if meta is None:
        return
    want = _meta_want(case)
    name = pick(draw, sorted(want))
    how = draw(st.integers(0, 4))
    case.damage.pop(f"meta:{name}", None)
    if how == 0:
        meta.pop(name, None)
        reject(case, f"meta:{name}", f"no {name}")
        return
    value = pick(draw, _near(want[name])) if how < 3 else draw(CONFIG_VALUES)
    meta[name] = value
    if not meta_ok(name, value, want[name]):
        reject(case, f"meta:{name}", f"{name}={value!r}")


RAW_META = (None, {"v": 1}, (ROUND,), np.array([ROUND, ROUND]), np.float64("nan"), object())


def m_meta_raw(draw, case: Case) -> None:
    """A meta value of a type ConfigRecord never holds (numpy scalars and arrays included)."""
    meta = case.record("meta", ConfigRecord)
    if meta is None:
        return
    name = pick(draw, sorted(_meta_want(case)))
    junk = pick(draw, RAW_META)
    meta.__dict__["_data"][name] = junk
    reject(case, f"meta:{name}", f"{name} is {type(junk).__name__}")


def m_extra_meta(draw, case: Case) -> None:
    meta = case.record("meta", ConfigRecord)
    if meta is None:
        return
    meta[fresh(draw(NAMES), {*_meta_want(case), *meta})] = draw(CONFIG_VALUES)
    case.harmless.append("extra meta")


def _pick_array(draw, case: Case) -> str | None:
    """One expected array name that the record still holds."""
    record = case.arrays()
    names = sorted(n for n in case.scenario.shapes if record is not None and n in record)
    return pick(draw, names) if names else None


def m_names(draw, case: Case) -> None:
    record = case.arrays()
    if record is None:
        return
    op = pick(draw, ("drop", "add", "rename"))
    new = fresh(draw(NAMES), {*case.scenario.shapes, *record})
    name = _pick_array(draw, case)
    if op in ("drop", "rename") and name is not None:
        array = record[name]
        del record[name]
        case.damage.pop(f"array:{name}", None)
        reject(case, f"names:-{name}", f"no {name}")
        if op == "rename":
            record.__dict__["_data"][new] = array  # (it may be junk, see m_raw_array)
            reject(case, f"names:+{new}", f"extra {new!r}")
    else:
        record[new] = Array(np.zeros(pick(draw, ((4, 2), (3,), ())), np.float32))
        reject(case, f"names:+{new}", f"extra {new!r}")


def _other_shape(draw, want: tuple) -> tuple:
    shape = draw(SHAPES)
    return shape if shape != tuple(want) else (*shape, 1)


def m_shape(draw, case: Case) -> None:
    """A well-formed float32 array of another shape."""
    if (name := _pick_array(draw, case)) is None:
        return
    shape = _other_shape(draw, case.scenario.shapes[name])
    case.set_array(name, Array(np.zeros(shape, np.float32)), f"{name} shape {shape}")


DTYPES = ("float64", "float16", ">f4", "int32", "int64", "int8", "uint8", "bool", "complex64", "S4", "U2")


def m_dtype(draw, case: Case) -> None:
    """An honest array of the right shape and another dtype."""
    if (name := _pick_array(draw, case)) is None:
        return
    dtype = pick(draw, DTYPES)
    with np.errstate(over="ignore", invalid="ignore"):  # float16 and ints cannot hold every value
        value = np.ascontiguousarray(case.values[name].astype(dtype))
    case.set_array(name, Array(value), f"{name} dtype {dtype}")


PAYLOADS = (
    "other-shape",
    "other-dtype",
    "big-endian",
    "fortran",
    "trailing",
    "truncated",
    "npz",
    "huge-header",
    "negative-header",
    "header-only",
    "bad-header",
    "object",
    "version",
    "garbage",
    "zip-magic",
    "pickle",
)
HUGE_SHAPES = ((10**13,), (2**31, 2**31), (10**9, 4), (2**62,), (10**5, 10**5))
BAD_HEADERS = ("{", "((((" * 60, "{'descr': 1}", "{'descr': '<f4'}", "x" * 70000)
NPY_VERSIONS = ((3, 0), (0, 1), (9, 9), (2, 0))


def m_lying_payload(draw, case: Case) -> None:
    """Declared float32 and the right shape; the bytes say something else (or nothing)."""
    if (name := _pick_array(draw, case)) is None:
        return
    want, value = case.scenario.shapes[name], case.values[name]
    good = npy_bytes(value)
    body = good[len(npy_header("<f4", False, want)) :]  # the raw float32 data
    kind = pick(draw, PAYLOADS)
    damage: str | None = f"{name} payload {kind}"
    if kind == "other-shape":
        data = npy_bytes(np.zeros(_other_shape(draw, want), np.float32))
    elif kind == "other-dtype":
        with np.errstate(over="ignore", invalid="ignore"):
            data = npy_bytes(value.astype(pick(draw, DTYPES)))
    elif kind == "big-endian":
        data = npy_bytes(value.astype(">f4"))
    elif kind == "fortran":  # an honest Fortran-ordered payload of the same values
        data, damage = npy_bytes(np.asfortranarray(value)), None
    elif kind == "trailing":
        data = good + (draw(SMALL_BINARY) or b"\x00")
    elif kind == "truncated":
        data = good[: draw(st.integers(0, len(good) - 1))]
    elif kind == "npz":
        buffer = io.BytesIO()
        np.savez(buffer, x=value)
        data = buffer.getvalue()
    elif kind == "huge-header":  # a few bytes that claim terabytes: must not be allocated
        data = npy_header("<f4", False, pick(draw, HUGE_SHAPES)) + draw(SMALL_BINARY)
    elif kind == "negative-header":
        data = npy_header("<f4", False, tuple(-s for s in want)) + body
    elif kind == "header-only":
        data = npy_header("<f4", False, want)
    elif kind == "bad-header":
        text = pick(draw, BAD_HEADERS).encode("latin1")
        data = b"\x93NUMPY\x01\x00" + min(len(text), 65535).to_bytes(2, "little") + text
    elif kind == "object":
        data = npy_header("|O", False, want) + b"\x80\x04N." * 8
    elif kind == "version":
        version = pick(draw, NPY_VERSIONS)
        header = npy_header("<f4", False, want, (2, 0))
        data = b"\x93NUMPY" + bytes(version) + header[8:] + body
        if version == (2, 0):  # a valid version-2.0 file
            damage = None
    elif kind == "garbage":
        data = draw(GARBAGE)
    elif kind == "zip-magic":
        data = b"PK\x03\x04" + draw(SMALL_BINARY)
    else:
        data = b"\x80\x04\x95" + draw(SMALL_BINARY)
    case.set_array(name, lying_array(want, data), damage)


DECLARED = ("huge", "negative", "bool", "rank", "dtype", "stype")
HUGE_DECLARED = ((10**18, 2), (2**63 - 1,), (10**6,) * 8, tuple(range(1, 40)))
BAD_DTYPES = ("float32 ", "<f4", "FLOAT32", "float", "object", "", "float64")
BAD_STYPES = ("torch.Tensor", "", "numpy.ndarray ", "pickle")


def m_declared(draw, case: Case) -> None:
    """Honest bytes; the declared dtype, shape or stype lies."""
    if (name := _pick_array(draw, case)) is None:
        return
    want, data = case.scenario.shapes[name], npy_bytes(case.values[name])
    kind = pick(draw, DECLARED)
    dtype, shape, stype = "float32", tuple(want), "numpy.ndarray"
    if kind == "huge":
        shape = pick(draw, HUGE_DECLARED)
    elif kind == "negative":
        shape = tuple(-s for s in want)
    elif kind == "bool":
        shape = tuple(True if s == 1 else s for s in want) if 1 in want else (True, *want)
    elif kind == "rank":
        shape = (*want, 1)
    elif kind == "dtype":
        dtype = pick(draw, BAD_DTYPES)
    else:
        stype = pick(draw, BAD_STYPES)
    case.set_array(name, Array(dtype=dtype, shape=shape, stype=stype, data=data), f"{name} declared {kind}")


def m_attr(draw, case: Case) -> None:
    """An Array whose fields were overwritten after construction (Flower does not re-check them)."""
    if (name := _pick_array(draw, case)) is None:
        return
    want, value = case.scenario.shapes[name], case.values[name]
    array = Array(value.copy())
    attr = pick(draw, ("dtype", "shape", "stype", "data"))
    junk = {
        "dtype": [None, 5, np.dtype("float32"), b"float32", np.array(["float32", "float32"])],
        "shape": [None, list(want), "4,2", tuple(float(s) for s in want), np.array(want), [list(want)]],
        "stype": [None, 5, b"numpy.ndarray", np.array(["numpy.ndarray"] * 2)],
        "data": [None, "", bytearray(array.data), memoryview(array.data), array.data.decode("latin1")],
    }[attr]
    bad = pick(draw, junk)
    setattr(array, attr, bad)
    same = attr == "shape" and isinstance(bad, list) and bad == list(want)  # the same array
    case.set_array(name, array, None if same else f"{name}.{attr}={type(bad).__name__}")


def m_nonfinite(draw, case: Case) -> None:
    if (name := _pick_array(draw, case)) is None:
        return
    value = case.values[name].copy()
    value.flat[draw(st.integers(0, value.size - 1))] = pick(draw, (math.nan, math.inf, -math.inf))
    case.set_array(name, Array(value), f"{name} non-finite")


RAW_WEIGHTS = (True, None, "10", b"10", np.int64(5), 10.0 + 0j)


def m_weight(draw, case: Case) -> None:
    metrics = case.record("metrics", MetricRecord)
    if metrics is None:
        return
    kind = pick(draw, ("drop", "bad", "raw", "valid"))
    case.damage.pop("metric:num-examples", None)
    if kind == "drop":
        metrics.pop("num-examples", None)
        reject(case, "metric:num-examples", "no num-examples")
    elif kind == "bad":
        metrics["num-examples"] = value = draw(BAD_WEIGHTS)
        reject(case, "metric:num-examples", f"num-examples={value!r}")
    elif kind == "raw":
        junk = pick(draw, RAW_WEIGHTS)
        metrics.__dict__["_data"]["num-examples"] = junk
        reject(case, "metric:num-examples", f"num-examples is {type(junk).__name__}")
    else:
        metrics["num-examples"] = case.weight = draw(GOOD_WEIGHTS)
        case.harmless.append("num-examples")


def m_metrics(draw, case: Case) -> None:
    """Odd values for the informational metrics: harmless unless no float can hold them."""
    metrics = case.record("metrics", MetricRecord)
    key = draw(METRIC_KEYS)
    if metrics is None or key == "num-examples":
        return
    metrics[key] = value = draw(METRIC_VALUES)
    case.damage.pop(f"metric:{key}", None)
    case.metrics.pop(key, None)
    if isinstance(value, list):
        case.harmless.append("list metric")  # not used
        return
    try:
        case.metrics[key] = float(value)
        case.harmless.append(f"metric {key}")
    except OverflowError:
        reject(case, f"metric:{key}", f"{key}={value}")


def m_negative_std(draw, case: Case) -> None:
    if case.arrays() is None or "moments" not in case.arrays():
        return
    value = case.values["moments"].copy()
    rows, width = value.shape[0], value.shape[2]
    index = (draw(st.integers(0, rows - 1)), 1, draw(st.integers(0, width - 1)))
    value[index] = -pick(draw, (1e-38, 1e-3, 1.0, 3e38, 0.0))  # -0.0 is not negative
    harmless = bool(value[index] == 0)
    if harmless:
        case.values["moments"] = value
    case.set_array("moments", Array(value), None if harmless else "negative std")


def m_negative_mean(draw, case: Case) -> None:
    if case.arrays() is None or "moments" not in case.arrays():
        return
    value = case.values["moments"].copy()
    value[:, 0] = -np.abs(value[:, 0]) - pick(draw, (0.0, 1.0, 1e30))
    case.values["moments"] = value
    case.set_array("moments", Array(value), None)


def m_late(draw, case: Case) -> None:
    """A reply to another round's instruction (only the handler can tell)."""
    case.group_id = draw(LATE_GROUPS)


COMMON = (
    m_error,
    m_drop_record,
    m_retype_record,
    m_raw_record,
    m_raw_content,
    m_raw_array,
    m_extra_record,
    m_meta_field,
    m_meta_raw,
    m_extra_meta,
    m_names,
    m_shape,
    m_dtype,
    m_lying_payload,
    m_declared,
    m_attr,
    m_nonfinite,
)
TRAIN_MUTATIONS = (*COMMON, m_weight, m_metrics, m_late)
STATS_MUTATIONS = (*COMMON, m_negative_std, m_negative_mean)
HARMLESS = (m_extra_record, m_extra_meta, m_weight, m_metrics, m_late)
STATS_HARMLESS = (m_extra_record, m_extra_meta, m_negative_mean)
HUGE = (m_lying_payload, m_declared)


@st.composite
def cases(draw, scenarios, mutations, min_mutations: int = 1, max_mutations: int = 3) -> Case:
    """A valid reply of one of ``scenarios``, then ``min_mutations`` to ``max_mutations`` of ``mutations``."""
    case = valid_case(draw, pick(draw, scenarios))
    for _ in range(draw(st.integers(min_mutations, max_mutations))):
        pick(draw, mutations)(draw, case)
    return case


# -- what a result must look like ----------------------------------------------------------------------


def check_rejection(exc: InvalidReply, case: Case) -> None:
    assert case.must_reject, f"a valid reply was rejected ({exc}); {case.labels()}"
    reason = str(exc)
    assert reason and "\n" not in reason and "\r" not in reason and len(reason) < 400, repr(reason)


def check_arrays(arrays: dict, case: Case) -> None:
    assert not case.must_reject, f"an invalid reply was accepted; {case.labels()}"
    assert set(arrays) == set(case.scenario.shapes)
    for name, tensor in arrays.items():
        assert isinstance(tensor, torch.Tensor) and tensor.dtype == torch.float32
        assert tuple(tensor.shape) == tuple(case.scenario.shapes[name])
        assert torch.isfinite(tensor).all()
        assert np.array_equal(tensor.numpy(), case.values[name]), name


def check_train_result(result, case: Case) -> None:
    increment, weight, metrics = result
    check_arrays(increment, case)
    assert type(weight) is int and weight == case.weight
    assert set(metrics) == set(case.metrics)
    for key, value in metrics.items():
        assert type(value) is float
        assert value == case.metrics[key] or (math.isnan(value) and math.isnan(case.metrics[key]))


def run_train_parser(case: Case) -> None:
    scenario = case.scenario
    try:
        result = parse_train_reply(case.message(), ROUND, scenario.shapes, scenario.expected)
    except InvalidReply as exc:
        check_rejection(exc, case)
    else:
        check_train_result(result, case)


def run_stats_parser(case: Case) -> None:
    try:
        moments, size = parse_stats_reply(case.message(), FACTORS, case.scenario.expected)
    except InvalidReply as exc:
        check_rejection(exc, case)
    else:
        check_arrays({"moments": moments}, case)
        assert type(size) is int and size > 0


# -- the properties ------------------------------------------------------------------------------------


@pytest.mark.heavy
@pytest.mark.timeout(300)
@fuzz_settings(2000)
@given(cases([PLAIN, CODED], TRAIN_MUTATIONS))
def test_train_validator_rejects_malformed_replies_and_nothing_else(case):
    run_train_parser(case)


@pytest.mark.heavy
@pytest.mark.timeout(300)
@fuzz_settings(1000)
@given(cases([STATS_MATRIX, STATS_COLUMN], STATS_MUTATIONS))
def test_stats_validator_rejects_malformed_replies_and_nothing_else(case):
    run_stats_parser(case)


@pytest.mark.timeout(120)
@fuzz_settings(600)
@given(
    st.one_of(
        cases([PLAIN, CODED], HARMLESS, 0, 2), cases([STATS_MATRIX, STATS_COLUMN], STATS_HARMLESS, 0, 2)
    )
)
def test_valid_and_harmlessly_odd_replies_are_accepted(case):
    """The other direction: replies the client builds, and ones with harmless oddities, parse to
    exactly what they carry."""
    if case.scenario.kind == "train":
        run_train_parser(case)
    else:
        run_stats_parser(case)


def _release(kind: str, clip: float):
    """The server side of a ``gaussian`` release under threat model ``kind`` (``none``: no release)."""
    plan = None if kind == "none" else NoisePlan(1.0, 1.0, clip, kind, 0.0, 1e-5, False)
    mechanism = "fedavg" if plan is None else "dp-fedavg"
    return make_release(preset("minilm-rt", mechanism=mechanism, noise_multiplier=1.0), plan)


@pytest.mark.heavy
@pytest.mark.timeout(300)
@fuzz_settings(1250)
@given(
    cases([PLAIN, CODED], TRAIN_MUTATIONS, 0, 3),
    st.sampled_from(["none", "central", "local", "distributed"]),
    st.sampled_from([0.5, 5.0, 1e4]),
)
def test_server_reply_handler_rejects_malformed_replies_and_nothing_else(case, threat, clip):
    """server.round.accept_reply: the validator plus late replies and (central noise) the clip."""
    release = _release(threat, clip)
    norm = math.sqrt(sum(float((v.astype(np.float64) ** 2).sum()) for v in case.values.values()))
    if case.late:
        reject(case, "late", f"group {case.group_id!r}")
    if threat == "central" and norm > clip * (1 + 1e-4):
        reject(case, "clip", f"norm {norm:.3g} > {clip}")
    try:
        result = accept_reply(case.message(), ROUND, case.scenario.shapes, case.scenario.expected, release)
    except InvalidReply as exc:
        check_rejection(exc, case)
    else:
        check_train_result(result, case)


@pytest.mark.timeout(120)
@fuzz_settings(500)
@given(
    st.one_of(
        cases([PLAIN, CODED], HARMLESS[:2], 0, 1), cases([STATS_MATRIX, STATS_COLUMN], HARMLESS[:2], 0, 1)
    ),
    st.floats(0.0, 2.0),
)
def test_byte_cap_rejects_oversized_replies_only(case, fraction):
    """MAX_REPLY_BYTES (lowered here to around the reply's size): over it is rejected, under it
    accepted, before anything is decoded."""
    total = sum(len(a.data) for a in case.arrays().values())
    cap = int(total * fraction)
    if total > cap:
        reject(case, "size", f"{total} > {cap} bytes")
    saved, wire.MAX_REPLY_BYTES = wire.MAX_REPLY_BYTES, cap
    try:
        (run_train_parser if case.scenario.kind == "train" else run_stats_parser)(case)
    finally:
        wire.MAX_REPLY_BYTES = saved


@pytest.mark.timeout(120)
@fuzz_settings(300)
@given(st.one_of(cases([PLAIN, CODED], HUGE, 1, 2), cases([STATS_MATRIX, STATS_COLUMN], HUGE, 1, 2)))
def test_lying_headers_allocate_nothing_big(case):
    """A payload's header or declared shape may claim terabytes: peak memory stays small."""
    tracemalloc.start()
    try:
        (run_train_parser if case.scenario.kind == "train" else run_stats_parser)(case)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 4 * 2**20, f"{peak} bytes traced; {case.labels()}"


class ListGrid:
    """A Grid stand-in whose nodes answer with canned (fuzzed) replies."""

    def __init__(self, replies: list[Message]) -> None:
        self.replies = replies

    def send_and_receive(self, messages, timeout=None):
        return list(self.replies)


class Reasons(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.rejections: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if "rejected reply" in message:
            self.rejections.append(message)


@pytest.mark.heavy
@pytest.mark.timeout(300)
@fuzz_settings(500)
@given(
    st.lists(cases([FEDAVG], TRAIN_MUTATIONS, 0, 2), min_size=1, max_size=5),
    st.integers(0, 2**32 - 1),
)
def test_round_applies_exactly_the_accepted_replies(batch, seed):
    """server.round.run_round over fuzzed replies: each rejected one is logged with its
    reason and leaves no trace; the global state moves by the weighted mean of the accepted ones
    only, and not at all when every reply is rejected."""
    shapes = FEDAVG.shapes
    for k, case in enumerate(batch):
        case.node = FIRST_NODE + k
        if case.late:
            reject(case, "late", "late")
    cfg = preset("minilm-rt", mechanism="fedavg", num_clients=len(batch), server_lr=0.5, min_replies=1)
    rng = np.random.default_rng(seed)
    state = {n: torch.from_numpy(rng.standard_normal(s).astype(np.float32)) for n, s in shapes.items()}
    before = {n: t.clone() for n, t in state.items()}
    replies = [case.message() for case in batch]
    sampled = [case.node for case in batch]
    reasons = Reasons()
    logger = logging.getLogger("fedlora.server")
    level = logger.level
    logger.addHandler(reasons)
    logger.setLevel(logging.WARNING)
    try:
        ctx = RoundContext(ListGrid(replies), make_release(cfg, None), cfg, shapes)
        new, record = run_round(ctx, ROUND, sampled, state)
        replied = record.replied
    finally:
        logger.removeHandler(reasons)
        logger.setLevel(level)
    accepted = [c for c in batch if not c.must_reject]
    assert replied == len(accepted), [c.labels() for c in batch]
    assert len(reasons.rejections) == len(batch) - len(accepted)
    assert all("\n" not in r and "\r" not in r for r in reasons.rejections)
    for name in shapes:
        assert torch.equal(state[name], before[name])  # never changed in place
    if not accepted:
        assert set(new) == set(shapes) and all(torch.equal(new[n], before[n]) for n in shapes)
        return
    total = float(sum(c.weight for c in accepted))
    for name in shapes:
        mean = sum(c.weight / total * c.values[name].astype(np.float64) for c in accepted)
        want = before[name].numpy().astype(np.float64) + 0.5 * mean
        scale = 1 + max(float(np.abs(c.values[name]).max()) for c in accepted)
        np.testing.assert_allclose(new[name].numpy(), want, rtol=1e-5, atol=1e-5 * scale)


def test_round_with_only_rejected_replies_leaves_the_state_alone():
    """A fixed all-rejected round (one reply of each basic kind), besides the fuzzed ones."""
    shapes = FEDAVG.shapes
    values = {n: np.ones(s, np.float32) for n, s in shapes.items()}
    batch = []
    for k, damage in enumerate(["meta", "nan", "error", "weight"]):
        content = train_reply(
            {n: torch.from_numpy(v) for n, v in values.items()}, ROUND, 5, {}, FEDAVG.expected
        )
        case = Case(FEDAVG, content, values, 5, node=FIRST_NODE + k)
        if damage == "meta":
            content["meta"]["release"] = "gaussian"
        elif damage == "nan":
            content["increment"]["l.A"] = Array(np.full((4, 2), np.nan, np.float32))
        elif damage == "error":
            case.error = Error(1, "client crashed")
        else:
            content["metrics"]["num-examples"] = -5
        batch.append(case)
    state = {n: torch.zeros(s) for n, s in shapes.items()}
    cfg = preset("minilm-rt", mechanism="fedavg", num_clients=len(batch), min_replies=1)
    grid = ListGrid([c.message() for c in batch])
    new, record = run_round(
        RoundContext(grid, make_release(cfg, None), cfg, shapes), ROUND, [c.node for c in batch], state
    )
    assert not record.applied and record.replied == 0 and len(record.rejected) == 4
    assert all(torch.equal(new[n], torch.zeros(s)) for n, s in shapes.items())


def test_late_reply_reason_is_one_line():
    values, reply = _valid_reply(FEDAVG, 0, 1.0, 1, 0)
    case = Case(FEDAVG, reply, values, 1)
    case.group_id = "2\nround 3: accepted reply from node 1001"
    with pytest.raises(InvalidReply) as info:
        accept_reply(case.message(), ROUND, FEDAVG.shapes, FEDAVG.expected, None)
    assert "\n" not in str(info.value)
