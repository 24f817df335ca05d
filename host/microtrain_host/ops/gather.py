"""Gather and its gradient GatherGrad. Constant indices (computed on the host) make one
strided copy per index (layout's kernels); indices from an int input (token ids,
categories: an embedding lookup) make one GATHER_ROWS step (kernels/gather.py), whose
gradient scatters dY into the table."""
import numpy as np

from .. import opcodes as op
from ..errors import UnsupportedOpError
from ..graph import DOMAIN, attr
from ..ir import INT32, axis_view
from ..reference import MicrotrainOp
from ..registry import gradient, lowering
from .layout import fill, strided_copy


@gradient("Gather")
def grad_gather(g, node, dys, needs):
    # Zeros of the data's shape plus dY's slices at the indices (ORT's GatherGrad).
    data, indices = node.input
    shape = g.constant("shape", np.array(g.shape(data), np.int64))
    return [g.node("GatherGrad", [shape, indices, dys[0]], g.shape(data), domain=DOMAIN,
                   hint="dGather", axis=attr(node, "axis", 0)), None]


def _gather_windows(ctx, node, shape, indices):
    """Gather with constant indices is one copy per index: (window, data strides, output
    strides, [(output start, data start) per index])."""
    if indices is None:
        raise UnsupportedOpError(f"{ctx.where(node)}: indices must be a constant (computed "
                                 f"on the host)")
    outer, size, inner = axis_view(shape, attr(node, "axis", 0), ctx.where(node))
    flat = [int(v) for v in np.asarray(indices).reshape(-1)]
    for v in flat:
        if not -size <= v < size:
            raise UnsupportedOpError(f"{ctx.where(node)}: index {v} out of range for an axis "
                                     f"of {size}")
    return ([outer, inner], [size * inner, 1], [len(flat) * inner, 1],
            [(p * inner, (v % size) * inner) for p, v in enumerate(flat)])


def _gather_rows(ctx, node, code, out, data_shape, pair):
    """Gather (or its gradient) with indices computed on the device, an int tensor:
    one GATHER_ROWS(_GRAD) step over data viewed as (outer, size, inner)."""
    indices = ctx.t(node.input[1])
    if ctx.tensors[indices].dtype != INT32:
        raise UnsupportedOpError(f"{ctx.where(node)}: indices '{node.input[1]}' must be "
                                 f"integers (a constant or an int input)")
    outer, size, inner = axis_view(data_shape, attr(node, "axis", 0), ctx.where(node))
    count = ctx.tensors[indices].size
    if 0 in (outer, size, inner, count):
        raise UnsupportedOpError(f"{ctx.where(node)}: nothing to gather (data "
                                 f"{list(data_shape)}, {count} indices)")
    ctx.step(code, [out, ctx.t(pair), indices], [outer, size, inner, count])


@lowering("Gather")
def lower_gather(ctx, node):
    data, indices = node.input
    if ctx.value(indices) is None:
        _gather_rows(ctx, node, op.GATHER_ROWS, ctx.define(node.output[0]), ctx.shape(data),
                     data)
        return
    window, s_data, s_out, starts = _gather_windows(ctx, node, ctx.shape(data),
                                                    ctx.value(indices))
    y = ctx.define(node.output[0])
    for at_y, at_x in starts:
        strided_copy(ctx, y, ctx.t(data), window, at_y, s_out, at_x, s_data)


@lowering("GatherGrad")
def lower_gather_grad(ctx, node):
    # dX = zeros plus dY's slice at every index, added: an index may repeat.
    _, indices, dy = node.input
    if ctx.value(indices) is None:  # indices from an int input: scattered on the device
        _gather_rows(ctx, node, op.GATHER_ROWS_GRAD, ctx.define(node.output[0]),
                     ctx.shape(node.output[0]), dy)
        return
    window, s_data, s_out, starts = _gather_windows(ctx, node, ctx.shape(node.output[0]),
                                                    ctx.value(indices))
    dx = ctx.define(node.output[0])
    fill(ctx, dx, 0.0)
    for at_y, at_x in starts:
        strided_copy(ctx, dx, ctx.t(dy), window, at_x, s_data, at_y, s_out,
                      code=op.STRIDED_ADD)


class GatherGrad(MicrotrainOp):
    """dX = zeros(shape) plus dY's slice added at every index Gather read (ORT's op)."""

    def _run(self, shape, indices, dy, axis=0):
        dx = np.zeros(tuple(int(d) for d in shape), dtype=dy.dtype)
        np.add.at(dx, (slice(None),) * (axis % dx.ndim) + (indices,), dy)
        return (dx,)
