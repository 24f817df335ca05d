"""Lowering: ONNX training / eval / optimizer graphs -> device tensors and steps.

The host does the thinking here: every shape is static, so broadcasting becomes strides,
transposes become strides, reshapes become aliases, and each node becomes one kernel call
with all its sizes precomputed. One lowering function per op type, in one table."""
import dataclasses

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from . import opcodes as op
from .errors import UnsupportedOpError
from .model import constant_value, tensor_shapes
from .optimizers import grad_buffer

FLOAT, INT32 = 0, 1
ROLES = ("input", "label", "param", "grad", "activation", "optimizer_state", "constant",
         "control")
INPUT, LABEL, PARAM, GRAD, ACTIVATION, OPTIMIZER_STATE, CONSTANT, CONTROL = range(8)
NO_TENSOR = 0xFFFFFFFF


@dataclasses.dataclass
class Tensor:
    name: str
    dtype: int
    role: int
    shape: tuple
    program: str = ""           # ACTIVATION: the program it belongs to
    data: bytes = b""           # CONSTANT: raw little-endian values
    storage: int = -1           # id of the tensor whose space it uses (itself unless an alias)
    offset: int = 0

    @property
    def size(self):
        return int(np.prod(self.shape, dtype=np.int64)) if self.shape else 1


@dataclasses.dataclass
class Step:
    op: int
    tensors: list
    ints: list
    floats: list
    node: str = ""              # the ONNX node it came from, for inspect


@dataclasses.dataclass
class Program:
    name: str
    steps: list
    inputs: list
    outputs: list


def contiguous_strides(shape):
    strides, acc = [], 1
    for d in reversed(shape):
        strides.append(acc)
        acc *= d
    return list(reversed(strides))


def broadcast_strides(out_shape, in_shape):
    """Strides of an input of in_shape read at every index of out_shape (0 = broadcast)."""
    pad = len(out_shape) - len(in_shape)
    own = contiguous_strides(in_shape)
    return [0 if i < pad or in_shape[i - pad] == 1 else own[i - pad]
            for i in range(len(out_shape))]


def collapse(shape, stride_sets, where):
    """Merge dimensions that every operand walks contiguously; drop size-1 dimensions.
    Returns (d0, d1, d2) and each operand's three strides."""
    dims = []
    for i, d in enumerate(shape):
        if d == 1:
            continue
        strides = [s[i] for s in stride_sets]
        if dims and all(p == s * d for p, s in zip(dims[-1][1], strides)):
            dims[-1] = (dims[-1][0] * d, strides)
        else:
            dims.append((d, strides))
    if len(dims) > 3:
        raise UnsupportedOpError(f"{where}: broadcasting over shape {list(shape)} needs "
                                 f"{len(dims)} strided dimensions; the kernels take 3")
    while len(dims) < 3:
        dims.insert(0, (1, [0] * len(stride_sets)))
    return [d for d, _ in dims], [[s[k] for _, s in dims] for k in range(len(stride_sets))]


def _attr(node, name, default=None):
    for a in node.attribute:
        if a.name == name:
            return helper.get_attribute_value(a)
    return default


def _axis_view(shape, axis, where):
    rank = len(shape)
    if not -rank <= axis < rank:
        raise UnsupportedOpError(f"{where}: axis {axis} out of range for shape {list(shape)}")
    axis %= rank
    return [int(np.prod(shape[:axis], dtype=np.int64)), shape[axis],
            int(np.prod(shape[axis + 1:], dtype=np.int64))]


