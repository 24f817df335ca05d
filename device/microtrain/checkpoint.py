# CheckpointState: parameters, optimizer state and properties, in the layout of ONNX
# Runtime's training checkpoint (file identifier "ODTC", version 2; the schema is
# host/microtrain_host/contract/checkpoint.fbs, whose field numbers the block below holds).
#
# Loading never holds the file in RAM: the file is read through a small window (the CRC-32
# computed, the structure and every float value checked), and each tensor is noted by where
# its bytes are (a Ref). A Module (and its Optimizer) then streams those bytes straight into
# their places in the arenas, the CRC-32 computed again on the way (a file changed since
# refuses); a state nobody binds reads them into arrays when its data is first asked for.
# A checkpoint in flash (given as a buffer) is read the same way, where it is.
#   Checkpoint field crc32_trailer is microtrain's own (ORT ignores it): the file ends in an
#   8-byte trailer, the CRC-32 of all bytes before it and b"MTCK". A file with the trailer
#   must match it; one whose root asks for it but lacks it was cut short; files written by
#   ORT have neither and load unchecked.
#   Int properties named RNG_PREFIX + k (k = 0, 1, ...: the k-th Dropout of the blob, the
#   stream number of Module.set_seed) are reserved: the state a*2**30 + b of that Dropout's
#   generator (kernels/norm.py get_state), written by save_checkpoint with the optimizer
#   state and restored by Module. They load into state.random_states, not state.properties.
#   Integer training (kernels/inttrain.py) keeps its stochastic-rounding generator of weight
#   W likewise, as RNG_PREFIX + "<W>.dither" (one int in [0, 2**16)).
#   Integer momentum velocities (INT_GEMM_UPDATE_MOMENTUM) are the optimizer state of their
#   parameter, as AdamW's moments are: one tensor "momentum0" like ORT's SGD-with-momentum
#   buffer (it is the same quantity, v = mu v + g), but with the integer type it has in the
#   arena, so the file keeps it exactly: ONNX INT16 for an int8 weight's velocity (1/256
#   quanta, the arena's 2 bytes little endian), INT32 for an int32 bias' velocity. They load
#   into state.int_velocities (not state.momentums, which float optimizers bind). A
#   checkpoint without them (written before they were saved, or without optimizer state)
#   loads with the velocities zero, as a fresh run starts.
import struct
from array import array
from microtrain.arenas import compact
from microtrain.blob import is_buffer
from microtrain.crc32 import crc32
from microtrain.errors import CheckpointError
from microtrain.files import BufferFile, open_existing, path_of, reason, seek
from microtrain.flatbuf import FileReader

# contract: checkpoint Checkpoint ModuleState Tensor ParameterOptimizerState OptimizerGroup PropertyBag IntProperty; checkpoint_facts
# (generated from host/microtrain_host/contract/ by `python -m microtrain_host.contract.generate`; do not edit)
from microtrain.errors import const
_CK_CHECKPOINT_VERSION = const(0)
_CK_CHECKPOINT_MODULE_STATE = const(1)
_CK_CHECKPOINT_OPTIMIZER_GROUPS = const(2)
_CK_CHECKPOINT_PROPERTY_BAG = const(3)
_CK_CHECKPOINT_CRC32_TRAILER = const(4)
_CK_MODULE_STATE_REQUIRES_GRAD_PARAMS = const(0)
_CK_MODULE_STATE_FROZEN_PARAMS = const(1)
_CK_MODULE_STATE_IS_NOMINAL_STATE = const(2)
_CK_MODULE_STATE_HAS_EXTERNAL_DATA = const(3)
_CK_TENSOR_NAME = const(0)
_CK_TENSOR_DIMS = const(2)
_CK_TENSOR_DATA_TYPE = const(3)
_CK_TENSOR_RAW_DATA = const(4)
_CK_TENSOR_EXTERNAL_DATA_OFFSET = const(6)
_CK_PARAMETER_OPTIMIZER_STATE_PARAM_NAME = const(0)
_CK_PARAMETER_OPTIMIZER_STATE_MOMENTUMS = const(1)
_CK_OPTIMIZER_GROUP_STEP = const(1)
_CK_OPTIMIZER_GROUP_INITIAL_LEARNING_RATE = const(2)
_CK_OPTIMIZER_GROUP_OPTIMIZER_STATES = const(3)
_CK_PROPERTY_BAG_INTS = const(0)
_CK_PROPERTY_BAG_FLOATS = const(1)
_CK_PROPERTY_BAG_STRINGS = const(2)
_CK_INT_PROPERTY_NAME = const(0)
_CK_INT_PROPERTY_VALUE = const(1)
CHECKPOINT_IDENTIFIER = b"ODTC"
_OBSERVER_RANGE = ".observer_range"  # may hold inf (not observed yet)
RNG_PREFIX = "microtrain.rng."  # int properties: generator states
VERSION = const(2)
TRAILER_MAGIC = b"MTCK"
# ONNX data type -> (bytes per element, array typecode)
_TENSOR_TYPES = {1: (4, "f"), 3: (1, "b"), 5: (2, "h"), 6: (4, "i")}
# end of contract
ONNX_FLOAT = 1
ONNX_INT8 = 3              # integer training (kernels/inttrain.py): int8 weights ...
ONNX_INT16 = 5             # ... their int16 momentum velocities ...
ONNX_INT32 = 6             # ... and int32 biases (and their velocities), as ONNX tensor types
_CHUNK = 256               # bytes read at a time
_ITEM = {"f": 4, "i": 4, "h": 2, "b": 1}   # bytes per element of an array of a typecode


