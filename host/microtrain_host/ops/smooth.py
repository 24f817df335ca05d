"""Smooth activations: Elu, Selu, Celu, Gelu (opset 20's op; torch's opset-17 exports of
GELU are Erf and arithmetic), Erf, Softsign, and their gradient ops, which read the forward
*input* X. Device kernels: kernels/smooth.py.

Elu, Selu and Celu are one exponential-linear unit y = scale * (x if x > 0 else
alpha * (exp(k * x) - 1)): Elu (scale 1, k 1), Selu (scale gamma, k 1), Celu (scale 1,
k 1 / alpha). At x = 0 the gradient is the exponential side's, as torch's."""
import math

import numpy as np

from .. import opcodes as op
from ..errors import UnsupportedOpError
from ..graph import DOMAIN, attr
from ..ir import unary
from ..reference import MicrotrainOp
from ..registry import gradient, lowering

# ONNX's Selu defaults (float32 roundings of the constants torch uses)
SELU_ALPHA = 1.67326319217681884765625
SELU_GAMMA = 1.05070102214813232421875


def exp_linear_coefficients(node, where):
    """(alpha, scale, k) of an Elu, Selu or Celu node."""
    if node.op_type == "Elu":
        return attr(node, "alpha", 1.0), 1.0, 1.0
    if node.op_type == "Selu":
        return attr(node, "alpha", SELU_ALPHA), attr(node, "gamma", SELU_GAMMA), 1.0
    alpha = attr(node, "alpha", 1.0)
    if not alpha > 0.0 or not math.isfinite(alpha):
        raise UnsupportedOpError(f"{where}: attribute alpha = {alpha}; Celu needs alpha > 0")
    return alpha, 1.0, 1.0 / alpha


def _input_grad(op_type, attrs_of=lambda node: {}):
    # dX = <op_type>(dY, X, **attributes): the kernels read the forward input.
    def rule(g, node, dys, needs):
        x = node.input[0]
        return [g.node(op_type, [dys[0], x], g.shape(x), domain=DOMAIN, hint="d" + node.op_type,
                       **attrs_of(node))]
    return rule


def _lower_input_grad(code, floats=lambda ctx, node: (), ints=lambda ctx, node: ()):
    def lower(ctx, node):
        dy, x = node.input
        dx = ctx.define(node.output[0])
        ctx.step(code, [dx, ctx.t(dy), ctx.t(x)], [ctx.tensors[dx].size] + list(ints(ctx, node)),
                 floats(ctx, node))
    return lower


# -- Elu, Selu, Celu ------------------------------------------------------------------------

@lowering("Elu", "Selu", "Celu")
def lower_exp_linear(ctx, node):
    y = ctx.define(node.output[0])
    ctx.step(op.EXP_LINEAR, [y, ctx.t(node.input[0])], [ctx.tensors[y].size],
             exp_linear_coefficients(node, ctx.where(node)))


def _exp_linear_attrs(node):
    alpha, scale, k = exp_linear_coefficients(node, f"{node.op_type} node '{node.name}'")
    return {"alpha": alpha, "scale": scale, "input_scale": k}


gradient("Elu", "Selu", "Celu")(_input_grad("ExpLinearGrad", _exp_linear_attrs))
lowering("ExpLinearGrad")(_lower_input_grad(
    op.EXP_LINEAR_GRAD, floats=lambda ctx, node: [attr(node, "alpha"), attr(node, "scale"),
                                                  attr(node, "input_scale")]))


class ExpLinearGrad(MicrotrainOp):
    """dX = dY * scale where X > 0, dY * scale * alpha * k * exp(k * X) where X <= 0."""

    def _run(self, dy, x, alpha=1.0, scale=1.0, input_scale=1.0):
        negative = scale * alpha * input_scale * np.exp(input_scale * np.minimum(x, 0))
        return ((dy * np.where(x > 0, scale, negative)).astype(dy.dtype),)


_erf = np.vectorize(math.erf, otypes=[np.float64])


# -- Erf, Gelu ------------------------------------------------------------------------------

lowering("Erf")(unary(op.ERF))
gradient("Erf")(_input_grad("ErfGrad"))
lowering("ErfGrad")(_lower_input_grad(op.ERF_GRAD))


class ErfGrad(MicrotrainOp):
    """dX = dY * 2 / sqrt(pi) * exp(-X^2)."""

    def _run(self, dy, x):
        return ((dy * 2.0 / np.sqrt(np.pi) * np.exp(-x * x)).astype(dy.dtype),)


def _gelu_approximate(node, where):
    approximate = attr(node, "approximate", "none")
    if approximate not in ("none", "tanh"):
        raise UnsupportedOpError(f"{where}: attribute approximate = '{approximate}' (none and "
                                 f"tanh are supported)")
    return int(approximate == "tanh")


@lowering("Gelu")
def lower_gelu(ctx, node):
    y = ctx.define(node.output[0])
    ctx.step(op.GELU, [y, ctx.t(node.input[0])],
             [ctx.tensors[y].size, _gelu_approximate(node, ctx.where(node))])


gradient("Gelu")(_input_grad("GeluGrad", lambda node: {
    "approximate": attr(node, "approximate", "none")}))
lowering("GeluGrad")(_lower_input_grad(
    op.GELU_GRAD, ints=lambda ctx, node: [_gelu_approximate(node, ctx.where(node))]))


def gelu_slope(x, approximate):
    """d gelu(x) / dx in float64."""
    x = x.astype(np.float64)
    if approximate == "tanh":
        c = math.sqrt(2.0 / math.pi)
        h = np.tanh(c * (x + 0.044715 * x ** 3))
        return 0.5 * (1 + h) + 0.5 * x * (1 - h * h) * c * (1 + 3 * 0.044715 * x * x)
    return 0.5 * (1 + _erf(x / math.sqrt(2.0))) + x * np.exp(-0.5 * x * x) / math.sqrt(
        2.0 * math.pi)


class GeluGrad(MicrotrainOp):
    """dX = dY * gelu'(X) (approximate: none or tanh)."""

    def _run(self, dy, x, approximate="none"):
        approximate = approximate.decode() if isinstance(approximate, bytes) else approximate
        return ((dy * gelu_slope(x, approximate)).astype(dy.dtype),)


# -- Softsign -------------------------------------------------------------------------------

lowering("Softsign")(unary(op.SOFTSIGN))
gradient("Softsign")(_input_grad("SoftsignGrad"))
lowering("SoftsignGrad")(_lower_input_grad(op.SOFTSIGN_GRAD))


class SoftsignGrad(MicrotrainOp):
    """dX = dY / (1 + |X|)^2."""

    def _run(self, dy, x):
        return ((dy / (1 + np.abs(x)) ** 2).astype(dy.dtype),)
