# CheckpointState: parameters, optimizer state and properties, in the layout of ONNX
# Runtime's training checkpoint (file identifier "ODTC", version 2; our own schema in
# host/microtrain_host/schema/checkpoint.fbs). Field numbers used below:
#   Checkpoint{0 version:int32, 1 module_state, 2 optimizer_groups, 3 property_bag}
#   ModuleState{0 requires_grad_params, 1 frozen_params, 2 is_nominal_state, 3 has_external_data}
#   Tensor{0 name, 1 doc_string, 2 dims:[int64], 3 data_type:int32, 4 raw_data:[ubyte]}
#   OptimizerGroup{0 group_name, 1 step:int64, 2 initial_learning_rate:float, 3 optimizer_states}
#   ParameterOptimizerState{0 param_name, 1 momentums:[Tensor]}
#   PropertyBag{0 ints, 1 floats, 2 strings}, each property {0 name, 1 value}
import os
from array import array
from microtrain import fbwriter
from microtrain.errors import CheckpointError
from microtrain.flatbuf import Reader

IDENTIFIER = b"ODTC"
VERSION = 2
ONNX_FLOAT = 1


class Parameter:
    """One named parameter. `data` is an array('f') until a Module binds it; from then on
    it is a view of the Module's arena, so it always shows the current values."""

    def __init__(self, name, shape, data, requires_grad):
        self.name = name
        self.shape = shape
        self.data = data
        self.requires_grad = requires_grad
        self.grad = None

    def size(self):
        n = 1
        for d in self.shape:
            n *= d
        return n


class CheckpointState:
    def __init__(self):
        self.parameters = {}       # name -> Parameter, in file order
        self.properties = {}       # name -> int, float or str
        self.is_nominal = False
        self.optimizer_step = 0
        self.initial_learning_rate = 0.001
        self.momentums = {}        # parameter name -> [array('f'), ...]
        self.parameter_order = []  # names in file order (dict order on MicroPython is not)

    @staticmethod
    def load_checkpoint(uri):
        try:
            with open(uri, "rb") as f:
                data = f.read()
        except OSError as e:
            raise CheckpointError("cannot read checkpoint '%s': %s" % (uri, e))
        return _parse(data, uri)

    @staticmethod
    def save_checkpoint(state, uri, include_optimizer_state=False):
        # Write a temporary file, then rename it over the old one: an interrupted save
        # leaves the previous checkpoint in place.
        tmp = uri + ".tmp"
        try:
            with open(tmp, "wb") as f:
                fbwriter.write(f, _to_flatbuffer(state, include_optimizer_state), IDENTIFIER)
            try:
                os.rename(tmp, uri)
            except OSError:
                # Some board filesystems will not rename over an existing file.
                os.remove(uri)
                os.rename(tmp, uri)
        except OSError as e:
            raise CheckpointError("cannot write checkpoint '%s': %s" % (uri, e))


def _read_tensor(r, t, nominal):
    name = r.string(t, 0, "tensor name")
    dims = tuple(r.scalars(t, 2, "q", "tensor dims"))
    dtype = r.scalar(t, 3, "i", 0)
    pos, nbytes = r.vector(t, 4, 1, "raw_data of '%s'" % name)
    if nominal:
        return name, dims, None
    if dtype != ONNX_FLOAT:
        raise CheckpointError("tensor '%s' has ONNX data type %d; only float (1) is supported"
                              % (name, dtype))
    count = 1
    for d in dims:
        if d < 0:
            raise CheckpointError("tensor '%s' has a negative dimension" % name)
        count *= d
    if nbytes != 4 * count:
        raise CheckpointError("tensor '%s' has %d data bytes; dims %r need %d"
                              % (name, nbytes, dims, 4 * count))
    return name, dims, array("f", bytes(r.buf[pos:pos + nbytes]))


def _first(pair):
    return pair[0]