class Ref:
    """Where a tensor's raw bytes lie in the checkpoint a state was loaded from."""

    def __init__(self, at, nbytes, data_type):
        self.at = at
        self.nbytes = nbytes
        self.typecode = _TENSOR_TYPES[data_type][1]


class Parameter:
    """One named parameter. `data`: its values - an array, or once a Module binds it a view
    of the Module's arena (so it always shows the current values)."""

    def __init__(self, name, shape, data, requires_grad, data_type=ONNX_FLOAT):
        self.name = name
        self.shape = shape
        self._data = data          # array or view, Ref (in the file, not read yet) or None
        self._state = None         # the state whose source a Ref points into
        self.requires_grad = requires_grad
        self.grad = None
        self.data_type = data_type  # ONNX: float (1), or int8 (3) / int32 (6) of a layer
                                    # trained in integers (its data then raw int8 bytes
                                    # or int32 values)

    @property
    def data(self):
        if isinstance(self._data, Ref):
            self._state.materialize()
        return self._data

    @data.setter
    def data(self, values):
        self._data = values

    def size(self):
        n = 1
        for d in self.shape:
            n *= d
        return n


class CheckpointState:
    """Like onnxruntime.training.api.CheckpointState: load_checkpoint(checkpoint_uri),
    save_checkpoint(state, checkpoint_uri, include_optimizer_state=False),
    state.parameters[name] (a Parameter) and state.properties[name]."""

    def __init__(self):
        self.parameters = {}       # name -> Parameter
        self.properties = {}       # name -> int, float or str
        self.is_nominal = False
        self.optimizer_step = 0
        self.initial_learning_rate = 0.001
        self._momentums = {}       # parameter name -> [array, view or Ref, ...]
        self._velocities = {}      # parameter name -> (ONNX_INT16 or ONNX_INT32, values):
                                   # integer momentum (see the top of this file)
        self.has_optimizer_state = False  # the file had an optimizer group
        self.parameter_order = []  # names in file order (dict order on MicroPython is not)
        self.random_states = {}    # RNG_PREFIX + k -> int, as loaded (Dropout generators)
        self._random_source = None  # set by Module: returns the current random_states
        self._source = None        # the path or buffer Refs point into, its FlatBuffer's
        self._end = 0              # length and CRC-32 (the stream checks them again)
        self._crc = 0

    @property
    def momentums(self):
        self.materialize()
        return self._momentums

    @momentums.setter
    def momentums(self, value):
        self._momentums = value

    @property
    def int_velocities(self):
        self.materialize()
        return self._velocities

    @staticmethod
    def load_checkpoint(checkpoint_uri):
        """Read and validate a checkpoint: a path, or a buffer (a file in a board's ROM
        filesystem, a frozen bytes object: read where it is). When the path is missing but
        its .bak exists (a save on a filesystem that cannot rename over a file was cut off
        half-way, see files.write_atomically), the .bak file, the previous checkpoint, is
        loaded. Tensor values are not kept in RAM (see the top of this file)."""
        # the state's objects then pack at the heap's bottom, not among the garbage the
        # imports left, where they would split the hole the Module's arenas need next
        compact()
        if is_buffer(checkpoint_uri):
            source = checkpoint_uri
            what = "the %d-byte checkpoint buffer" % len(source)
            f = BufferFile(source)
        else:
            path = path_of(checkpoint_uri, CheckpointError, "the checkpoint", True)
            try:
                f, source = open_existing(path)
            except OSError as e:
                raise CheckpointError("cannot read checkpoint '%s': %s" % (path, reason(e)))
            what = source
        try:
            with f:
                state = _parse(f, what)
        except OSError as e:
            raise CheckpointError("cannot read checkpoint '%s': %s" % (what, reason(e)))
        state._source = source
        return state

    @staticmethod
    def save_checkpoint(state, checkpoint_uri, include_optimizer_state=False):
        """Write the checkpoint atomically (files.write_atomically): an interrupted or
        refused save leaves the previous checkpoint in place. include_optimizer_state=True
        also writes the optimizer state (moments; integer training's momentum velocities)
        and the generators' states (properties microtrain.rng.*: Dropout, stochastic
        rounding), so that a resumed run continues as the uninterrupted one."""
        if not isinstance(state, CheckpointState):
            raise CheckpointError("save_checkpoint(state, checkpoint_uri, include_optimizer_state"
                                  "=False): state must be a CheckpointState, not %s"
                                  % type(state).__name__)
        path = path_of(checkpoint_uri, CheckpointError, "the checkpoint")
        state.materialize()
        # the writer (and fbwriter) is imported when a run first saves: a run's load, where
        # the heap is tightest (arenas, the parse), does not carry its ~1 KB of objects
        from microtrain.checkpoint_writer import write_checkpoint
        write_checkpoint(state, path, include_optimizer_state)

    # -- tensor bytes in the source --------------------------------------------------------
    def materialize(self):
        """Read every tensor still in the source into an array of its own (a state no
        Module binds, whose data is asked for)."""
        # every (holder, key, Ref) still in the source: holder[key] is replaced by the values
        # (listed here, not by a method of its own: each function costs a board's heap)
        refs = []
        for p in self.parameters.values():
            if isinstance(p._data, Ref):
                refs.append((p, None, p._data))
        for moments in self._momentums.values():
            for i in range(len(moments)):
                if isinstance(moments[i], Ref):
                    refs.append((moments, i, moments[i]))
        for name in self._velocities:
            dtype, values = self._velocities[name]
            if isinstance(values, Ref):
                refs.append((self._velocities, name, values))
        if not refs:
            return
        targets = []
        for holder, key, ref in refs:
            values = array(ref.typecode, bytes(ref.nbytes))
            targets.append((ref, values, 0))
            if key is None:
                holder._data = values
            elif isinstance(holder, list):
                holder[key] = values
            else:
                holder[key] = (holder[key][0], values)
        self.stream(targets)

    def stream(self, targets):
        """Copy each target (Ref, arena, element offset)'s bytes from the source into
        the arena, reading the source once front to back with the CRC-32 of all of it
        computed again: a source that changed since it was validated is refused."""
        targets = sorted(targets, key=lambda t: t[0].at)
        source = self._source
        try:
            f = BufferFile(source) if is_buffer(source) else open(source, "rb")
            with f:
                if f.seek(0, 2) < self._end:
                    raise CheckpointError("checkpoint '%s' changed since it was loaded"
                                          % source)
                f.seek(0)
                chunk = bytearray(_CHUNK)
                crc, at = 0, 0
                for ref, arena, offset in targets:
                    crc = _crc_through(f, chunk, crc, ref.at - at)
                    view = memoryview(arena)
                    # bytes per element: the byte arena holds int8 values and the two bytes
                    # of each int16 velocity; arrays hold elements of the tensor's type
                    item = 1 if isinstance(arena, bytearray) else _ITEM[ref.typecode]
                    step = _CHUNK // item
                    first, last = offset, offset + ref.nbytes // item
                    for start in range(first, last, step):
                        piece = view[start:min(start + step, last)]
                        if _read_piece(f, piece, item, ref.typecode) != len(piece) * item:
                            raise CheckpointError("checkpoint '%s' changed since it was "
                                                  "loaded" % source)
                        crc = crc32(piece, crc)
                    at = ref.at + ref.nbytes
                crc = _crc_through(f, chunk, crc, self._end - at)
        except OSError as e:
            raise CheckpointError("cannot read checkpoint '%s': %s" % (source, reason(e)))
        if crc & 0xFFFFFFFF != self._crc:
            raise CheckpointError("checkpoint '%s' changed since it was loaded" % source)


