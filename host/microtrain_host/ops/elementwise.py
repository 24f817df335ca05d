"""Elementwise ops: Add, Sub, Mul, Div with numpy broadcasting (each operand read through
strides, 0 where it is broadcast, after merging the dimensions every operand walks
contiguously), Expand, and the unary Neg, Abs, Sign, Exp, Log, Sqrt, Pow (a constant scalar
exponent; a tensor or trained one broadcasts like Add), Reciprocal. Device kernels:
kernels/elementwise.py."""
import numpy as np

from .. import opcodes as op
from ..errors import UnsupportedOpError
from ..graph import DOMAIN, unbroadcast
from ..ir import NO_TENSOR, broadcast_strides, collapse, contiguous_strides, unary
from ..reference import MicrotrainOp
from ..registry import gradient, lowering, lowerings


def binary_step(ctx, code, y, a, b, where):
    """One strided step Y = f(A, B) of a broadcasting binary kernel; y, a, b are tensor ids
    (Y has the broadcast shape)."""
    out_shape = ctx.tensors[y].shape
    strides = [contiguous_strides(out_shape),
               broadcast_strides(out_shape, ctx.tensors[a].shape),
               broadcast_strides(out_shape, ctx.tensors[b].shape)]
    dims, (_, s_a, s_b) = collapse(out_shape, strides, where)
    ctx.step(code, [y, a, b], dims + s_a + s_b)


def _binary(code):
    """The lowering of a broadcasting binary op Y = f(A, B): one strided step."""
    def lower(ctx, node):
        y = ctx.define(node.output[0])  # before the inputs: constants get ids after Y
        binary_step(ctx, code, y, ctx.t(node.input[0]), ctx.t(node.input[1]), ctx.where(node))
    return lower


# -- Add, Sub, Mul, Div ------------------------------------------------------------------

lowerings(_binary, {"Add": op.ADD, "Sub": op.SUB, "Mul": op.MUL, "Div": op.DIV})


@gradient("Add", "Sum")
def grad_add(g, node, dys, needs):
    # Sum (below) is Add of any number of inputs: each gets dY summed to its shape.
    return [unbroadcast(g, dys[0], g.shape(x)) if need else None
            for x, need in zip(node.input, needs)]


@gradient("Sub")
def grad_sub(g, node, dys, needs):
    da = unbroadcast(g, dys[0], g.shape(node.input[0])) if needs[0] else None
    db = None
    if needs[1]:
        db = g.node("Neg", [unbroadcast(g, dys[0], g.shape(node.input[1]))],
                    g.shape(node.input[1]), hint="dB")
    return [da, db]


@gradient("Mul")
def grad_mul(g, node, dys, needs):
    a, b = node.input
    dy = dys[0]
    out = []
    for x, other, need in ((a, b, needs[0]), (b, a, needs[1])):
        out.append(unbroadcast(g, g.node("Mul", [dy, other], g.shape(dy), hint="dMul"), g.shape(x))
                   if need else None)
    return out


@gradient("Div")
def grad_div(g, node, dys, needs):
    # y = a / b: da = dy / b, db = -dy * y / b
    a, b = node.input
    dy, y = dys[0], node.output[0]
    da = db = None
    if needs[0]:
        da = unbroadcast(g, g.node("Div", [dy, b], g.shape(dy), hint="dDiv"), g.shape(a))
    if needs[1]:
        t = g.node("Div", [g.node("Mul", [dy, y], g.shape(dy), hint="dDiv"), b], g.shape(dy),
                   hint="dDiv")
        db = g.node("Neg", [unbroadcast(g, t, g.shape(b))], g.shape(b), hint="dB")
    return [da, db]


# -- Expand ------------------------------------------------------------------------------

@gradient("Expand")
def grad_expand(g, node, dys, needs):
    return [unbroadcast(g, dys[0], g.shape(node.input[0])), None]


@lowering("Expand")
def lower_expand(ctx, node):
    x = node.input[0]
    out_shape = ctx.shape(node.output[0])
    dims, (_, s_x) = collapse(out_shape, [contiguous_strides(out_shape),
                                          broadcast_strides(out_shape, ctx.shape(x))],
                              ctx.where(node))
    y = ctx.define(node.output[0])
    ctx.step(op.EXPAND, [y, ctx.t(x)], dims + s_x)