def _parse(data, uri):
    r = Reader(data, CheckpointError)
    if len(data) < 8 or r.identifier() != IDENTIFIER:
        raise CheckpointError("'%s' is not a training checkpoint (identifier %r, expected %r)"
                              % (uri, bytes(data[4:8]), IDENTIFIER))
    root = r.root()
    version = r.scalar(root, 0, "i", 0)
    if version != VERSION:
        raise CheckpointError("checkpoint version %d is not supported (expected %d)"
                              % (version, VERSION))
    state = CheckpointState()
    module = r.table(root, 1, "module_state")
    if module is not None:
        state.is_nominal = bool(r.scalar(module, 2, "B", 0))
        if r.scalar(module, 3, "B", 0):
            raise CheckpointError("checkpoints with external data are not supported")
        for index, trainable in ((0, True), (1, False)):
            for t in r.tables(module, index, "parameter"):
                name, dims, values = _read_tensor(r, t, state.is_nominal)
                state.parameters[name] = Parameter(name, dims, values, trainable)
                state.parameter_order.append(name)
    for group in r.tables(root, 2, "optimizer group"):
        state.optimizer_step = r.scalar(group, 1, "q", 0)
        state.initial_learning_rate = r.scalar(group, 2, "f", 0.0)  # schema default
        for ps in r.tables(group, 3, "parameter optimizer state"):
            pname = r.string(ps, 0, "param_name")
            moments = [(n, v) for n, _, v in
                       (_read_tensor(r, t, False) for t in r.tables(ps, 1, "momentum"))]
            moments.sort(key=_first)  # by name only: arrays do not compare on MicroPython
            state.momentums[pname] = [v for _, v in moments]
    bag = r.table(root, 3, "property_bag")
    if bag is not None:
        for index, fmt, default in ((0, "q", 0), (1, "f", 0.0)):
            for p in r.tables(bag, index, "property"):
                state.properties[r.string(p, 0, "property name")] = r.scalar(p, 1, fmt, default)
        for p in r.tables(bag, 2, "property"):
            state.properties[r.string(p, 0, "property name")] = r.string(p, 1, "property")
    return state


def _tensor(name, shape, values, nominal):
    if nominal:
        return fbwriter.Table([fbwriter.String(name), None, None, ("i", ONNX_FLOAT), None])
    n = 1
    for d in shape:
        n *= d
    return fbwriter.Table([fbwriter.String(name), None, fbwriter.Vector("q", list(shape)),
                           ("i", ONNX_FLOAT), fbwriter.Raw(values, 4 * n)])


def _to_flatbuffer(state, include_optimizer_state):
    # Like ORT, tensors and properties are written sorted by name.
    names = sorted(state.parameters)
    lists = ([], [])
    for name in names:
        p = state.parameters[name]
        lists[0 if p.requires_grad else 1].append(
            _tensor(name, p.shape, p.data, state.is_nominal))
    module = fbwriter.Table([fbwriter.Tables(lists[0]), fbwriter.Tables(lists[1]),
                             ("B", 1 if state.is_nominal else 0), ("B", 0)])
    groups = None
    if include_optimizer_state and state.momentums:
        per_param = []
        for name in sorted(state.momentums):
            shape = state.parameters[name].shape
            moments = [_tensor("momentum%d" % i, shape, m, False)
                       for i, m in enumerate(state.momentums[name])]
            per_param.append(fbwriter.Table([fbwriter.String(name), fbwriter.Tables(moments)]))
        groups = fbwriter.Tables([fbwriter.Table([
            fbwriter.String("group0"), ("q", state.optimizer_step),
            ("f", state.initial_learning_rate), fbwriter.Tables(per_param)])])
    bag = None
    if state.properties:
        kinds = ([], [], [])
        for name in sorted(state.properties):
            value = state.properties[name]
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
    return fbwriter.Table([("i", VERSION), module, groups, bag])
