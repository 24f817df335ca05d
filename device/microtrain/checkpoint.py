# CheckpointState: parameters, optimizer state and properties, in the layout of ONNX
# Runtime's training checkpoint (file identifier "ODTC", version 2; our own schema in
# host/microtrain_host/schema/checkpoint.fbs). Field numbers used below:
#   Checkpoint{0 version:int32, 1 module_state, 2 optimizer_groups, 3 property_bag}
#   ModuleState{0 requires_grad_params, 1 frozen_params, 2 is_nominal_state, 3 has_external_data}
#   Tensor{0 name, 1 doc_string, 2 dims:[int64], 3 data_type:int32, 4 raw_data:[ubyte]}
#   OptimizerGroup{0 group_name, 1 step:int64, 2 initial_learning_rate:float, 3 optimizer_states}
#   ParameterOptimizerState{0 param_name, 1 momentums:[Tensor]}
#   PropertyBag{0 ints, 1 floats, 2 strings}, each property {0 name, 1 value}
#   Checkpoint field 4, crc32_trailer:bool, is microtrain's own (ORT ignores it): the file
#   ends in an 8-byte trailer, the CRC-32 of all bytes before it and b"MTCK". A file with
#   the trailer must match it; one whose root asks for it but lacks it was cut short; files
#   written by ORT have neither and load unchecked.
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
from microtrain import fbwriter
from microtrain.files import open_existing, read_whole, write_atomically
from microtrain.crc32 import crc32
from microtrain.errors import CheckpointError
from microtrain.flatbuf import Reader

IDENTIFIER = b"ODTC"
VERSION = 2
ONNX_FLOAT = 1
ONNX_INT8 = 3              # integer training (kernels/inttrain.py): int8 weights ...
ONNX_INT16 = 5             # ... their int16 momentum velocities ...
ONNX_INT32 = 6             # ... and int32 biases (and their velocities), as ONNX tensor types
_ITEM = {ONNX_FLOAT: (4, "f"), ONNX_INT8: (1, "b"), ONNX_INT16: (2, "h"), ONNX_INT32: (4, "i")}
TRAILER_MAGIC = b"MTCK"
RNG_PREFIX = "microtrain.rng."


class Parameter:
    """One named parameter. `data` is an array('f') until a Module binds it; from then on
    it is a view of the Module's arena, so it always shows the current values."""

    def __init__(self, name, shape, data, requires_grad, data_type=ONNX_FLOAT):
        self.name = name
        self.shape = shape
        self.data = data
        self.requires_grad = requires_grad
        self.grad = None
        self.data_type = data_type  # ONNX: float (1), or int8 (3) / int32 (6) of a layer
                                    # trained in integers (its data then raw int8 bytes
                                    # or int32 values)

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
        self.momentums = {}        # parameter name -> [array('f'), ...]
        self.int_velocities = {}   # parameter name -> (ONNX_INT16 or ONNX_INT32, values):
                                   # integer momentum (see the top of this file); bound by
                                   # Module to views of the arena
        self.has_optimizer_state = False  # the file had an optimizer group
        self.parameter_order = []  # names in file order (dict order on MicroPython is not)
        self.random_states = {}    # RNG_PREFIX + k -> int, as loaded (Dropout generators)
        self._random_source = None  # set by Module: returns the current random_states

    @staticmethod
    def load_checkpoint(checkpoint_uri):
        """Read and validate a checkpoint. When `checkpoint_uri` is missing but its .bak
        exists (a save on a filesystem that cannot rename over a file was cut off half-way,
        see write_atomically), the .bak file, the previous checkpoint, is loaded."""
        try:
            f, path = open_existing(checkpoint_uri)
            with f:
                data = read_whole(f)
        except OSError as e:
            raise CheckpointError("cannot read checkpoint '%s': %s" % (checkpoint_uri, e))
        return _parse(data, path)

    @staticmethod
    def save_checkpoint(state, checkpoint_uri, include_optimizer_state=False):
        """Write the checkpoint atomically (write_atomically): an interrupted save leaves
        the previous checkpoint in place. include_optimizer_state=True also writes the
        optimizer state (moments; integer training's momentum velocities) and the
        generators' states (properties microtrain.rng.*: Dropout, stochastic rounding), so
        that a resumed run continues as the uninterrupted one."""
        if not isinstance(state, CheckpointState):
            raise CheckpointError("save_checkpoint(state, checkpoint_uri, include_optimizer_state"
                                  "=False): state must be a CheckpointState, not %s"
                                  % type(state).__name__)

        def write(f):
            out = _Crc32Stream(f)
            fbwriter.write(out, _to_flatbuffer(state, include_optimizer_state), IDENTIFIER)
            f.write(struct.pack("<I", out.crc & 0xFFFFFFFF) + TRAILER_MAGIC)

        write_atomically(checkpoint_uri, write, CheckpointError, "checkpoint")