# -- unary ops ---------------------------------------------------------------------------

lowerings(unary, {"Neg": op.NEG, "Abs": op.ABS, "Sign": op.SIGN, "Exp": op.EXP, "Log": op.LOG,
                  "Sqrt": op.SQRT})


@gradient("Neg")
def grad_neg(g, node, dys, needs):
    return [g.node("Neg", [dys[0]], g.shape(dys[0]), hint="dNeg")]


@gradient("Abs")
def grad_abs(g, node, dys, needs):
    x = node.input[0]
    sign = g.node("Sign", [x], g.shape(x), hint="dAbs_sign")
    return [g.node("Mul", [dys[0], sign], g.shape(x), hint="dAbs")]


@gradient("Exp")
def grad_exp(g, node, dys, needs):
    return [g.node("Mul", [dys[0], node.output[0]], g.shape(dys[0]), hint="dExp")]


@gradient("Log")
def grad_log(g, node, dys, needs):
    return [g.node("Div", [dys[0], node.input[0]], g.shape(dys[0]), hint="dLog")]


@gradient("Sqrt")
def grad_sqrt(g, node, dys, needs):
    twice = g.node("Mul", [node.output[0], g.constant("two", np.float32(2.0))],
                   g.shape(node.output[0]), hint="dSqrt")
    return [g.node("Div", [dys[0], twice], g.shape(dys[0]), hint="dSqrt")]


@gradient("Pow")
def grad_pow(g, node, dys, needs):
    x, p = node.input
    exponent = g.constant_value(p)
    if p not in g.parameters and exponent is not None and exponent.size == 1:
        # y = x^p with a constant p: dx = dy * p * x^(p-1), with the unary kernel
        return [_grad_pow_constant(g, x, float(exponent.reshape(())), dys[0]), None]
    # A tensor exponent, or a parameter (trained, or frozen: the device may still copy
    # another value in): PowGrad gives dX and dP in Y's shape, summed here to X's and P's.
    y = node.output[0]
    outputs = [g.fresh(f"d{node.name}_{part}") if need else ""
               for part, need in zip(("X", "P"), needs)]
    g.node("PowGrad", [dys[0], y, x, p], [g.shape(y), g.shape(y)], outputs=outputs,
           domain=DOMAIN)
    return [unbroadcast(g, out, g.shape(name)) if out else None
            for out, name in zip(outputs, (x, p))]


def _grad_pow_constant(g, x, p_value, dy):
    if p_value == 2.0:
        slope = g.node("Mul", [x, g.constant("two", np.float32(2.0))], g.shape(x), hint="dPow")
    else:
        lower = g.node("Pow", [x, g.constant("exponent", np.float32(p_value - 1.0))], g.shape(x),
                       hint="dPow")
        slope = g.node("Mul", [lower, g.constant("exponent", np.float32(p_value))], g.shape(x),
                       hint="dPow")
    return g.node("Mul", [dy, slope], g.shape(x), hint="dPow")


@lowering("Pow")
def lower_pow(ctx, node):
    # A constant scalar exponent: the unary kernel. Anything else (a tensor of exponents,
    # broadcast as Add broadcasts, or a parameter): the strided binary one.
    x, p = node.input
    exponent = ctx.value(p)
    y = ctx.define(node.output[0])
    if exponent is not None and exponent.size == 1:
        ctx.step(op.POW, [y, ctx.t(x)], [ctx.tensors[y].size], [float(exponent.reshape(()))])
        return
    binary_step(ctx, op.POW_TENSOR, y, ctx.t(x), _float_exponent(ctx, p), ctx.where(node))


def _float_exponent(ctx, p):
    """The exponent's tensor id: an integer exponent tensor (ONNX allows one) is a host
    value, given to the device as floats."""
    value = ctx.value(p)
    if value is not None and value.dtype.kind in "iub":
        p = f"{p}.float"
        ctx._constant(p, value.astype(np.float32))
    return ctx.t(p)


