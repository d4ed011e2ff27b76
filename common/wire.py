"""Wire format between ServerApp and ClientApp: named Flower records, validated, never pickled.

Messages carry only what varies per round; static options (local steps, lr, seed, release,
clip, statistics settings) come from the run config that server and clients both hold.

Train instruction (server -> client), message type ``train`` (:class:`TrainInstruction`):
  ``global``  ArrayRecord   the round's global adapter state (absolute; see common.models.lora);
                            a node refuses one holding a non-finite value or one beyond
                            ±``MAX_GLOBAL_VALUE`` (:func:`global_of`)
  ``config``  ConfigRecord  ``schema``, ``round``, ``noise-std`` (the client's noise share), ``clip``
                            (adaptive clipping only: the round's C); a
                            ``dr-encoder`` release adds ``codec``, ``ae-version``, ``latent-size``,
                            ``codec-seed``, ``layout`` (JSON)
  ``encoder`` ArrayRecord   (``dr-encoder`` with codec ``ae`` only) the encoder's parameters and scale
  ``encoder-meta`` ConfigRecord  its metadata (autoencoder/broadcast.py)
Train reply (client -> server):
  ``increment`` ArrayRecord   client state minus global state, same names and shapes; under a
                              ``dr-encoder`` release its code: ``latent`` (k,) and the dense entries
                              (e.g. a classification head) that the codec does not cover; with
                              adaptive clipping also ``clip-bit`` (1,): [‖Δ‖ ≤ C] (plus a noise share
                              under distributed noise)
  ``metrics``   MetricRecord  ``num-examples`` (FedAvg weight) and ``train-loss``, only without DP:
                              under any DP mechanism a reply carries no count and no loss (neither
                              is private), and the server averages with uniform weights
  ``meta``      ConfigRecord  ``schema``, ``round``, ``mechanism``, ``release``, ``noise-std``
                              (must equal what the round asked for; ``ae-version`` too
                              under ``dr-encoder``, ``clip`` under adaptive clipping);
                              optional ``data-source``: where the node's examples came from,
                              ``partition`` (its partition of the run's dataset) or ``own`` (a
                              data owner's own file; never its path or name). Never a reason to
                              reject a reply: missing or any other value, the server counts the
                              node's data as unstated (:func:`data_source`)
Statistics query (server -> client), message type ``query.gradstats`` (DR-Encoder Algorithm 1,
:class:`StatsQuery`):
  ``global``  ArrayRecord   as in ``train``
  ``config``  ConfigRecord  ``schema``
Statistics reply: ``stats`` ArrayRecord with one array ``moments`` ``(F, 2, w)``: mean and std of the
F factors in sorted-name order, ``w = 1`` (``matrix``) or r (``column``); ``meta`` ConfigRecord
``schema``, ``granularity``, ``noise-std``.
"""

from __future__ import annotations

import io
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from numpy.lib import format as npy

from common.errors import FedloraError
from common.models.lora import AdapterState

SCHEMA = "fedlora/2"  # 2: no num-examples under DP; static options only in the run config
MAX_REPLY_BYTES = 512 * 2**20
MAX_NUM_EXAMPLES = 2**63 - 1  # the wire's sint64
_NUMPY_STYPE = "numpy.ndarray"  # flwr.common.constant.SType.NUMPY
_FLOAT32 = np.dtype("<f4")
CLIP_BIT = "clip-bit"  # adaptive clipping's tensor in a train reply
DATA_SOURCE = "data-source"  # train reply meta: where the node's examples came from (optional)
DATA_SOURCES = ("partition", "own")  # its values: the run's partition, a data owner's own file
_NPY_HEADERS = {(1, 0): npy.read_array_header_1_0, (2, 0): npy.read_array_header_2_0}
_MAX_NPY_HEADER = 10_000  # bytes: numpy.lib.format's default max_header_size
#: largest |value| a node accepts in a received global adapter (LoRA factors, dense entries such as a
#: classification head): a real adapter's values are of order 0.1 (MiniLM's initial one: at most
#: 0.07, tests/client/test_coin_outcomes.py) and rounds move them by lr-sized steps, so a value
#: beyond it, like a non-finite one, is a poisoned or diverged broadcast, refused before anything
#: depends on the node's hidden coin
MAX_GLOBAL_VALUE = 1e4


class InvalidReply(ValueError):
    """A reply that must not be used; the message says why in one line."""


def to_record(state: AdapterState) -> ArrayRecord:
    return ArrayRecord.from_torch_state_dict({k: v.detach().float() for k, v in state.items()})


