"""Training checkpoints in ONNX Runtime's layout (identifier "ODTC", version 2).

The schema is `contract/checkpoint.fbs` (field numbers, types and defaults are read from it).
One codec both ways: the host writes with the `flatbuffers` Builder and reads with a small
bounds-checked reader (formats/flatbuf.py). Every problem with a file is reported as a
`CheckpointError` that names the file and says what is wrong.

Tensors are float32, or (integer training: quant/inttrain.py) int8 weights and int32 biases
with the device's int16 / int32 momentum velocities.

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
import math
import os
import struct
import zlib

import flatbuffers
import numpy as np

from ..contract import facts, schema
from ..errors import CheckpointError
from .files import write_atomically
from .flatbuf import Reader, write_table

SCHEMA = schema.checkpoint_schema()
IDENTIFIER = facts.CHECKPOINT_IDENTIFIER.encode()
VERSION = facts.CHECKPOINT_VERSION
ONNX_FLOAT = 1
_INTEGER_TYPES = {"|i1": (3, "i1"), "<i4": (6, "<i4")}   # kept by keep_integers only
GROUP_NAME = "group0"
TRAILER_MAGIC = facts.CHECKPOINT_TRAILER.encode()
TRAILER_SIZE = 8  # u32 CRC-32 of the FlatBuffer, then TRAILER_MAGIC
_TENSOR, _MODULE, _STATE, _GROUP, _BAG, _ROOT = (
    SCHEMA[t] for t in ("Tensor", "ModuleState", "ParameterOptimizerState", "OptimizerGroup",
                        "PropertyBag", "Checkpoint"))
_PROPERTIES = {int: SCHEMA["IntProperty"], float: SCHEMA["FloatProperty"],
               str: SCHEMA["StringProperty"]}

# ONNX TensorProto.DataType names, for messages.
_ONNX_TYPE_NAMES = {
    0: "UNDEFINED", 1: "FLOAT", 2: "UINT8", 3: "INT8", 4: "UINT16", 5: "INT16", 6: "INT32",
    7: "INT64", 8: "STRING", 9: "BOOL", 10: "FLOAT16", 11: "DOUBLE", 12: "UINT32",
    13: "UINT64", 14: "COMPLEX64", 15: "COMPLEX128", 16: "BFLOAT16",
}

# ONNX data type -> (stored numpy type, type of the array read). Integer training
# (quant/inttrain.py) writes int8 weights and int32 biases, and the device saves their
# integer momentum velocities as int16 / int32 momentum0 tensors; they stay integers here.
_NUMPY_TYPES = {ONNX_FLOAT: ("<f4", np.float32), 3: ("i1", np.int8), 5: ("<i2", np.int16),
                6: ("<i4", np.int32)}
assert set(_NUMPY_TYPES) == set(facts.CHECKPOINT_TENSOR_TYPES)

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
    quant/inttrain.py) instead of becoming float32."""
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
    module = write_table(b, _MODULE, [("requires_grad_params", lists[0]),
                                      ("frozen_params", lists[1]),
                                      ("is_nominal_state", nominal), ("has_external_data", False)])

    groups = 0
    if optimizer_step is not None or moments:
        states = []
        for name, ms in moments.items():
            tensors = w.tables([w.tensor(f"momentum{i}", m, False) for i, m in enumerate(ms)])
            param = w.string(name)
            states.append(write_table(b, _STATE, [("param_name", param),
                                                  ("momentums", tensors)]))
        states_vector = w.tables(states)
        group_name = w.string(GROUP_NAME)
        groups = w.tables([write_table(b, _GROUP, [
            ("step", optimizer_step or 0), ("group_name", group_name),
            ("initial_learning_rate", lr), ("optimizer_states", states_vector)])])

    bag = 0
    if props:
        kinds = []
        for kind in (int, float, str):
            entries = []
            for name in sorted(n for n, v in props.items() if type(v) is kind):
                value = props[name]
                name_off = w.string(name)
                if kind is str:    # the value's string before the table, as its name's
                    entry = [("name", name_off), ("value", w.string(value))]
                else:
                    entry = [("value", value), ("name", name_off)]
                entries.append(write_table(b, _PROPERTIES[kind], entry))
            kinds.append(w.tables(entries))
        bag = write_table(b, _BAG, list(zip(("ints", "floats", "strings"), kinds)))

    root = write_table(b, _ROOT, [("crc32_trailer", True), ("version", VERSION),
                                  ("module_state", module), ("optimizer_groups", groups or None),
                                  ("property_bag", bag or None)])
    b.Finish(root, file_identifier=IDENTIFIER)
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
        return write_table(self.builder, _TENSOR, [("raw_data", raw), ("dims", dims),
                                                   ("name", name_off), ("data_type", kind[0])])

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


