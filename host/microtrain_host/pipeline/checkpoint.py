"""Training checkpoints in ONNX Runtime's layout (identifier "ODTC", version 2).

The schema is `schema/checkpoint.fbs`. The host writes with the `flatbuffers` Builder and
reads with a small bounds-checked reader of its own (the `flatbuffers` package trusts its
input: a corrupt offset there gives an IndexError, a wrong value, or a negative index that
silently wraps around). Every problem with a file is reported as a `CheckpointError` that
names the file and says what is wrong.

Only float32 tensors are supported, which is all microtrain trains.

Integrity: ORT's format has no checksum, so a flipped bit inside raw tensor data would load
unnoticed. microtrain appends an 8-byte trailer after the FlatBuffer - the CRC-32 of every
byte before it, then the magic b"MTCK" - and sets a field of its own in the root table
(Checkpoint field 4, `crc32_trailer`) saying the trailer must be there. onnxruntime-training
ignores both (an unknown field and bytes past the buffer; checked by scripts/ort_interop.py)
and writes neither, so its files load here unchecked. A file that carries the trailer must
match it; a file whose root says "trailer" but has none was cut short. So every truncation
and every single flipped byte is refused.
"""

from __future__ import annotations

import dataclasses
import os
import secrets
import struct

import zlib

import flatbuffers
import numpy as np

from microtrain_host.errors import CheckpointError

IDENTIFIER = b"ODTC"
VERSION = 2
ONNX_FLOAT = 1
_INTEGER_TYPES = {"|i1": (3, "i1"), "<i4": (6, "<i4")}   # kept by keep_integers only
GROUP_NAME = "group0"
TRAILER_MAGIC = b"MTCK"
TRAILER_SIZE = 8  # u32 CRC-32 of the FlatBuffer, then TRAILER_MAGIC

# ONNX TensorProto.DataType names, for messages.
_ONNX_TYPE_NAMES = {
    0: "UNDEFINED", 1: "FLOAT", 2: "UINT8", 3: "INT8", 4: "UINT16", 5: "INT16", 6: "INT32",
    7: "INT64", 8: "STRING", 9: "BOOL", 10: "FLOAT16", 11: "DOUBLE", 12: "UINT32",
    13: "UINT64", 14: "COMPLEX64", 15: "COMPLEX128", 16: "BFLOAT16",
}

# Field numbers, in schema order (a field's vtable slot is 4 + 2 * number).
_TENSOR_NAME, _TENSOR_DOC, _TENSOR_DIMS, _TENSOR_TYPE, _TENSOR_RAW, _TENSOR_STRINGS, \
    _TENSOR_EXTERNAL = range(7)
_MODULE_TRAINABLE, _MODULE_FROZEN, _MODULE_NOMINAL, _MODULE_EXTERNAL = range(4)
_STATE_PARAM, _STATE_MOMENTUMS = range(2)
_GROUP_NAME, _GROUP_STEP, _GROUP_LR, _GROUP_STATES = range(4)
_PROP_NAME, _PROP_VALUE = range(2)
_BAG_INTS, _BAG_FLOATS, _BAG_STRINGS = range(3)
_ROOT_VERSION, _ROOT_MODULE, _ROOT_GROUPS, _ROOT_BAG, _ROOT_CRC_TRAILER = range(5)

_INT64_MIN, _INT64_MAX = -(2 ** 63), 2 ** 63 - 1


@dataclasses.dataclass
class Checkpoint:
    """What a checkpoint holds. In a nominal checkpoint the arrays are empty (the file
    keeps only the names). Optimizer step and learning rate are None without an optimizer
    group; `momentums` maps a parameter name to its moments, momentum0 first. `checked`
    says the file carried microtrain's CRC-32 trailer (files written by ORT do not)."""

    trainable: dict[str, np.ndarray]
    frozen: dict[str, np.ndarray]
    is_nominal: bool = False
    optimizer_step: int | None = None
    initial_learning_rate: float | None = None
    momentums: dict[str, list[np.ndarray]] = dataclasses.field(default_factory=dict)
    properties: dict[str, int | float | str] = dataclasses.field(default_factory=dict)
    checked: bool = False