def from_record(record: ArrayRecord) -> AdapterState:
    """The float32 tensors of ``record``, each checked against its declared shape (one-line
    :class:`InvalidReply` otherwise); nothing is unpickled."""
    return {
        k: torch.from_numpy(_decode_float32(k, array.data, tuple(array.shape))) for k, array in record.items()
    }


@dataclass(frozen=True)
class TrainInstruction:
    """``train`` (server -> client): the round's global adapter and what varies per round. Everything
    static (local steps, lr, seed, release, clip, ...) comes from the run config both sides hold.

    ``noise_std``: the client's noise share (it depends on the round's sample); ``codec``: the
    ``dr-encoder`` codec (``codec``, ``ae-version``, ``latent-size``, ``codec-seed``, ``layout``,
    ``encode-at``);
    ``records``: further named records (the encoder broadcast); ``clip``: the round's C under
    adaptive clipping (0: the run config's)."""

    round: int
    global_state: AdapterState
    noise_std: float = 0.0
    codec: Mapping[str, object] = field(default_factory=dict)
    records: Mapping[str, object] = field(default_factory=dict)
    clip: float = 0.0

    def to_record(self) -> RecordDict:
        clip = {"clip": self.clip} if self.clip else {}
        config = ConfigRecord(
            {"schema": SCHEMA, "round": self.round, "noise-std": self.noise_std, **clip, **self.codec}
        )
        return RecordDict({"global": to_record(self.global_state), "config": config, **self.records})

    @classmethod
    def from_record(cls, content: RecordDict) -> TrainInstruction:
        config = _config_of(content, "train instruction")
        records = {k: v for k, v in content.items() if k not in ("global", "config")}
        rnd, std = int(config.pop("round")), float(config.pop("noise-std"))
        clip = float(config.pop("clip", 0.0))
        if not (math.isfinite(clip) and clip >= 0):
            raise FedloraError(f"train instruction: clip must be >= 0 and finite, got {clip}")
        return cls(rnd, global_of(content, "train instruction"), std, config, records, clip)


@dataclass(frozen=True)
class StatsQuery:
    """``query.gradstats`` (server -> client, DR-Encoder Algorithm 1): the global adapter the
    statistics' local steps start from; every other value comes from the run config."""

    global_state: AdapterState

    def to_record(self) -> RecordDict:
        return RecordDict(
            {"global": to_record(self.global_state), "config": ConfigRecord({"schema": SCHEMA})}
        )

    @classmethod
    def from_record(cls, content: RecordDict) -> StatsQuery:
        _config_of(content, "statistics query")
        return cls(global_of(content, "statistics query"))


def global_of(content: RecordDict, what: str) -> AdapterState:
    """The global adapter of an instruction's ``global`` record, every value finite and within
    ±:data:`MAX_GLOBAL_VALUE`; a one-line :class:`~common.errors.FedloraError` otherwise (before the
    node trains, or draws its participation coin: the refusal depends on the broadcast alone)."""
    state = from_record(content["global"])
    for name, value in state.items():
        if not bool((value.abs() <= MAX_GLOBAL_VALUE).all()):  # (nan compares false)
            bad = f"|values| > {MAX_GLOBAL_VALUE:g}" if bool(value.isfinite().all()) else "non-finite values"
            raise FedloraError(f"{what}: global adapter {_short(name)} holds {bad}; refused before training")
    return state


def _config_of(content: RecordDict, what: str) -> dict:
    """An instruction's config record without its ``schema``, which must be :data:`SCHEMA`."""
    config = dict(content["config"])
    if config.pop("schema", None) != SCHEMA:
        raise FedloraError(f"{what} of another schema than {SCHEMA!r}")
    return config


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
    increment: AdapterState, server_round: int, num_examples: int | None, metrics: Mapping, meta: Mapping
) -> RecordDict:
    """``meta``: ``mechanism``, ``release``, ``noise-std`` (``ae-version``) as the client applied them;
    ``num_examples`` None: no count is sent (any DP mechanism)."""
    count = {} if num_examples is None else {"num-examples": num_examples}
    return RecordDict(
        {
            "increment": to_record(increment),
            "metrics": MetricRecord({**count, **metrics}),
            "meta": ConfigRecord({"schema": SCHEMA, "round": server_round, **meta}),
        }
    )


def data_source(msg: Message) -> str | None:
    """The :data:`DATA_SOURCE` a train reply declares (one of :data:`DATA_SOURCES`), else None: the
    key is optional, so a reply without it (a client before it) or with any other value is never
    rejected for it, and its data counts as unstated. Never raises."""
    if msg.has_error() or not isinstance(msg.content, RecordDict):
        return None
    meta = msg.content.get("meta")
    value = meta.get(DATA_SOURCE) if isinstance(meta, ConfigRecord) else None
    return value if isinstance(value, str) and value in DATA_SOURCES else None


