"""Lowering: ONNX training / eval / optimizer graphs -> device tensors and steps.

The host does the thinking here: every shape is static, so broadcasting becomes strides,
transposes become strides, reshapes become aliases, and each node becomes one kernel call
with all its sizes precomputed. The Lowering walks a graph and calls, for every node, the
lowering its op family registered (registry.LOWERINGS, ops/<family>.py) into the tensor table
and programs of ir.py (where the stride arithmetic the families share lives too). Every step
is checked against the op table of the contract (contract/ops.py) as it is emitted."""
import numpy as np
from onnx import AttributeProto, TensorProto, numpy_helper

from ..contract.facts import INT32_MAX, INT32_MIN
from ..errors import UnsupportedOpError, node_name
from ..graph import optional_input
from ..ir import (ACTIVATION, CONSTANT, CONTROL, FLOAT, GRAD, INPUT, INT8, INT32, LABEL,
                  LAZY_RESET_GRAD, LEARNING_RATE, OPTIMIZER_STATE, PARAM, STEP, UINT8, Program,
                  Step, Tensor, check_step, grad_buffer)
from ..registry import LOWERINGS, lowering
from .load import constant_value, tensor_shapes

TWIN_SOURCES = ("train", "forward_backward")   # programs whose activations eval may share


class Lowering:
    """Collects the tensor table and the programs of one blob."""

    def __init__(self, roles):
        self.tensors = []
        self.persistent = {}      # name -> id, shared by every program
        self.roles = roles        # name -> role of every graph input
        self.programs = {}
        self.host_values = {}     # integer constants consumed here (shapes, axes)
        self.controls = {}
        self.twins = {}           # name -> activation of the training program (for eval)
        self.program_name = ""

    # -- tensor table ----------------------------------------------------------------
    def add(self, tensor):
        """Add a tensor; returns its id. An eval activation whose training twin (same name,
        dtype, shape and storage) exists is that twin: one table entry, and the planner
        keeps it where the training program has it (plan.assign_offsets)."""
        twin = self.twin(tensor)
        if twin is not None:
            return twin
        tensor.storage = len(self.tensors) if tensor.storage < 0 else tensor.storage
        self.tensors.append(tensor)
        tid = len(self.tensors) - 1
        if tensor.role == ACTIVATION and tensor.name and self.program_name in TWIN_SOURCES:
            self.twins.setdefault(tensor.name, tid)
        return tid

    def twin(self, tensor):
        if tensor.role != ACTIVATION or self.program_name != "eval" or not tensor.name:
            return None
        tid = self.twins.get(tensor.name)
        if tid is None:
            return None
        t = self.tensors[tid]
        own = tensor.storage < 0
        if t.role != ACTIVATION or t.dtype != tensor.dtype or tuple(t.shape) != tuple(tensor.shape) or (
                (t.storage == tid) != own) or (not own and t.storage != tensor.storage):
            return None
        return tid

    def control(self, name):
        if name not in self.persistent:
            self.persistent[name] = self.add(Tensor(name, FLOAT, CONTROL, (1,)))
        return self.persistent[name]

    # -- one program -------------------------------------------------------------------
    def lower(self, name, model):
        graph = model.graph
        self.program_name = name
        self.shapes = tensor_shapes(graph)
        self.local = {}
        self.in_place = set()
        self.steps = []
        self.producer = {}        # tensor id -> index of the step that writes it
        self.uses = {}            # tensor name -> how many nodes and graph outputs read it
        self.readers = {}         # tensor name -> op types of the nodes that read it
        for node in graph.node:
            for i in node.input:
                self.uses[i] = self.uses.get(i, 0) + 1
                self.readers.setdefault(i, set()).add(node.op_type)
        for o in graph.output:
            self.uses[o.name] = self.uses.get(o.name, 0) + 1
        # Float constants get arena space (and blob bytes) only when a step reads them: a
        # folded BatchNorm's statistics, for one, are read by no step.
        self.unplaced = {}
        for init in graph.initializer:
            self._constant(init.name, numpy_helper.to_array(init))
        inputs = []
        for vi in graph.input:
            if vi.name in self.local or vi.name in self.host_values or vi.name in self.unplaced:
                continue
            role = self.roles.get(vi.name)
            if role is None:
                raise UnsupportedOpError(f"{name} graph input '{vi.name}' has no known role")
            if role in (INPUT, LABEL):
                inputs.append(self._persistent(vi.name, role))
            elif vi.name == LAZY_RESET_GRAD or vi.name == LEARNING_RATE:
                self.control(vi.name)
            elif vi.name != STEP:
                self._persistent(vi.name, role)
        for node in graph.node:
            self.node_name = node.name or node.op_type
            lowering = LOWERINGS.get(node.op_type)
            if lowering is None:
                raise UnsupportedOpError(
                    f"op '{node.op_type}' (node {node_name(node)}) is not supported; "
                    f"supported ops: {', '.join(sorted(LOWERINGS))}")
            first = len(self.steps)
            lowering(self, node)
            self._check_int_arguments(node, first)
        # The caller reads the loss and the model outputs (activations, or aliases of a
        # parameter or input, e.g. Identity(weight)); in-place results (updated parameters,
        # accumulated gradients) stay where they are.
        outputs = [self.t(o.name) for o in graph.output if o.name not in self.in_place]
        self.programs[name] = Program(name, self.steps, inputs, outputs)

    def _check_int_arguments(self, node, first):
        """A step's int arguments are int32 in the blob and on the device: refuse a node
        whose steps (from `first`) need a value outside int32 that one of its attributes
        put there (Conv strides of 2**62), naming the attribute, rather than fail in the
        writer. An attribute the lowering reduces (a Dropout seed) is no matter. Other
        values outside int32 are sizes and strides of a tensor with more elements than
        int32 counts, which pack._check_limits refuses naming the tensor."""
        if all(INT32_MIN <= v <= INT32_MAX for step in self.steps[first:] for v in step.ints):
            return
        for attr in node.attribute:
            values = (list(attr.ints) if attr.type == AttributeProto.INTS
                      else [attr.i] if attr.type == AttributeProto.INT else [])
            if any(not INT32_MIN <= v <= INT32_MAX for v in values):
                shown = values if attr.type == AttributeProto.INTS else values[0]
                raise UnsupportedOpError(
                    f"{self.where(node)}: attribute {attr.name}={shown} does not fit the "
                    f"device's int32 step arguments (-2**31 .. 2**31 - 1)")

    def _persistent(self, name, role):
        if name not in self.persistent:
            elem, shape = self.shapes[name]
            quantized = getattr(self, "quantization", {}).get(name)
            if quantized is not None and elem in (TensorProto.INT8, TensorProto.UINT8):
                # an int8 / uint8 input or parameter (integer training: quant/inttrain.py)
                # with its scale(s), zero point(s) and axis
                scale, zero_point, axis = quantized
                self.persistent[name] = self.add(Tensor(
                    name, INT8 if elem == TensorProto.INT8 else UINT8, role, tuple(shape),
                    scale=tuple(float(v) for v in scale),
                    zero_point=tuple(int(v) for v in zero_point), axis=axis))
                self.local[name] = self.persistent[name]
                return self.persistent[name]
            dtype = INT32 if elem in (TensorProto.INT64, TensorProto.INT32) else FLOAT
            if elem not in (TensorProto.FLOAT, TensorProto.INT64, TensorProto.INT32):
                raise UnsupportedOpError(f"input '{name}' has ONNX type {elem}; only float and "
                                         f"integer labels are supported")
            self.persistent[name] = self.add(Tensor(name, dtype, role, tuple(shape)))
        self.local[name] = self.persistent[name]
        return self.persistent[name]

    def _constant(self, name, value):
        if value.dtype.kind in "iub":
            self.host_values[name] = value
            return
        if name in self.persistent:     # placed by an earlier program
            self.local[name] = self.persistent[name]
        else:
            self.unplaced[name] = value

    def _place_constant(self, name):
        value = self.unplaced.pop(name)
        data = np.ascontiguousarray(value, dtype="<f4").tobytes()
        self.persistent[name] = self.add(Tensor(name, FLOAT, CONSTANT, tuple(value.shape),
                                                data=data))
        self.local[name] = self.persistent[name]

    def t(self, name):
        if name in self.local:
            return self.local[name]
        if name in self.unplaced:
            self._place_constant(name)
            return self.local[name]
        raise UnsupportedOpError(f"node '{self.node_name}': tensor '{name}' is not computed "
                                 f"on the device (integer or unknown)")

    def shape(self, name):
        return tuple(self.shapes[name][1])

    def value(self, name):
        if name in self.host_values:
            return self.host_values[name]
        if name in self.unplaced:
            return self.unplaced[name]
        tid = self.local.get(name)
        if tid is not None and self.tensors[tid].role == CONSTANT:
            return np.frombuffer(self.tensors[tid].data, "<f4").reshape(self.tensors[tid].shape)
        return None

    def define(self, name, shape=None):
        shape = self.shape(name) if shape is None else tuple(shape)
        tid = self.add(Tensor(name, FLOAT, ACTIVATION, shape, program=self.program_name))
        if name:
            self.local[name] = tid
        return tid

    def alias(self, out_name, in_name):
        base = self.tensors[self.t(in_name)]
        tid = self.add(Tensor(out_name, base.dtype, base.role, self.shape(out_name),
                              program=base.program, storage=base.storage, scale=base.scale,
                              zero_point=base.zero_point, axis=base.axis, derived=base.derived))
        if base.role == CONSTANT:
            self.tensors[tid].data = base.data
        self.local[out_name] = tid
        return tid

    def alias_in_place(self, out_name, in_name):
        # Updated-in-place outputs (optimizer, accumulation) name their input's storage.
        self.local[out_name] = self.t(in_name)
        self.in_place.add(out_name)

    def step(self, code, tensors, ints=(), floats=()):
        check_step(code, tensors, ints, floats, self.node_name)
        self.producer[tensors[0]] = len(self.steps)
        self.steps.append(Step(code, list(tensors), [int(i) for i in ints],
                               [float(f) for f in floats], self.node_name))

    def where(self, node):
        return f"{node.op_type} node {node_name(node)}"

    def optional_value(self, node, index):
        """The constant value of the node's input `index`, or None when it is absent."""
        name = optional_input(node, index)
        return self.value(name) if name else None