class Lowering:
    """Collects the tensor table and the programs of one blob."""

    def __init__(self, roles):
        self.tensors = []
        self.persistent = {}      # name -> id, shared by every program
        self.roles = roles        # name -> role of every graph input
        self.programs = {}
        self.host_values = {}     # integer constants consumed here (shapes, axes)
        self.controls = {}

    # -- tensor table ----------------------------------------------------------------
    def add(self, tensor):
        tensor.storage = len(self.tensors) if tensor.storage < 0 else tensor.storage
        self.tensors.append(tensor)
        return len(self.tensors) - 1

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
        for node in graph.node:
            for i in node.input:
                self.uses[i] = self.uses.get(i, 0) + 1
        for o in graph.output:
            self.uses[o.name] = self.uses.get(o.name, 0) + 1
        for init in graph.initializer:
            self._constant(init.name, numpy_helper.to_array(init))
        inputs = []
        for vi in graph.input:
            if vi.name in self.local or vi.name in self.host_values:
                continue
            role = self.roles.get(vi.name)
            if role is None:
                raise UnsupportedOpError(f"{name} graph input '{vi.name}' has no known role")
            if role in (INPUT, LABEL):
                inputs.append(self._persistent(vi.name, role))
            elif vi.name == "lazy_reset_grad" or vi.name == "learning_rate":
                self.control(vi.name)
            elif vi.name != "step":
                self._persistent(vi.name, role)
        for node in graph.node:
            self.node_name = node.name or node.op_type
            lowering = LOWERINGS.get(node.op_type)
            if lowering is None:
                raise UnsupportedOpError(
                    f"op '{node.op_type}' (node '{self.node_name}') is not supported; "
                    f"supported ops: {', '.join(sorted(LOWERINGS))}")
            lowering(self, node)
        # The caller reads the loss and the model outputs (activations, or aliases of a
        # parameter or input, e.g. Identity(weight)); in-place results (updated parameters,
        # accumulated gradients) stay where they are.
        outputs = [self.t(o.name) for o in graph.output if o.name not in self.in_place]
        self.programs[name] = Program(name, self.steps, inputs, outputs)

    def _persistent(self, name, role):
        if name not in self.persistent:
            elem, shape = self.shapes[name]
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
        if name not in self.persistent:
            data = np.ascontiguousarray(value, dtype="<f4").tobytes()
            self.persistent[name] = self.add(Tensor(name, FLOAT, CONSTANT, tuple(value.shape),
                                                    data=data))
        self.local[name] = self.persistent[name]

    def t(self, name):
        if name in self.local:
            return self.local[name]
        raise UnsupportedOpError(f"node '{self.node_name}': tensor '{name}' is not computed "
                                 f"on the device (integer or unknown)")

    def shape(self, name):
        return tuple(self.shapes[name][1])

    def value(self, name):
        if name in self.host_values:
            return self.host_values[name]
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
                              program=base.program, storage=base.storage))
        if base.role == CONSTANT:
            self.tensors[tid].data = base.data
        self.local[out_name] = tid
        return tid

    def alias_in_place(self, out_name, in_name):
        # Updated-in-place outputs (optimizer, accumulation) name their input's storage.
        self.local[out_name] = self.t(in_name)
        self.in_place.add(out_name)

    def step(self, code, tensors, ints=(), floats=()):
        self.producer[tensors[0]] = len(self.steps)
        self.steps.append(Step(code, list(tensors), [int(i) for i in ints],
                               [float(f) for f in floats], self.node_name))

    def where(self, node):
        return f"{node.op_type} node '{self.node_name}'"


# -- lowering functions, one per op type ----------------------------------------------

def lower_gemm(ctx, node):
    a, b = node.input[0], node.input[1]
    c = node.input[2] if len(node.input) > 2 and node.input[2] else None
    sa, sb = ctx.shape(a), ctx.shape(b)
    if len(sa) != 2 or len(sb) != 2:
        raise UnsupportedOpError(f"{ctx.where(node)}: only 2-D operands are supported, got "
                                 f"{list(sa)} x {list(sb)}")
    ta, tb = _attr(node, "transA", 0), _attr(node, "transB", 0)
    m, k = (sa[1], sa[0]) if ta else sa
    n = sb[0] if tb else sb[1]
    sa_m, sa_k = (1, sa[1]) if ta else (sa[1], 1)
    sb_k, sb_n = (1, sb[1]) if tb else (sb[1], 1)
    sc = broadcast_strides((m, n), ctx.shape(c)) if c else [0, 0]
    y = ctx.define(node.output[0])
    ctx.step(op.GEMM, [y, ctx.t(a), ctx.t(b), ctx.t(c) if c else NO_TENSOR],
             [m, k, n, sa_m, sa_k, sb_k, sb_n, sc[0], sc[1]],
             [_attr(node, "alpha", 1.0), _attr(node, "beta", 1.0) if c else 0.0])


def lower_matmul(ctx, node):
    a, b = node.input
    if len(ctx.shape(a)) != 2 or len(ctx.shape(b)) != 2:
        raise UnsupportedOpError(f"{ctx.where(node)}: only 2-D operands are supported, got "
                                 f"{list(ctx.shape(a))} x {list(ctx.shape(b))}")
    lower_gemm(ctx, node)


def _binary(code):
    def lower(ctx, node):
        a, b = node.input
        out_shape = ctx.shape(node.output[0])
        strides = [contiguous_strides(out_shape), broadcast_strides(out_shape, ctx.shape(a)),
                   broadcast_strides(out_shape, ctx.shape(b))]
        dims, (_, s_a, s_b) = collapse(out_shape, strides, ctx.where(node))
        y = ctx.define(node.output[0])
        ctx.step(code, [y, ctx.t(a), ctx.t(b)], dims + s_a + s_b)
    return lower


def _unary(code):
    def lower(ctx, node):
        y = ctx.define(node.output[0])
        ctx.step(code, [y, ctx.t(node.input[0])], [ctx.tensors[y].size])
    return lower


def _activation_grad(code):
    def lower(ctx, node):
        dy, y = node.input
        dx = ctx.define(node.output[0])
        ctx.step(code, [dx, ctx.t(dy), ctx.t(y)], [ctx.tensors[dx].size])
    return lower