# --------------------------------------------------------------------------- reading

def read_checkpoint(path) -> Checkpoint:
    """Read and validate a checkpoint file; any problem raises CheckpointError."""
    path = os.fspath(path)
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise CheckpointError(f"cannot read checkpoint '{path}': {e}") from e
    return parse_checkpoint(data, path)


def parse_checkpoint(data: bytes, source: str = "<bytes>") -> Checkpoint:
    """Read a checkpoint from bytes; `source` names it in error messages."""
    reader = Reader(bytes(data), CheckpointError, f"checkpoint '{source}': ")
    try:
        return _parse(reader)
    except CheckpointError:
        raise
    except (struct.error, IndexError, ValueError, OverflowError, MemoryError) as e:
        # Belt and braces: the reader checks every position, so this is not expected.
        reader.fail(f"corrupt ({type(e).__name__}: {e})")


def _check_trailer(r: Reader) -> bool:
    """Verify and cut off microtrain's CRC-32 trailer; False when the file has none."""
    if r.size < 8 + TRAILER_SIZE or r.data[-4:] != TRAILER_MAGIC:
        return False
    body = r.data[:-TRAILER_SIZE]
    if zlib.crc32(body) != struct.unpack_from("<I", r.data, r.size - TRAILER_SIZE)[0]:
        r.fail("corrupt: the CRC-32 of the file does not match its trailer")
    r.data, r.size = body, len(body)
    return True


