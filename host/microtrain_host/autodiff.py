"""Reverse-mode autodiff over ONNX graphs: one gradient rule per op, in one table.

A rule gets the builder, the forward node, the gradients of the node's outputs (None where
no gradient flows) and which inputs need a gradient; it emits nodes and returns one
gradient name (or None) per input. Gradients of a tensor used several times are summed.
Only tensors that depend on a trainable parameter get gradients, so frozen layers and the
input gradient of the first trainable layer cost nothing."""
import numpy as np
from onnx import helper

from .errors import UnsupportedOpError
from .graph import DOMAIN


def _attr(node, name, default):
    for a in node.attribute:
        if a.name == name:
            return helper.get_attribute_value(a)
    return default


def unbroadcast(g, dy, in_shape):
    """Sum dy over the dimensions along which an input of in_shape was broadcast."""
    out_shape = g.shape(dy)
    in_shape = tuple(in_shape)
    if out_shape == in_shape:
        return dy
    lead = len(out_shape) - len(in_shape)
    axes = [i for i in range(len(out_shape))
            if i < lead or (in_shape[i - lead] == 1 and out_shape[i] != 1)]
    kept = tuple(1 if i in axes else d for i, d in enumerate(out_shape))
    summed = g.node("ReduceSum", [dy, g.constant("axes", np.array(axes, dtype=np.int64))],
                    kept, hint="unbroadcast", keepdims=1)
    if kept == in_shape:
        return summed
    return g.node("Reshape", [summed, g.constant("shape", np.array(in_shape, dtype=np.int64))],
                  in_shape, hint="unbroadcast_reshape")


def _gemm_operand_grad(g, first, second, trans_first, trans_second, alpha, shape, hint):
    return g.node("Gemm", [first, second], shape, hint=hint, alpha=alpha,
                  transA=int(trans_first), transB=int(trans_second))


def grad_gemm(g, node, dys, needs):
    # Y = alpha * op(A) op(B) + beta * C, op = transpose when transA / transB.
    a, b = node.input[0], node.input[1]
    dy = dys[0]
    alpha = _attr(node, "alpha", 1.0)
    beta = _attr(node, "beta", 1.0)
    ta, tb = _attr(node, "transA", 0), _attr(node, "transB", 0)
    grads = [None] * len(node.input)
    if needs[0]:
        # dA = alpha * dY op(B)^T, or its transpose when A was transposed.
        if not ta:
            grads[0] = _gemm_operand_grad(g, dy, b, 0, not tb, alpha, g.shape(a), "dA")
        else:
            grads[0] = _gemm_operand_grad(g, b, dy, tb, 1, alpha, g.shape(a), "dA")
    if needs[1]:
        # dB = alpha * op(A)^T dY, or its transpose when B was transposed.
        if not tb:
            grads[1] = _gemm_operand_grad(g, a, dy, not ta, 0, alpha, g.shape(b), "dB")
        else:
            grads[1] = _gemm_operand_grad(g, dy, a, 1, ta, alpha, g.shape(b), "dB")
    if len(node.input) > 2 and node.input[2] and needs[2]:
        dc = unbroadcast(g, dy, g.shape(node.input[2]))
        if beta != 1.0:
            dc = g.node("Mul", [dc, g.constant("beta", np.float32(beta))], g.shape(node.input[2]),
                        hint="dC")
        grads[2] = dc
    return grads


def grad_matmul(g, node, dys, needs):
    a, b = node.input
    if len(g.shape(a)) != 2 or len(g.shape(b)) != 2:
        raise UnsupportedOpError(f"MatMul node '{node.name}': only 2-D operands are supported, "
                                 f"got {list(g.shape(a))} x {list(g.shape(b))}")
    dy = dys[0]
    return [_gemm_operand_grad(g, dy, b, 0, 1, 1.0, g.shape(a), "dA") if needs[0] else None,
            _gemm_operand_grad(g, a, dy, 1, 0, 1.0, g.shape(b), "dB") if needs[1] else None]


