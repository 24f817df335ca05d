"""Pooling: MaxPool, AveragePool, GlobalMaxPool, GlobalAveragePool and their gradient ops
MaxPoolGrad / AveragePoolGrad, with the window geometry they share. Device kernels:
kernels/pool.py (1-D and 2-D windows; a 3-D pool is two of their steps: pool_stages).

An ONNX pooling node (MaxPool, AveragePool, GlobalMaxPool, GlobalAveragePool, or our
MaxPoolGrad / AveragePoolGrad) is resolved once into explicit attributes: kernel_shape,
strides, pads (begins then ends), dilations, ceil_mode and, for averages, count_include_pad.
auto_pad is turned into pads here, so gradient nodes and kernels never see it.

Window rules (onnxruntime and torch agree on all of them):
  * window o along a dimension starts at o * stride - pad_begin and takes kernel elements,
    dilation apart; elements outside the input are padding and never win a max;
  * output size = floor or, with ceil_mode, ceil((in + pads - dilated kernel) / stride) + 1,
    minus one when ceil_mode would start the last window in the end padding;
  * an average divides by the number of input elements in the window, or with
    count_include_pad by the window clipped to the padded input [-pad_begin, in + pad_end),
    so a ceil_mode window running past the padded edge counts only what lies inside it."""
import numpy as np

from .. import opcodes as op
from ..errors import UnsupportedOpError, node_name
from ..graph import DOMAIN, attr
from ..reference import MicrotrainOp
from ..registry import gradient, lowering
from .windows import check_rank, window_attributes