def _parse(r: Reader) -> Checkpoint:
    if r.size < 8 or r.data[4:8] != IDENTIFIER:
        found = r.data[4:8]
        hint = " (it looks size-prefixed)" if r.data[8:12] == IDENTIFIER else ""
        r.fail(f"not a training checkpoint: file identifier {found!r}, expected "
               f"{IDENTIFIER!r}{hint}")
    checked = _check_trailer(r)
    root = r.root()
    version = r.scalar(root, _ROOT["version"])
    if version != VERSION:
        r.fail(f"checkpoint format version {version} is not supported (expected {VERSION})")
    if r.scalar(root, _ROOT["crc32_trailer"]) and not checked:
        r.fail("truncated or corrupt: the CRC-32 trailer this file was written with is missing")

    ckpt = Checkpoint(trainable={}, frozen={}, checked=checked)
    module = r.subtable(root, _ROOT["module_state"], "module_state")
    if module is not None:
        ckpt.is_nominal = bool(r.scalar(module, _MODULE["is_nominal_state"]))
        if r.scalar(module, _MODULE["has_external_data"]):
            r.fail("parameters stored as external data are not supported")
        for field, params, kind in ((_MODULE["requires_grad_params"], ckpt.trainable,
                                     "trainable parameter"),
                                    (_MODULE["frozen_params"], ckpt.frozen, "frozen parameter")):
            for t in r.tables(module, field, kind):
                name, array = _read_tensor(r, t, ckpt.is_nominal)
                if name in ckpt.trainable or name in ckpt.frozen:
                    r.fail(f"parameter '{name}' appears twice")
                params[name] = array

    groups = r.tables(root, _ROOT["optimizer_groups"], "optimizer group")
    if len(groups) > 1:
        r.fail(f"{len(groups)} optimizer groups; only one is supported")
    for group in groups:
        r.string(group, _GROUP["group_name"], "optimizer group name")
        ckpt.optimizer_step = r.scalar(group, _GROUP["step"])
        ckpt.initial_learning_rate = r.scalar(group, _GROUP["initial_learning_rate"])
        for state in r.tables(group, _GROUP["optimizer_states"], "parameter optimizer state"):
            name = r.string(state, _STATE["param_name"], "param_name")
            moments = [_read_tensor(r, t, False)
                       for t in r.tables(state, _STATE["momentums"], f"momentum of '{name}'")]
            if name not in ckpt.trainable:
                r.fail(f"optimizer state for '{name}', which is not a trainable parameter")
            if name in ckpt.momentums:
                r.fail(f"optimizer state for '{name}' appears twice")
            moments.sort(key=lambda m: (len(m[0]), m[0]))  # momentum0, momentum1, ..., momentum10
            if not ckpt.is_nominal:
                for moment, value in moments:
                    if value.shape != ckpt.trainable[name].shape:
                        r.fail(f"{moment} of '{name}' has shape {value.shape}; the parameter "
                               f"has shape {ckpt.trainable[name].shape}")
            ckpt.momentums[name] = [value for _, value in moments]

    bag = r.subtable(root, _ROOT["property_bag"], "property_bag")
    if bag is not None:
        for field, kind in (("ints", int), ("floats", float), ("strings", str)):
            entry = _PROPERTIES[kind]
            kind = kind.__name__.replace("str", "string")
            for p in r.tables(bag, _BAG[field], f"{kind} property"):
                name = r.string(p, entry["name"], f"{kind} property name")
                if not name:
                    r.fail(f"a {kind} property has no name")
                if kind == "string":
                    value = r.string(p, entry["value"], f"property '{name}'") or ""
                else:
                    value = r.scalar(p, entry["value"])
                if name in ckpt.properties:
                    r.fail(f"property '{name}' appears twice")
                ckpt.properties[name] = value
    return ckpt


def _read_tensor(r: Reader, t, nominal: bool) -> tuple[str, np.ndarray]:
    name = r.string(t, _TENSOR["name"], f"name of {t.what}")
    if not name:
        r.fail(f"{t.what} has no name")
    what = f"tensor '{name}'"
    r.string(t, _TENSOR["doc_string"], f"doc_string of {what}")
    dims_pos, ndims = r.vector(t, _TENSOR["dims"], 8, f"dims of {what}")
    dims = struct.unpack_from(f"<{ndims}q", r.data, dims_pos) if ndims else ()
    dtype = r.scalar(t, _TENSOR["data_type"])
    raw_pos, nbytes = r.vector(t, _TENSOR["raw_data"], 1, f"raw_data of {what}")
    _, nstrings = r.vector(t, _TENSOR["string_data"], 4, f"string_data of {what}")
    external = r.scalar(t, _TENSOR["external_data_offset"])
    if dtype not in _NUMPY_TYPES:
        type_name = _ONNX_TYPE_NAMES.get(dtype, "unknown")
        r.fail(f"{what} has ONNX data type {dtype} ({type_name}); only FLOAT (1), INT8 (3), "
               f"INT16 (5) and INT32 (6) are supported")
    if external != -1:
        r.fail(f"{what} keeps its data in an external file, which is not supported")
    stored, kind = _NUMPY_TYPES[dtype]
    if nstrings:
        r.fail(f"{what} is a {_ONNX_TYPE_NAMES[dtype]} tensor but has string_data")
    if nominal:
        return name, np.zeros(0, dtype=kind)
    if any(d < 0 for d in dims):
        r.fail(f"{what} has a negative dimension in {list(dims)}")
    count = math.prod(dims)
    item = np.dtype(stored).itemsize
    if nbytes != item * count:
        r.fail(f"{what} has {nbytes} bytes of raw_data; dims {list(dims)} need {item * count}")
    values = np.frombuffer(r.data, dtype=stored, count=count, offset=raw_pos) if count else \
        np.zeros(0, dtype=stored)
    return name, values.astype(kind).reshape(dims)