def grad_add(g, node, dys, needs):
    return [unbroadcast(g, dys[0], g.shape(x)) if need else None
            for x, need in zip(node.input, needs)]


def grad_sub(g, node, dys, needs):
    da = unbroadcast(g, dys[0], g.shape(node.input[0])) if needs[0] else None
    db = None
    if needs[1]:
        db = g.node("Neg", [unbroadcast(g, dys[0], g.shape(node.input[1]))],
                    g.shape(node.input[1]), hint="dB")
    return [da, db]


def grad_mul(g, node, dys, needs):
    a, b = node.input
    dy = dys[0]
    out = []
    for x, other, need in ((a, b, needs[0]), (b, a, needs[1])):
        out.append(unbroadcast(g, g.node("Mul", [dy, other], g.shape(dy), hint="dMul"), g.shape(x))
                   if need else None)
    return out


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


def _activation_grad(op_type):
    # dX = <op>Grad(dY, Y): the kernels need only the forward output.
    def rule(g, node, dys, needs):
        return [g.node(op_type, [dys[0], node.output[0]], g.shape(node.input[0]),
                       domain=DOMAIN, hint="d" + node.op_type)]
    return rule


def _softmax_grad(op_type):
    def rule(g, node, dys, needs):
        axis = _attr(node, "axis", -1)
        return [g.node(op_type, [dys[0], node.output[0]], g.shape(node.input[0]), domain=DOMAIN,
                       hint="d" + node.op_type, axis=axis)]
    return rule


def grad_reshape(g, node, dys, needs):
    # Flatten, Reshape, Squeeze, Unsqueeze: the gradient has the input's shape.
    x = node.input[0]
    grads = [None] * len(node.input)
    grads[0] = g.node("Reshape", [dys[0], g.constant("shape", np.array(g.shape(x), np.int64))],
                      g.shape(x), hint="d" + node.op_type)
    return grads


def grad_identity(g, node, dys, needs):
    return [dys[0]]


def grad_softplus(g, node, dys, needs):
    # d/dx log(1 + exp(x)) = sigmoid(x)
    x = node.input[0]
    slope = g.node("Sigmoid", [x], g.shape(x), hint="dSoftplus")
    return [g.node("Mul", [dys[0], slope], g.shape(x), hint="dSoftplus")]


def grad_neg(g, node, dys, needs):
    return [g.node("Neg", [dys[0]], g.shape(dys[0]), hint="dNeg")]


def grad_abs(g, node, dys, needs):
    x = node.input[0]
    sign = g.node("Sign", [x], g.shape(x), hint="dAbs_sign")
    return [g.node("Mul", [dys[0], sign], g.shape(x), hint="dAbs")]


def grad_exp(g, node, dys, needs):
    return [g.node("Mul", [dys[0], node.output[0]], g.shape(dys[0]), hint="dExp")]


def grad_log(g, node, dys, needs):
    return [g.node("Div", [dys[0], node.input[0]], g.shape(dys[0]), hint="dLog")]


def grad_sqrt(g, node, dys, needs):
    twice = g.node("Mul", [node.output[0], g.constant("two", np.float32(2.0))],
                   g.shape(node.output[0]), hint="dSqrt")
    return [g.node("Div", [dys[0], twice], g.shape(dys[0]), hint="dSqrt")]


def grad_pow(g, node, dys, needs):
    # y = x^p with a constant p: dx = dy * p * x^(p-1)
    x, p = node.input
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


def _reduce_axes(g, node):
    x = node.input[0]
    rank = len(g.shape(x))
    axes = _attr(node, "axes", None)
    if axes is None and len(node.input) > 1 and node.input[1]:
        value = g.constant_value(node.input[1])
        if value is None:
            raise UnsupportedOpError(f"{node.op_type} node '{node.name}': axes must be constant")
        axes = [int(v) for v in value.reshape(-1)]
    if not axes:
        if _attr(node, "noop_with_empty_axes", 0):
            return []
        axes = list(range(rank))
    return sorted(a % rank for a in axes)


