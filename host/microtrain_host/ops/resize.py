"""Resize (Upsample from opsets 7-9 arrives as Resize: pipeline/upgrade.py) and its gradient
ResizeGrad. Device kernels: kernels/resize.py.

Supported: mode nearest and linear on the last one or two axes (1-D (N, C, L), 2-D (N, C, H,
W), or any tensor whose leading axes keep their size), scales or sizes as constants (opset 18's
axes too); every coordinate_transformation_mode but tf_crop_and_resize, every nearest_mode.
Refused, naming node and attribute: cubic, antialias, exclude_outside, keep_aspect_ratio_policy
other than stretch, scales or sizes computed on the device, resizing a leading axis.

Where each output row and column reads is worked out here, once, the way onnxruntime does it:
the coordinate in float32, x_original = f(x_resized) by the transformation mode (scale =
the scales value, or output / input length as float32 when sizes are given); nearest rounds
it by nearest_mode and clamps it into the input; linear clamps it into [0, length - 1] and
weighs the two neighbours floor(x) and floor(x) + 1 (the last one twice at the end). The
tables travel with the step, so the device computes no coordinate (float32 ports would round
them differently) and its checker sees every index at load. The gradient scatters dY back
through the same tables, which is what torch's interpolate backward and the adjoint of
onnxruntime's forward both do."""
import numpy as np

from .. import opcodes as op
from ..errors import UnsupportedOpError
from ..graph import DOMAIN, attr
from ..reference import MicrotrainOp
from ..registry import gradient, lowering

DEFAULTS = {"mode": "nearest", "coordinate_transformation_mode": "half_pixel",
            "nearest_mode": "round_prefer_floor", "keep_aspect_ratio_policy": "stretch",
            "antialias": 0, "exclude_outside": 0, "axes": None}
SUPPORTED = {
    "mode": ("nearest", "linear"),
    "coordinate_transformation_mode": ("half_pixel", "half_pixel_symmetric",
                                       "pytorch_half_pixel", "align_corners", "asymmetric",
                                       "tf_half_pixel_for_nn"),
    "nearest_mode": ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil"),
    "keep_aspect_ratio_policy": ("stretch",),
    "antialias": (0,),
    "exclude_outside": (0,),
}


def resize_attributes(get, where):
    """The attributes that decide a Resize, read with get(name, default) and checked."""
    attrs = {}
    for name, default in DEFAULTS.items():
        value = get(name, default)
        attrs[name] = value.decode() if isinstance(value, bytes) else value
    for name, allowed in SUPPORTED.items():
        if attrs[name] not in allowed:
            raise UnsupportedOpError(f"{where}: attribute {name}={attrs[name]!r} is not "
                                     f"supported (supported: "
                                     f"{', '.join(repr(a) for a in allowed)})")
    return attrs


def _source_coordinates(attrs, out_len, in_len, scale):
    """x_original of every output index along one axis, in float32 as onnxruntime computes
    it."""
    x = np.arange(out_len, dtype=np.float32)
    scale = np.float32(scale)
    mode = attrs["coordinate_transformation_mode"]
    if mode == "asymmetric":
        return x / scale
    if mode == "tf_half_pixel_for_nn":
        return (x + np.float32(0.5)) / scale
    if mode == "align_corners":
        if out_len == 1:
            return np.zeros(1, np.float32)
        return x * np.float32(in_len - 1) / np.float32(out_len - 1)
    if mode == "pytorch_half_pixel" and out_len == 1:
        return np.zeros(1, np.float32)
    half_pixel = (x + np.float32(0.5)) / scale - np.float32(0.5)
    if mode == "half_pixel_symmetric":
        adjustment = np.float32(out_len) / (scale * np.float32(in_len))
        center = np.float32(in_len) / np.float32(2)
        return center * (np.float32(1) - adjustment) + half_pixel
    return half_pixel   # half_pixel, pytorch_half_pixel


