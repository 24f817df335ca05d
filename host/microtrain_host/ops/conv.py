"""Convolution: Conv and its gradient ops ConvGradInput (dX) and ConvGradWeight (dW), with
the geometry they share; ConvTranspose, which is a convolution's input gradient (so its
own gradients are a Conv and a ConvGradWeight). Device kernels: kernels/conv.py.

An ONNX Conv node (or our ConvGradInput / ConvGradWeight) on a 1-D (N, C, L), 2-D
(N, C, H, W) or 3-D (N, C, D, H, W) input is resolved once into explicit attributes:
kernel_shape, strides, pads (begins then ends), dilations and group. auto_pad is turned into
pads here, so gradient nodes and kernels never see it.

Rules (onnxruntime and torch agree on all of them):
  * output o along a dimension reads the input at o * stride - pad_begin + k * dilation for
    every kernel tap k; positions outside the input are zero padding;
  * output size = floor((in + pad_begin + pad_end - ((kernel - 1) * dilation + 1)) / stride) + 1;
  * auto_pad as in windows.py (SAME with a stride larger than the kernel pads nothing);
  * W is (M, C / group, *kernel); output channel m reads the input channels of group
    m // (M / group)."""
import numpy as np

from .. import opcodes as op
from ..errors import UnsupportedOpError, node_name
from ..graph import DOMAIN, attr, optional_input
from ..ir import NO_TENSOR
from ..reference import MicrotrainOp
from ..registry import gradient, lowering
from .windows import check_rank, window_attributes, window_values


def _kernel_shape(node, w_shape, where):
    """The weight's spatial shape, which the attribute kernel_shape, when given, must be."""
    kernel = list(w_shape[2:])
    if list(attr(node, "kernel_shape", kernel)) != kernel:
        raise UnsupportedOpError(f"{where}: attribute kernel_shape="
                                 f"{list(attr(node, 'kernel_shape', kernel))} does not match the "
                                 f"weight's spatial shape {kernel}")
    return kernel


def conv_attributes(node, x_shape, w_shape, where, depth=False):
    """Explicit attributes of a convolution of an input of x_shape with a weight of w_shape.
    Raises UnsupportedOpError, naming the node and the attribute, for what the kernels
    cannot do. depth: 3-D (N, C, D, H, W) is allowed (the float kernels have it, not the
    int8 ones)."""
    check_rank(x_shape, where, "convolution", depth)
    spatial = list(x_shape[2:])
    rank = len(spatial)
    if len(w_shape) != rank + 2:
        raise UnsupportedOpError(f"{where}: the weight has shape {list(w_shape)}; for input "
                                 f"{list(x_shape)} it must be (M, C / group, *kernel_shape)")
    kernel = _kernel_shape(node, w_shape, where)
    strides, dilations, pads = window_attributes(node, kernel, spatial, where, "clamp")
    group = attr(node, "group", 1)
    channels, out_channels = x_shape[1], w_shape[0]
    if group < 1 or channels % group or out_channels % group or w_shape[1] * group != channels:
        raise UnsupportedOpError(f"{where}: attribute group={group} does not fit input channels "
                                 f"{channels} and weight shape {list(w_shape)} (group must "
                                 f"divide both channel counts, weight dim 1 = C / group)")
    attrs = {"kernel_shape": kernel, "strides": strides, "pads": pads, "dilations": dilations,
             "group": group}
    if min(output_spatial(spatial, attrs)) < 1:
        raise UnsupportedOpError(f"{where}: kernel_shape={kernel} with dilations={dilations} "
                                 f"and pads={pads} is larger than the input {list(x_shape)}")
    return attrs