def _read_tensor(r, t, nominal):
    name = r.string(t, 0, "tensor name")
    if not name:
        raise CheckpointError("a tensor of the checkpoint has no name")
    dims = tuple(r.scalars(t, 2, "q", "tensor dims"))
    dtype = r.scalar(t, 3, "i", 0)
    pos, nbytes = r.vector(t, 4, 1, "raw_data of '%s'" % name)
    if dtype not in _ITEM:
        raise CheckpointError("tensor '%s' has ONNX data type %d; only float (1), int8 (3), "
                              "int16 (5) and int32 (6) are supported" % (name, dtype))
    if r.scalar(t, 6, "q", -1) != -1:
        raise CheckpointError("tensor '%s' keeps its data in an external file, which is not "
                              "supported" % name)
    if nominal:
        return name, dims, None, dtype
    count = 1
    for d in dims:
        if d < 0:
            raise CheckpointError("tensor '%s' has a negative dimension" % name)
        count *= d
    item, code = _ITEM[dtype]
    if nbytes != item * count:
        raise CheckpointError("tensor '%s' has %d data bytes; dims %r need %d"
                              % (name, nbytes, dims, item * count))
    return name, dims, array(code, bytes(r.buf[pos:pos + nbytes])), dtype


def _moment_order(pair):
    # momentum0, momentum1, ..., momentum10: shorter names first
    return (len(pair[0]), pair[0])


class _Crc32Stream:
    # Passes writes through to a file, keeping the CRC-32 of everything written.
    def __init__(self, f):
        self.f = f
        self.crc = 0

    def write(self, data):
        self.crc = crc32(data, self.crc)
        return self.f.write(data)


def _check_trailer(data, uri):
    # The FlatBuffer without its trailer (verified), or None when the file has no trailer.
    n = len(data)
    if n < 16 or bytes(data[n - 4:]) != TRAILER_MAGIC:
        return None
    body = memoryview(data)[:n - 8]
    if crc32(body) & 0xFFFFFFFF != struct.unpack_from("<I", data, n - 8)[0]:
        raise CheckpointError("checkpoint '%s' is corrupt: its CRC-32 does not match" % uri)
    return body


def _parse(data, uri):
    if len(data) < 8 or bytes(data[4:8]) != IDENTIFIER:
        raise CheckpointError("'%s' is not a training checkpoint (identifier %r, expected %r)"
                              % (uri, bytes(data[4:8]), IDENTIFIER))
    body = _check_trailer(data, uri)
    checked = body is not None
    if checked:
        data = body
    r = Reader(data, CheckpointError)
    root = r.root()
    version = r.scalar(root, 0, "i", 0)
    if version != VERSION:
        raise CheckpointError("checkpoint '%s': version %d is not supported (expected %d); "
                              "write it with onnxruntime-training 1.19 or microtrain"
                              % (uri, version, VERSION))
    if r.scalar(root, 4, "B", 0) and not checked:
        raise CheckpointError("checkpoint '%s' is truncated or corrupt: its CRC-32 trailer is "
                              "missing" % uri)
    state = CheckpointState()
    module = r.table(root, 1, "module_state")
    if module is not None:
        state.is_nominal = bool(r.scalar(module, 2, "B", 0))
        if r.scalar(module, 3, "B", 0):
            raise CheckpointError("checkpoints with external data are not supported")
        for index, trainable in ((0, True), (1, False)):
            for t in r.tables(module, index, "parameter"):
                name, dims, values, dtype = _read_tensor(r, t, state.is_nominal)
                if name in state.parameters:
                    raise CheckpointError("parameter '%s' appears twice" % name)
                state.parameters[name] = Parameter(name, dims, values, trainable, dtype)
                state.parameter_order.append(name)
    groups = r.tables(root, 2, "optimizer group")
    if len(groups) > 1:
        raise CheckpointError("%d optimizer groups; only one is supported" % len(groups))
    for group in groups:
        state.has_optimizer_state = True
        state.optimizer_step = r.scalar(group, 1, "q", 0)
        if state.optimizer_step < 0:
            raise CheckpointError("optimizer step %d is negative" % state.optimizer_step)
        state.initial_learning_rate = r.scalar(group, 2, "f", 0.0)  # schema default
        for ps in r.tables(group, 3, "parameter optimizer state"):
            pname = r.string(ps, 0, "param_name")
            moments = []
            velocity = None
            for t in r.tables(ps, 1, "momentum"):
                n, _, v, dtype = _read_tensor(r, t, False)
                if dtype == ONNX_FLOAT:
                    moments.append((n, v))
                elif dtype in (ONNX_INT16, ONNX_INT32) and n == "momentum0":
                    velocity = (dtype, v)
                else:
                    raise CheckpointError("%s of '%s' is not a float tensor (nor an integer "
                                          "momentum0: int16 or int32)" % (n, pname))
            moments.sort(key=_moment_order)  # by name only: arrays do not compare on MicroPython
            p = state.parameters.get(pname)
            if p is None or not p.requires_grad or pname in state.momentums or \
                    pname in state.int_velocities:
                raise CheckpointError("optimizer state for '%s', which is not a trainable "
                                      "parameter or appears twice" % pname)
            if velocity is not None:
                if moments or state.is_nominal:
                    raise CheckpointError("optimizer state of '%s': an integer momentum0 "
                                          "with other moments, or in a nominal checkpoint"
                                          % pname)
                if len(velocity[1]) != p.size():
                    raise CheckpointError("the integer momentum velocity (momentum0) of '%s' "
                                          "has %d values; the parameter has %d"
                                          % (pname, len(velocity[1]), p.size()))
                state.int_velocities[pname] = velocity
                continue
            if state.is_nominal and moments:
                raise CheckpointError("a nominal checkpoint holds optimizer moments")
            for mname, v in moments:
                if len(v) != p.size():
                    raise CheckpointError("%s of '%s' has %d values; the parameter has %d"
                                          % (mname, pname, len(v), p.size()))
            state.momentums[pname] = [v for _, v in moments]
    bag = r.table(root, 3, "property_bag")
    if bag is not None:
        for index, fmt, default in ((0, "q", 0), (1, "f", 0.0)):
            for p in r.tables(bag, index, "property"):
                name = r.string(p, 0, "property name")
                value = r.scalar(p, 1, fmt, default)
                if index == 0 and name.startswith(RNG_PREFIX):
                    state.random_states[name] = value
                else:
                    state.properties[name] = value
        for p in r.tables(bag, 2, "property"):
            state.properties[r.string(p, 0, "property name")] = r.string(p, 1, "property")
    return state