def _softmax(code):
    def lower(ctx, node):
        x = node.input[0]
        view = _axis_view(ctx.shape(x), _attr(node, "axis", -1), ctx.where(node))
        y = ctx.define(node.output[0])
        ctx.step(code, [y, ctx.t(x)], view)
    return lower


def _softmax_grad(code):
    def lower(ctx, node):
        dy, y = node.input
        view = _axis_view(ctx.shape(y), _attr(node, "axis", -1), ctx.where(node))
        dx = ctx.define(node.output[0])
        ctx.step(code, [dx, ctx.t(dy), ctx.t(y)], view)
    return lower


def lower_alias(ctx, node):
    # Flatten, Reshape, Identity, Squeeze, Unsqueeze: same elements, new shape, no step.
    ctx.alias(node.output[0], node.input[0])


def lower_constant(ctx, node):
    value = constant_value(node)
    if value is None:
        raise UnsupportedOpError(f"{ctx.where(node)}: sparse constants are not supported")
    ctx._constant(node.output[0], value)


def lower_pow(ctx, node):
    x, p = node.input
    exponent = ctx.value(p)
    if exponent is None or exponent.size != 1:
        raise UnsupportedOpError(f"{ctx.where(node)}: the exponent must be a constant scalar")
    y = ctx.define(node.output[0])
    ctx.step(op.POW, [y, ctx.t(x)], [ctx.tensors[y].size], [float(exponent.reshape(()))])


def _reduce_axes(ctx, node, rank):
    axes = _attr(node, "axes")
    if axes is None and len(node.input) > 1 and node.input[1]:
        value = ctx.value(node.input[1])
        if value is None:
            raise UnsupportedOpError(f"{ctx.where(node)}: axes must be a constant")
        axes = [int(v) for v in np.asarray(value).reshape(-1)]
    if not axes:
        if _attr(node, "noop_with_empty_axes", 0):
            return []
        return list(range(rank))
    return sorted(a % rank for a in axes)


def lower_reduce(ctx, node):
    x = node.input[0]
    shape = ctx.shape(x)
    axes = _reduce_axes(ctx, node, len(shape))
    kept = [1 if i in axes else d for i, d in enumerate(shape)]
    y_strides = [0 if i in axes else s for i, s in enumerate(contiguous_strides(kept))]
    dims, (_, s_y) = collapse(shape, [contiguous_strides(shape), y_strides], ctx.where(node))
    count = int(np.prod([shape[a] for a in axes], dtype=np.int64)) if axes else 1
    scale = 1.0 / count if node.op_type == "ReduceMean" else 1.0
    y = ctx.define(node.output[0])
    ctx.step(op.REDUCE_SUM, [y, ctx.t(x)], dims + s_y + [ctx.tensors[y].size], [scale])


def lower_expand(ctx, node):
    x = node.input[0]
    out_shape = ctx.shape(node.output[0])
    dims, (_, s_x) = collapse(out_shape, [contiguous_strides(out_shape),
                                          broadcast_strides(out_shape, ctx.shape(x))],
                              ctx.where(node))
    y = ctx.define(node.output[0])
    ctx.step(op.EXPAND, [y, ctx.t(x)], dims + s_x)


def _check_cross_entropy(ctx, node):
    scores = node.input[0]
    if len(ctx.shape(scores)) != 2:
        raise UnsupportedOpError(f"{ctx.where(node)}: scores must be [batch, classes], got "
                                 f"{list(ctx.shape(scores))}")
    if _attr(node, "reduction", b"mean") not in (b"mean", "mean"):
        raise UnsupportedOpError(f"{ctx.where(node)}: only reduction='mean' is supported")
    if _attr(node, "ignore_index") is not None:
        raise UnsupportedOpError(f"{ctx.where(node)}: ignore_index is not supported")
    return ctx.shape(scores)


def lower_softmax_cross_entropy(ctx, node):
    n, c = _check_cross_entropy(ctx, node)
    if len(node.input) > 2 and node.input[2]:
        raise UnsupportedOpError(f"{ctx.where(node)}: class weights are not supported")
    loss = ctx.define(node.output[0], ())
    log_prob = (ctx.define(node.output[1]) if len(node.output) > 1 and node.output[1]
                else ctx.define("", (n, c)))  # scratch: the kernel always writes it
    ctx.step(op.SOFTMAX_CE, [loss, log_prob, ctx.t(node.input[0]), ctx.t(node.input[1])], [n, c])


def lower_softmax_cross_entropy_grad(ctx, node):
    dloss, log_prob, labels = node.input
    n, c = ctx.shape(log_prob)
    dx = ctx.define(node.output[0])
    ctx.step(op.SOFTMAX_CE_GRAD, [dx, ctx.t(dloss), ctx.t(log_prob), ctx.t(labels)], [n, c])