@lowering("PowGrad")
def lower_pow_grad(ctx, node):
    dy, y, x, p = node.input
    shape = ctx.shape(y)
    dims, (_, s_x, s_p) = collapse(shape, [contiguous_strides(shape),
                                           broadcast_strides(shape, ctx.shape(x)),
                                           broadcast_strides(shape, ctx.shape(p))],
                                   ctx.where(node))
    outs = [ctx.define(name) if name else NO_TENSOR for name in list(node.output) + [""] * 2][:2]
    tensors = [ctx.t(dy), ctx.t(y), ctx.t(x), _float_exponent(ctx, p)]
    ctx.step(op.POW_TENSOR_GRAD, outs + tensors, dims + s_x + s_p)


class PowGrad(MicrotrainOp):
    """dX = dY * P * X^(P-1), 0 where P == 0; dP = dY * Y * ln(X), 0 where X == 0 and
    P >= 0 (torch's pow backward); both in Y's shape."""

    def _run(self, dy, y, x, p):
        x, p = np.broadcast_to(x, y.shape), np.broadcast_to(p, y.shape)
        with np.errstate(all="ignore"):
            dx = np.where(p == 0, 0, dy * p * np.power(x, p - 1))
            dp = np.where((x == 0) & (p >= 0), 0, dy * y * np.log(x))
        return dx.astype(dy.dtype), dp.astype(dy.dtype)


@gradient("Reciprocal")
def grad_reciprocal(g, node, dys, needs):
    # y = 1 / x: dx = -dy * y^2
    y = node.output[0]
    square = g.node("Mul", [y, y], g.shape(y), hint="dReciprocal")
    return [g.node("Neg", [g.node("Mul", [dys[0], square], g.shape(y), hint="dReciprocal")],
                   g.shape(y), hint="dReciprocal")]


@lowering("Reciprocal")
def lower_reciprocal(ctx, node):
    y = ctx.define(node.output[0])
    ctx.step(op.POW, [y, ctx.t(node.input[0])], [ctx.tensors[y].size], [-1.0])


# -- Max, Min, Sum, Mean: variadic, broadcasting, folded pairwise ---------------------------

def _fold(ctx, node, code):
    """Y = f(f(f(X0, X1), X2), ...): one binary step per further input, each partial result
    shaped like the broadcast of the inputs so far; the last writes Y."""
    inputs = [i for i in node.input if i]
    if len(inputs) == 1:
        return ctx.t(inputs[0]), False
    acc = ctx.t(inputs[0])
    for k, name in enumerate(inputs[1:], start=2):
        x = ctx.t(name)
        if k == len(inputs):
            y = ctx.define(node.output[0])
        else:
            y = ctx.define("", np.broadcast_shapes(ctx.tensors[acc].shape, ctx.tensors[x].shape))
        binary_step(ctx, code, y, acc, x, ctx.where(node))
        acc = y
    return acc, True


def _lower_fold(code):
    def lower(ctx, node):
        if not _fold(ctx, node, code)[1]:
            ctx.alias(node.output[0], node.input[0])
    return lower


lowerings(_lower_fold, {"Max": op.MAX, "Min": op.MIN, "Sum": op.ADD})


@lowering("Mean")
def lower_mean(ctx, node):
    count = sum(1 for i in node.input if i)
    if count == 1:
        ctx.alias(node.output[0], node.input[0])
        return
    total, _ = _fold(ctx, node, op.ADD)
    # Y = sum * (1 / count) in place: the elementwise kernels read each element once, before
    # writing it.
    scale = f"mean_scale({count})"
    ctx._constant(scale, np.array(1.0 / count, np.float32))
    binary_step(ctx, op.MUL, total, total, ctx.t(scale), ctx.where(node))


@gradient("Mean")
def grad_mean(g, node, dys, needs):
    scale = g.constant("mean_scale", np.float32(1.0 / len(node.input)))
    dy = g.node("Mul", [dys[0], scale], g.shape(dys[0]), hint="dMean")
    return [unbroadcast(g, dy, g.shape(x)) if need else None
            for x, need in zip(node.input, needs)]


@gradient("Max", "Min")
def grad_max_min(g, node, dys, needs):
    # dX_i = dY / count where X_i gave the output, count = how many inputs tie for it.
    if len(node.input) == 1:
        return [dys[0]]
    y = node.output[0]
    shape = g.shape(y)
    count = g.node("TieCount", [y] + list(node.input), shape, domain=DOMAIN,
                   hint="d" + node.op_type + "_ties")
    return [unbroadcast(g, g.node("TieShare", [dys[0], y, count, x], shape, domain=DOMAIN,
                                  hint="d" + node.op_type), g.shape(x)) if need else None
            for x, need in zip(node.input, needs)]


