"""Lowering: ONNX training / eval / optimizer graphs -> device tensors and steps.

The host does the thinking here: every shape is static, so broadcasting becomes strides,
transposes become strides, reshapes become aliases, and each node becomes one kernel call
with all its sizes precomputed. One lowering function per op type, in one table."""
import dataclasses
import math

import numpy as np
from onnx import TensorProto, numpy_helper

from .. import opcodes as op
from ..ops.conv import conv_attributes, device_geometry, output_spatial
from ..errors import UnsupportedOpError
from ..graph import attr
from ..ops.layout import matmul_views, pad_amounts, slice_windows
from .load import constant_value, tensor_shapes
from ..ops.norm import RANDOM_SPAN, batch_norm_training, dropout_config
from .optimizers import grad_buffer
from ..ops.pool import pool_kernel_ints

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


def collapse(shape, stride_sets, where, rank=3):
    """Merge dimensions that every operand walks contiguously; drop size-1 dimensions.
    Returns `rank` dimensions (d0, d1, d2 by default) and each operand's strides for them."""
    dims = []
    for i, d in enumerate(shape):
        if d == 1:
            continue
        strides = [s[i] for s in stride_sets]
        if dims and all(p == s * d for p, s in zip(dims[-1][1], strides)):
            dims[-1] = (dims[-1][0] * d, strides)
        else:
            dims.append((d, strides))
    if len(dims) > rank:
        raise UnsupportedOpError(f"{where}: broadcasting over shape {list(shape)} needs "
                                 f"{len(dims)} strided dimensions; the kernels take {rank}")
    while len(dims) < rank:
        dims.insert(0, (1, [0] * len(stride_sets)))
    return [d for d, _ in dims], [[s[k] for _, s in dims] for k in range(len(stride_sets))]


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
    ta, tb = attr(node, "transA", 0), attr(node, "transB", 0)
    m, k = (sa[1], sa[0]) if ta else sa
    n = sb[0] if tb else sb[1]
    sa_m, sa_k = (1, sa[1]) if ta else (sa[1], 1)
    sb_k, sb_n = (1, sb[1]) if tb else (sb[1], 1)
    sc = broadcast_strides((m, n), ctx.shape(c)) if c else [0, 0]
    y = ctx.define(node.output[0])
    ctx.step(op.GEMM, [y, ctx.t(a), ctx.t(b), ctx.t(c) if c else NO_TENSOR],
             [m, k, n, sa_m, sa_k, sb_k, sb_n, sc[0], sc[1]],
             [attr(node, "alpha", 1.0), attr(node, "beta", 1.0) if c else 0.0])


def lower_matmul(ctx, node):
    # numpy's rules: 1-D operands get a unit dimension, batch dimensions broadcast.
    a, b = node.input
    view_a, view_b, _ = matmul_views(ctx.shape(a), ctx.shape(b), ctx.where(node))
    _matmul(ctx, node, view_a, view_b, 0, 0, 1.0)


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
        view = _axis_view(ctx.shape(x), attr(node, "axis", -1), ctx.where(node))
        y = ctx.define(node.output[0])
        ctx.step(code, [y, ctx.t(x)], view)
    return lower


def _softmax_grad(code):
    def lower(ctx, node):
        dy, y = node.input
        view = _axis_view(ctx.shape(y), attr(node, "axis", -1), ctx.where(node))
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
    axes = attr(node, "axes")
    if axes is None and len(node.input) > 1 and node.input[1]:
        value = ctx.value(node.input[1])
        if value is None:
            raise UnsupportedOpError(f"{ctx.where(node)}: axes must be a constant")
        axes = [int(v) for v in np.asarray(value).reshape(-1)]
    if not axes:
        if attr(node, "noop_with_empty_axes", 0):
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
    if count == 0 and node.op_type == "ReduceMean":
        raise UnsupportedOpError(f"{ctx.where(node)}: the mean of '{x}' (shape {list(shape)}) "
                                 f"over axes {axes} is a mean of no elements")
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
    if attr(node, "reduction", "mean") != "mean":
        raise UnsupportedOpError(f"{ctx.where(node)}: only reduction='mean' is supported")
    if attr(node, "ignore_index") is not None:
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
    producer = ctx.steps[produced_by] if produced_by is not None else None
    fusable = producer is not None and ctx.uses.get(value) == 1
    if fusable and producer.op == op.GEMM and producer.tensors[3] == NO_TENSOR:
        # The gradient comes from a GEMM nothing else reads: let the GEMM accumulate
        # straight into the buffer, and the temporary (weight-sized) disappears.
        producer.op = op.GEMM_ACCUMULATE
        producer.tensors = [ctx.t(buf)] + producer.tensors[1:3] + [reset]
        producer.ints = producer.ints[:7]
        producer.floats = producer.floats[:1]
    elif fusable and producer.op == op.CONV_GRAD_WEIGHT:
        # Likewise a convolution's weight gradient: given the reset flag, its kernel adds
        # into the buffer itself.
        producer.tensors = [ctx.t(buf)] + producer.tensors[1:3] + [reset]
    else:
        fusable = False
        ctx.step(op.ACCUMULATE, [ctx.t(buf), ctx.t(value), reset],
                 [ctx.tensors[ctx.t(buf)].size])
    if fusable:  # the gradient temporary now names the buffer's space
        fused = ctx.tensors[ctx.t(value)]
        fused.storage, fused.role, fused.program = ctx.tensors[ctx.t(buf)].storage, GRAD, ""
    ctx.alias_in_place(node.output[0], buf)