def lower_grad_accumulate(ctx, node):
    buf, value, _ = node.input
    reset = ctx.control("lazy_reset_grad")
    produced_by = ctx.producer.get(ctx.t(value))
    gemm = ctx.steps[produced_by] if produced_by is not None else None
    if (gemm is not None and gemm.op == op.GEMM and gemm.tensors[3] == NO_TENSOR
            and ctx.uses.get(value) == 1):
        # The gradient comes from a GEMM nothing else reads: let the GEMM accumulate
        # straight into the buffer, and the temporary (weight-sized) disappears.
        gemm.op = op.GEMM_ACCUMULATE
        gemm.tensors = [ctx.t(buf)] + gemm.tensors[1:3] + [reset]
        gemm.ints = gemm.ints[:7]
        gemm.floats = gemm.floats[:1]
        fused = ctx.tensors[ctx.t(value)]
        fused.storage, fused.role, fused.program = ctx.tensors[ctx.t(buf)].storage, GRAD, ""
    else:
        ctx.step(op.ACCUMULATE, [ctx.t(buf), ctx.t(value), reset],
                 [ctx.tensors[ctx.t(buf)].size])
    ctx.alias_in_place(node.output[0], buf)


def lower_sgd(ctx, node):
    _, p, g = node.input
    ctx.step(op.SGD, [ctx.t(p), ctx.t(g), ctx.control("learning_rate")],
             [ctx.tensors[ctx.t(p)].size])
    ctx.alias_in_place(node.output[0], p)


def lower_adamw(ctx, node):
    _, _, p, g, m, v = node.input
    if _attr(node, "correct_bias", 1) not in (0, 1):
        raise UnsupportedOpError(f"{ctx.where(node)}: correct_bias must be 0 or 1")
    ctx.step(op.ADAMW, [ctx.t(p), ctx.t(g), ctx.t(m), ctx.t(v), ctx.control("learning_rate"),
                        ctx.control("step_size")],
             [ctx.tensors[ctx.t(p)].size],
             [_attr(node, "alpha", 0.9), _attr(node, "beta", 0.999), _attr(node, "epsilon", 1e-6),
              _attr(node, "weight_decay", 0.0)])
    for out, inp in zip(node.output, (p, m, v)):
        ctx.alias_in_place(out, inp)


LOWERINGS = {
    "Gemm": lower_gemm,
    "MatMul": lower_matmul,
    "Add": _binary(op.ADD),
    "Sub": _binary(op.SUB),
    "Mul": _binary(op.MUL),
    "Div": _binary(op.DIV),
    "Expand": lower_expand,
    "Neg": _unary(op.NEG),
    "Abs": _unary(op.ABS),
    "Sign": _unary(op.SIGN),
    "Exp": _unary(op.EXP),
    "Log": _unary(op.LOG),
    "Sqrt": _unary(op.SQRT),
    "Pow": lower_pow,
    "Relu": _unary(op.RELU),
    "Sigmoid": _unary(op.SIGMOID),
    "Tanh": _unary(op.TANH),
    "Softplus": _unary(op.SOFTPLUS),
    "Softmax": _softmax(op.SOFTMAX),
    "LogSoftmax": _softmax(op.LOG_SOFTMAX),
    "ReluGrad": _activation_grad(op.RELU_GRAD),
    "SigmoidGrad": _activation_grad(op.SIGMOID_GRAD),
    "TanhGrad": _activation_grad(op.TANH_GRAD),
    "SoftmaxGrad": _softmax_grad(op.SOFTMAX_GRAD),
    "LogSoftmaxGrad": _softmax_grad(op.LOG_SOFTMAX_GRAD),
    "Flatten": lower_alias,
    "Reshape": lower_alias,
    "Identity": lower_alias,
    "Squeeze": lower_alias,
    "Unsqueeze": lower_alias,
    "Constant": lower_constant,
    "ReduceSum": lower_reduce,
    "ReduceMean": lower_reduce,
    "SoftmaxCrossEntropyLoss": lower_softmax_cross_entropy,
    "SoftmaxCrossEntropyLossGrad": lower_softmax_cross_entropy_grad,
    "GradAccumulate": lower_grad_accumulate,
    "SGD": lower_sgd,
    "AdamW": lower_adamw,
}


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
    for name in meta_names(meta, "params"):
        roles[name] = PARAM
    for name in meta_names(meta, "trainable"):
        roles[grad_buffer(name)] = GRAD
    roles["lazy_reset_grad"] = CONTROL
    roles["learning_rate"] = CONTROL
    roles["step"] = CONTROL
    if optimizer_model is not None:
        for vi in optimizer_model.graph.input:
            roles.setdefault(vi.name, OPTIMIZER_STATE)
    return roles, meta