def grad_reduce(g, node, dys, needs):
    # ReduceSum / ReduceMean: broadcast dY back over the reduced axes (scaled for the mean).
    x = node.input[0]
    shape = g.shape(x)
    axes = _reduce_axes(g, node)
    kept = tuple(1 if i in axes else d for i, d in enumerate(shape))
    dy = dys[0]
    if g.shape(dy) != kept:
        dy = g.node("Reshape", [dy, g.constant("shape", np.array(kept, np.int64))], kept,
                    hint="dReduce")
    dx = g.node("Expand", [dy, g.constant("shape", np.array(shape, np.int64))], shape,
                hint="dReduce")
    if node.op_type == "ReduceMean":
        count = int(np.prod([shape[a] for a in axes])) if axes else 1
        dx = g.node("Mul", [dx, g.constant("inv_count", np.float32(1.0 / count))], shape,
                    hint="dReduceMean")
    grads = [None] * len(node.input)
    grads[0] = dx
    return grads


def grad_softmax_cross_entropy(g, node, dys, needs):
    scores, labels = node.input[0], node.input[1]
    if len(node.output) < 2 or not node.output[1]:
        raise UnsupportedOpError(f"SoftmaxCrossEntropyLoss node '{node.name}' needs its log_prob "
                                 f"output for the gradient")
    return [g.node("SoftmaxCrossEntropyLossGrad", [dys[0], node.output[1], labels],
                   g.shape(scores), domain=DOMAIN, hint="dScores", reduction="mean"), None]


GRAD_RULES = {
    "Gemm": grad_gemm,
    "MatMul": grad_matmul,
    "Add": grad_add,
    "Sub": grad_sub,
    "Mul": grad_mul,
    "Div": grad_div,
    "Relu": _activation_grad("ReluGrad"),
    "Sigmoid": _activation_grad("SigmoidGrad"),
    "Tanh": _activation_grad("TanhGrad"),
    "Softmax": _softmax_grad("SoftmaxGrad"),
    "LogSoftmax": _softmax_grad("LogSoftmaxGrad"),
    "Softplus": grad_softplus,
    "Flatten": grad_reshape,
    "Reshape": grad_reshape,
    "Squeeze": grad_reshape,
    "Unsqueeze": grad_reshape,
    "Identity": grad_identity,
    "Neg": grad_neg,
    "Abs": grad_abs,
    "Exp": grad_exp,
    "Log": grad_log,
    "Sqrt": grad_sqrt,
    "Pow": grad_pow,
    "ReduceSum": grad_reduce,
    "ReduceMean": grad_reduce,
    "SoftmaxCrossEntropyLoss": grad_softmax_cross_entropy,
}


def build_gradients(g, forward_nodes, loss, trainable):
    """Emit the backward pass of `forward_nodes` into g; returns {param: gradient name}."""
    needs_grad = set(trainable)
    for node in forward_nodes:
        if any(i in needs_grad for i in node.input if i):
            needs_grad.update(o for o in node.output if o)
    grads = {loss: g.constant("loss_grad", np.float32(1.0))}
    pending = {}  # tensor -> list of gradient contributions not yet summed

    def gradient_of(name):
        parts = pending.pop(name, None)
        if parts:
            total = parts[0]
            for part in parts[1:]:
                total = g.node("Add", [total, part], g.shape(name), hint=f"{name}_grad_sum")
            grads[name] = total
        return grads.get(name)

    for node in reversed(forward_nodes):
        needs = [bool(i) and i in needs_grad for i in node.input]
        if not any(needs):
            continue
        dys = [gradient_of(o) if o else None for o in node.output]
        if all(d is None for d in dys):
            continue
        rule = GRAD_RULES.get(node.op_type)
        if rule is None:
            raise UnsupportedOpError(f"no gradient rule for op '{node.op_type}' (node "
                                     f"'{node.name}'); supported: {', '.join(sorted(GRAD_RULES))}")
        for inp, need, dx in zip(node.input, needs, rule(g, node, dys, needs)):
            if need and dx is not None:
                pending.setdefault(inp, []).append(dx)
    return {p: gradient_of(p) for p in trainable}