def _optional_inputs(node, count):
    return list(node.input) + [""] * (count - len(node.input))


def _penalties(ctx, node):
    l1, l2 = attr(node, "l1_penalty", 0.0), attr(node, "l2_penalty", 0.0)
    if l1 < 0 or l2 < 0:
        raise UnsupportedOpError(f"{ctx.where(node)}: l1_penalty and l2_penalty must be >= 0, "
                                 f"got {l1}, {l2}")
    return [l1, l2]


def lower_clip_grad_norm(ctx, node):
    # Inputs g1, p1, g2, p2, ...: one pass summing the squared penalized gradients into the
    # output, then that sum becomes the clipping factor in place.
    max_norm = attr(node, "max_norm", 1.0)
    if not max_norm > 0 or len(node.input) % 2:
        raise UnsupportedOpError(f"{ctx.where(node)}: needs (gradient, parameter) pairs and "
                                 f"max_norm > 0, got {len(node.input)} inputs, max_norm {max_norm}")
    coef = ctx.define(node.output[0], (1,))
    penalties = _penalties(ctx, node)
    for k in range(0, len(node.input), 2):
        g, p = ctx.t(node.input[k]), ctx.t(node.input[k + 1])
        ctx.step(op.GRAD_NORM_SQUARED, [coef, g, p], [ctx.tensors[p].size, int(k == 0)],
                 penalties)
    ctx.step(op.CLIP_COEF, [coef], [], [max_norm])


def lower_sgd(ctx, node):
    _, p, g, step, buf, coef = _optional_inputs(node, 6)
    momentum, dampening = attr(node, "momentum", 0.0), attr(node, "dampening", 0.0)
    nesterov, weight_decay = attr(node, "nesterov", 0), attr(node, "weight_decay", 0.0)
    penalties = _penalties(ctx, node)
    if momentum < 0 or weight_decay < 0 or nesterov not in (0, 1):
        raise UnsupportedOpError(f"{ctx.where(node)}: momentum {momentum} and weight_decay "
                                 f"{weight_decay} must be >= 0, nesterov 0 or 1")
    if bool(momentum) != bool(buf) or (buf and not step):
        raise UnsupportedOpError(f"{ctx.where(node)}: momentum {momentum} needs the momentum "
                                 f"buffer and step inputs exactly when it is not 0")
    if nesterov and (not momentum or dampening):
        raise UnsupportedOpError(f"{ctx.where(node)}: nesterov needs momentum > 0 and "
                                 f"dampening 0, got momentum {momentum}, dampening {dampening}")
    size = ctx.tensors[ctx.t(p)].size
    lr = ctx.control("learning_rate")
    if not (buf or coef or weight_decay or any(penalties)):
        ctx.step(op.SGD, [ctx.t(p), ctx.t(g), lr], [size])  # plain SGD: the fast kernel
    else:
        ctx.step(op.SGD_GENERAL, [ctx.t(p), ctx.t(g), lr,
                                  ctx.control("step") if buf else NO_TENSOR,
                                  ctx.t(buf) if buf else NO_TENSOR,
                                  ctx.t(coef) if coef else NO_TENSOR],
                 [size, nesterov], [momentum, dampening, weight_decay] + penalties)
    for out, inp in zip(node.output, (p, buf)):
        ctx.alias_in_place(out, inp)


def lower_adamw(ctx, node):
    _, _, p, g, m, v, coef = _optional_inputs(node, 7)
    if attr(node, "correct_bias", 1) not in (0, 1):
        raise UnsupportedOpError(f"{ctx.where(node)}: correct_bias must be 0 or 1")
    if attr(node, "adam_mode", 1) != 1:
        raise UnsupportedOpError(f"{ctx.where(node)}: only adam_mode 1 (the Hugging Face "
                                 f"AdamW rule) is supported")
    penalties = _penalties(ctx, node)
    tensors = [ctx.t(p), ctx.t(g), ctx.t(m), ctx.t(v), ctx.control("learning_rate"),
               ctx.control("step_size")]
    floats = [attr(node, "alpha", 0.9), attr(node, "beta", 0.999),
              attr(node, "epsilon", 1e-6), attr(node, "weight_decay", 0.0)]
    size = [ctx.tensors[ctx.t(p)].size]
    if coef or any(penalties):
        ctx.step(op.ADAMW_GENERAL, tensors + [ctx.t(coef) if coef else NO_TENSOR], size,
                 floats + penalties)
    else:
        ctx.step(op.ADAMW, tensors, size, floats)
    for out, inp in zip(node.output, (p, m, v)):
        ctx.alias_in_place(out, inp)


