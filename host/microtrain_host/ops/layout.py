"""Layout ops: Flatten, Reshape, Identity, Squeeze, Unsqueeze (free aliases), Transpose,
Slice, Concat, Split, Pad, Tile, ConstantOfShape, and the gradient ops SliceGrad, TileGrad,
PadGrad. On the device every one that moves data is a strided copy (kernels/layout.py:
STRIDED_COPY, STRIDED_ADD, FILL), which gather.py uses too."""
import numpy as np
from onnx import TensorProto, helper, numpy_helper

from .. import opcodes as op
from ..errors import UnsupportedOpError
from ..graph import DOMAIN, attr, optional_input
from ..ir import collapse, contiguous_strides
from ..reference import MicrotrainOp
from ..registry import gradient, lowering


def _ints(value, what, where):
    if value is None:
        raise UnsupportedOpError(f"{where}: {what} must be a constant (computed on the host)")
    return [int(v) for v in np.asarray(value).reshape(-1)]


def _axes(axes, rank, what, where):
    out = []
    for a in axes:
        if not -rank <= a < rank:
            raise UnsupportedOpError(f"{where}: {what} {a} out of range for rank {rank}")
        if a % rank in out:
            raise UnsupportedOpError(f"{where}: {what} names axis {a} twice")
        out.append(a % rank)
    return out


def slice_windows(shape, starts, ends, axes, steps, where):
    """ONNX Slice on a static shape: per dimension (first index, step, count), with ONNX's
    rules for negative and out-of-range starts / ends (the same as Python's slices).
    starts, ends, axes, steps: numpy values (axes and steps may be None)."""
    starts = _ints(starts, "starts", where)
    ends = _ints(ends, "ends", where)
    axes = _axes(_ints(axes, "axes", where) if axes is not None else range(len(starts)),
                 len(shape), "axes", where)
    steps = _ints(steps, "steps", where) if steps is not None else [1] * len(starts)
    if not len(starts) == len(ends) == len(axes) == len(steps):
        raise UnsupportedOpError(f"{where}: starts, ends, axes and steps differ in length")
    windows = [(0, 1, d) for d in shape]
    for start, end, axis, step in zip(starts, ends, axes, steps):
        if step == 0:
            raise UnsupportedOpError(f"{where}: steps must not be 0 (axis {axis})")
        picked = range(*slice(start, end, step).indices(shape[axis]))
        windows[axis] = (picked.start, step, len(picked))
    return windows


def pad_amounts(rank, pads, axes, where):
    """ONNX Pad: (begins, ends) per dimension from the pads input and the optional axes
    input (opset 18). Negative amounts crop."""
    pads = _ints(pads, "pads", where)
    axes = _axes(_ints(axes, "axes", where) if axes is not None else range(rank), rank,
                 "axes", where)
    if len(pads) != 2 * len(axes):
        raise UnsupportedOpError(f"{where}: pads has {len(pads)} values for {len(axes)} axes")
    begins, ends = [0] * rank, [0] * rank
    for i, axis in enumerate(axes):
        begins[axis], ends[axis] = pads[i], pads[i + len(axes)]
    return begins, ends


# -- free aliases -------------------------------------------------------------------------

@gradient("Flatten", "Reshape", "Squeeze", "Unsqueeze")
def grad_reshape(g, node, dys, needs):
    # Flatten, Reshape, Squeeze, Unsqueeze: the gradient has the input's shape.
    x = node.input[0]
    grads = [None] * len(node.input)
    grads[0] = g.node("Reshape", [dys[0], g.constant("shape", np.array(g.shape(x), np.int64))],
                      g.shape(x), hint="d" + node.op_type)
    return grads


@gradient("Identity")
def grad_identity(g, node, dys, needs):
    return [dys[0]]


@lowering("Flatten", "Reshape", "Identity", "Squeeze", "Unsqueeze")
def lower_alias(ctx, node):
    # Flatten, Reshape, Identity, Squeeze, Unsqueeze: same elements, new shape, no step.
    ctx.alias(node.output[0], node.input[0])