def _round(x, rule):
    """x_original rounded by nearest_mode (in float64, which holds every float32 exactly):
    round_prefer_ceil is C's round (halves away from zero), round_prefer_floor the same
    except that a value of the form trunc(x) + 0.5 goes down."""
    x = x.astype(np.float64)
    if rule == "floor":
        return np.floor(x)
    if rule == "ceil":
        return np.ceil(x)
    rounded = np.sign(x) * np.floor(np.abs(x) + 0.5)
    if rule == "round_prefer_floor":
        rounded = np.where(x == np.trunc(x) + 0.5, np.floor(x), rounded)
    return rounded


def axis_map(attrs, in_len, out_len, scale):
    """Where the outputs along one axis read: nearest ([source index per output],);
    linear ([first index], [second index], [first weight], [second weight])."""
    if scale == 1 and in_len == out_len:   # onnxruntime leaves such an axis as it is, even
        x = np.arange(out_len, dtype=np.float32)   # where tf_half_pixel_for_nn would move it
    else:
        x = _source_coordinates(attrs, out_len, in_len, scale)
    if attrs["mode"] == "nearest":
        return ([int(i) for i in np.clip(_round(x, attrs["nearest_mode"]), 0, in_len - 1)],)
    x = np.clip(x, np.float32(0), np.float32(in_len - 1))
    first = np.minimum(np.floor(x).astype(np.int64), in_len - 1)
    second = np.minimum(first + 1, in_len - 1)
    w_second = np.abs(x - first.astype(np.float32))    # onnxruntime's dx1, dx2
    w_first = np.abs(x - second.astype(np.float32))
    same = first == second                                # the last index: read once, fully
    w_first = np.where(same, np.float32(1), w_first)
    w_second = np.where(same, np.float32(0), w_second)
    return ([int(i) for i in first], [int(i) for i in second],
            [float(w) for w in w_first], [float(w) for w in w_second])


def interpolation_matrix(table, in_len):
    """The (out, in) matrix of one axis's map: Y = M @ X along that axis."""
    out_len = len(table[0])
    m = np.zeros((out_len, in_len))
    if len(table) == 1:
        m[np.arange(out_len), table[0]] = 1.0
    else:
        for o in range(out_len):
            m[o, table[0][o]] += table[2][o]
            m[o, table[1][o]] += table[3][o]
    return m


def resize_geometry(attrs, x_shape, y_shape, scales, sizes, where):
    """(planes, in_h, in_w, out_h, out_w, row map, column map) of a Resize from x_shape to
    y_shape, the tensor viewed as (planes, H, W) around its last two axes."""
    rank = len(x_shape)
    axes = list(range(rank)) if attrs["axes"] is None else [a % rank for a in attrs["axes"]]
    factors = [np.float32(1)] * rank
    out = list(x_shape)
    if scales is not None and np.size(scales):
        if sizes is not None and np.size(sizes):
            raise UnsupportedOpError(f"{where}: both scales and sizes are given")
        if np.size(scales) != len(axes):
            raise UnsupportedOpError(f"{where}: {np.size(scales)} scales for {len(axes)} axes")
        for a, s in zip(axes, np.asarray(scales, np.float32).reshape(-1)):
            factors[a] = s
            out[a] = int(np.floor(np.float32(x_shape[a]) * s))
    elif sizes is not None and np.size(sizes):
        if np.size(sizes) != len(axes):
            raise UnsupportedOpError(f"{where}: {np.size(sizes)} sizes for {len(axes)} axes")
        for a, n in zip(axes, np.asarray(sizes).reshape(-1)):
            out[a] = int(n)
            factors[a] = np.float32(n) / np.float32(x_shape[a])
    else:
        raise UnsupportedOpError(f"{where}: scales or sizes must be a constant (computed on "
                                 f"the host)")
    if tuple(out) != tuple(y_shape):
        raise UnsupportedOpError(f"{where}: the scales / sizes give output shape {out}, the "
                                 f"graph says {list(y_shape)}")
    if min(out) < 1:
        raise UnsupportedOpError(f"{where}: output shape {out} is empty")
    maps = [axis_map(attrs, x_shape[a], out[a], factors[a]) for a in range(rank)]
    for a in range(rank - 2):
        if out[a] != x_shape[a] or not np.array_equal(
                interpolation_matrix(maps[a], x_shape[a]), np.eye(out[a])):
            raise UnsupportedOpError(f"{where}: axis {a} of {list(x_shape)} is resized "
                                     f"(scale {factors[a]}); only the last two axes can be "
                                     f"(1-D and 2-D resizing)")
    if rank == 1:
        return (1, 1, x_shape[0], 1, out[0], axis_map(attrs, 1, 1, 1.0), maps[0])
    return (int(np.prod(x_shape[:-2], dtype=np.int64)), x_shape[-2], x_shape[-1], out[-2],
            out[-1], maps[-2], maps[-1])