# -- layout ops: every one is a strided copy (kernels/layout.py) ------------------------

def _strided_copy(ctx, y, x, shape, y_start, y_strides, x_start, x_strides,
                  code=op.STRIDED_COPY):
    """Steps that copy a window of `shape` elements, Y[y_start + i.y_strides] =
    X[x_start + i.x_strides] (+= with STRIDED_ADD). The kernel walks four dimensions; a
    window that needs more after merging becomes one step per index of the leading ones."""
    if 0 in shape:
        return
    dims, (s_y, s_x) = collapse(shape, [y_strides, x_strides], ctx.node_name,
                                rank=max(4, len(shape)))
    lead = len(dims) - 4
    for index in np.ndindex(*dims[:lead]):
        at_y = y_start + sum(i * s for i, s in zip(index, s_y))
        at_x = x_start + sum(i * s for i, s in zip(index, s_x))
        ctx.step(code, [y, x], [at_y, at_x] + dims[lead:] + s_y[lead:] + s_x[lead:])


def _fill(ctx, y, value):
    ctx.step(op.FILL, [y], [ctx.tensors[y].size], [value])


def lower_transpose(ctx, node):
    x = node.input[0]
    shape = ctx.shape(x)
    perm = attr(node, "perm") or list(reversed(range(len(shape))))
    if sorted(perm) != list(range(len(shape))):
        raise UnsupportedOpError(f"{ctx.where(node)}: perm {list(perm)} is not a permutation "
                                 f"of the {len(shape)} axes")
    moved = [p for p in perm if shape[p] != 1]
    if moved == sorted(moved):  # only unit dimensions move: the same elements in order
        ctx.alias(node.output[0], x)
        return
    out_shape = [shape[p] for p in perm]
    strides = contiguous_strides(shape)
    y = ctx.define(node.output[0])
    _strided_copy(ctx, y, ctx.t(x), out_shape, 0, contiguous_strides(out_shape), 0,
                  [strides[p] for p in perm])


def _optional_value(ctx, node, index):
    return ctx.value(node.input[index]) if len(node.input) > index and node.input[index] \
        else None


def _slice_window(ctx, node, shape, first):
    """(start, strides, window shape) of the elements Slice picks from a tensor of shape;
    starts, ends, axes and steps are the inputs from index `first` on."""
    windows = slice_windows(shape, ctx.value(node.input[first]),
                            ctx.value(node.input[first + 1]),
                            _optional_value(ctx, node, first + 2),
                            _optional_value(ctx, node, first + 3), ctx.where(node))
    strides = contiguous_strides(shape)
    start = sum(begin * s for (begin, _, _), s in zip(windows, strides))
    return start, [step * s for (_, step, _), s in zip(windows, strides)], \
        [count for _, _, count in windows]


def lower_slice(ctx, node):
    x = node.input[0]
    start, strides, window = _slice_window(ctx, node, ctx.shape(x), 1)
    y = ctx.define(node.output[0])
    _strided_copy(ctx, y, ctx.t(x), window, 0, contiguous_strides(window), start, strides)


def lower_slice_grad(ctx, node):
    # dX = zeros with dY scattered into the window Slice read.
    dy = node.input[0]
    start, strides, window = _slice_window(ctx, node, ctx.shape(node.output[0]), 2)
    dx = ctx.define(node.output[0])
    if ctx.tensors[dx].size != ctx.tensors[ctx.t(dy)].size:
        _fill(ctx, dx, 0.0)
    _strided_copy(ctx, dx, ctx.t(dy), window, start, strides, 0, contiguous_strides(window))


def lower_concat(ctx, node):
    out_shape = ctx.shape(node.output[0])
    axis = attr(node, "axis") % len(out_shape)
    strides = contiguous_strides(out_shape)
    y = ctx.define(node.output[0])
    at = 0
    for x in node.input:
        shape = ctx.shape(x)
        _strided_copy(ctx, y, ctx.t(x), shape, at * strides[axis], strides, 0,
                      contiguous_strides(shape))
        at += shape[axis]


def lower_split(ctx, node):
    # The split sizes (input, attribute or num_outputs) are already in the output shapes.
    x = node.input[0]
    shape = ctx.shape(x)
    axis = attr(node, "axis", 0) % len(shape)
    strides = contiguous_strides(shape)
    at = 0
    for out in node.output:
        window = ctx.shape(out)
        y = ctx.define(out)
        _strided_copy(ctx, y, ctx.t(x), window, 0, contiguous_strides(window),
                      at * strides[axis], strides)
        at += window[axis]


