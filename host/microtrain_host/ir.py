"""The lowered model: what the lowering emits, the planner places and the blob writer stores.

A `Tensor` lives in one of three arenas by its dtype (float32, int32, bytes); a `Step` is one
kernel call (an op code of contract/ops.py with tensor ids, ints and floats); a `Program` is
a list of steps with the tensors its caller fills and reads. Dtype and role numbers are the
schema's enums (contract/microtrain.fbs), the tensor names of ORT's artifacts are made here.
The op families (ops/) and the pipeline stages (pipeline/) both build on this module; it
imports neither.

Also here: the stride arithmetic the families' lowerings share (static shapes make
broadcasting strides, transposes strides, reshapes aliases)."""
import dataclasses

import numpy as np

from .contract import facts
from .contract.ops import BY_CODE
from .errors import UnsupportedOpError

FLOAT, INT32, INT8, UINT8 = (facts.DTYPES[n] for n in ("FLOAT", "INT32", "INT8", "UINT8"))
BYTE_TYPES = (INT8, UINT8)   # in the byte arena
ROLES = facts.ROLES          # ("input", "label", "param", ...), numbered as the schema's Role
INPUT, LABEL, PARAM, GRAD, ACTIVATION, OPTIMIZER_STATE, CONSTANT, CONTROL = range(len(ROLES))
NO_TENSOR = facts.NO_TENSOR
LAZY_RESET_GRAD, LEARNING_RATE, STEP, STEP_SIZE = facts.CONTROLS


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
    scale: tuple = ()           # INT8 / UINT8: quantization scale(s), per tensor or per channel
    zero_point: tuple = ()      # ... and zero point(s)
    axis: int = 0               # ... the channel axis of per-channel ones
    derived: bool = False       # CONSTANT whose data holds only its first elements (the
                                # device computes the rest at load: qlinear requantization)
    in_place: bool = False      # int8 CONSTANT read only as a weight (a "w" argument): no
                                # arena space, the device reads it where the blob is

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
    latent_from: int = 0        # train program: the step a latent-cached batch resumes at
    latent: list = dataclasses.field(default_factory=list)  # ... and the tensors it keeps


def check_step(code, tensors, ints, floats, where):
    """A step as the contract's op table names it: as many tensors, ints and floats (a
    lowering that emits anything else is a bug of microtrain's, caught before a blob the
    device would refuse is written)."""
    o = BY_CODE.get(code)
    if o is None:
        raise RuntimeError(f"node '{where}': op code {code} is not in the contract")
    counts = (len(tensors), len(ints), len(floats))
    wanted = (len(o.tensors), o.int_count, o.float_count)
    for got, want, named in zip(counts, wanted, (o.tensors, o.ints, o.floats)):
        if got != want and not (want < 0 and got >= len(named) - 1):
            raise RuntimeError(f"node '{where}': step {o.name} has {counts[0]} tensors, "
                               f"{counts[1]} ints, {counts[2]} floats; the contract names "
                               f"{len(o.tensors)}, {o.int_count}, {o.float_count}")


# -- the names of ORT's training artifacts ---------------------------------------------------

def grad_buffer(param):
    """The gradient accumulation buffer of a parameter (ORT's name)."""
    return f"{param}_grad.accumulation.buffer"


def state_name(param, state):
    """An optimizer state tensor of a parameter, e.g. fc.weight.momentum0."""
    return f"{param}.{state}"


# -- strides ---------------------------------------------------------------------------------

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


def axis_view(shape, axis, where):
    """(outer, n, inner): shape viewed around one axis (Softmax, Gather, ...)."""
    rank = len(shape)
    if not -rank <= axis < rank:
        raise UnsupportedOpError(f"{where}: axis {axis} out of range for shape {list(shape)}")
    axis %= rank
    return [int(np.prod(shape[:axis], dtype=np.int64)), shape[axis],
            int(np.prod(shape[axis + 1:], dtype=np.int64))]


def unary(code):
    """The lowering of an elementwise op Y = f(X): one step over every element."""
    def lower(ctx, node):
        y = ctx.define(node.output[0])
        ctx.step(code, [y, ctx.t(node.input[0])], [ctx.tensors[y].size])
    return lower