def _read_piece(f, piece, item, typecode):
    # the file's next bytes into piece, a view of an arena (bytes, or elements of item
    # bytes of typecode); the bytes read. A BufferFile copies by slice assignment, which
    # takes bytes only into a byte view: elements come through an array made from the
    # raw bytes.
    if item == 1 or not isinstance(f, BufferFile):
        return f.readinto(piece)
    raw = f.read(len(piece) * item)
    if len(raw) == len(piece) * item:
        piece[:] = array(typecode, raw)
    return len(raw)


def _crc_through(f, chunk, crc, n):
    # the CRC-32 of the next n bytes of f, read through chunk (a whole chunk without a
    # slice: only the last piece makes one)
    while n > 0:
        piece = chunk if n >= len(chunk) else memoryview(chunk)[:n]
        got = f.readinto(piece)
        if got != len(piece):
            if not got:
                raise OSError(5, "the file ended early")
            piece = memoryview(chunk)[:got]
        crc = crc32(piece, crc)
        n -= got
    return crc


def _read_tensor(r, t, nominal, what):
    # (name, dims, Ref or None, ONNX data type) of one tensor table
    name = r.string(t, _CK_TENSOR_NAME, "tensor name")
    if not name:
        raise CheckpointError("%s: a tensor has no name" % what)
    dims = tuple(r.scalars(t, _CK_TENSOR_DIMS, "q", "tensor dims"))
    dtype = r.scalar(t, _CK_TENSOR_DATA_TYPE, "i", 0)
    pos, nbytes = r.vector(t, _CK_TENSOR_RAW_DATA, 1, "raw_data of '%s'", name)
    if dtype not in _TENSOR_TYPES:
        raise CheckpointError("tensor '%s' has ONNX data type %d; only float (1), int8 (3), "
                              "int16 (5) and int32 (6) are supported" % (name, dtype))
    if r.scalar(t, _CK_TENSOR_EXTERNAL_DATA_OFFSET, "q", -1) != -1:
        raise CheckpointError("tensor '%s' keeps its data in an external file, which is not "
                              "supported" % name)
    if nominal:
        return name, dims, None, dtype
    count = 1
    for d in dims:
        if d < 0:
            raise CheckpointError("tensor '%s' has a negative dimension" % name)
        count *= d
    if nbytes != _TENSOR_TYPES[dtype][0] * count:
        raise CheckpointError("tensor '%s' has %d data bytes; dims %r need %d"
                              % (name, nbytes, dims, _TENSOR_TYPES[dtype][0] * count))
    return name, dims, Ref(pos, nbytes, dtype), dtype