def _gather_windows(ctx, node, shape, indices):
    """Gather with constant indices is one copy per index: (window, data strides, output
    strides, [(output start, data start) per index])."""
    if indices is None:
        raise UnsupportedOpError(f"{ctx.where(node)}: indices must be a constant (computed "
                                 f"on the host)")
    outer, size, inner = _axis_view(shape, attr(node, "axis", 0), ctx.where(node))
    flat = [int(v) for v in np.asarray(indices).reshape(-1)]
    for v in flat:
        if not -size <= v < size:
            raise UnsupportedOpError(f"{ctx.where(node)}: index {v} out of range for an axis "
                                     f"of {size}")
    return ([outer, inner], [size * inner, 1], [len(flat) * inner, 1],
            [(p * inner, (v % size) * inner) for p, v in enumerate(flat)])


def lower_gather(ctx, node):
    data, indices = node.input
    window, s_data, s_out, starts = _gather_windows(ctx, node, ctx.shape(data),
                                                    ctx.value(indices))
    y = ctx.define(node.output[0])
    for at_y, at_x in starts:
        _strided_copy(ctx, y, ctx.t(data), window, at_y, s_out, at_x, s_data)


def lower_gather_grad(ctx, node):
    # dX = zeros plus dY's slice at every index, added: an index may repeat.
    _, indices, dy = node.input
    window, s_data, s_out, starts = _gather_windows(ctx, node, ctx.shape(node.output[0]),
                                                    ctx.value(indices))
    dx = ctx.define(node.output[0])
    _fill(ctx, dx, 0.0)
    for at_y, at_x in starts:
        _strided_copy(ctx, dx, ctx.t(dy), window, at_x, s_data, at_y, s_out,
                      code=op.STRIDED_ADD)


def _tile_view(shape, repeats, where):
    """Tile's output viewed as (r0, d0, r1, d1, ...): X broadcast along every r."""
    repeats = [int(r) for r in np.asarray(repeats).reshape(-1)] if repeats is not None else None
    if repeats is None or len(repeats) != len(shape) or min(repeats, default=1) < 1:
        raise UnsupportedOpError(f"{where}: repeats must be a constant with one positive "
                                 f"value per axis of {list(shape)}")
    view, strides = [], []
    for r, d, s in zip(repeats, shape, contiguous_strides(shape)):
        view += [r, d]
        strides += [0, s]
    return view, strides


def lower_tile(ctx, node):
    x = node.input[0]
    view, x_strides = _tile_view(ctx.shape(x), ctx.value(node.input[1]), ctx.where(node))
    y = ctx.define(node.output[0])
    _strided_copy(ctx, y, ctx.t(x), view, 0, contiguous_strides(view), 0, x_strides)


def lower_tile_grad(ctx, node):
    # dX = the sum of dY's tiles: one strided add with stride 0 along the repeats.
    dy = node.input[0]
    view, dx_strides = _tile_view(ctx.shape(node.output[0]), ctx.value(node.input[1]),
                                  ctx.where(node))
    dx = ctx.define(node.output[0])
    _fill(ctx, dx, 0.0)
    _strided_copy(ctx, dx, ctx.t(dy), view, 0, dx_strides, 0, contiguous_strides(view),
                  code=op.STRIDED_ADD)


def lower_reciprocal(ctx, node):
    y = ctx.define(node.output[0])
    ctx.step(op.POW, [y, ctx.t(node.input[0])], [ctx.tensors[y].size], [-1.0])


def _pad_mode(ctx, node):
    mode = attr(node, "mode", "constant")
    if mode not in ("constant", "edge", "reflect"):
        raise UnsupportedOpError(f"{ctx.where(node)}: mode '{mode}' is not supported "
                                 f"(constant, edge and reflect are)")
    return mode


def _pad_borders(out_shape, shape, begins, mode):
    """The copies that fill Pad's borders in edge / reflect mode from Y itself, one axis
    after another (earlier axes over their whole padded extent, later ones over the input's
    window): [(region shape, destination start, source start, source strides)], in Y."""
    strides = contiguous_strides(out_shape)
    rank = len(shape)
    copies = []
    for axis in range(rank):
        region = [out_shape[i] if i < axis else shape[i] for i in range(rank)]
        base = sum(begins[i] * strides[i] for i in range(axis + 1, rank))
        first, last = begins[axis], begins[axis] + shape[axis] - 1
        step = 0 if mode == "edge" else -1  # edge repeats the end, reflect mirrors it
        for start, count, source in ((0, first, first if mode == "edge" else 2 * first),
                                     (last + 1, out_shape[axis] - last - 1,
                                      last if mode == "edge" else last - 1)):
            if count:
                region[axis] = count
                source_strides = list(strides)
                source_strides[axis] = step * strides[axis]
                copies.append((list(region), base + start * strides[axis],
                               base + source * strides[axis], source_strides))
    return copies


def _pad_window(shape, out_shape, begins, ends):
    """(window shape, start in Y, start in X) of the input elements Pad keeps."""
    window = [max(0, d + min(b, 0) + min(e, 0)) for d, b, e in zip(shape, begins, ends)]
    at_y = sum(max(b, 0) * s for b, s in zip(begins, contiguous_strides(out_shape)))
    at_x = sum(max(-b, 0) * s for b, s in zip(begins, contiguous_strides(shape)))
    return window, at_y, at_x