def _tensor(name, shape, values, nominal, dtype=ONNX_FLOAT):
    # A nominal tensor keeps its dims and has an empty raw_data vector (ORT writes empty
    # dims there; it refuses a tensor without either vector; see schema/checkpoint.fbs).
    n = 0
    if not nominal:
        n = 1
        for d in shape:
            n *= d
    return fbwriter.Table([fbwriter.String(name), None, fbwriter.Vector("q", list(shape)),
                           ("i", dtype), fbwriter.Raw(values if n else b"", _ITEM[dtype][0] * n)])


def _to_flatbuffer(state, include_optimizer_state):
    # Like ORT, tensors and properties are written sorted by name.
    names = sorted(state.parameters)
    lists = ([], [])
    for name in names:
        p = state.parameters[name]
        lists[0 if p.requires_grad else 1].append(
            _tensor(name, p.shape, p.data, state.is_nominal, p.data_type))
    module = fbwriter.Table([fbwriter.Tables(lists[0]), fbwriter.Tables(lists[1]),
                             ("B", 1 if state.is_nominal else 0), ("B", 0)])
    groups = None
    velocities = state.int_velocities
    if include_optimizer_state and (state.has_optimizer_state or state.momentums or velocities):
        per_param = []
        for name in sorted(list(state.momentums) + list(velocities)):
            shape = state.parameters[name].shape
            if name in velocities:
                dtype, values = velocities[name]
                moments = [_tensor("momentum0", shape, values, False, dtype)]
            else:
                moments = [_tensor("momentum%d" % i, shape, m, False)
                           for i, m in enumerate(state.momentums[name])]
            per_param.append(fbwriter.Table([fbwriter.String(name), fbwriter.Tables(moments)]))
        groups = fbwriter.Tables([fbwriter.Table([
            fbwriter.String("group0"), ("q", state.optimizer_step),
            ("f", state.initial_learning_rate), fbwriter.Tables(per_param)])])
    properties = state.properties
    for name in properties:
        if name.startswith(RNG_PREFIX):
            raise CheckpointError("property '%s': names starting with '%s' are reserved for "
                                  "the Dropout generators' states" % (name, RNG_PREFIX))
    if include_optimizer_state:
        source = state._random_source
        randoms = source() if source is not None else state.random_states
        if randoms:
            properties = dict(properties)
            properties.update(randoms)
    bag = None
    if properties:
        kinds = ([], [], [])
        for name in sorted(properties):
            value = properties[name]
            if isinstance(value, bool) or isinstance(value, int):
                kinds[0].append(fbwriter.Table([fbwriter.String(name), ("q", int(value))]))
            elif isinstance(value, float):
                kinds[1].append(fbwriter.Table([fbwriter.String(name), ("f", value)]))
            elif isinstance(value, str):
                kinds[2].append(fbwriter.Table([fbwriter.String(name), fbwriter.String(value)]))
            else:
                raise CheckpointError("property '%s' must be int, float or str, not %s"
                                      % (name, type(value).__name__))
        bag = fbwriter.Table([fbwriter.Tables(k) for k in kinds])
    return fbwriter.Table([("i", VERSION), module, groups, bag, ("B", 1)])
