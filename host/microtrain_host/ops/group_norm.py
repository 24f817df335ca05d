"""Per-sample normalisation: LayerNormalization (any axis; the opset-17 op; torch's
lower-opset exports are ReduceMean / Sub / Pow / Sqrt / Div, which train through those ops),
InstanceNormalization, GroupNormalization (opset 21: per-channel scale and bias; torch's
GroupNorm exports as InstanceNormalization on a reshaped input), and their gradient op
NormalizationGrad. One device kernel pair (kernels/group_norm.py) over a view of X as
(rows, groups, channels per group, inner): see there."""
import numpy as np

from .. import opcodes as op
from ..errors import UnsupportedOpError
from ..graph import DOMAIN, attr, optional_input
from ..ir import NO_TENSOR
from ..reference import MicrotrainOp
from ..registry import SHAPED_LIKE_INPUT, gradient, lowering

SHAPED_LIKE_INPUT.add("GroupNormalization")  # a function op onnx infers no shape for


def normalization_view(node, x_shape, where, channels_of=None):
    """[rows, groups, channels per group, inner] of a LayerNormalization,
    InstanceNormalization or GroupNormalization node over X of x_shape; channels_of(name)
    gives an input's element count (to check scale and bias)."""
    shape = list(x_shape)
    size = int(np.prod(shape, dtype=np.int64))
    if node.op_type == "LayerNormalization":
        axis = attr(node, "axis", -1)
        if not -len(shape) <= axis < len(shape):
            raise UnsupportedOpError(f"{where}: attribute axis = {axis} is out of range for "
                                     f"X of shape {shape}")
        block = int(np.prod(shape[axis % len(shape):], dtype=np.int64))
        view = [size // block if block else 0, 1, block, 1]
    else:
        if len(shape) < 3 if node.op_type == "GroupNormalization" else len(shape) < 2:
            raise UnsupportedOpError(f"{where}: X must be (N, C, ...), got {shape}")
        n, c = shape[:2]
        inner = int(np.prod(shape[2:], dtype=np.int64))
        groups = c if node.op_type == "InstanceNormalization" else attr(node, "num_groups")
        if groups is None or groups < 1 or c % groups:
            raise UnsupportedOpError(f"{where}: attribute num_groups = {groups} does not "
                                     f"divide the {c} channels")
        view = [n * groups, groups, c // groups, inner]
    if 0 in view:
        raise UnsupportedOpError(f"{where}: X of shape {shape} has nothing to normalise")
    if channels_of is not None:
        channels = view[1] * view[2]
        for index, what in ((1, "scale"), (2, "bias")):
            if optional_input(node, index):
                count = channels_of(node.input[index])
                if count != channels:
                    raise UnsupportedOpError(
                        f"{where}: input {what} holds {count} values, the kernel takes one per "
                        f"{'normalised element' if node.op_type == 'LayerNormalization' else 'channel'}"
                        f" ({channels})" + (" (GroupNormalization before opset 21 has one per "
                                            "group: export at opset 21)"
                                            if node.op_type == "GroupNormalization" else ""))
    return view


def _check_outputs(node, uses, where):
    # LayerNormalization's optional Mean and InvStdDev outputs are not computed.
    used = [o for o in node.output[1:] if o and uses(o)]
    if used:
        raise UnsupportedOpError(f"{where}: outputs {', '.join(used)} (the saved mean and "
                                 f"inverse deviation) are not supported")


@lowering("LayerNormalization", "InstanceNormalization", "GroupNormalization")
def lower_normalization(ctx, node):
    x = node.input[0]
    where = ctx.where(node)
    _check_outputs(node, ctx.uses.get, where)
    view = normalization_view(node, ctx.shape(x), where,
                              lambda name: int(np.prod(ctx.shape(name), dtype=np.int64)))
    scale_bias = [ctx.t(name) if name else NO_TENSOR
                  for name in (optional_input(node, 1), optional_input(node, 2))]
    y = ctx.define(node.output[0])
    ctx.step(op.GROUP_NORM, [y, ctx.t(x)] + scale_bias, view, [attr(node, "epsilon", 1e-5)])


@gradient("LayerNormalization", "InstanceNormalization", "GroupNormalization")
def grad_normalization(g, node, dys, needs):
    # NormalizationGrad(dY, X, scale) -> dX, dscale, dbias, each only when needed; the
    # statistics are recomputed from X.
    where = f"{node.op_type} node '{node.name}'"
    if any(d is not None for d in dys[1:]):
        raise UnsupportedOpError(f"{where}: its mean and inverse deviation outputs feed the "
                                 f"loss; they have no gradient")
    x = node.input[0]
    view = normalization_view(node, g.shape(x), where)
    inputs = list(node.input) + [""] * (3 - len(node.input))
    outputs = [g.fresh(f"d{node.name}_{part}") if need else ""
               for part, need in zip(("X", "scale", "bias"), list(needs) + [False] * 3)]
    shapes = [g.shape(x)] + [g.shape(name) if name else None for name in inputs[1:3]]
    g.node("NormalizationGrad", [dys[0], x, inputs[1]], shapes, outputs=outputs, domain=DOMAIN,
           view=view, epsilon=attr(node, "epsilon", 1e-5))
    return [o or None for o in outputs][:len(node.input)]


@lowering("NormalizationGrad")
def lower_normalization_grad(ctx, node):
    dy, x = node.input[:2]
    scale = optional_input(node, 2)
    outs = [ctx.define(name) if name else NO_TENSOR
            for name in (list(node.output) + ["", ""])[:3]]
    ctx.step(op.GROUP_NORM_GRAD, outs + [ctx.t(dy), ctx.t(x), ctx.t(scale) if scale
                                          else NO_TENSOR],
             attr(node, "view"), [attr(node, "epsilon", 1e-5)])


class NormalizationGrad(MicrotrainOp):
    """dX, dscale, dbias of Y = normalize(X) * scale + bias over X viewed as
    (rows / groups, groups, channels per group, inner) = `view` (rows, groups, cpb, inner),
    statistics over the last two axes, scale and bias per (group, channel)."""

    def _run(self, dy, x, scale=None, view=None, epsilon=1e-5):
        rows, groups, cpb, inner = (int(v) for v in view)
        shape = (rows // groups, groups, cpb, inner)
        xs, dys = x.astype(np.float64).reshape(shape), dy.astype(np.float64).reshape(shape)
        mean = xs.mean(axis=(2, 3), keepdims=True)
        inv_std = 1.0 / np.sqrt(xs.var(axis=(2, 3), keepdims=True) + epsilon)
        xhat = (xs - mean) * inv_std
        k = np.ones((1, groups, cpb, 1)) if scale is None else \
            scale.astype(np.float64).reshape(1, groups, cpb, 1)
        gs = dys * k
        dx = inv_std * (gs - gs.mean(axis=(2, 3), keepdims=True)
                        - xhat * (gs * xhat).mean(axis=(2, 3), keepdims=True))
        dscale = (dys * xhat).sum(axis=(0, 3))
        dbias = dys.sum(axis=(0, 3))
        channel_shape = scale.shape if scale is not None else (groups * cpb,)
        return (dx.reshape(x.shape).astype(x.dtype),
                dscale.reshape(channel_shape).astype(x.dtype),
                dbias.reshape(channel_shape).astype(x.dtype))
