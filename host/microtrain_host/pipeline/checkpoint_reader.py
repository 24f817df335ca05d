"""Reading ONNX Runtime training checkpoints: a bounds-checked FlatBuffers reader of our own
(the `flatbuffers` package trusts its input: a corrupt offset there gives an IndexError, a
wrong value, or a negative index that silently wraps around). Every problem is a
CheckpointError naming the file. The layout and the CRC-32 trailer are described in
checkpoint.py, which also re-exports read_checkpoint and parse_checkpoint."""

from __future__ import annotations

import dataclasses
import math
import os
import struct
import zlib

import numpy as np

from microtrain_host.errors import CheckpointError

from .checkpoint import (  # the layout: identifiers and field numbers
    _BAG_FLOATS, _BAG_INTS, _BAG_STRINGS, _GROUP_LR, _GROUP_NAME, _GROUP_STATES, _GROUP_STEP,
    _MODULE_EXTERNAL, _MODULE_FROZEN, _MODULE_NOMINAL, _MODULE_TRAINABLE, _ONNX_TYPE_NAMES,
    _PROP_NAME, _PROP_VALUE, _ROOT_BAG, _ROOT_CRC_TRAILER, _ROOT_GROUPS, _ROOT_MODULE,
    _ROOT_VERSION, _STATE_MOMENTUMS, _STATE_PARAM, _TENSOR_DIMS, _TENSOR_DOC, _TENSOR_EXTERNAL,
    _TENSOR_NAME, _TENSOR_RAW, _TENSOR_STRINGS, _TENSOR_TYPE, IDENTIFIER,
    ONNX_FLOAT, TRAILER_MAGIC, TRAILER_SIZE, VERSION, Checkpoint)

# ONNX data type -> (stored numpy type, type of the array read). Integer training
# (pipeline/inttrain.py) writes int8 weights and int32 biases, and the device saves their
# integer momentum velocities as int16 / int32 momentum0 tensors; they stay integers here.
_NUMPY_TYPES = {ONNX_FLOAT: ("<f4", np.float32), 3: ("i1", np.int8), 5: ("<i2", np.int16),
                6: ("<i4", np.int32)}

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
    reader = _Reader(bytes(data), source)
    try:
        return _parse(reader)
    except CheckpointError:
        raise
    except (struct.error, IndexError, ValueError, OverflowError, MemoryError) as e:
        # Belt and braces: the reader checks every position, so this is not expected.
        reader.fail(f"corrupt ({type(e).__name__}: {e})")


@dataclasses.dataclass
class _Table:
    pos: int      # where the table starts (its soffset to the vtable)
    vtable: int
    vsize: int    # vtable size in bytes
    tsize: int    # table size in bytes
    what: str


class _Reader:
    """Bounds-checked access to a FlatBuffers buffer (little-endian, unprefixed)."""

    def __init__(self, data: bytes, source: str):
        self.data = data
        self.size = len(data)
        self.source = source

    def fail(self, problem: str):
        raise CheckpointError(f"checkpoint '{self.source}': {problem}")

    def need(self, pos: int, nbytes: int, what: str) -> None:
        if pos < 0 or nbytes < 0 or pos + nbytes > self.size:
            self.fail(f"truncated or corrupt: {what} at byte {pos} (+{nbytes} bytes) lies "
                      f"outside the {self.size}-byte file")

    def unpack(self, fmt: str, pos: int, what: str):
        self.need(pos, struct.calcsize(fmt), what)
        return struct.unpack_from("<" + fmt, self.data, pos)[0]

    def table(self, pos: int, what: str) -> _Table:
        vtable = pos - self.unpack("i", pos, what)
        vsize = self.unpack("H", vtable, what + " vtable")
        tsize = self.unpack("H", vtable + 2, what + " vtable")
        if vsize < 4 or vsize % 2:
            self.fail(f"corrupt: {what} has a vtable of {vsize} bytes")
        if tsize < 4:
            self.fail(f"corrupt: {what} is {tsize} bytes long")
        self.need(vtable, vsize, what + " vtable")
        self.need(pos, tsize, what)
        return _Table(pos, vtable, vsize, tsize, what)

    def field(self, t: _Table, index: int, width: int) -> int | None:
        """Absolute position of field `index` (`width` bytes), None when absent."""
        slot = 4 + 2 * index
        if slot + 2 > t.vsize:
            return None
        off = self.unpack("H", t.vtable + slot, t.what + " vtable")
        if off == 0:
            return None
        if off < 4 or off + width > t.tsize:
            self.fail(f"corrupt: field {index} of {t.what} lies outside the table")
        return t.pos + off

    def scalar(self, t: _Table, index: int, fmt: str, default):
        at = self.field(t, index, struct.calcsize(fmt))
        return default if at is None else self.unpack(fmt, at, f"field {index} of {t.what}")

    def target(self, t: _Table, index: int, what: str) -> int | None:
        """Where the offset field `index` points to, None when absent."""
        at = self.field(t, index, 4)
        return None if at is None else at + self.unpack("I", at, what)

    def subtable(self, t: _Table, index: int, what: str) -> _Table | None:
        at = self.target(t, index, what)
        return None if at is None else self.table(at, what)

    def vector(self, t: _Table, index: int, elem_size: int, what: str) -> tuple[int, int]:
        """(position of the first element, element count); (0, 0) when absent."""
        at = self.target(t, index, what)
        if at is None:
            return 0, 0
        count = self.unpack("I", at, what + " length")
        self.need(at + 4, count * elem_size, what)
        return at + 4, count

    def tables(self, t: _Table, index: int, what: str) -> list[_Table]:
        pos, count = self.vector(t, index, 4, what + " list")
        out = []
        for i in range(count):
            at = pos + 4 * i
            out.append(self.table(at + self.unpack("I", at, what), f"{what} {i}"))
        return out

    def string(self, t: _Table, index: int, what: str) -> str | None:
        pos, count = self.vector(t, index, 1, what)
        if not pos:
            return None
        self.need(pos + count, 1, what + " terminator")
        if self.data[pos + count] != 0:
            self.fail(f"corrupt: {what} is not NUL-terminated")
        try:
            return self.data[pos:pos + count].decode("utf-8")
        except UnicodeDecodeError:
            self.fail(f"corrupt: {what} is not valid UTF-8")