# --------------------------------------------------------------------------- writing


def write_checkpoint(path, trainable: dict[str, np.ndarray], frozen: dict[str, np.ndarray], *,
                     nominal: bool = False, optimizer_step: int | None = None,
                     initial_learning_rate: float = 0.001,
                     momentums: dict[str, list[np.ndarray]] | None = None,
                     properties: dict | None = None, keep_integers: bool = False) -> None:
    """Write a checkpoint file atomically (a temporary file in the same directory, then
    os.replace), so an interrupted write never leaves a half-written file at `path`.

    Parameters are written in dict order, trainable ones into requires_grad_params and
    frozen ones into frozen_params. A nominal checkpoint keeps names and data types only.
    An optimizer group "group0" is written when `optimizer_step` or `momentums` is given;
    each parameter's moments are named momentum0, momentum1, ... Properties go to the
    int, float (float32) or string list by the value's type, sorted by name.
    """
    data = build_checkpoint(trainable, frozen, nominal=nominal, optimizer_step=optimizer_step,
                            initial_learning_rate=initial_learning_rate, momentums=momentums,
                            properties=properties, keep_integers=keep_integers)
    try:
        write_atomically(os.fspath(path), data)
    except OSError as e:
        raise CheckpointError(f"cannot write checkpoint '{path}': {e}") from e