def _output_size(size, kernel, stride, dilation, pad_begin, pad_end, ceil_mode):
    span = size + pad_begin + pad_end - ((kernel - 1) * dilation + 1)
    if not ceil_mode:
        return span // stride + 1
    out = -(-span // stride) + 1
    if (out - 1) * stride >= size + pad_begin:
        out -= 1  # the last window would start in the end padding
    return out


def _touches_input(size, kernel, stride, dilation, pad_begin, window):
    start = window * stride - pad_begin
    return any(0 <= start + k * dilation < size for k in range(kernel))


def pool_attributes(node, in_shape, out_shape, where, depth=False):
    """Explicit attributes of a pooling node whose input has in_shape; checks that the
    windows give out_shape. Raises UnsupportedOpError for what the kernels cannot do.
    depth: 3-D (N, C, D, H, W) pooling is allowed (pool_stages runs it in two steps)."""
    check_rank(in_shape, where, "pooling", depth)
    spatial = list(in_shape[2:])
    rank = len(spatial)
    if node.op_type.startswith("Global"):
        attrs = {"kernel_shape": spatial, "strides": [1] * rank, "pads": [0] * (2 * rank),
                 "dilations": [1] * rank, "ceil_mode": 0}
    else:
        attrs = _window_attributes(node, spatial, where)
        _check_windows(attrs, spatial, where)
    if "Max" not in node.op_type:
        attrs["count_include_pad"] = int(attr(node, "count_include_pad", 0))
    expected = list(in_shape[:2]) + _window_counts(attrs, spatial)
    if list(out_shape) != expected:
        raise UnsupportedOpError(
            f"{where}: the windows give output shape {expected}, but the graph says "
            f"{list(out_shape)}; onnx shape inference before opset 22 keeps a ceil_mode window "
            f"that starts in the end padding, which onnxruntime and torch drop (attribute "
            f"ceil_mode): export with opset >= 22 or change pads or strides")
    return attrs


def _window_attributes(node, spatial, where):
    # kernel_shape, strides, pads, dilations, ceil_mode of a MaxPool / AveragePool (or of
    # its gradient node), validated, with auto_pad resolved into pads.
    rank = len(spatial)
    is_max = "Max" in node.op_type
    if is_max and len(node.output) > 1 and node.output[1]:
        raise UnsupportedOpError(f"{where}: the optional Indices output is not supported")
    if is_max and attr(node, "storage_order", 0) != 0:
        raise UnsupportedOpError(f"{where}: attribute storage_order="
                                 f"{attr(node, 'storage_order', 0)} is not supported (only 0)")
    kernel = list(attr(node, "kernel_shape", []))
    if len(kernel) != rank:
        raise UnsupportedOpError(f"{where}: attribute kernel_shape={kernel} does not match "
                                 f"the {rank} spatial dimensions")
    strides, dilations, pads = window_attributes(node, kernel, spatial, where, "refuse")
    if not is_max and dilations != [1] * rank:
        raise UnsupportedOpError(f"{where}: attribute dilations={dilations} is not supported "
                                 f"for AveragePool (only 1)")
    return {"kernel_shape": kernel, "strides": strides, "pads": pads, "dilations": dilations,
            "ceil_mode": int(attr(node, "ceil_mode", 0))}


def _check_windows(attrs, spatial, where):
    # Every window must fit the padded input and hold at least one input element.
    rank = len(spatial)
    kernel, dilations, pads = attrs["kernel_shape"], attrs["dilations"], attrs["pads"]
    for i in range(rank):
        if spatial[i] + pads[i] + pads[i + rank] < (kernel[i] - 1) * dilations[i] + 1:
            raise UnsupportedOpError(f"{where}: attribute kernel_shape={kernel} (dilations "
                                     f"{dilations}) is larger than the padded input "
                                     f"{spatial} (pads {pads})")
    for i, count in enumerate(_window_counts(attrs, spatial)):
        if not all(_touches_input(spatial[i], kernel[i], attrs["strides"][i], dilations[i],
                                  pads[i], o) for o in range(count)):
            raise UnsupportedOpError(f"{where}: attribute pads={pads} leaves a window with "
                                     f"only padding in it along spatial axis {i}")


def _window_counts(attrs, spatial):
    """Number of windows along each spatial dimension."""
    rank = len(spatial)
    return [_output_size(spatial[i], attrs["kernel_shape"][i], attrs["strides"][i],
                         attrs["dilations"][i], attrs["pads"][i], attrs["pads"][i + rank],
                         attrs["ceil_mode"]) for i in range(rank)]


def pool_kernel_ints(node, in_shape, out_shape, where):
    """The int attributes of the device pool kernels (kernels/pool.py), with 1-D pooling as
    height 1: planes, H, W, OH, OW, kH, kW, sH, sW, pT, pL, then dH, dW for a max, or for an
    average the rows [ch0, ch1) and columns [cw0, cw1) a window is counted within."""
    attrs = pool_attributes(node, in_shape, out_shape, where)
    lead = 4 - len(in_shape)  # 1 for 1-D pooling: a unit height in front
    rank = len(in_shape) - 2

    def two_d(values, fill):
        return [fill] * lead + list(values)

    return _kernel_ints(node, attrs, in_shape[0] * in_shape[1], two_d(in_shape[2:], 1),
                        two_d(out_shape[2:], 1), two_d(attrs["kernel_shape"], 1),
                        two_d(attrs["strides"], 1), two_d(attrs["pads"][:rank], 0),
                        two_d(attrs["pads"][rank:], 0), two_d(attrs["dilations"], 1))


def _kernel_ints(node, attrs, planes, size, out, kernel, strides, begin, end, dilations):
    # One pool step's ints over (planes, H, W): see pool_kernel_ints.
    ints = [planes] + size + out + kernel + strides + begin
    if "Max" in node.op_type:
        return ints + dilations
    if attrs["count_include_pad"]:
        return ints + [-begin[0], size[0] + end[0], -begin[1], size[1] + end[1]]
    return ints + [0, size[0], 0, size[1]]


def pool_stages(node, in_shape, out_shape, where):
    """The pool steps of a node as [(kernel ints, output shape of the step)]: one for 1-D
    and 2-D pooling; two for 3-D, because a max or a mean over a (d, h, w) box is the max or
    mean over d of the maxes or means over (h, w) (each window is a box, so an average's
    count is the product of its counts along the axes): first every depth slice is pooled
    over (H, W), as planes of a 2-D pool; then those results over D, viewed as a 2-D pool
    of (D, OH * OW) planes with (kD, 1) windows. The first maximum in (d, h, w) order is
    the first depth whose slice holds the maximum and that slice's first maximum, so the
    backward routes each gradient where a 3-D kernel would."""
    if len(in_shape) < 5:
        return [(pool_kernel_ints(node, in_shape, out_shape, where), tuple(out_shape))]
    attrs = pool_attributes(node, in_shape, out_shape, where, depth=True)
    n, c, d, h, w = in_shape
    out_d, out_h, out_w = out_shape[2:]
    kernel, strides, dilations = attrs["kernel_shape"], attrs["strides"], attrs["dilations"]
    begin, end = attrs["pads"][:3], attrs["pads"][3:]
    planes = _kernel_ints(node, attrs, n * c * d, [h, w], [out_h, out_w], kernel[1:],
                          strides[1:], begin[1:], end[1:], dilations[1:])
    depth = _kernel_ints(node, attrs, n * c, [d, out_h * out_w], [out_d, out_h * out_w],
                         [kernel[0], 1], [strides[0], 1], [begin[0], 0], [end[0], 0],
                         [dilations[0], 1])
    return [(planes, (n, c, d, out_h, out_w)), (depth, tuple(out_shape))]


# -- gradient rule, lowerings, numpy references ------------------------------------------

@gradient("MaxPool", "AveragePool", "GlobalMaxPool", "GlobalAveragePool")
def grad_pool(g, node, dys, needs):
    # MaxPoolGrad(dY, X) / AveragePoolGrad(dY, X) with explicit windows: auto_pad resolved
    # into pads, a Global pool as one window over the whole plane.
    x = node.input[0]
    attrs = pool_attributes(node, g.shape(x), g.shape(node.output[0]),
                            f"{node.op_type} node {node_name(node)}", depth=True)
    op_type = "MaxPoolGrad" if "Max" in node.op_type else "AveragePoolGrad"
    return [g.node(op_type, [dys[0], x], g.shape(x), domain=DOMAIN, hint="d" + node.op_type,
                   **attrs)]


@lowering("MaxPool", "AveragePool", "GlobalMaxPool", "GlobalAveragePool")
def lower_pool(ctx, node):
    # MaxPool, AveragePool and their Global forms: pool_stages resolves the windows (3-D
    # pooling: two steps through a temporary).
    x, y = node.input[0], node.output[0]
    stages = pool_stages(node, ctx.shape(x), ctx.shape(y), ctx.where(node))
    code = op.MAX_POOL if "Max" in node.op_type else op.AVERAGE_POOL
    targets = [ctx.define("", shape) for _, shape in stages[:-1]] + [ctx.define(y)]
    sources = [ctx.t(x)] + targets[:-1]
    for (ints, _), target, source in zip(stages, targets, sources):
        ctx.step(code, [target, source], ints)


@lowering("MaxPoolGrad", "AveragePoolGrad")
def lower_pool_grad(ctx, node):
    # MaxPoolGrad(dY, X) recomputes each window's argmax from X. AveragePoolGrad(dY, X)
    # takes only its shape from X, so its step does not keep X alive. 3-D pooling: the
    # stages backwards, a max's intermediate maxima recomputed from X first.
    dy, x = node.input
    stages = pool_stages(node, ctx.shape(x), ctx.shape(dy), ctx.where(node))
    is_max = node.op_type == "MaxPoolGrad"
    stage_inputs = [ctx.t(x)] if is_max else []
    if is_max:  # each stage's argmax is taken in its input: the maxima of the stage before
        for ints, shape in stages[:-1]:
            stage_inputs.append(ctx.define("", shape))
            ctx.step(op.MAX_POOL, [stage_inputs[-1], stage_inputs[-2]], ints)
    grad = ctx.t(dy)
    for k in reversed(range(len(stages))):
        into = ctx.define(node.output[0]) if k == 0 else ctx.define("", stages[k - 1][1])
        if is_max:
            ctx.step(op.MAX_POOL_GRAD, [into, grad, stage_inputs[k]], stages[k][0])
        else:
            ctx.step(op.AVERAGE_POOL_GRAD, [into, grad], stages[k][0])
        grad = into


def _pool_windows(in_size, out_size, kernel_shape, strides, pads, dilations):
    """For each output position: the input indices of its window along each spatial axis,
    and the window's length along each axis clipped to the padded input."""
    rank = len(in_size)
    for out in np.ndindex(*out_size):
        taps, padded = [], []
        for i in range(rank):
            start = out[i] * strides[i] - pads[i]
            index = start + dilations[i] * np.arange(kernel_shape[i])
            taps.append(index[(index >= 0) & (index < in_size[i])])
            padded.append(min(start + kernel_shape[i], in_size[i] + pads[rank + i]) - start)
        yield out, taps, padded


class MaxPoolGrad(MicrotrainOp):
    """dX = each window's dY added at the window's first maximum of X (row-major order)."""

    def _run(self, dy, x, kernel_shape=None, strides=None, pads=None, dilations=None,
             ceil_mode=0):
        dx = np.zeros_like(x)
        for out, taps, _ in _pool_windows(x.shape[2:], dy.shape[2:], kernel_shape, strides,
                                          pads, dilations):
            grid = np.stack(np.meshgrid(*taps, indexing="ij"), -1).reshape(-1, len(taps))
            window = x[(slice(None), slice(None)) + np.ix_(*taps)].reshape(x.shape[:2] + (-1,))
            first_max = np.argmax(window, axis=-1)
            for plane in np.ndindex(*x.shape[:2]):
                dx[plane + tuple(grid[first_max[plane]])] += dy[plane + out]
        return (dx,)


class AveragePoolGrad(MicrotrainOp):
    """dX = each window's dY / count spread over the window's input elements; count = the
    elements of the input in it, or with count_include_pad the window clipped to the padded
    input. X only gives the shape."""

    def _run(self, dy, x, kernel_shape=None, strides=None, pads=None, dilations=None,
             ceil_mode=0, count_include_pad=0):
        dx = np.zeros_like(x)
        for out, taps, padded in _pool_windows(x.shape[2:], dy.shape[2:], kernel_shape, strides,
                                               pads, dilations):
            count = np.prod(padded) if count_include_pad else np.prod([len(t) for t in taps])
            share = dy[(slice(None), slice(None)) + out] / count
            dx[(slice(None), slice(None)) + np.ix_(*taps)] += share.reshape(
                share.shape + (1,) * len(taps))
        return (dx,)