def _check_trailer(r: _Reader) -> bool:
    """Verify and cut off microtrain's CRC-32 trailer; False when the file has none."""
    if r.size < 8 + TRAILER_SIZE or r.data[-4:] != TRAILER_MAGIC:
        return False
    body = r.data[:-TRAILER_SIZE]
    if zlib.crc32(body) != struct.unpack_from("<I", r.data, r.size - TRAILER_SIZE)[0]:
        r.fail("corrupt: the CRC-32 of the file does not match its trailer")
    r.data, r.size = body, len(body)
    return True


def _parse(r: _Reader) -> Checkpoint:
    if r.size < 8 or r.data[4:8] != IDENTIFIER:
        found = r.data[4:8]
        hint = " (it looks size-prefixed)" if r.data[8:12] == IDENTIFIER else ""
        r.fail(f"not a training checkpoint: file identifier {found!r}, expected "
               f"{IDENTIFIER!r}{hint}")
    checked = _check_trailer(r)
    root = r.table(r.unpack("I", 0, "root offset"), "root table")
    version = r.scalar(root, _ROOT_VERSION, "i", 0)
    if version != VERSION:
        r.fail(f"checkpoint format version {version} is not supported (expected {VERSION})")
    if r.scalar(root, _ROOT_CRC_TRAILER, "B", 0) and not checked:
        r.fail("truncated or corrupt: the CRC-32 trailer this file was written with is missing")

    ckpt = Checkpoint(trainable={}, frozen={}, checked=checked)
    module = r.subtable(root, _ROOT_MODULE, "module_state")
    if module is not None:
        ckpt.is_nominal = bool(r.scalar(module, _MODULE_NOMINAL, "B", 0))
        if r.scalar(module, _MODULE_EXTERNAL, "B", 0):
            r.fail("parameters stored as external data are not supported")
        for index, params, kind in ((_MODULE_TRAINABLE, ckpt.trainable, "trainable parameter"),
                                    (_MODULE_FROZEN, ckpt.frozen, "frozen parameter")):
            for t in r.tables(module, index, kind):
                name, array = _read_tensor(r, t, ckpt.is_nominal)
                if name in ckpt.trainable or name in ckpt.frozen:
                    r.fail(f"parameter '{name}' appears twice")
                params[name] = array

    groups = r.tables(root, _ROOT_GROUPS, "optimizer group")
    if len(groups) > 1:
        r.fail(f"{len(groups)} optimizer groups; only one is supported")
    for group in groups:
        r.string(group, _GROUP_NAME, "optimizer group name")
        ckpt.optimizer_step = r.scalar(group, _GROUP_STEP, "q", 0)
        ckpt.initial_learning_rate = r.scalar(group, _GROUP_LR, "f", 0.0)
        for state in r.tables(group, _GROUP_STATES, "parameter optimizer state"):
            name = r.string(state, _STATE_PARAM, "param_name")
            moments = [_read_tensor(r, t, False)
                       for t in r.tables(state, _STATE_MOMENTUMS, f"momentum of '{name}'")]
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

    bag = r.subtable(root, _ROOT_BAG, "property_bag")
    if bag is not None:
        for index, kind in ((_BAG_INTS, "int"), (_BAG_FLOATS, "float"), (_BAG_STRINGS, "string")):
            for p in r.tables(bag, index, f"{kind} property"):
                name = r.string(p, _PROP_NAME, f"{kind} property name")
                if not name:
                    r.fail(f"a {kind} property has no name")
                if kind == "int":
                    value = r.scalar(p, _PROP_VALUE, "q", 0)
                elif kind == "float":
                    value = r.scalar(p, _PROP_VALUE, "f", 0.0)
                else:
                    value = r.string(p, _PROP_VALUE, f"property '{name}'") or ""
                if name in ckpt.properties:
                    r.fail(f"property '{name}' appears twice")
                ckpt.properties[name] = value
    return ckpt


def _read_tensor(r: _Reader, t: _Table, nominal: bool) -> tuple[str, np.ndarray]:
    name = r.string(t, _TENSOR_NAME, f"name of {t.what}")
    if not name:
        r.fail(f"{t.what} has no name")
    what = f"tensor '{name}'"
    r.string(t, _TENSOR_DOC, f"doc_string of {what}")
    dims_pos, ndims = r.vector(t, _TENSOR_DIMS, 8, f"dims of {what}")
    dims = struct.unpack_from(f"<{ndims}q", r.data, dims_pos) if ndims else ()
    dtype = r.scalar(t, _TENSOR_TYPE, "i", 0)
    raw_pos, nbytes = r.vector(t, _TENSOR_RAW, 1, f"raw_data of {what}")
    _, nstrings = r.vector(t, _TENSOR_STRINGS, 4, f"string_data of {what}")
    external = r.scalar(t, _TENSOR_EXTERNAL, "q", -1)
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