def build_checkpoint(trainable: dict[str, np.ndarray], frozen: dict[str, np.ndarray], *,
                     nominal: bool = False, optimizer_step: int | None = None,
                     initial_learning_rate: float = 0.001,
                     momentums: dict[str, list[np.ndarray]] | None = None,
                     properties: dict | None = None, keep_integers: bool = False) -> bytes:
    """The bytes write_checkpoint writes (same arguments): the FlatBuffer and its trailer.
    keep_integers: int8 and int32 arrays stay INT8 / INT32 tensors (integer training,
    pipeline/inttrain.py) instead of becoming float32."""
    trainable = _float_arrays(trainable, "trainable", keep_integers)
    frozen = _float_arrays(frozen, "frozen")
    both = sorted(set(trainable) & set(frozen))
    if both:
        raise CheckpointError(f"parameter(s) {both} are both trainable and frozen")
    moments = _check_momentums(momentums or {}, trainable, nominal)
    props = _check_properties(properties or {})
    if optimizer_step is not None:
        optimizer_step = _int64(optimizer_step, "optimizer_step")
    lr = _float32(initial_learning_rate, "initial_learning_rate")

    raw_bytes = sum(a.nbytes for a in trainable.values()) + sum(a.nbytes for a in frozen.values())
    raw_bytes += sum(m.nbytes for ms in moments.values() for m in ms)
    w = _Writer(1024 + (0 if nominal else raw_bytes) * 11 // 10)
    b = w.builder

    # The module state is built first, so the buffer ends in one of its objects (see _Writer).
    lists = []
    for params in (trainable, frozen):
        lists.append(w.tables([w.tensor(name, a, nominal) for name, a in params.items()]))
    b.StartObject(4)
    b.PrependUOffsetTRelativeSlot(_MODULE_TRAINABLE, lists[0], 0)
    b.PrependUOffsetTRelativeSlot(_MODULE_FROZEN, lists[1], 0)
    b.PrependBoolSlot(_MODULE_NOMINAL, bool(nominal), False)
    b.PrependBoolSlot(_MODULE_EXTERNAL, False, False)
    module = b.EndObject()

    groups = 0
    if optimizer_step is not None or moments:
        states = []
        for name, ms in moments.items():
            tensors = w.tables([w.tensor(f"momentum{i}", m, False) for i, m in enumerate(ms)])
            param = w.string(name)
            b.StartObject(2)
            b.PrependUOffsetTRelativeSlot(_STATE_PARAM, param, 0)
            b.PrependUOffsetTRelativeSlot(_STATE_MOMENTUMS, tensors, 0)
            states.append(b.EndObject())
        states_vector = w.tables(states)
        group_name = w.string(GROUP_NAME)
        b.StartObject(4)
        b.PrependInt64Slot(_GROUP_STEP, optimizer_step or 0, 0)
        b.PrependUOffsetTRelativeSlot(_GROUP_NAME, group_name, 0)
        b.PrependFloat32Slot(_GROUP_LR, lr, 0.0)
        b.PrependUOffsetTRelativeSlot(_GROUP_STATES, states_vector, 0)
        groups = w.tables([b.EndObject()])

    bag = 0
    if props:
        kinds = []
        for kind in (int, float, str):
            entries = []
            for name in sorted(n for n, v in props.items() if type(v) is kind):
                value = props[name]
                name_off = w.string(name)
                value_off = w.string(value) if kind is str else 0
                b.StartObject(2)
                if kind is int:
                    b.PrependInt64Slot(_PROP_VALUE, value, 0)
                elif kind is float:
                    b.PrependFloat32Slot(_PROP_VALUE, value, 0.0)
                b.PrependUOffsetTRelativeSlot(_PROP_NAME, name_off, 0)
                if kind is str:
                    b.PrependUOffsetTRelativeSlot(_PROP_VALUE, value_off, 0)
                entries.append(b.EndObject())
            kinds.append(w.tables(entries))
        b.StartObject(3)
        for index, vector in zip((_BAG_INTS, _BAG_FLOATS, _BAG_STRINGS), kinds):
            b.PrependUOffsetTRelativeSlot(index, vector, 0)
        bag = b.EndObject()

    b.StartObject(5)
    b.PrependBoolSlot(_ROOT_CRC_TRAILER, True, False)
    b.PrependInt32Slot(_ROOT_VERSION, VERSION, 0)
    b.PrependUOffsetTRelativeSlot(_ROOT_MODULE, module, 0)
    if groups:
        b.PrependUOffsetTRelativeSlot(_ROOT_GROUPS, groups, 0)
    if bag:
        b.PrependUOffsetTRelativeSlot(_ROOT_BAG, bag, 0)
    b.Finish(b.EndObject(), file_identifier=IDENTIFIER)
    body = w.output()
    return body + struct.pack("<I", zlib.crc32(body)) + TRAILER_MAGIC


class _Writer:
    """The flatbuffers Builder plus helpers that note the padding at the end of the buffer.

    The Builder builds back to front, so the first object it places ends the buffer, and
    it pads after that object for alignment. Those trailing pad bytes belong to no object:
    cut off, no reader could tell. output() drops them, so that the last byte of the file
    is always one a reader checks, and truncation at any byte is detected. Positions from
    the start (and so every alignment) stay as they were.
    """

    def __init__(self, size_hint: int):
        self.builder = flatbuffers.Builder(min(size_hint, 2 ** 31 - 1))
        self.tail_padding = 0

    def _placed(self, offset_before: int, size: int) -> None:
        if offset_before == 0:
            self.tail_padding = self.builder.Offset() - size

    def string(self, text: str) -> int:
        data = text.encode("utf-8")
        before = self.builder.Offset()
        off = self.builder.CreateString(data)
        self._placed(before, 4 + len(data) + 1)
        return off

    def raw(self, data: bytes) -> int:
        before = self.builder.Offset()
        off = self.builder.CreateByteVector(data)
        self._placed(before, 4 + len(data))
        return off

    def int64s(self, values) -> int:
        array = np.asarray(values, dtype="<i8").reshape(-1)
        before = self.builder.Offset()
        off = self.builder.CreateNumpyVector(array)
        self._placed(before, 4 + array.nbytes)
        return off

    def tables(self, offsets: list[int]) -> int:
        b = self.builder
        before = b.Offset()
        b.StartVector(4, len(offsets), 4)
        for off in reversed(offsets):
            b.PrependUOffsetTRelative(off)
        off = b.EndVector()
        self._placed(before, 4 + 4 * len(offsets))
        return off

    def tensor(self, name: str, array: np.ndarray, nominal: bool) -> int:
        # A nominal tensor keeps its dims and has an empty raw_data vector: onnxruntime-
        # training refuses a tensor without either vector ("Flatbuffer tensor is invalid").
        name_off = self.string(name)
        dims = self.int64s(array.shape)
        kind = _INTEGER_TYPES.get(array.dtype.str, (ONNX_FLOAT, "<f4"))
        raw = self.raw(b"" if nominal else array.astype(kind[1], copy=False).tobytes())
        b = self.builder
        b.StartObject(7)
        b.PrependUOffsetTRelativeSlot(_TENSOR_RAW, raw, 0)
        b.PrependUOffsetTRelativeSlot(_TENSOR_DIMS, dims, 0)
        b.PrependUOffsetTRelativeSlot(_TENSOR_NAME, name_off, 0)
        b.PrependInt32Slot(_TENSOR_TYPE, kind[0], 0)
        return b.EndObject()

    def output(self) -> bytes:
        data = bytes(self.builder.Output())
        pad = self.tail_padding
        if pad:
            assert 0 < pad < 8 and not any(data[-pad:]), "unexpected tail padding"
            data = data[:-pad]
        return data


def _float_arrays(params, what: str, keep_integers=False) -> dict[str, np.ndarray]:
    if not isinstance(params, dict):
        raise CheckpointError(f"{what} parameters must be a dict name -> array, "
                              f"not {type(params).__name__}")
    out = {}
    for name, value in params.items():
        _check_name(name, f"{what} parameter")
        if keep_integers and np.asarray(value).dtype in (np.int8, np.int32):
            out[name] = np.asarray(value)
            continue
        out[name] = _float_array(value, f"{what} parameter '{name}'")
    return out


def _float_array(value, what: str) -> np.ndarray:
    array = np.asarray(value)
    if array.dtype.kind not in "fiub":
        raise CheckpointError(f"{what} has dtype {array.dtype}; a float32 array is needed")
    return array.astype(np.float32, copy=False)  # a 0-d array stays 0-d


def _check_name(name, what: str) -> None:
    if not isinstance(name, str) or not name:
        raise CheckpointError(f"{what} name {name!r} must be a non-empty string")


def _check_momentums(momentums, trainable, nominal) -> dict[str, list[np.ndarray]]:
    if momentums and nominal:
        raise CheckpointError("a nominal checkpoint holds no optimizer state (momentums)")
    unknown = sorted(set(momentums) - set(trainable), key=str)
    if unknown:
        raise CheckpointError(f"momentums given for {unknown}, which are not trainable parameters")
    out = {}
    for name in trainable:  # in parameter order
        if name not in momentums:
            continue
        ms = [_float_array(m, f"momentum{i} of '{name}'") for i, m in enumerate(momentums[name])]
        for i, m in enumerate(ms):
            if m.shape != trainable[name].shape:
                raise CheckpointError(f"momentum{i} of '{name}' has shape {m.shape}; "
                                      f"the parameter has shape {trainable[name].shape}")
        out[name] = ms
    return out


def _check_properties(properties) -> dict[str, int | float | str]:
    out = {}
    for name, value in properties.items():
        _check_name(name, "property")
        if isinstance(value, (bool, int, np.integer)):
            out[name] = _int64(value, f"property '{name}'")
        elif isinstance(value, (float, np.floating)):
            out[name] = _float32(value, f"property '{name}'")
        elif isinstance(value, str):
            out[name] = str(value)
        else:
            raise CheckpointError(f"property '{name}' must be an int, float or str, "
                                  f"not {type(value).__name__}")
    return out


def _int64(value, what: str) -> int:
    value = int(value)
    if not _INT64_MIN <= value <= _INT64_MAX:
        raise CheckpointError(f"{what} = {value} does not fit in int64")
    return value


def _float32(value, what: str) -> float:
    value = float(value)
    try:
        struct.pack("<f", value)
    except OverflowError:
        raise CheckpointError(f"{what} = {value} does not fit in float32") from None
    return value


def write_atomically(path: str, data: bytes) -> None:
    """Write a temporary file in the same directory, fsync it, then os.replace it over
    `path`: an interrupted write never leaves a half-written file there. Raises OSError."""
    directory = os.path.dirname(os.path.abspath(path))
    tmp = os.path.join(directory, f".{os.path.basename(path)}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0), 0o666)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


# Reading lives in checkpoint_reader.py; the format's public functions stay importable here.
from .checkpoint_reader import parse_checkpoint, read_checkpoint  # noqa: E402,F401