def lower_pad(ctx, node):
    x = node.input[0]
    shape, out_shape = ctx.shape(x), ctx.shape(node.output[0])
    mode = _pad_mode(ctx, node)
    begins, ends = pad_amounts(len(shape), ctx.value(node.input[1]),
                               _optional_value(ctx, node, 3), ctx.where(node))
    value = 0.0
    if mode == "constant" and len(node.input) > 2 and node.input[2]:
        constant = ctx.value(node.input[2])
        if constant is None or np.asarray(constant).size != 1:
            raise UnsupportedOpError(f"{ctx.where(node)}: constant_value must be a constant "
                                     f"scalar")
        value = float(np.asarray(constant).reshape(-1)[0])
    if mode != "constant":
        for axis, (b, e, d) in enumerate(zip(begins, ends, shape)):
            if min(b, e) < 0 or (mode == "reflect" and max(b, e) >= d) or d == 0:
                raise UnsupportedOpError(f"{ctx.where(node)}: mode '{mode}' needs pads in "
                                         f"[0, {d - 1 if mode == 'reflect' else 'any'}] on "
                                         f"axis {axis} of {list(shape)}, got ({b}, {e})")
    window, at_y, at_x = _pad_window(shape, out_shape, begins, ends)
    y = ctx.define(node.output[0])
    if mode == "constant" and ctx.tensors[y].size != int(np.prod(window, dtype=np.int64)):
        _fill(ctx, y, value)
    _strided_copy(ctx, y, ctx.t(x), window, at_y, contiguous_strides(out_shape), at_x,
                  contiguous_strides(shape))
    if mode != "constant":
        for region, start, source, source_strides in _pad_borders(out_shape, shape, begins,
                                                                  mode):
            _strided_copy(ctx, y, y, region, start, contiguous_strides(out_shape), source,
                          source_strides)


def lower_pad_grad(ctx, node):
    # Edge / reflect Pad backward: in a copy of dY, add every border back onto the elements
    # it was copied from, undoing the forward copies in reverse order; dX is the window.
    dy = node.input[0]
    out_shape, shape = ctx.shape(dy), ctx.shape(node.output[0])
    begins, ends = pad_amounts(len(shape), ctx.value(node.input[1]), None, ctx.where(node))
    work = ctx.define("", out_shape)
    ctx.step(op.COPY, [work, ctx.t(dy)], [ctx.tensors[work].size])
    strides = contiguous_strides(out_shape)
    for region, start, source, source_strides in reversed(
            _pad_borders(out_shape, shape, begins, _pad_mode(ctx, node))):
        _strided_copy(ctx, work, work, region, source, source_strides, start, strides,
                      code=op.STRIDED_ADD)
    window, at_y, _ = _pad_window(shape, out_shape, begins, ends)
    dx = ctx.define(node.output[0])
    _strided_copy(ctx, dx, work, window, 0, contiguous_strides(window), at_y, strides)


def lower_constant_of_shape(ctx, node):
    # Only gradient graphs keep ConstantOfShape (zeros for a Split output nothing reads);
    # load_model folds those of the model itself.
    value = attr(node, "value")
    if value is not None and value.data_type != TensorProto.FLOAT:
        raise UnsupportedOpError(f"{ctx.where(node)}: only float values are computed on the "
                                 f"device")
    y = ctx.define(node.output[0])
    _fill(ctx, y, float(numpy_helper.to_array(value).reshape(-1)[0]) if value is not None
          else 0.0)


def _matmul(ctx, node, shape_a, shape_b, trans_a, trans_b, alpha):
    """Y = alpha * op(A) op(B) over the broadcast batch dimensions, op = transpose of the
    last two. One GEMM when there is one product, or when B is shared by the whole batch
    (A's batch then folds into its rows); otherwise BATCHED_GEMM."""
    a, b = node.input
    rows_a, cols_a = shape_a[-2:]
    rows_b, cols_b = shape_b[-2:]
    m, k = (cols_a, rows_a) if trans_a else (rows_a, cols_a)
    n = rows_b if trans_b else cols_b
    sa_m, sa_k = (1, cols_a) if trans_a else (cols_a, 1)
    sb_k, sb_n = (1, cols_b) if trans_b else (cols_b, 1)
    batch = tuple(np.broadcast_shapes(shape_a[:-2], shape_b[:-2]))
    count = int(np.prod(batch, dtype=np.int64))
    y = ctx.define(node.output[0])
    if count == 1 or (not trans_a and np.prod(shape_b[:-2], dtype=np.int64) == 1
                      and np.prod(shape_a[:-2], dtype=np.int64) == count):
        ctx.step(op.GEMM, [y, ctx.t(a), ctx.t(b), NO_TENSOR],
                 [count * m, k, n, sa_m, sa_k, sb_k, sb_n, 0, 0], [alpha, 0.0])
        return
    strides = [[s * m * n for s in contiguous_strides(batch)],
               [s * rows_a * cols_a for s in broadcast_strides(batch, shape_a[:-2])],
               [s * rows_b * cols_b for s in broadcast_strides(batch, shape_b[:-2])]]
    dims, (_, s_a, s_b) = collapse(batch, strides, ctx.where(node))
    ctx.step(op.BATCHED_GEMM, [y, ctx.t(a), ctx.t(b)],
             dims + s_a + s_b + [m, k, n, sa_m, sa_k, sb_k, sb_n], [alpha])