def _resize_step(ctx, node, codes, out, source, x_shape, y_shape):
    where = ctx.where(node)
    attrs = resize_attributes(lambda name, default: attr(node, name, default), where)
    planes, in_h, in_w, out_h, out_w, rows, cols = resize_geometry(
        attrs, x_shape, y_shape, ctx.optional_value(node, 2), ctx.optional_value(node, 3),
        where)
    nearest = attrs["mode"] == "nearest"
    ints = [planes, in_h, in_w, out_h, out_w]
    floats = []
    for table in (rows, cols):
        ints += [i for indices in table[:2] for i in indices]
        floats += [w for weights in table[2:] for w in weights]
    ctx.step(codes[0] if nearest else codes[1], [out, ctx.t(source)], ints, floats)


@lowering("Resize")
def lower_resize(ctx, node):
    y = ctx.define(node.output[0])
    _resize_step(ctx, node, (op.RESIZE_NEAREST, op.RESIZE_LINEAR), y, node.input[0],
                 ctx.shape(node.input[0]), ctx.shape(node.output[0]))


@gradient("Resize")
def grad_resize(g, node, dys, needs):
    # ResizeGrad(dY, roi, scales, sizes) with the forward's attributes and X's shape: the
    # same tables, scattered.
    x = node.input[0]
    attrs = {a.name: attr(node, a.name) for a in node.attribute}
    dx = g.node("ResizeGrad", [dys[0]] + list(node.input[1:]), g.shape(x), domain=DOMAIN,
                hint="dResize", input_shape=list(g.shape(x)), **attrs)
    return [dx] + [None] * (len(node.input) - 1)


@lowering("ResizeGrad")
def lower_resize_grad(ctx, node):
    dx = ctx.define(node.output[0])
    _resize_step(ctx, node, (op.RESIZE_NEAREST_GRAD, op.RESIZE_LINEAR_GRAD), dx,
                 node.input[0], tuple(attr(node, "input_shape")), ctx.shape(node.input[0]))


class ResizeGrad(MicrotrainOp):
    """dX of Y = Resize(X): dY through the transposed interpolation matrix of each of the
    last two axes (the leading ones keep their size)."""

    def _run(self, dy, roi=None, scales=None, sizes=None, input_shape=None, **given):
        where = "ResizeGrad"
        attrs = resize_attributes(lambda name, default: default if given.get(name) is None
                                  else given[name], where)
        planes, in_h, in_w, out_h, out_w, rows, cols = resize_geometry(
            attrs, tuple(input_shape), dy.shape, scales, sizes, where)
        flat = dy.astype(np.float64).reshape(planes, out_h, out_w)
        dx = interpolation_matrix(rows, in_h).T @ flat @ interpolation_matrix(cols, in_w)
        return (dx.reshape(input_shape).astype(dy.dtype),)
