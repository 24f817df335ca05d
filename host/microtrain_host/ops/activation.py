"""Activations: Relu, Sigmoid, Tanh, Softplus, LeakyRelu, Clip (ReLU6), HardSigmoid,
HardSwish, Shrink, Softmax, LogSoftmax, and their gradient ops. Device kernels:
kernels/activation.py.

The gradients of Relu, Sigmoid, Tanh, Softmax and LogSoftmax read the forward *output* Y (the
input need not be kept); those of the piecewise-linear ones read X, since Y cannot tell which
side of a kink X was on. At a kink the gradient is torch's."""
import math

import numpy as np
from onnx import helper

from .. import opcodes as op
from ..errors import UnsupportedOpError
from ..graph import DOMAIN, attr, optional_input
from ..ir import axis_view, unary
from ..reference import MicrotrainOp
from ..registry import gradient, lowering, lowerings


def _grad_from_output(op_type):
    # dX = <op>Grad(dY, Y): the kernels need only the forward output.
    def rule(g, node, dys, needs):
        return [g.node(op_type, [dys[0], node.output[0]], g.shape(node.input[0]),
                       domain=DOMAIN, hint="d" + node.op_type)]
    return rule


def _lower_grad_from_output(code):
    def lower(ctx, node):
        dy, y = node.input
        dx = ctx.define(node.output[0])
        ctx.step(code, [dx, ctx.t(dy), ctx.t(y)], [ctx.tensors[dx].size])
    return lower


# -- Relu, Sigmoid, Tanh, Softplus -------------------------------------------------------

lowerings(unary, {"Relu": op.RELU, "Sigmoid": op.SIGMOID, "Tanh": op.TANH,
                  "Softplus": op.SOFTPLUS})
for op_type in ("Relu", "Sigmoid", "Tanh"):
    gradient(op_type)(_grad_from_output(op_type + "Grad"))
lowerings(_lower_grad_from_output, {"ReluGrad": op.RELU_GRAD, "SigmoidGrad": op.SIGMOID_GRAD,
                                    "TanhGrad": op.TANH_GRAD})


@gradient("Softplus")
def grad_softplus(g, node, dys, needs):
    # d/dx log(1 + exp(x)) = sigmoid(x)
    x = node.input[0]
    slope = g.node("Sigmoid", [x], g.shape(x), hint="dSoftplus")
    return [g.node("Mul", [dys[0], slope], g.shape(x), hint="dSoftplus")]


class ReluGrad(MicrotrainOp):
    """dX = dY where Y > 0, else 0."""

    def _run(self, dy, y):
        return (np.where(y > 0, dy, np.zeros_like(dy)),)


class SigmoidGrad(MicrotrainOp):
    """dX = dY * Y * (1 - Y)."""

    def _run(self, dy, y):
        return ((dy * y * (1 - y)).astype(dy.dtype),)


class TanhGrad(MicrotrainOp):
    """dX = dY * (1 - Y^2)."""

    def _run(self, dy, y):
        return ((dy * (1 - y * y)).astype(dy.dtype),)


# -- Softmax, LogSoftmax: viewed as (outer, n, inner) around the axis ------------------------

def _softmax_grad_rule(op_type):
    def rule(g, node, dys, needs):
        axis = attr(node, "axis", -1)
        return [g.node(op_type, [dys[0], node.output[0]], g.shape(node.input[0]), domain=DOMAIN,
                       hint="d" + node.op_type, axis=axis)]
    return rule


def _lower_softmax(code):
    def lower(ctx, node):
        x = node.input[0]
        view = axis_view(ctx.shape(x), attr(node, "axis", -1), ctx.where(node))
        y = ctx.define(node.output[0])
        ctx.step(code, [y, ctx.t(x)], view)
    return lower


def _lower_softmax_grad(code):
    def lower(ctx, node):
        dy, y = node.input
        view = axis_view(ctx.shape(y), attr(node, "axis", -1), ctx.where(node))
        dx = ctx.define(node.output[0])
        ctx.step(code, [dx, ctx.t(dy), ctx.t(y)], view)
    return lower