def lower_fused_matmul(ctx, node):
    # ai.microtrain FusedMatMul (ORT's op of that name, without its transBatch options):
    # the gradients of a batched MatMul read their operands transposed.
    a, b = node.input
    if len(ctx.shape(a)) < 2 or len(ctx.shape(b)) < 2:
        raise UnsupportedOpError(f"{ctx.where(node)}: operands must have rank >= 2")
    _matmul(ctx, node, ctx.shape(a), ctx.shape(b), attr(node, "transA", 0),
            attr(node, "transB", 0), attr(node, "alpha", 1.0))


# -- pooling and the piecewise-linear activations --------------------------------------

def lower_pool(ctx, node):
    # MaxPool, AveragePool and their Global forms: pooling.py resolves the windows.
    x, y = node.input[0], node.output[0]
    ints = pool_kernel_ints(node, ctx.shape(x), ctx.shape(y), ctx.where(node))
    code = op.MAX_POOL if "Max" in node.op_type else op.AVERAGE_POOL
    ctx.step(code, [ctx.define(y), ctx.t(x)], ints)


def lower_pool_grad(ctx, node):
    # MaxPoolGrad(dY, X) recomputes each window's argmax from X. AveragePoolGrad(dY, X)
    # takes only its shape from X, so its step does not keep X alive.
    dy, x = node.input
    ints = pool_kernel_ints(node, ctx.shape(x), ctx.shape(dy), ctx.where(node))
    dx = ctx.define(node.output[0])
    if node.op_type == "MaxPoolGrad":
        ctx.step(op.MAX_POOL_GRAD, [dx, ctx.t(dy), ctx.t(x)], ints)
    else:
        ctx.step(op.AVERAGE_POOL_GRAD, [dx, ctx.t(dy)], ints)


def _clip_bounds(ctx, node):
    # ClipGrad carries its bounds as attributes; Clip takes them as optional constant inputs.
    if node.op_type == "ClipGrad":
        return [attr(node, "min", -math.inf), attr(node, "max", math.inf)]
    bounds = []
    for index, name, default in ((1, "min", -math.inf), (2, "max", math.inf)):
        tensor = node.input[index] if len(node.input) > index else ""
        if not tensor:
            bounds.append(default)
            continue
        value = ctx.value(tensor)
        if value is None or value.size != 1:
            raise UnsupportedOpError(f"{ctx.where(node)}: input '{name}' must be a constant "
                                     f"scalar (a Constant node or a non-parameter initializer)")
        bounds.append(float(np.asarray(value).reshape(())))
    return bounds


def _piecewise(code, floats):
    # LeakyRelu, Clip, HardSigmoid, HardSwish, and their gradients, which read (dY, X).
    def lower(ctx, node):
        inputs = node.input[:2] if node.op_type.endswith("Grad") else node.input[:1]
        y = ctx.define(node.output[0])
        ctx.step(code, [y] + [ctx.t(i) for i in inputs], [ctx.tensors[y].size],
                 floats(ctx, node))
    return lower


def _leaky_relu_alpha(ctx, node):
    return [attr(node, "alpha", 0.01)]


def _hard_sigmoid_floats(ctx, node):
    return [attr(node, "alpha", 0.2), attr(node, "beta", 0.5)]


def _no_floats(ctx, node):
    return []


def _conv_step(ctx, node, code, tensors, x_shape, w_shape):
    attrs = conv_attributes(node, x_shape, w_shape, ctx.where(node))
    ctx.step(code, tensors, device_geometry(attrs, x_shape, w_shape))
    return attrs


def lower_conv(ctx, node):
    x, w = node.input[0], node.input[1]
    b = node.input[2] if len(node.input) > 2 and node.input[2] else None
    y = ctx.define(node.output[0])
    attrs = _conv_step(ctx, node, op.CONV, [y, ctx.t(x), ctx.t(w), ctx.t(b) if b else NO_TENSOR],
                       ctx.shape(x), ctx.shape(w))
    expected = ctx.shape(x)[:1] + ctx.shape(w)[:1] + tuple(output_spatial(ctx.shape(x)[2:], attrs))
    if ctx.shape(node.output[0]) != expected:
        raise UnsupportedOpError(f"{ctx.where(node)}: the attributes give output shape "
                                 f"{list(expected)}, the graph says "
                                 f"{list(ctx.shape(node.output[0]))}")