def parse_train_reply(
    msg: Message,
    server_round: int,
    shapes: Mapping[str, tuple[int, ...]],
    expected: Mapping,
    counts: bool = True,
) -> tuple[AdapterState, int | None, dict[str, float]]:
    """Validated ``(increment, num_examples, metrics)`` or :class:`InvalidReply`. ``counts`` False
    (a DP mechanism): the reply must carry no metrics at all (no ``num-examples``, no loss: neither
    is private) and the weight returned is None.

    Checks, in order: error reply, records present, schema, round, the ``expected`` meta values
    (mechanism and release parameters), names, declared dtype and shape (before decoding), byte
    size, the ``.npy`` header's dtype, shape and data length (before allocating), finiteness,
    weight (a positive int64) and metrics (numbers a float can hold). Anything malformed raises
    :class:`InvalidReply` with a one-line reason, never another exception.
    """
    values = _parse_arrays(msg, "increment", shapes, expected, server_round)
    try:
        metrics = msg.content["metrics"]
    except KeyError as exc:
        raise InvalidReply(f"missing record {exc}") from None
    if not isinstance(metrics, MetricRecord):
        raise InvalidReply("wrong record types")
    weight = metrics.get("num-examples")
    if not counts:
        if len(metrics):
            name = _short(sorted(metrics.keys())[0])
            raise InvalidReply(f"metric {name} sent under a DP mechanism (clear metrics are not private)")
    elif not _is_int(weight) or not 1 <= weight <= MAX_NUM_EXAMPLES:
        raise InvalidReply(f"num-examples must be a positive int, got {_short(weight)}")
    extra = {}
    for name, value in metrics.items():
        if name == "num-examples" or isinstance(value, bool) or not isinstance(value, int | float):
            continue  # lists (and anything else) are not used
        try:
            extra[name] = float(value)
        except OverflowError:  # an int beyond float range
            raise InvalidReply(f"metric {_short(name)}: {_short(value)} is out of range") from None
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
    check_not_error(msg)
    content = msg.content
    if not isinstance(content, RecordDict):
        raise InvalidReply(f"content is {type(content).__name__}, not a RecordDict")
    try:
        record, meta = content[key], content["meta"]
    except KeyError as exc:
        raise InvalidReply(f"missing record {exc}") from None
    if not isinstance(record, ArrayRecord) or not isinstance(meta, ConfigRecord):
        raise InvalidReply("wrong record types")
    if not isinstance(meta.get("schema"), str) or meta.get("schema") != SCHEMA:
        raise InvalidReply(f"schema {_short(meta.get('schema'))} != {SCHEMA!r}")
    if server_round is not None and not (_is_int(meta.get("round")) and meta.get("round") == server_round):
        raise InvalidReply(f"reply for round {_short(meta.get('round'))}, expected {server_round}")
    check_meta(meta, expected)
    if set(record.keys()) != set(shapes):
        raise InvalidReply(f"tensor names differ from the expected ({len(record)} vs {len(shapes)})")
    total = 0
    state: dict[str, torch.Tensor] = {}
    for name, arr in record.items():
        if not isinstance(arr, Array):
            raise InvalidReply(f"{name}: {type(arr).__name__}, not an Array")
        want = tuple(int(s) for s in shapes[name])
        dtype, declared = arr.dtype, arr.shape
        if not isinstance(dtype, str) or dtype != "float32" or not _same_shape(declared, want):
            dtype = dtype if isinstance(dtype, str) and len(dtype) <= 20 else _short(dtype, 20)
            raise InvalidReply(f"{name}: {dtype}{_shape_text(declared)} != float32{want}")
        if not isinstance(arr.stype, str) or arr.stype != _NUMPY_STYPE:
            raise InvalidReply(f"{name}: undecodable array (stype {_short(arr.stype, 40)})")
        if not isinstance(arr.data, bytes):
            raise InvalidReply(f"{name}: undecodable array (data is {type(arr.data).__name__})")
        total += len(arr.data)
        if total > MAX_REPLY_BYTES:
            raise InvalidReply(f"reply larger than {MAX_REPLY_BYTES} bytes")
        value = _decode_float32(name, arr.data, want)
        if not np.isfinite(value).all():
            raise InvalidReply(f"{name}: non-finite values")
        state[name] = torch.from_numpy(value)
    return state


def check_not_error(msg: Message) -> None:
    """Raise :class:`InvalidReply` with the client's one-line reason when ``msg`` is an error reply."""
    if msg.has_error():
        reason = msg.error.reason
        text = " ".join(reason.split()) if isinstance(reason, str) else repr(reason)
        raise InvalidReply(f"client error: {text[:200]}")