def _moment_order(pair):
    # momentum0, momentum1, ..., momentum10: shorter names first
    return (len(pair[0]), pair[0])


def _frame(f, uri):
    # (end of the FlatBuffer, its CRC-32) of the open checkpoint file f, checked: the
    # identifier, the trailer's CRC-32 when there is one.
    size = f.seek(0, 2)
    f.seek(0)
    head = f.read(8)
    if len(head) < 8 or head[4:8] != CHECKPOINT_IDENTIFIER:
        raise CheckpointError("'%s' is not a training checkpoint (identifier %r, expected %r)"
                              % (uri, bytes(head[4:8]), CHECKPOINT_IDENTIFIER))
    end = size
    stored = None
    if size >= 16:
        f.seek(size - 8)
        tail = f.read(8)
        if tail[4:] == TRAILER_MAGIC:
            end = size - 8
            stored = struct.unpack("<I", tail[:4])[0]
    f.seek(0)
    crc = _crc_through(f, bytearray(_CHUNK), 0, end) & 0xFFFFFFFF
    if stored is not None and crc != stored:
        raise CheckpointError("checkpoint '%s' is corrupt: its CRC-32 does not match" % uri)
    return end, crc, stored is not None


def _check_values(f, ref, chunk, uri, name, owner=None):
    # every float of a tensor (parameter `name`, or moment `name` of parameter `owner`) a
    # number, and finite (but a QAT observer's range, which is [inf, -inf] until it has seen
    # a batch): a NaN or infinite parameter or moment would train into NaN, or freeze a
    # weight, without a word. The floats are read as little-endian bytes through chunk, the
    # parse's one bytearray, and judged by their exponent bits: no float is boxed and no
    # slice made but the last, so checking allocates (nearly) nothing and the objects the
    # state keeps lie together in the heap.
    if ref is None or ref.typecode != "f":
        return
    infinite_ok = (owner or name).endswith(_OBSERVER_RANGE)
    seek(f, ref.at)     # (not f.seek: littlefs, see files.seek)
    done = 0
    count = ref.nbytes
    full = len(chunk)
    while done < count:
        n = min(full, count - done)
        if f.readinto(chunk if n == full else memoryview(chunk)[:n]) != n:
            raise OSError(5, "the file ended early")
        i = 3
        while i < n:
            # sign and exponent in bytes 3 and 2: the exponent all ones is an infinity
            # (mantissa 0) or a NaN
            if chunk[i] & 0x7F == 0x7F and chunk[i - 1] & 0x80 and not (
                    infinite_ok and chunk[i - 1] & 0x7F == 0 and chunk[i - 2] == 0 and
                    chunk[i - 3] == 0):
                what = "parameter '%s'" % name if owner is None else \
                    "%s of '%s'" % (name, owner)
                v = struct.unpack("<f", chunk[i - 3:i + 1])[0]
                raise CheckpointError("checkpoint '%s': %s holds %r at position %d (a "
                                      "parameter, moment or statistic must be finite)"
                                      % (uri, what, v, (done + i) // 4))
            i += 4
        done += n


def _parse(f, uri):
    end, crc, checked = _frame(f, uri)
    # the CRC pass left garbage (a boxed CRC per chunk): collected now, the objects the
    # state keeps start at the heap's lowest hole instead of above that garbage (a resumed
    # run's state would otherwise lie spread over the hole its Module's arenas need)
    compact()
    r = FileReader(f, end, CheckpointError)
    root = r.root()
    version = r.scalar(root, _CK_CHECKPOINT_VERSION, "i", 0)
    if version != VERSION:
        raise CheckpointError("checkpoint '%s': version %d is not supported (expected %d); "
                              "write it with onnxruntime-training 1.19 or microtrain"
                              % (uri, version, VERSION))
    if r.scalar(root, _CK_CHECKPOINT_CRC32_TRAILER, "B", 0) and not checked:
        raise CheckpointError("checkpoint '%s' is truncated or corrupt: its CRC-32 trailer is "
                              "missing" % uri)
    chunk = bytearray(_CHUNK)   # _check_values reads every float through it
    state = CheckpointState()
    state._end, state._crc = end, crc
    module = r.table(root, _CK_CHECKPOINT_MODULE_STATE, "module_state")
    if module is not None:
        state.is_nominal = bool(r.scalar(module, _CK_MODULE_STATE_IS_NOMINAL_STATE, "B", 0))
        if r.scalar(module, _CK_MODULE_STATE_HAS_EXTERNAL_DATA, "B", 0):
            raise CheckpointError("checkpoints with external data are not supported")
        for index, trainable in ((_CK_MODULE_STATE_REQUIRES_GRAD_PARAMS, True),
                                 (_CK_MODULE_STATE_FROZEN_PARAMS, False)):
            for t in r.tables(module, index, "parameter"):
                name, dims, ref, dtype = _read_tensor(r, t, state.is_nominal, uri)
                if name in state.parameters:
                    raise CheckpointError("parameter '%s' appears twice" % name)
                p = Parameter(name, dims, ref, trainable, dtype)
                p._state = state
                state.parameters[name] = p
                state.parameter_order.append(name)
                _check_values(f, ref, chunk, uri, name)
    groups = r.tables(root, _CK_CHECKPOINT_OPTIMIZER_GROUPS, "optimizer group")
    if len(groups) > 1:
        raise CheckpointError("%d optimizer groups; only one is supported" % len(groups))
    for group in groups:
        state.has_optimizer_state = True
        state.optimizer_step = r.scalar(group, _CK_OPTIMIZER_GROUP_STEP, "q", 0)
        if state.optimizer_step < 0:
            raise CheckpointError("optimizer step %d is negative" % state.optimizer_step)
        state.initial_learning_rate = r.scalar(group, _CK_OPTIMIZER_GROUP_INITIAL_LEARNING_RATE,
                                               "f", 0.0)  # the schema's default
        for ps in r.tables(group, _CK_OPTIMIZER_GROUP_OPTIMIZER_STATES,
                           "parameter optimizer state"):
            _read_moments(r, ps, state, chunk, uri)
    bag = r.table(root, _CK_CHECKPOINT_PROPERTY_BAG, "property_bag")
    if bag is not None:
        for index, fmt, default in ((_CK_PROPERTY_BAG_INTS, "q", 0),
                                    (_CK_PROPERTY_BAG_FLOATS, "f", 0.0)):
            for p in r.tables(bag, index, "property"):
                name = r.string(p, _CK_INT_PROPERTY_NAME, "property name")
                value = r.scalar(p, _CK_INT_PROPERTY_VALUE, fmt, default)
                if index == _CK_PROPERTY_BAG_INTS and name.startswith(RNG_PREFIX):
                    state.random_states[name] = value
                else:
                    state.properties[name] = value
        for p in r.tables(bag, _CK_PROPERTY_BAG_STRINGS, "property"):
            # (every property table is {name, value}: IntProperty's numbers serve all three)
            state.properties[r.string(p, _CK_INT_PROPERTY_NAME, "property name")] = \
                r.string(p, _CK_INT_PROPERTY_VALUE, "property")
    return state


def _read_moments(r, ps, state, chunk, uri):
    pname = r.string(ps, _CK_PARAMETER_OPTIMIZER_STATE_PARAM_NAME, "param_name")
    moments = []
    velocity = None
    for t in r.tables(ps, _CK_PARAMETER_OPTIMIZER_STATE_MOMENTUMS, "momentum"):
        n, dims, ref, dtype = _read_tensor(r, t, False, uri)
        if dtype == ONNX_FLOAT:
            moments.append((n, ref))
        elif dtype in (ONNX_INT16, ONNX_INT32) and n == "momentum0":
            velocity = (dtype, ref)
        else:
            raise CheckpointError("%s of '%s' is not a float tensor (nor an integer "
                                  "momentum0: int16 or int32)" % (n, pname))
        _check_values(r.f, ref, chunk, uri, n, pname)
    moments.sort(key=_moment_order)
    p = state.parameters.get(pname)
    if p is None or not p.requires_grad or pname in state._momentums or \
            pname in state._velocities:
        raise CheckpointError("optimizer state for '%s', which is not a trainable "
                              "parameter or appears twice" % pname)
    if velocity is not None:
        if moments or state.is_nominal:
            raise CheckpointError("optimizer state of '%s': an integer momentum0 "
                                  "with other moments, or in a nominal checkpoint" % pname)
        count = velocity[1].nbytes // _TENSOR_TYPES[velocity[0]][0]
        if count != p.size():
            raise CheckpointError("the integer momentum velocity (momentum0) of '%s' "
                                  "has %d values; the parameter has %d"
                                  % (pname, count, p.size()))
        state._velocities[pname] = velocity
        return
    if state.is_nominal and moments:
        raise CheckpointError("a nominal checkpoint holds optimizer moments")
    for mname, ref in moments:
        if ref.nbytes // 4 != p.size():
            raise CheckpointError("%s of '%s' has %d values; the parameter has %d"
                                  % (mname, pname, ref.nbytes // 4, p.size()))
    state._momentums[pname] = [ref for _, ref in moments]
