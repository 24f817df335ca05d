# Writing a CheckpointState in ONNX Runtime's layout (checkpoint.py reads it): the
# FlatBuffer laid out front to back by fbwriter.py, tensor data taken straight from the
# arenas' views, CRC-32 trailer after it, saved atomically. Everything that could make the
# file unreadable - a counter beyond int64, a property of another type - is refused before
# any file is touched.
import math
import struct
from microtrain import fbwriter
from microtrain.crc32 import crc32
from microtrain.errors import CheckpointError
from microtrain.files import write_atomically

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
_CK_PARAMETER_OPTIMIZER_STATE_PARAM_NAME = const(0)
_CK_PARAMETER_OPTIMIZER_STATE_MOMENTUMS = const(1)
_CK_OPTIMIZER_GROUP_GROUP_NAME = const(0)
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
_ONNX_FLOAT = 1
_INT64_MAX = 0x7FFFFFFFFFFFFFFF
_FLOAT32_MAX = 3.4028234663852886e38


def write_checkpoint(state, path, include_optimizer_state):
    """Write state to path atomically (files.write_atomically); its tensors' values must be
    in RAM (arrays, or views of a Module's arenas)."""
    root = _to_flatbuffer(state, include_optimizer_state)   # checked before any file

    def write(f):
        out = _Crc32Stream(f)
        fbwriter.write(out, root, CHECKPOINT_IDENTIFIER)
        f.write(struct.pack("<I", out.crc & 0xFFFFFFFF) + TRAILER_MAGIC)

    write_atomically(path, write, CheckpointError, "checkpoint")


class _Crc32Stream:
    # Passes writes through to a file, keeping the CRC-32 of everything written.
    def __init__(self, f):
        self.f = f
        self.crc = 0

    def write(self, data):
        self.crc = crc32(data, self.crc)
        return self.f.write(data)


def _fields(*pairs):
    # a table's fields, by field number: (number, value) pairs, the rest absent
    fields = [None] * (max(number for number, _ in pairs) + 1)
    for number, value in pairs:
        fields[number] = value
    return fbwriter.Table(fields)


def _tensor(name, shape, values, nominal, dtype=_ONNX_FLOAT):
    # A nominal tensor keeps its dims and has an empty raw_data vector (ORT writes empty
    # dims there; it refuses a tensor without either vector; see contract/checkpoint.fbs).
    n = 0
    if not nominal:
        n = 1
        for d in shape:
            n *= d
    return _fields((_CK_TENSOR_NAME, fbwriter.String(name)),
                   (_CK_TENSOR_DIMS, fbwriter.Vector("q", list(shape))),
                   (_CK_TENSOR_DATA_TYPE, ("i", dtype)),
                   (_CK_TENSOR_RAW_DATA, fbwriter.Raw(values if n else b"",
                                                      _TENSOR_TYPES[dtype][0] * n)))


def _int64(value, what):
    if not -_INT64_MAX - 1 <= value <= _INT64_MAX:
        raise CheckpointError("%s %d does not fit in the checkpoint's int64" % (what, value))
    return value


def _to_flatbuffer(state, include_optimizer_state):
    # Like ORT, tensors and properties are written sorted by name.
    names = sorted(state.parameters)
    lists = ([], [])
    for name in names:
        p = state.parameters[name]
        lists[0 if p.requires_grad else 1].append(
            _tensor(name, p.shape, p.data, state.is_nominal, p.data_type))
    module = _fields((_CK_MODULE_STATE_REQUIRES_GRAD_PARAMS, fbwriter.Tables(lists[0])),
                     (_CK_MODULE_STATE_FROZEN_PARAMS, fbwriter.Tables(lists[1])),
                     (_CK_MODULE_STATE_IS_NOMINAL_STATE, ("B", 1 if state.is_nominal else 0)),
                     (_CK_MODULE_STATE_HAS_EXTERNAL_DATA, ("B", 0)))
    groups = None
    momentums = state._momentums
    velocities = state._velocities
    if include_optimizer_state and (state.has_optimizer_state or momentums or velocities):
        per_param = []
        for name in sorted(list(momentums) + list(velocities)):
            shape = state.parameters[name].shape
            if name in velocities:
                dtype, values = velocities[name]
                moments = [_tensor("momentum0", shape, values, False, dtype)]
            else:
                moments = [_tensor("momentum%d" % i, shape, m, False)
                           for i, m in enumerate(momentums[name])]
            per_param.append(_fields(
                (_CK_PARAMETER_OPTIMIZER_STATE_PARAM_NAME, fbwriter.String(name)),
                (_CK_PARAMETER_OPTIMIZER_STATE_MOMENTUMS, fbwriter.Tables(moments))))
        step = state.optimizer_step
        if not isinstance(step, int) or step < 0:
            raise CheckpointError("optimizer step %r must be an int >= 0" % (step,))
        groups = fbwriter.Tables([_fields(
            (_CK_OPTIMIZER_GROUP_GROUP_NAME, fbwriter.String("group0")),
            (_CK_OPTIMIZER_GROUP_STEP, ("q", _int64(step, "optimizer step"))),
            (_CK_OPTIMIZER_GROUP_INITIAL_LEARNING_RATE, ("f", state.initial_learning_rate)),
            (_CK_OPTIMIZER_GROUP_OPTIMIZER_STATES, fbwriter.Tables(per_param)))])
    properties = state.properties
    for name in properties:
        if not isinstance(name, str) or not name:
            raise CheckpointError("property name %r must be a non-empty str" % (name,))
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
                kind, entry = 0, ("q", _int64(int(value), "property '%s' =" % name))
            elif isinstance(value, float):
                if _FLOAT32_MAX < abs(value) < math.inf:
                    raise CheckpointError("property '%s' = %r does not fit in the "
                                          "checkpoint's float32" % (name, value))
                kind, entry = 1, ("f", value)
            elif isinstance(value, str):
                kind, entry = 2, fbwriter.String(value)
            else:
                raise CheckpointError("property '%s' must be int, float or str, not %s"
                                      % (name, type(value).__name__))
            kinds[kind].append(_fields((_CK_INT_PROPERTY_NAME, fbwriter.String(name)),
                                       (_CK_INT_PROPERTY_VALUE, entry)))
        bag = _fields((_CK_PROPERTY_BAG_INTS, fbwriter.Tables(kinds[0])),
                      (_CK_PROPERTY_BAG_FLOATS, fbwriter.Tables(kinds[1])),
                      (_CK_PROPERTY_BAG_STRINGS, fbwriter.Tables(kinds[2])))
    return _fields((_CK_CHECKPOINT_VERSION, ("i", VERSION)),
                   (_CK_CHECKPOINT_MODULE_STATE, module),
                   (_CK_CHECKPOINT_OPTIMIZER_GROUPS, groups),
                   (_CK_CHECKPOINT_PROPERTY_BAG, bag),
                   (_CK_CHECKPOINT_CRC32_TRAILER, ("B", 1)))
