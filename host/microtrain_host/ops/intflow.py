"""Integer gradients through residual Adds, pools and tensors read twice (issue 22; device
kernels: kernels/intflow.py, which documents the fixed point). quant/intbackward.py builds
the graphs that use them, with ops/intgrad.py's convolution steps.

  IntGradSum(A, B) -> G            the sum of two gradients of one tensor (gradient tensors:
                                   [exponent, then mantissas], ops/intgrad.py)
  IntAddGrad(G, Y) -> GA [, GB]    the gradients of a QLinearAdd's inputs: G where its output
                                   Y lies inside the clamp (attributes lo, hi), else 0
  IntMaxPoolGrad(G, X) -> GX       MaxPool's backward (the pool's attributes copied on the
                                   node; X its int8 input, the output's maxima found again)
  IntAveragePoolGrad(G, X) -> GX   AveragePool's backward (X for the shape only)
  IntConcatGrad(G, X, Y) -> GX     a QLinearConcat's input X: its part of G (attributes axis
                                   and start, where X begins along it), 0 where X's
                                   requantization to Y saturated"""
from onnx import helper

from .. import opcodes as op
from ..errors import UnsupportedOpError
from ..graph import attr
from ..ir import INT8, NO_TENSOR
from ..registry import lowering
from .intgrad import _grad_tensor
from .inttrain import _byte, _derived
from .pool import pool_kernel_ints
from .qlinear import concat_geometry


def _gradient(ctx, name, node):
    tid = ctx.t(name)
    if len(ctx.tensors[tid].shape) != 1 or ctx.tensors[tid].size < 2:
        raise UnsupportedOpError(f"{ctx.where(node)}: '{name}' is not a gradient tensor")
    return tid, ctx.tensors[tid].size - 1


def gradient_of(ctx, node, count, name, what):
    """The quantized tensor `name` (its id and Tensor) whose gradient has `count` values:
    one per element, or an error naming it the `what` (input, output) of the gradient."""
    tid, t = _byte(ctx, name, node)
    if t.size != count:
        raise UnsupportedOpError(f"{ctx.where(node)}: a gradient of {count} values for an "
                                 f"{what} of {t.size}")
    return tid, t


@lowering("IntGradSum")
def lower_int_grad_sum(ctx, node):
    a, count = _gradient(ctx, node.input[0], node)
    b, other = _gradient(ctx, node.input[1], node)
    if other != count:
        raise UnsupportedOpError(f"{ctx.where(node)}: gradients of {count} and {other} values")
    g = _grad_tensor(ctx, node.output[0], count)
    ratio = _derived(ctx, f"{node.name}.ratio", 3)
    ctx.step(op.INT_GRAD_SUM, [g, a, b, ratio], [count])


@lowering("IntAddGrad")
def lower_int_add_grad(ctx, node):
    g, count = _gradient(ctx, node.input[0], node)
    yid, y = gradient_of(ctx, node, count, node.input[1], "output")
    outputs = [_grad_tensor(ctx, name, count) for name in node.output]
    if len(outputs) not in (1, 2):
        raise UnsupportedOpError(f"{ctx.where(node)}: one or two outputs")
    ga, gb = (outputs + [NO_TENSOR])[:2]
    ctx.step(op.INT_ADD_GRAD, [ga, gb, g, yid],
             [count, attr(node, "lo", 0), attr(node, "hi", 255), int(y.dtype == INT8)])


def _pool(ctx, node, kind):
    g, count = _gradient(ctx, node.input[0], node)
    xid, x = _byte(ctx, node.input[1], node)
    out_shape = [int(v) for v in attr(node, "output_shape")]
    # the pool node as the pool op it is the backward of (pool_kernel_ints reads the op
    # type: a max has dilations, an average its counted area)
    pool = helper.make_node(kind, node.input[1:2], node.output, name=node.name)
    pool.attribute.extend(a for a in node.attribute if a.name != "output_shape")
    ints = pool_kernel_ints(pool, x.shape, out_shape, ctx.where(node))
    planes, out_h, out_w = ints[0], ints[3], ints[4]
    if planes * out_h * out_w != count:
        raise UnsupportedOpError(f"{ctx.where(node)}: a gradient of {count} values for a pool "
                                 f"output of {out_shape}")
    return g, xid, x, ints, _grad_tensor(ctx, node.output[0], x.size)


@lowering("IntMaxPoolGrad")
def lower_int_max_pool_grad(ctx, node):
    g, xid, x, ints, gx = _pool(ctx, node, "MaxPool")
    if ints[11:] != [1, 1]:
        raise UnsupportedOpError(f"{ctx.where(node)}: int8 MaxPool with dilations")
    ctx.step(op.INT_MAX_POOL_GRAD, [gx, g, xid], ints[:11] + [int(x.dtype == INT8)])


@lowering("IntAveragePoolGrad")
def lower_int_average_pool_grad(ctx, node):
    g, xid, x, ints, gx = _pool(ctx, node, "AveragePool")
    k_h, k_w = ints[5], ints[6]
    factors = _derived(ctx, f"{node.name}.factors", 2 * k_h * k_w)
    ctx.step(op.INT_AVERAGE_POOL_GRAD, [gx, g, factors], ints)


@lowering("IntConcatGrad")
def lower_int_concat_grad(ctx, node):
    g, count = _gradient(ctx, node.input[0], node)
    xid, x = _byte(ctx, node.input[1], node)
    yid, y = gradient_of(ctx, node, count, node.input[2], "output")
    geometry = concat_geometry(x.shape, y.shape, attr(node, "axis"), attr(node, "start"),
                               ctx.where(node))
    gx = _grad_tensor(ctx, node.output[0], x.size)
    keep = _derived(ctx, f"{node.name}.keep", 2)
    ctx.step(op.INT_CONCAT_GRAD, [gx, g, xid, yid, keep],
             list(geometry) + [int(x.dtype == INT8)])