def output_spatial(spatial, attrs):
    """Output size along each spatial dimension of an input of that spatial shape."""
    rank = len(spatial)
    return [(spatial[i] + attrs["pads"][i] + attrs["pads"][i + rank]
             - (attrs["kernel_shape"][i] - 1) * attrs["dilations"][i] - 1)
            // attrs["strides"][i] + 1 for i in range(rank)]


def device_geometry(attrs, x_shape, w_shape):
    """The ints of the device's conv kernels (kernels/conv.py): the geometry of a 2-D
    convolution, a 1-D one being a 2-D one of height 1; for a 3-D one, the 3-D kernels'
    (each group of sizes depth first)."""
    group = attrs["group"]
    spatial = list(x_shape[2:])
    out = output_spatial(spatial, attrs)
    rank = len(spatial)
    axes = max(2, rank)

    def padded(values, fill):
        return [fill] * (axes - len(values)) + list(values)

    return ([x_shape[0], group, x_shape[1] // group, w_shape[0] // group] + padded(spatial, 1)
            + padded(out, 1) + padded(attrs["kernel_shape"], 1) + padded(attrs["strides"], 1)
            + padded(attrs["dilations"], 1) + padded(attrs["pads"][:rank], 0))


# -- gradient rule, lowerings, numpy references ------------------------------------------

def _bias_grad(g, dy, bias, hint):
    # dB of a convolution or a transposed one: dY summed over images and positions.
    axes = [0] + list(range(2, len(g.shape(dy))))
    return g.node("ReduceSum", [dy, g.constant("axes", np.array(axes, np.int64))],
                  g.shape(bias), hint=hint, keepdims=0)


def _check_output_shape(ctx, node, expected):
    # Conv, ConvTranspose: the graph's output shape must be the one the attributes give.
    if ctx.shape(node.output[0]) != expected:
        raise UnsupportedOpError(f"{ctx.where(node)}: the attributes give output shape "
                                 f"{list(expected)}, the graph says "
                                 f"{list(ctx.shape(node.output[0]))}")


@gradient("Conv")
def grad_conv(g, node, dys, needs):
    # Y = Conv(X, W[, B]), auto_pad resolved into pads: dX = ConvGradInput(dY, W) (only when
    # X needs it: never for the first trainable layer), dW = ConvGradWeight(dY, X),
    # dB = dY summed over images and positions.
    x, w = node.input[0], node.input[1]
    attrs = conv_attributes(node, g.shape(x), g.shape(w), f"Conv node {node_name(node)}",
                            depth=True)
    shared = {k: attrs[k] for k in ("strides", "pads", "dilations", "group")}
    dy = dys[0]
    grads = [None] * len(node.input)
    if needs[0]:
        grads[0] = g.node("ConvGradInput", [dy, w], g.shape(x), domain=DOMAIN, hint="dConvX",
                          input_shape=list(g.shape(x)), **shared)
    if needs[1]:
        grads[1] = g.node("ConvGradWeight", [dy, x], g.shape(w), domain=DOMAIN, hint="dConvW",
                          kernel_shape=attrs["kernel_shape"], **shared)
    if optional_input(node, 2) and needs[2]:
        grads[2] = _bias_grad(g, dy, node.input[2], "dConvB")
    return grads


# The 3-D kernel of each conv step (six more geometry ints: new op codes, so that the 1-D
# and 2-D steps of existing blobs stay as they are).
CODES_3D = {op.CONV: op.CONV_3D, op.CONV_GRAD_INPUT: op.CONV_3D_GRAD_INPUT,
            op.CONV_GRAD_WEIGHT: op.CONV_3D_GRAD_WEIGHT}


def layer_inputs(ctx, node):
    """A Conv / ConvTranspose / Gemm node's input names (X, W and B, None when absent) and
    the shapes of X and W."""
    names = node.input[0], node.input[1], optional_input(node, 2)
    return names, ctx.shape(names[0]), ctx.shape(names[1])


def layer_tensors(ctx, y, names):
    """The step's tensors [Y, X, W, B] (NO_TENSOR for an absent B), after Y is defined (an
    input's first use may place a constant: the order keeps the tensor numbering)."""
    return [y] + [ctx.t(name) if name else NO_TENSOR for name in names]


def _conv_step(ctx, node, code, tensors, x_shape, w_shape):
    attrs = conv_attributes(node, x_shape, w_shape, ctx.where(node), depth=True)
    if len(x_shape) == 5:
        code = CODES_3D[code]
    ctx.step(code, tensors, device_geometry(attrs, x_shape, w_shape))
    return attrs


@lowering("Conv")
def lower_conv(ctx, node):
    names, x_shape, w_shape = layer_inputs(ctx, node)
    y = ctx.define(node.output[0])
    attrs = _conv_step(ctx, node, op.CONV, layer_tensors(ctx, y, names), x_shape, w_shape)
    expected = x_shape[:1] + w_shape[:1] + tuple(output_spatial(x_shape[2:], attrs))
    _check_output_shape(ctx, node, expected)


@lowering("ConvGradInput")
def lower_conv_grad_input(ctx, node):
    dy, w = node.input
    dx = ctx.define(node.output[0])
    _conv_step(ctx, node, op.CONV_GRAD_INPUT, [dx, ctx.t(dy), ctx.t(w)], ctx.shape(node.output[0]),
               ctx.shape(w))


@lowering("ConvGradWeight")
def lower_conv_grad_weight(ctx, node):
    # The fourth tensor (the reset flag) is set when lower_grad_accumulate fuses the step.
    dy, x = node.input
    dw = ctx.define(node.output[0])
    _conv_step(ctx, node, op.CONV_GRAD_WEIGHT, [dw, ctx.t(dy), ctx.t(x), NO_TENSOR],
               ctx.shape(x), ctx.shape(node.output[0]))


def _conv_taps(kernel_shape, strides, dilations, out_spatial):
    """(tap, slices of the padded input that tap reads for all outputs) for every kernel tap."""
    for tap in np.ndindex(*kernel_shape):
        yield tap, tuple(slice(k * d, k * d + (o - 1) * s + 1, s)
                         for k, d, s, o in zip(tap, dilations, strides, out_spatial))


def _conv_groups(group, out_channels, in_channels):
    """(output channel slice, input channel slice) of each group."""
    m, c = out_channels // group, in_channels // group
    return [(slice(g * m, (g + 1) * m), slice(g * c, (g + 1) * c)) for g in range(group)]


class ConvGradInput(MicrotrainOp):
    """dX of Y = Conv(X, W) (pads explicit, no auto_pad): every tap spreads dY, weighted by
    W, back over the padded input positions it read; then the padding is cut off.
    input_shape is X's shape."""

    def _run(self, dy, w, input_shape=None, strides=None, pads=None, dilations=None, group=1):
        rank = len(input_shape) - 2
        begins, ends = pads[:rank], pads[rank:]
        padded = np.zeros(list(input_shape[:2]) + [d + b + e for d, b, e in
                                                   zip(input_shape[2:], begins, ends)], dy.dtype)
        groups = _conv_groups(group, w.shape[0], input_shape[1])
        for tap, window in _conv_taps(w.shape[2:], strides, dilations, dy.shape[2:]):
            for outs, ins in groups:
                padded[(slice(None), ins) + window] += np.einsum(
                    "nm...,mc->nc...", dy[:, outs], w[(outs, slice(None)) + tap])
        inside = tuple(slice(b, b + d) for b, d in zip(begins, input_shape[2:]))
        return (padded[(slice(None), slice(None)) + inside],)


class ConvGradWeight(MicrotrainOp):
    """dW of Y = Conv(X, W) (pads explicit, no auto_pad): for every tap, dY times the padded
    input positions that tap read, summed over images and output positions."""

    def _run(self, dy, x, kernel_shape=None, strides=None, pads=None, dilations=None, group=1):
        rank = x.ndim - 2
        padded = np.pad(x, [(0, 0), (0, 0)] + list(zip(pads[:rank], pads[rank:])))
        dw = np.zeros((dy.shape[1], x.shape[1] // group) + tuple(kernel_shape), dy.dtype)
        groups = _conv_groups(group, dy.shape[1], x.shape[1])
        for tap, window in _conv_taps(kernel_shape, strides, dilations, dy.shape[2:]):
            for outs, ins in groups:
                taken = padded[(slice(None), ins) + window]
                dw[(outs, slice(None)) + tap] = np.einsum(
                    "nmp,ncp->mc", dy[:, outs].reshape(dy.shape[0], -1, taken[0, 0].size),
                    taken.reshape(taken.shape[0], taken.shape[1], -1))
        return (dw,)


# -- ConvTranspose ------------------------------------------------------------------------
#
# Y = ConvTranspose(X, W) is the input gradient dX of the convolution that reads Y's shape
# and writes X's, with the same W (C_X, C_Y / group, *kernel), strides, dilations, group and
# begin pads: Y[n, g*cy + c, o * stride - pad_begin + k * dilation] += X[n, ci, o] *
# W[ci, c, k] for ci in group g. So its forward runs the conv kernels' input-gradient walk
# (CONV_TRANSPOSE, with a bias), its dX is that convolution's forward, Conv(dY, W), and
# its dW that convolution's weight gradient with the roles of the two tensors swapped,
# ConvGradWeight(X as "dY", dY as "X"). Output size along a dimension:
#   stride * (in - 1) + output_padding + (kernel - 1) * dilation + 1 - pad_begin - pad_end.
# output_shape, or auto_pad SAME (output in * stride), gives the total padding instead,
# split with its odd element at the end for SAME_UPPER and at the beginning otherwise; SAME
# with a stride larger than the kernel pads nothing (the output stays below in * stride),
# all as onnxruntime and onnx's shape inference do. output_padding must be below the
# stride (onnxruntime refuses more).

def transpose_attributes(node, x_shape, w_shape, where):
    """Explicit attributes of Y = ConvTranspose(X, W): kernel_shape, strides, dilations,
    group, output_padding, pads (begins, then ends) and the output's spatial shape."""
    check_rank(x_shape, where, "transposed convolution")
    spatial = list(x_shape[2:])
    rank = len(spatial)
    group = attr(node, "group", 1)
    if (len(w_shape) != rank + 2 or group < 1 or x_shape[1] % group
            or w_shape[0] != x_shape[1]):
        raise UnsupportedOpError(f"{where}: the weight has shape {list(w_shape)} and attribute "
                                 f"group={group}; for input {list(x_shape)} the weight must be "
                                 f"(C, M / group, *kernel_shape) with group dividing C")
    kernel = _kernel_shape(node, w_shape, where)
    strides, dilations, pads = window_values(node, rank, where)
    output_padding = list(attr(node, "output_padding", [0] * rank))
    if len(output_padding) != rank or any(not 0 <= p < s
                                          for p, s in zip(output_padding, strides)):
        raise UnsupportedOpError(f"{where}: attribute output_padding={output_padding} must hold "
                                 f"{rank} values, each at least 0 and below its stride "
                                 f"(strides={strides})")
    natural = [s * (n - 1) + p + (k - 1) * d + 1
               for n, s, p, k, d in zip(spatial, strides, output_padding, kernel, dilations)]
    auto_pad = attr(node, "auto_pad", "NOTSET")
    output_shape = attr(node, "output_shape")
    if auto_pad not in ("NOTSET", "VALID", "SAME_UPPER", "SAME_LOWER"):
        raise UnsupportedOpError(f"{where}: attribute auto_pad={auto_pad!r} is not valid")
    if auto_pad in ("SAME_UPPER", "SAME_LOWER") and output_shape is None and any(output_padding):
        raise UnsupportedOpError(f"{where}: attribute auto_pad={auto_pad} with output_padding="
                                 f"{output_padding} is not supported (onnx's shape inference "
                                 f"adds the output_padding to in * stride, onnxruntime does not)")
    if output_shape is not None or auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        name = "output_shape" if output_shape is not None else "auto_pad"
        wanted = ([n * s for n, s in zip(spatial, strides)] if output_shape is None
                  else list(output_shape)[-rank:])
        totals = [n - w for n, w in zip(natural, wanted)]
        if output_shape is None:   # SAME with strides beyond the kernel: no padding
            totals = [max(0, t) for t in totals]
        if len(wanted) != rank or min(totals) < 0:
            raise UnsupportedOpError(
                f"{where}: attribute {name} asks for output size {wanted}, larger than the "
                f"{natural} the input, kernel, strides and output_padding give (onnxruntime "
                f"refuses it too)")
        begins = [t // 2 if auto_pad == "SAME_UPPER" else t - t // 2 for t in totals]
        pads = begins + [t - b for t, b in zip(totals, begins)]
    elif auto_pad == "VALID":
        pads = [0] * (2 * rank)
    out = [n - pads[i] - pads[i + rank] for i, n in enumerate(natural)]
    if min(out) < 1:
        raise UnsupportedOpError(f"{where}: attribute pads={pads} leaves no output (sizes {out})")
    return {"kernel_shape": kernel, "strides": strides, "dilations": dilations, "group": group,
            "output_padding": output_padding, "pads": pads, "output_spatial": out}


def _mirror_pads(attrs):
    """Pads of the convolution whose input gradient the ConvTranspose is, read over dY: the
    begin pads, and end pads that give exactly X's size back (output_padding cells and the
    end pad only ever receive zeros from X)."""
    rank = len(attrs["strides"])
    ends = [max(0, attrs["pads"][rank + i] - attrs["output_padding"][i]) for i in range(rank)]
    return attrs["pads"][:rank] + ends


@gradient("ConvTranspose")
def grad_conv_transpose(g, node, dys, needs):
    x, w = node.input[0], node.input[1]
    attrs = transpose_attributes(node, g.shape(x), g.shape(w),
                                 f"ConvTranspose node '{node.name}'")
    shared = {"strides": attrs["strides"], "pads": _mirror_pads(attrs),
              "dilations": attrs["dilations"], "group": attrs["group"]}
    dy = dys[0]
    grads = [None] * len(node.input)
    if needs[0]:
        grads[0] = g.node("Conv", [dy, w], g.shape(x), hint="dConvTransposeX",
                          kernel_shape=attrs["kernel_shape"], **shared)
    if needs[1]:
        grads[1] = g.node("ConvGradWeight", [x, dy], g.shape(w), domain=DOMAIN,
                          hint="dConvTransposeW", kernel_shape=attrs["kernel_shape"], **shared)
    if optional_input(node, 2) and needs[2]:
        grads[2] = _bias_grad(g, dy, node.input[2], "dConvTransposeB")
    return grads


@lowering("ConvTranspose")
def lower_conv_transpose(ctx, node):
    names, x_shape, w_shape = layer_inputs(ctx, node)
    attrs = transpose_attributes(node, x_shape, w_shape, ctx.where(node))
    expected = (x_shape[0], w_shape[1] * attrs["group"]) + tuple(attrs["output_spatial"])
    _check_output_shape(ctx, node, expected)
    y = ctx.define(node.output[0])
    ctx.step(op.CONV_TRANSPOSE, layer_tensors(ctx, y, names),
             device_geometry(attrs, expected, w_shape))