def lower_conv_grad_input(ctx, node):
    dy, w = node.input
    dx = ctx.define(node.output[0])
    _conv_step(ctx, node, op.CONV_GRAD_INPUT, [dx, ctx.t(dy), ctx.t(w)], ctx.shape(node.output[0]),
               ctx.shape(w))


def lower_conv_grad_weight(ctx, node):
    # The fourth tensor (the reset flag) is set when lower_grad_accumulate fuses the step.
    dy, x = node.input
    dw = ctx.define(node.output[0])
    _conv_step(ctx, node, op.CONV_GRAD_WEIGHT, [dw, ctx.t(dy), ctx.t(x), NO_TENSOR],
               ctx.shape(x), ctx.shape(node.output[0]))


RANDOM_STATE = ".random_state"   # suffix of each Dropout's generator state (Module.set_seed)


def _channel_view(ctx, node, x):
    # (N, C, inner): the BatchNormalization kernels walk channel planes of `inner` elements.
    shape = ctx.shape(x)
    if len(shape) < 2:
        raise UnsupportedOpError(f"{ctx.where(node)}: the input must be (N, C, ...), got "
                                 f"{list(shape)}")
    return [shape[0], shape[1], int(np.prod(shape[2:], dtype=np.int64))]


def _batch_norm_multiplier(ctx, scale, var, eps):
    # a = scale / sqrt(var + eps) of constant inputs, computed here in float64 once.
    return ctx.value(scale).astype(np.float64) / np.sqrt(ctx.value(var).astype(np.float64) + eps)


def _folded_batch_norm(ctx, scale, bias, mean, var, eps):
    # A BatchNormalization whose inputs are all constants is y = x * a + b per channel with
    # b = bias - mean * a: one multiply-add.
    a = _batch_norm_multiplier(ctx, scale, var, eps)
    b = ctx.value(bias).astype(np.float64) - ctx.value(mean).astype(np.float64) * a
    multiplier = f"batch_norm_multiplier({scale},{var})"
    offset = f"batch_norm_offset({scale},{bias},{mean},{var})"
    ctx._constant(multiplier, a.astype(np.float32))
    ctx._constant(offset, b.astype(np.float32))
    return ctx.t(multiplier), ctx.t(offset)


def lower_batch_norm(ctx, node):
    x, scale, bias, mean, var = node.input[:5]
    view = _channel_view(ctx, node, x)
    eps = attr(node, "epsilon", 1e-5)
    if batch_norm_training(node):
        _lower_batch_norm_training(ctx, node, view, eps)
        return
    y = ctx.define(node.output[0])
    if all(ctx.value(name) is not None for name in (scale, bias, mean, var)):
        a, b = _folded_batch_norm(ctx, scale, bias, mean, var, eps)
        ctx.step(op.CHANNEL_AFFINE, [y, ctx.t(x), a, b], view)
    else:
        ctx.step(op.BATCH_NORM_INFERENCE, [y] + [ctx.t(name) for name in node.input[:5]], view,
                 [eps])


def _lower_batch_norm_training(ctx, node, view, eps):
    # Running statistics that are parameters are updated in place, and the node's running
    # statistics outputs name them; computed ones (track_running_stats=False) are not.
    x, scale, bias, mean, var = node.input[:5]
    n, _, inner = view
    if n * inner < 2:
        raise UnsupportedOpError(f"{ctx.where(node)}: training mode needs more than one value "
                                 f"per channel, the input has shape {list(ctx.shape(x))}")
    if any(node.output[3:]):
        raise UnsupportedOpError(f"{ctx.where(node)}: the saved mean and variance outputs "
                                 f"(opset 9-13) are not supported; export with opset >= 15")
    stats = []
    for stat, out in zip((mean, var), (list(node.output[1:3]) + ["", ""])[:2]):
        tid = ctx.local.get(stat)
        updated = tid is not None and ctx.tensors[tid].role == PARAM
        stats.append(tid if updated else NO_TENSOR)
        if out and updated:
            ctx.alias_in_place(out, stat)
        elif out and ctx.uses.get(out):
            raise UnsupportedOpError(f"{ctx.where(node)}: output '{out}' reads the running "
                                     f"statistic '{stat}', which is not a parameter")
    y = ctx.define(node.output[0])
    ctx.step(op.BATCH_NORM_TRAINING, [y, ctx.t(x), ctx.t(scale), ctx.t(bias)] + stats, view,
             [eps, attr(node, "momentum", 0.9)])