def _decode_float32(name: str, data: bytes, shape: tuple[int, ...]) -> np.ndarray:
    """A writable C-ordered copy of the ``.npy`` payload ``data``, which must hold exactly a
    little-endian float32 array of ``shape``. The header is read (bounded by numpy's header size
    limit) and checked before any array is allocated, so a header that lies costs nothing."""
    try:
        header_shape, fortran, dtype, offset = _npy_header(_header_bytes(data))
    except Exception as exc:  # anything the parser raises means the bytes are not a .npy payload
        why = " ".join(str(exc).split()) or type(exc).__name__
        raise InvalidReply(f"{name}: undecodable array ({why[:100]})") from None
    if dtype != _FLOAT32 or not _same_shape(header_shape, shape) or not isinstance(fortran, bool):
        held = f"{dtype.str}{_shape_text(header_shape)}"
        raise InvalidReply(f"{name}: payload holds {held}, not its declared float32{shape}")
    count = math.prod(shape)
    if len(data) - offset != count * _FLOAT32.itemsize:
        raise InvalidReply(
            f"{name}: payload has {len(data) - offset} data bytes, {count * _FLOAT32.itemsize} declared"
        )
    flat = np.frombuffer(data, dtype=_FLOAT32, count=count, offset=offset)
    return np.array(flat.reshape(shape, order="F" if fortran else "C"), dtype=np.float32, order="C")


def _header_bytes(data: bytes) -> bytes:
    """The .npy header of ``data``: magic, version, length field and the header dict (NEP 1: a
    2-byte length in version 1.0, 4 bytes in 2.0). Raises ValueError for any other prefix."""
    version = tuple(data[6:8])
    if data[:6] != npy.MAGIC_PREFIX or version not in _NPY_HEADERS:
        raise ValueError("not a .npy version 1.0 or 2.0 payload")
    width = 2 if version == (1, 0) else 4
    length = int.from_bytes(data[8 : 8 + width], "little")
    if length > _MAX_NPY_HEADER:  # numpy's own reader refuses these too, after hashing them
        raise ValueError(f"header of {length} bytes (at most {_MAX_NPY_HEADER})")
    return data[: 8 + width + length]


@lru_cache(maxsize=256)
def _npy_header(header: bytes) -> tuple[object, object, np.dtype, int]:
    """(shape, fortran order, dtype, data offset) of a .npy header, parsed by numpy's own reader
    (``ast.literal_eval`` of the dict, ~40 µs) once per distinct header: a round's arrays share a
    few."""
    stream = io.BytesIO(header)
    read_header = _NPY_HEADERS[npy.read_magic(stream)]
    shape, fortran, dtype = read_header(stream)
    if stream.tell() != len(header):
        raise ValueError("header length field disagrees with the header")
    return shape, fortran, dtype, len(header)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _same_shape(shape: object, want: tuple[int, ...]) -> bool:
    """``shape`` is exactly ``want``: a tuple or list of ints (no bools), compared without allocating."""
    return (
        isinstance(shape, tuple | list)
        and len(shape) == len(want)
        and all(_is_int(s) and s == w for s, w in zip(shape, want, strict=True))
    )


def check_meta(meta: object, expected: Mapping) -> None:
    """Raise :class:`InvalidReply` unless the reply's ``meta`` record holds every ``expected`` value
    (a train reply's mechanism and release parameters, as the round asked them)."""
    if not isinstance(meta, ConfigRecord):
        raise InvalidReply("no meta record")
    for name, value in expected.items():
        if not _matches(meta.get(name), value):
            raise InvalidReply(f"{name} {_short(meta.get(name))} != {value!r}")


def _matches(got: object, want: object) -> bool:
    """A meta value equals the round's: numbers compare as numbers (``0 == 0.0``) but never as
    bools; anything else must have the same type."""
    if isinstance(want, bool) or isinstance(got, bool):
        return type(got) is type(want) and got == want
    if isinstance(want, int | float):
        return isinstance(got, int | float) and got == want
    return type(got) is type(want) and got == want


def _short(value: object, limit: int = 60) -> str:
    """``repr(value)`` cut to ``limit`` characters (reasons go to logs, one line each)."""
    text = repr(value[:limit] if isinstance(value, str | bytes) else value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _shape_text(shape: object) -> str:
    if isinstance(shape, tuple | list) and len(shape) <= 8:
        return _short(tuple(shape))
    return f"(<{len(shape)} dims>)" if isinstance(shape, tuple | list) else _short(shape)