lowerings(_lower_softmax, {"Softmax": op.SOFTMAX, "LogSoftmax": op.LOG_SOFTMAX})
for op_type in ("Softmax", "LogSoftmax"):
    gradient(op_type)(_softmax_grad_rule(op_type + "Grad"))
lowerings(_lower_softmax_grad, {"SoftmaxGrad": op.SOFTMAX_GRAD,
                                "LogSoftmaxGrad": op.LOG_SOFTMAX_GRAD})


class SoftmaxGrad(MicrotrainOp):
    """Y = softmax(X, axis): dX = Y * (dY - sum(dY * Y, axis))."""

    def _run(self, dy, y, axis=-1):
        dot = np.sum(dy * y, axis=axis, keepdims=True)
        return ((y * (dy - dot)).astype(dy.dtype),)


class LogSoftmaxGrad(MicrotrainOp):
    """Y = log_softmax(X, axis): dX = dY - exp(Y) * sum(dY, axis)."""

    def _run(self, dy, y, axis=-1):
        total = np.sum(dy, axis=axis, keepdims=True)
        return ((dy - np.exp(y) * total).astype(dy.dtype),)


# -- LeakyRelu, Clip, HardSigmoid, HardSwish, Shrink, ThresholdedRelu: piecewise linear,
# gradients read X ------------------------------------------------------------------------

def _grad_from_input(op_type):
    # dX = <op>Grad(dY, X) with the forward node's attributes: Y cannot tell which side
    # of a kink X was on.
    def rule(g, node, dys, needs):
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        return [g.node(op_type, [dys[0], node.input[0]], g.shape(node.input[0]), domain=DOMAIN,
                       hint="d" + node.op_type, **attrs)]
    return rule


def _lower_piecewise(code, floats):
    # The PIECEWISE ops (below) and their gradients, which read (dY, X).
    def lower(ctx, node):
        inputs = node.input[:2] if node.op_type.endswith("Grad") else node.input[:1]
        y = ctx.define(node.output[0])
        ctx.step(code, [y] + [ctx.t(i) for i in inputs], [ctx.tensors[y].size],
                 floats(ctx, node))
    return lower


def _leaky_relu_alpha(ctx, node):
    return [attr(node, "alpha", 0.01)]


def _hard_sigmoid_floats(ctx, node):
    return [attr(node, "alpha", 0.2), attr(node, "beta", 0.5)]


def _no_floats(ctx, node):
    return []


def _threshold_alpha(ctx, node):
    return [attr(node, "alpha", 1.0)]


def _shrink_floats(ctx, node):
    # Shrink (torch's hardshrink: bias 0; softshrink: bias = lambd); ShrinkGrad needs lambd
    floats = [attr(node, "lambd", 0.5)]
    return floats if node.op_type == "ShrinkGrad" else floats + [attr(node, "bias", 0.0)]


def _clip_bounds(ctx, node):
    # ClipGrad carries its bounds as attributes; Clip takes them as optional constant inputs.
    if node.op_type == "ClipGrad":
        return [attr(node, "min", -math.inf), attr(node, "max", math.inf)]
    bounds = []
    for index, name, default in ((1, "min", -math.inf), (2, "max", math.inf)):
        tensor = optional_input(node, index)
        if not tensor:
            bounds.append(default)
            continue
        value = ctx.value(tensor)
        if value is None or value.size != 1:
            raise UnsupportedOpError(f"{ctx.where(node)}: input '{name}' must be a constant "
                                     f"scalar (a Constant node or a non-parameter initializer)")
        bounds.append(float(np.asarray(value).reshape(())))
    return bounds