def lower_batch_norm_grad(ctx, node):
    dy, x, scale = node.input[:3]
    training = attr(node, "training_mode", 0)
    eps = attr(node, "epsilon", 1e-5)
    view = _channel_view(ctx, node, x)
    dx, dscale, dbias = (list(node.output) + ["", ""])[:3]
    stats = node.input[3:5]
    if (not training and not dscale and not dbias
            and all(ctx.value(name) is not None for name in (scale, stats[1]))):
        # Constant scale and statistics: dx = dy * a (the forward's multiplier when folded).
        multiplier = f"batch_norm_multiplier({scale},{stats[1]})"
        ctx._constant(multiplier, _batch_norm_multiplier(ctx, scale, stats[1], eps)
                      .astype(np.float32))
        ctx.step(op.CHANNEL_AFFINE, [ctx.define(dx), ctx.t(dy), ctx.t(multiplier), NO_TENSOR],
                 view)
        return
    outs = [ctx.define(name) if name else NO_TENSOR for name in (dx, dscale, dbias)]
    stat_ids = [NO_TENSOR, NO_TENSOR] if training else [ctx.t(name) for name in stats]
    ctx.step(op.BATCH_NORM_GRAD, outs + [ctx.t(dy), ctx.t(x), ctx.t(scale)] + stat_ids, view,
             [eps])


def lower_dropout(ctx, node):
    # Training: y = x * mask / (1 - ratio) with a mask drawn on the device, kept bit-packed
    # in the int arena for the backward (1 bit per element instead of a 4-byte float).
    # Inference, or ratio 0: the identity, no step.
    ratio, training = dropout_config(node, ctx.value, ctx.where(node))
    x = node.input[0]
    mask = node.output[1] if len(node.output) > 1 else ""
    if not training or ratio == 0.0:
        if mask and ctx.uses.get(mask):
            raise UnsupportedOpError(f"{ctx.where(node)}: the mask of a Dropout that drops "
                                     f"nothing is not supported")
        ctx.alias(node.output[0], x)
        return
    size = ctx.tensors[ctx.t(x)].size
    y = ctx.define(node.output[0])
    mask_id = ctx.add(Tensor(mask, INT32, ACTIVATION, ((size + 29) // 30,),
                             program=ctx.program_name))
    if mask:
        ctx.local[mask] = mask_id
    stream = sum(1 for t in ctx.tensors if t.name.endswith(RANDOM_STATE))
    state = ctx.add(Tensor(ctx.node_name + RANDOM_STATE, INT32, CONTROL, (2,)))
    ctx.step(op.DROPOUT, [y, ctx.t(x), mask_id, state],
             [size, round(ratio * RANDOM_SPAN), attr(node, "seed", 0) % RANDOM_SPAN, stream],
             [1.0 / (1.0 - ratio)])


def lower_dropout_grad(ctx, node):
    dy, mask = node.input
    dx = ctx.define(node.output[0])
    ctx.step(op.DROPOUT_GRAD, [dx, ctx.t(dy), ctx.t(mask)], [ctx.tensors[dx].size],
             [1.0 / (1.0 - attr(node, "ratio", 0.5))])


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
    "LeakyRelu": _piecewise(op.LEAKY_RELU, _leaky_relu_alpha),
    "LeakyReluGrad": _piecewise(op.LEAKY_RELU_GRAD, _leaky_relu_alpha),
    "Clip": _piecewise(op.CLIP, _clip_bounds),
    "ClipGrad": _piecewise(op.CLIP_GRAD, _clip_bounds),
    "HardSigmoid": _piecewise(op.HARD_SIGMOID, _hard_sigmoid_floats),
    "HardSigmoidGrad": _piecewise(op.HARD_SIGMOID_GRAD, _hard_sigmoid_floats),
    "HardSwish": _piecewise(op.HARD_SWISH, _no_floats),
    "HardSwishGrad": _piecewise(op.HARD_SWISH_GRAD, _no_floats),
    "MaxPool": lower_pool,
    "AveragePool": lower_pool,
    "GlobalMaxPool": lower_pool,
    "GlobalAveragePool": lower_pool,
    "MaxPoolGrad": lower_pool_grad,
    "AveragePoolGrad": lower_pool_grad,
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
    "ClipGradNorm": lower_clip_grad_norm,
    "SGD": lower_sgd,
    "AdamW": lower_adamw,
    "Transpose": lower_transpose,
    "Slice": lower_slice,
    "SliceGrad": lower_slice_grad,
    "Concat": lower_concat,
    "Split": lower_split,
    "Pad": lower_pad,
    "PadGrad": lower_pad_grad,
    "ConstantOfShape": lower_constant_of_shape,
    "FusedMatMul": lower_fused_matmul,
    "Gather": lower_gather,
    "GatherGrad": lower_gather_grad,
    "Tile": lower_tile,
    "TileGrad": lower_tile_grad,
    "Reciprocal": lower_reciprocal,
    "Conv": lower_conv,
    "ConvGradInput": lower_conv_grad_input,
    "ConvGradWeight": lower_conv_grad_weight,
    "BatchNormalization": lower_batch_norm,
    "BatchNormalizationGrad": lower_batch_norm_grad,
    "Dropout": lower_dropout,
    "DropoutGrad": lower_dropout_grad,
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
    for name in meta_names(meta, "output_grads"):
        roles[name] = INPUT
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