# -- lowerings that belong to no op family ------------------------------------------------

@lowering("Constant")
def lower_constant(ctx, node):
    value = constant_value(node)
    if value is None:
        raise UnsupportedOpError(f"{ctx.where(node)}: sparse constants are not supported")
    ctx._constant(node.output[0], value)


def meta_names(meta, key):
    """The comma-separated names generate_artifacts stored under microtrain.<key>."""
    return [n for n in meta.get(f"microtrain.{key}", "").split(",") if n]


def roles_from_metadata(model, optimizer_model=None):
    """Role of every graph input, from the metadata generate_artifacts writes."""
    meta = {p.key: p.value for p in model.metadata_props}
    roles = {}
    for name in meta_names(meta, "inputs"):
        roles[name] = INPUT
    for name in meta_names(meta, "labels"):
        roles[name] = LABEL
    for name in meta_names(meta, "output_grads"):
        roles[name] = INPUT
    for name in meta_names(meta, "params"):
        roles[name] = PARAM
    for name in meta_names(meta, "trainable"):
        roles[grad_buffer(name)] = GRAD
    for name in meta_names(meta, "optimizer_states"):  # updates in the training graph
        roles[name] = OPTIMIZER_STATE
    for name in (LAZY_RESET_GRAD, LEARNING_RATE, STEP):
        roles[name] = CONTROL
    if optimizer_model is not None:
        for vi in optimizer_model.graph.input:
            roles.setdefault(vi.name, OPTIMIZER_STATE)
    return roles, meta
