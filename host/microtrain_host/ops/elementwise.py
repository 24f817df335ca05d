"""Elementwise ops: Add, Sub, Mul, Div with numpy broadcasting (each operand read through
strides, 0 where it is broadcast, after merging the dimensions every operand walks
contiguously), Expand, and the unary Neg, Abs, Sign, Exp, Log, Sqrt, Pow (constant scalar
exponent), Reciprocal. Device kernels: kernels/elementwise.py."""
import numpy as np

from .. import opcodes as op
from ..errors import UnsupportedOpError
from ..pipeline.autodiff import unbroadcast
from ..pipeline.lower import broadcast_strides, collapse, contiguous_strides, unary
from ..registry import gradient, lowering


def _binary(code):
    """The lowering of a broadcasting binary op Y = f(A, B): one strided step."""
    def lower(ctx, node):
        a, b = node.input
        out_shape = ctx.shape(node.output[0])
        strides = [contiguous_strides(out_shape), broadcast_strides(out_shape, ctx.shape(a)),
                   broadcast_strides(out_shape, ctx.shape(b))]
        dims, (_, s_a, s_b) = collapse(out_shape, strides, ctx.where(node))
        y = ctx.define(node.output[0])
        ctx.step(code, [y, ctx.t(a), ctx.t(b)], dims + s_a + s_b)
    return lower


# -- Add, Sub, Mul, Div ------------------------------------------------------------------

lowering("Add")(_binary(op.ADD))
lowering("Sub")(_binary(op.SUB))
lowering("Mul")(_binary(op.MUL))
lowering("Div")(_binary(op.DIV))


@gradient("Add")
def grad_add(g, node, dys, needs):
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

lowering("Neg")(unary(op.NEG))
lowering("Abs")(unary(op.ABS))
lowering("Sign")(unary(op.SIGN))
lowering("Exp")(unary(op.EXP))
lowering("Log")(unary(op.LOG))
lowering("Sqrt")(unary(op.SQRT))


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
    # y = x^p with a constant p: dx = dy * p * x^(p-1)
    x, p = node.input
    if needs[1]:
        raise UnsupportedOpError(f"Pow node '{node.name}': the exponent '{p}' gets no gradient; "
                                 f"freeze it or make it a constant")
    exponent = g.constant_value(p)
    if exponent is None or exponent.size != 1:
        raise UnsupportedOpError(f"Pow node '{node.name}': only a constant scalar exponent "
                                 f"is supported")
    p_value = float(exponent.reshape(()))
    if p_value == 2.0:
        slope = g.node("Mul", [x, g.constant("two", np.float32(2.0))], g.shape(x), hint="dPow")
    else:
        lower = g.node("Pow", [x, g.constant("exponent", np.float32(p_value - 1.0))], g.shape(x),
                       hint="dPow")
        slope = g.node("Mul", [lower, g.constant("exponent", np.float32(p_value))], g.shape(x),
                       hint="dPow")
    return [g.node("Mul", [dys[0], slope], g.shape(x), hint="dPow"), None]


@lowering("Pow")
def lower_pow(ctx, node):
    x, p = node.input
    exponent = ctx.value(p)
    if exponent is None or exponent.size != 1:
        raise UnsupportedOpError(f"{ctx.where(node)}: the exponent must be a constant scalar")
    y = ctx.define(node.output[0])
    ctx.step(op.POW, [y, ctx.t(x)], [ctx.tensors[y].size], [float(exponent.reshape(()))])


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
