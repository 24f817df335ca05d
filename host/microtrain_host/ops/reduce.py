"""Reductions: ReduceSum and ReduceMean (axes as attribute or constant input, keepdims,
noop_with_empty_axes). One device kernel (kernels/reduce.py): the input walked through
strides with output stride 0 on the reduced axes; ReduceMean is a sum with a scale."""
import numpy as np

from .. import opcodes as op
from ..errors import UnsupportedOpError
from ..graph import attr, optional_input
from ..ir import collapse, contiguous_strides
from ..registry import gradient, lowering


def reduce_axes(node, rank, value_of, where):
    """The sorted, non-negative axes a ReduceSum / ReduceMean node reduces over; value_of
    gives a constant input's value (None when it is computed)."""
    axes = attr(node, "axes")
    if axes is None and optional_input(node, 1):
        value = value_of(node.input[1])
        if value is None:
            raise UnsupportedOpError(f"{where}: axes must be a constant")
        axes = [int(v) for v in np.asarray(value).reshape(-1)]
    if not axes:
        if attr(node, "noop_with_empty_axes", 0):
            return []
        return list(range(rank))
    return sorted(a % rank for a in axes)


@gradient("ReduceSum", "ReduceMean")
def grad_reduce(g, node, dys, needs):
    # ReduceSum / ReduceMean: broadcast dY back over the reduced axes (scaled for the mean).
    x = node.input[0]
    shape = g.shape(x)
    axes = reduce_axes(node, len(shape), g.constant_value, f"{node.op_type} node '{node.name}'")
    kept = tuple(1 if i in axes else d for i, d in enumerate(shape))
    dy = dys[0]
    if g.shape(dy) != kept:
        dy = g.node("Reshape", [dy, g.constant("shape", np.array(kept, np.int64))], kept,
                    hint="dReduce")
    dx = g.node("Expand", [dy, g.constant("shape", np.array(shape, np.int64))], shape,
                hint="dReduce")
    if node.op_type == "ReduceMean":
        count = int(np.prod([shape[a] for a in axes])) if axes else 1
        if count == 0:  # X is empty (e.g. a Conv or pool window larger than its input, which
            return [dx] + [None] * (len(node.input) - 1)  # that node's rule refuses): so is dX
        dx = g.node("Mul", [dx, g.constant("inv_count", np.float32(1.0 / count))], shape,
                    hint="dReduceMean")
    grads = [None] * len(node.input)
    grads[0] = dx
    return grads


@lowering("ReduceSum", "ReduceMean")
def lower_reduce(ctx, node):
    x = node.input[0]
    shape = ctx.shape(x)
    axes = reduce_axes(node, len(shape), ctx.value, ctx.where(node))
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