# op type: (its op code, the op code of its gradient op <op type>Grad, the floats both
# steps carry)
PIECEWISE = {
    "LeakyRelu": (op.LEAKY_RELU, op.LEAKY_RELU_GRAD, _leaky_relu_alpha),
    "Clip": (op.CLIP, op.CLIP_GRAD, _clip_bounds),
    "HardSigmoid": (op.HARD_SIGMOID, op.HARD_SIGMOID_GRAD, _hard_sigmoid_floats),
    "HardSwish": (op.HARD_SWISH, op.HARD_SWISH_GRAD, _no_floats),
    "Shrink": (op.SHRINK, op.SHRINK_GRAD, _shrink_floats),
    "ThresholdedRelu": (op.THRESHOLDED_RELU, op.THRESHOLDED_RELU_GRAD, _threshold_alpha),
}
for op_type, (code, grad_code, floats) in PIECEWISE.items():
    lowering(op_type)(_lower_piecewise(code, floats))
    lowering(op_type + "Grad")(_lower_piecewise(grad_code, floats))
    if op_type != "Clip":   # its bounds are inputs, which get no gradient: grad_clip
        gradient(op_type)(_grad_from_input(op_type + "Grad"))


@gradient("Clip")
def grad_clip(g, node, dys, needs):
    # dX = dY where min <= X <= max; min and max (optional inputs) must be constants.
    if any(needs[1:]):
        raise UnsupportedOpError(f"Clip node '{node.name}': min and max get no gradient; "
                                 f"freeze them or make them constants")
    bounds = {}
    for index, name in ((1, "min"), (2, "max")):
        if optional_input(node, index):
            value = g.constant_value(node.input[index])
            if value is None or np.size(value) != 1:
                raise UnsupportedOpError(f"Clip node '{node.name}': input '{name}' must be a "
                                         f"constant scalar")
            bounds[name] = float(np.reshape(value, ()))
    dx = g.node("ClipGrad", [dys[0], node.input[0]], g.shape(node.input[0]), domain=DOMAIN,
                hint="dClip", **bounds)
    return [dx] + [None] * (len(node.input) - 1)


class LeakyReluGrad(MicrotrainOp):
    """dX = dY where X > 0, else alpha * dY (alpha also at X = 0, as torch)."""

    def _run(self, dy, x, alpha=0.01):
        return (np.where(x > 0, dy, alpha * dy).astype(dy.dtype),)


class ClipGrad(MicrotrainOp):
    """dX = dY where min <= X <= max, else 0 (the bounds pass, as torch.clamp)."""

    def _run(self, dy, x, min=-np.inf, max=np.inf):
        return (np.where((x >= min) & (x <= max), dy, 0).astype(dy.dtype),)


class HardSigmoidGrad(MicrotrainOp):
    """dX = alpha * dY where 0 < alpha * X + beta < 1, else 0 (0 at the kinks, as torch)."""

    def _run(self, dy, x, alpha=0.2, beta=0.5):
        t = alpha * x + beta
        return (np.where((t > 0) & (t < 1), alpha * dy, 0).astype(dy.dtype),)


class ShrinkGrad(MicrotrainOp):
    """dX = dY where X < -lambd or X > lambd, else 0 (0 at the bounds, as torch's
    hardshrink and softshrink)."""

    def _run(self, dy, x, lambd=0.5, bias=0.0):
        return (np.where((x < -lambd) | (x > lambd), dy, 0).astype(dy.dtype),)


class ThresholdedReluGrad(MicrotrainOp):
    """dX = dY where X > alpha, else 0 (at X == alpha too: the step is 0 there)."""

    def _run(self, dy, x, alpha=1.0):
        return (np.where(x > alpha, dy, 0).astype(dy.dtype),)


class HardSwishGrad(MicrotrainOp):
    """dX = dY * (X / 3 + 1/2) where -3 < X < 3, 0 for X <= -3, dY for X >= 3 (as torch)."""

    def _run(self, dy, x):
        inside = np.where(x >= 3, dy, dy * (x / 3 + 0.5))
        return (np.where(x <= -3, 0, inside).astype(dy.dtype),)