@lowering("TieCount")
def lower_tie_count(ctx, node):
    count = ctx.define(node.output[0])
    ctx.step(op.FILL, [count], [ctx.tensors[count].size], [0.0])
    y = ctx.t(node.input[0])
    for x in node.input[1:]:
        binary_step(ctx, op.COUNT_EQUAL, count, y, ctx.t(x), ctx.where(node))


@lowering("TieShare")
def lower_tie_share(ctx, node):
    dy, y, count, x = node.input
    shape = ctx.shape(y)
    dims, (_, s_x) = collapse(shape, [contiguous_strides(shape),
                                      broadcast_strides(shape, ctx.shape(x))], ctx.where(node))
    dx = ctx.define(node.output[0])
    ctx.step(op.TIE_SHARE, [dx, ctx.t(dy), ctx.t(y), ctx.t(count), ctx.t(x)], dims + s_x)


class TieCount(MicrotrainOp):
    """How many of the inputs X_i (broadcast) equal Y at each element."""

    def _run(self, y, *xs):
        return (sum((np.broadcast_to(x, y.shape) == y).astype(y.dtype) for x in xs),)


class TieShare(MicrotrainOp):
    """dY / count where X (broadcast) equals Y, else 0: X's share of Max / Min's gradient."""

    def _run(self, dy, y, count, x):
        tied = np.broadcast_to(x, y.shape) == y
        return (np.where(tied, dy / np.where(tied, count, 1), 0).astype(dy.dtype),)


# -- PRelu ---------------------------------------------------------------------------------

def _broadcasts_to(shape, target):
    """Whether numpy broadcasts `shape` to exactly `target` (unidirectional broadcasting)."""
    if len(shape) > len(target):
        return False
    return all(d == t or d == 1 for d, t in zip(reversed(shape), reversed(target)))


@lowering("PRelu")
def lower_prelu(ctx, node):
    x, slope = node.input
    if not _broadcasts_to(ctx.shape(slope), ctx.shape(x)):
        raise UnsupportedOpError(f"{ctx.where(node)}: slope {list(ctx.shape(slope))} does not "
                                 f"broadcast to X {list(ctx.shape(x))} (numpy-style, from the "
                                 f"last axis, as from opset 7: a per-channel slope of an "
                                 f"(N, C, ...) input has shape (C, 1, ...))")
    binary_step(ctx, op.PRELU, ctx.define(node.output[0]), ctx.t(x), ctx.t(slope),
                ctx.where(node))


@gradient("PRelu")
def grad_prelu(g, node, dys, needs):
    # PReluGrad(dY, X, slope) -> dX, dslope in X's shape (summed to the slope's shape here).
    x, slope = node.input
    outputs = [g.fresh(f"d{node.name}_{part}") if need else ""
               for part, need in zip(("X", "slope"), needs)]
    g.node("PReluGrad", [dys[0], x, slope], [g.shape(x), g.shape(x)], outputs=outputs,
           domain=DOMAIN)
    dslope = unbroadcast(g, outputs[1], g.shape(slope)) if needs[1] else None
    return [outputs[0] or None, dslope]


@lowering("PReluGrad")
def lower_prelu_grad(ctx, node):
    dy, x, slope = node.input
    shape = ctx.shape(x)
    dims, (_, s_slope) = collapse(shape, [contiguous_strides(shape),
                                          broadcast_strides(shape, ctx.shape(slope))],
                                  ctx.where(node))
    outs = [ctx.define(name) if name else NO_TENSOR for name in list(node.output) + [""] * 2][:2]
    ctx.step(op.PRELU_GRAD, outs + [ctx.t(dy), ctx.t(x), ctx.t(slope)], dims + s_slope)


class PReluGrad(MicrotrainOp):
    """dX = dY where X > 0, else dY * slope; dslope (X's shape) = 0 where X > 0, else
    dY * X (torch's PReLU backward)."""

    def _run(self, dy, x, slope):
        positive = x > 0
        return (np.where(positive, dy, dy * slope).astype(dy.dtype),
                np.where(positive, 0, dy * x).astype(dy.dtype))