# -- strided copies ------------------------------------------------------------------------

def strided_copy(ctx, y, x, shape, y_start, y_strides, x_start, x_strides,
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


def fill(ctx, y, value):
    ctx.step(op.FILL, [y], [ctx.tensors[y].size], [value])


@lowering("ConstantOfShape")
def lower_constant_of_shape(ctx, node):
    # Only gradient graphs keep ConstantOfShape (zeros for a Split output nothing reads);
    # load_model folds those of the model itself.
    value = attr(node, "value")
    if value is not None and value.data_type != TensorProto.FLOAT:
        raise UnsupportedOpError(f"{ctx.where(node)}: only float values are computed on the "
                                 f"device")
    y = ctx.define(node.output[0])
    fill(ctx, y, float(numpy_helper.to_array(value).reshape(-1)[0]) if value is not None
          else 0.0)


@gradient("Transpose")
def grad_transpose(g, node, dys, needs):
    # The inverse permutation.
    shape = g.shape(node.input[0])
    perm = attr(node, "perm", None) or list(reversed(range(len(shape))))
    if sorted(perm) != list(range(len(shape))):  # onnx shape inference lets a short one pass
        raise UnsupportedOpError(f"Transpose node '{node.name}': perm {list(perm)} is not a "
                                 f"permutation of the {len(shape)} axes")
    inverse = [0] * len(perm)
    for i, p in enumerate(perm):
        inverse[p] = i
    return [g.node("Transpose", [dys[0]], shape, hint="dTranspose", perm=inverse)]


@lowering("Transpose")
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
    strided_copy(ctx, y, ctx.t(x), out_shape, 0, contiguous_strides(out_shape), 0,
                  [strides[p] for p in perm])


# -- Slice, Concat, Split ------------------------------------------------------------------

@gradient("Slice")
def grad_slice(g, node, dys, needs):
    # Zeros of X's shape with dY scattered back into the window (ORT's SliceGrad).
    x = node.input[0]
    shape = g.constant("shape", np.array(g.shape(x), np.int64))
    return [g.node("SliceGrad", [dys[0], shape] + list(node.input[1:]), g.shape(x),
                   domain=DOMAIN, hint="dSlice")] + [None] * (len(node.input) - 1)


def _slice_window(ctx, node, shape, first):
    """(start, strides, window shape) of the elements Slice picks from a tensor of shape;
    starts, ends, axes and steps are the inputs from index `first` on."""
    windows = slice_windows(shape, ctx.value(node.input[first]),
                            ctx.value(node.input[first + 1]),
                            ctx.optional_value(node, first + 2),
                            ctx.optional_value(node, first + 3), ctx.where(node))
    strides = contiguous_strides(shape)
    start = sum(begin * s for (begin, _, _), s in zip(windows, strides))
    return start, [step * s for (_, step, _), s in zip(windows, strides)], \
        [count for _, _, count in windows]


@lowering("Slice")
def lower_slice(ctx, node):
    x = node.input[0]
    start, strides, window = _slice_window(ctx, node, ctx.shape(x), 1)
    y = ctx.define(node.output[0])
    strided_copy(ctx, y, ctx.t(x), window, 0, contiguous_strides(window), start, strides)


@lowering("SliceGrad")
def lower_slice_grad(ctx, node):
    # dX = zeros with dY scattered into the window Slice read.
    dy = node.input[0]
    start, strides, window = _slice_window(ctx, node, ctx.shape(node.output[0]), 2)
    dx = ctx.define(node.output[0])
    if ctx.tensors[dx].size != ctx.tensors[ctx.t(dy)].size:
        fill(ctx, dx, 0.0)
    strided_copy(ctx, dx, ctx.t(dy), window, start, strides, 0, contiguous_strides(window))


class SliceGrad(MicrotrainOp):
    """dX = zeros(shape) with dY where Slice(X, starts, ends, axes, steps) read it."""

    def _run(self, dy, shape, starts, ends, axes=None, steps=None):
        window = [slice(None)] * len(shape)
        axes = range(len(starts)) if axes is None else axes
        steps = [1] * len(starts) if steps is None else steps
        for start, end, axis, step in zip(starts, ends, axes, steps):
            window[int(axis)] = slice(int(start), int(end), int(step))
        dx = np.zeros(tuple(int(d) for d in shape), dtype=dy.dtype)
        dx[tuple(window)] = dy
        return (dx,)


@gradient("Concat")
def grad_concat(g, node, dys, needs):
    # Each input's gradient is its window of dY along the axis.
    axis = attr(node, "axis", 0) % len(g.shape(node.output[0]))
    grads, at = [], 0
    for x, need in zip(node.input, needs):
        size = g.shape(x)[axis]
        if need:
            bounds = [g.constant(hint, np.array([v], np.int64))
                      for hint, v in (("starts", at), ("ends", at + size), ("axes", axis))]
            grads.append(g.node("Slice", [dys[0]] + bounds, g.shape(x), hint="dConcat"))
        else:
            grads.append(None)
        at += size
    return grads


@lowering("Concat")
def lower_concat(ctx, node):
    out_shape = ctx.shape(node.output[0])
    axis = attr(node, "axis") % len(out_shape)
    strides = contiguous_strides(out_shape)
    y = ctx.define(node.output[0])
    at = 0
    for x in node.input:
        shape = ctx.shape(x)
        strided_copy(ctx, y, ctx.t(x), shape, at * strides[axis], strides, 0,
                      contiguous_strides(shape))
        at += shape[axis]


@gradient("Split")
def grad_split(g, node, dys, needs):
    # The outputs' gradients side by side, zeros for an output nothing reads.
    pieces = [dy if dy is not None else g.node(
        "ConstantOfShape", [g.constant("shape", np.array(g.shape(out), np.int64))], g.shape(out),
        hint="dSplit_zeros", value=helper.make_tensor("value", TensorProto.FLOAT, [1], [0.0]))
        for out, dy in zip(node.output, dys)]
    return [g.node("Concat", pieces, g.shape(node.input[0]), hint="dSplit",
                   axis=attr(node, "axis", 0))] + [None] * (len(node.input) - 1)


@lowering("Split")
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
        strided_copy(ctx, y, ctx.t(x), window, 0, contiguous_strides(window),
                      at * strides[axis], strides)
        at += window[axis]


# -- Tile ---------------------------------------------------------------------------------

@gradient("Tile")
def grad_tile(g, node, dys, needs):
    # The sum of dY's tiles (TileGrad, ai.microtrain).
    x = node.input[0]
    return [g.node("TileGrad", [dys[0], node.input[1]], g.shape(x), domain=DOMAIN,
                   hint="dTile"), None]


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


@lowering("Tile")
def lower_tile(ctx, node):
    x = node.input[0]
    view, x_strides = _tile_view(ctx.shape(x), ctx.value(node.input[1]), ctx.where(node))
    y = ctx.define(node.output[0])
    strided_copy(ctx, y, ctx.t(x), view, 0, contiguous_strides(view), 0, x_strides)


@lowering("TileGrad")
def lower_tile_grad(ctx, node):
    # dX = the sum of dY's tiles: one strided add with stride 0 along the repeats.
    dy = node.input[0]
    view, dx_strides = _tile_view(ctx.shape(node.output[0]), ctx.value(node.input[1]),
                                  ctx.where(node))
    dx = ctx.define(node.output[0])
    fill(ctx, dx, 0.0)
    strided_copy(ctx, dx, ctx.t(dy), view, 0, dx_strides, 0, contiguous_strides(view),
                  code=op.STRIDED_ADD)


class TileGrad(MicrotrainOp):
    """dX = the sum of the tiles of dY = Tile(X, repeats)."""

    def _run(self, dy, repeats):
        view = [v for r, d in zip(repeats, dy.shape) for v in (int(r), d // int(r))]
        return (dy.reshape(view).sum(axis=tuple(range(0, len(view), 2))).astype(dy.dtype),)


# -- Pad ------------------------------------------------------------------------------------

@gradient("Pad")
def grad_pad(g, node, dys, needs):
    # constant: dX = dY without the border (a Slice), with zeros where Pad cropped X (a Pad
    # by the crop; written as the two so that onnx.reference, whose Pad takes no negative
    # pads, runs it too). edge / reflect: PadGrad adds each border element back onto the
    # element it copies.
    x = node.input[0]
    where = f"Pad node '{node.name}'"
    if len(needs) > 2 and needs[2]:
        raise UnsupportedOpError(f"{where}: no gradient for a trainable constant_value")
    axes = optional_input(node, 3)
    begins, ends = pad_amounts(len(g.shape(x)), g.constant_value(node.input[1]),
                               g.constant_value(axes) if axes else None, where)
    mode = attr(node, "mode", "constant")
    if mode == "constant":
        dx, shape = dys[0], g.shape(dys[0])
        if max(begins + ends) > 0:
            shape = tuple(d - max(b, 0) - max(e, 0) for d, b, e in zip(shape, begins, ends))
            bounds = [g.constant(hint, np.array(v, np.int64)) for hint, v in (
                ("starts", [max(b, 0) for b in begins]),
                ("ends", [max(b, 0) + d for b, d in zip(begins, shape)]))]
            dx = g.node("Slice", [dx] + bounds, shape, hint="dPad")
        if min(begins + ends) < 0:
            crop = [max(-p, 0) for p in begins + ends]
            dx = g.node("Pad", [dx, g.constant("pads", np.array(crop, np.int64))], g.shape(x),
                        hint="dPad", mode="constant")
    else:
        dx = g.node("PadGrad", [dys[0], g.constant("pads", np.array(begins + ends, np.int64))],
                    g.shape(x), domain=DOMAIN, hint="dPad", mode=mode)
    return [dx] + [None] * (len(node.input) - 1)


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


@lowering("Pad")
def lower_pad(ctx, node):
    x = node.input[0]
    shape, out_shape = ctx.shape(x), ctx.shape(node.output[0])
    mode = _pad_mode(ctx, node)
    begins, ends = pad_amounts(len(shape), ctx.value(node.input[1]),
                               ctx.optional_value(node, 3), ctx.where(node))
    value = 0.0
    if mode == "constant" and optional_input(node, 2):
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
        fill(ctx, y, value)
    strided_copy(ctx, y, ctx.t(x), window, at_y, contiguous_strides(out_shape), at_x,
                  contiguous_strides(shape))
    if mode != "constant":
        for region, start, source, source_strides in _pad_borders(out_shape, shape, begins,
                                                                  mode):
            strided_copy(ctx, y, y, region, start, contiguous_strides(out_shape), source,
                          source_strides)


@lowering("PadGrad")
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
        strided_copy(ctx, work, work, region, source, source_strides, start, strides,
                      code=op.STRIDED_ADD)
    window, at_y, _ = _pad_window(shape, out_shape, begins, ends)
    dx = ctx.define(node.output[0])
    strided_copy(ctx, dx, work, window, 0, contiguous_strides(window), at_y, strides)


class PadGrad(MicrotrainOp):
    """Pad backward in edge / reflect mode (pads: begins then ends of every axis): each dY
    element is added to the X element it is a copy of (np.pad of X's indices says which)."""

    def _run(self, dy, pads, mode="edge"):
        mode = mode.decode() if isinstance(mode, bytes) else mode
        rank = dy.ndim
        widths = [(int(pads[i]), int(pads[i + rank])) for i in range(rank)]
        shape = tuple(d - b - e for d, (b, e) in zip(dy.shape, widths))
        source = np.pad(np.arange(int(np.prod(shape))).reshape(shape), widths, mode=mode)
        dx = np.bincount(source.reshape(-1), weights=dy.reshape(-1).astype(np.float64),
                         minlength=source.size)
        return (dx[:int(np.prod(shape))].reshape(shape).astype(dy.dtype),)
