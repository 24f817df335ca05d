"""Reverse-mode autodiff over ONNX graphs: one gradient rule per op, in one table.

A rule gets the builder, the forward node, the gradients of the node's outputs (None where
no gradient flows) and which inputs need a gradient; it emits nodes and returns one
gradient name (or None) per input. Gradients of a tensor used several times are summed.
Only tensors that depend on a trainable parameter get gradients, so frozen layers and the
input gradient of the first trainable layer cost nothing."""
import numpy as np
from onnx import TensorProto, helper

from ..ops.conv import conv_attributes
from ..errors import UnsupportedOpError
from ..graph import DOMAIN, attr
from ..ops.norm import batch_norm_training, dropout_config
from ..ops.pool import pool_attributes
from ..ops.layout import matmul_views, pad_amounts


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
    alpha = attr(node, "alpha", 1.0)
    beta = attr(node, "beta", 1.0)
    ta, tb = attr(node, "transA", 0), attr(node, "transB", 0)
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


def _view(g, name, shape, hint):
    """name with another shape (a free alias on the device), or name itself."""
    shape = tuple(shape)
    if tuple(g.shape(name)) == shape:
        return name
    return g.node("Reshape", [name, g.constant("shape", np.array(shape, np.int64))], shape,
                  hint=hint)


def grad_matmul(g, node, dys, needs):
    # Y = A @ B with numpy's rules (1-D operands, broadcast batch dimensions). When B is a
    # matrix, A's batch folds into its rows and both gradients are 2-D Gemms (dB can then
    # accumulate in place). Otherwise each gradient is a FusedMatMul with one operand
    # transposed, summed over the batch dimensions its operand was broadcast along.
    a, b = node.input
    view_a, view_b, view_y = matmul_views(g.shape(a), g.shape(b), f"MatMul node '{node.name}'")
    dy = _view(g, dys[0], view_y, "dMatMul")
    da = db = None
    if len(view_b) == 2:
        rows = (int(np.prod(view_a[:-1])), view_a[-1])
        dy_rows = _view(g, dy, (rows[0], view_b[1]), "dMatMul")
        if needs[0]:
            da = _gemm_operand_grad(g, dy_rows, _view(g, b, view_b, "dMatMul"), 0, 1, 1.0, rows,
                                    "dA")
        if needs[1]:
            db = _gemm_operand_grad(g, _view(g, a, rows, "dMatMul"), dy_rows, 1, 0, 1.0, view_b,
                                    "dB")
    else:
        batch = view_y[:-2]
        if needs[0]:
            da = unbroadcast(g, g.node("FusedMatMul", [dy, _view(g, b, view_b, "dMatMul")],
                                       batch + view_a[-2:], domain=DOMAIN, hint="dA", transB=1),
                             view_a)
        if needs[1]:
            db = unbroadcast(g, g.node("FusedMatMul", [_view(g, a, view_a, "dMatMul"), dy],
                                       batch + view_b[-2:], domain=DOMAIN, hint="dB", transA=1),
                             view_b)
    return [_view(g, da, g.shape(a), "dA") if da else None,
            _view(g, db, g.shape(b), "dB") if db else None]


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
        axis = attr(node, "axis", -1)
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


def _reduce_axes(g, node):
    x = node.input[0]
    rank = len(g.shape(x))
    axes = attr(node, "axes", None)
    if axes is None and len(node.input) > 1 and node.input[1]:
        value = g.constant_value(node.input[1])
        if value is None:
            raise UnsupportedOpError(f"{node.op_type} node '{node.name}': axes must be constant")
        axes = [int(v) for v in value.reshape(-1)]
    if not axes:
        if attr(node, "noop_with_empty_axes", 0):
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
        if count == 0:  # X is empty (e.g. a Conv or pool window larger than its input, which
            return [dx] + [None] * (len(node.input) - 1)  # that node's rule refuses): so is dX
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


def grad_expand(g, node, dys, needs):
    return [unbroadcast(g, dys[0], g.shape(node.input[0])), None]


def grad_transpose(g, node, dys, needs):
    # The inverse permutation.
    shape = g.shape(node.input[0])
    perm = attr(node, "perm", None) or list(reversed(range(len(shape))))
    if sorted(perm) != list(range(len(shape))):  # onnx shape inference lets a short one pass
        raise UnsupportedOpError(f"Transpose node '{node.name}': perm {list(perm)} is not a "
                                 f"permutation of the {len(shape)} axes")
    inverse = [0] * len(perm)
    for i, p in enumerate(perm):
        inverse[p] = i
    return [g.node("Transpose", [dys[0]], shape, hint="dTranspose", perm=inverse)]


def grad_slice(g, node, dys, needs):
    # Zeros of X's shape with dY scattered back into the window (ORT's SliceGrad).
    x = node.input[0]
    shape = g.constant("shape", np.array(g.shape(x), np.int64))
    return [g.node("SliceGrad", [dys[0], shape] + list(node.input[1:]), g.shape(x),
                   domain=DOMAIN, hint="dSlice")] + [None] * (len(node.input) - 1)


def grad_concat(g, node, dys, needs):
    # Each input's gradient is its window of dY along the axis.
    axis = attr(node, "axis", 0) % len(g.shape(node.output[0]))
    grads, at = [], 0
    for x, need in zip(node.input, needs):
        size = g.shape(x)[axis]
        if need:
            bounds = [g.constant(hint, np.array([v], np.int64))
                      for hint, v in (("starts", at), ("ends", at + size), ("axes", axis))]
            grads.append(g.node("Slice", [dys[0]] + bounds, g.shape(x), hint="dConcat"))
        else:
            grads.append(None)
        at += size
    return grads


def grad_split(g, node, dys, needs):
    # The outputs' gradients side by side, zeros for an output nothing reads.
    pieces = [dy if dy is not None else g.node(
        "ConstantOfShape", [g.constant("shape", np.array(g.shape(out), np.int64))], g.shape(out),
        hint="dSplit_zeros", value=helper.make_tensor("value", TensorProto.FLOAT, [1], [0.0]))
        for out, dy in zip(node.output, dys)]
    return [g.node("Concat", pieces, g.shape(node.input[0]), hint="dSplit",
                   axis=attr(node, "axis", 0))] + [None] * (len(node.input) - 1)


def grad_gather(g, node, dys, needs):
    # Zeros of the data's shape plus dY's slices at the indices (ORT's GatherGrad).
    data, indices = node.input
    shape = g.constant("shape", np.array(g.shape(data), np.int64))
    return [g.node("GatherGrad", [shape, indices, dys[0]], g.shape(data), domain=DOMAIN,
                   hint="dGather", axis=attr(node, "axis", 0)), None]


def grad_tile(g, node, dys, needs):
    # The sum of dY's tiles (TileGrad, ai.microtrain).
    x = node.input[0]
    return [g.node("TileGrad", [dys[0], node.input[1]], g.shape(x), domain=DOMAIN,
                   hint="dTile"), None]


def grad_reciprocal(g, node, dys, needs):
    # y = 1 / x: dx = -dy * y^2
    y = node.output[0]
    square = g.node("Mul", [y, y], g.shape(y), hint="dReciprocal")
    return [g.node("Neg", [g.node("Mul", [dys[0], square], g.shape(y), hint="dReciprocal")],
                   g.shape(y), hint="dReciprocal")]


def grad_pad(g, node, dys, needs):
    # constant: dX = dY without the border (a Slice), with zeros where Pad cropped X (a Pad
    # by the crop; written as the two so that onnx.reference, whose Pad takes no negative
    # pads, runs it too). edge / reflect: PadGrad adds each border element back onto the
    # element it copies.
    x = node.input[0]
    where = f"Pad node '{node.name}'"
    if len(needs) > 2 and needs[2]:
        raise UnsupportedOpError(f"{where}: no gradient for a trainable constant_value")
    axes = node.input[3] if len(node.input) > 3 and node.input[3] else None
    begins, ends = pad_amounts(len(g.shape(x)), g.constant_value(node.input[1]),
                               g.constant_value(axes) if axes else None, where)
    mode = attr(node, "mode", "constant")
    if mode == "constant":
        dx, shape = dys[0], g.shape(dys[0])
        if max(begins + ends) > 0:
            shape = tuple(d - max(b, 0) - max(e, 0) for d, b, e in zip(shape, begins, ends))
            bounds = [g.constant(hint, np.array(v, np.int64)) for hint, v in (
                ("starts", [max(b, 0) for b in begins]),
                ("ends", [max(b, 0) + d for b, d in zip(begins, shape)]))]
            dx = g.node("Slice", [dx] + bounds, shape, hint="dPad")
        if min(begins + ends) < 0:
            crop = [max(-p, 0) for p in begins + ends]
            dx = g.node("Pad", [dx, g.constant("pads", np.array(crop, np.int64))], g.shape(x),
                        hint="dPad", mode="constant")
    else:
        dx = g.node("PadGrad", [dys[0], g.constant("pads", np.array(begins + ends, np.int64))],
                    g.shape(x), domain=DOMAIN, hint="dPad", mode=mode)
    return [dx] + [None] * (len(node.input) - 1)


def grad_pool(g, node, dys, needs):
    # MaxPoolGrad(dY, X) / AveragePoolGrad(dY, X) with explicit windows: auto_pad resolved
    # into pads, a Global pool as one window over the whole plane.
    x = node.input[0]
    attrs = pool_attributes(node, g.shape(x), g.shape(node.output[0]),
                            f"{node.op_type} node '{node.name}'")
    op_type = "MaxPoolGrad" if "Max" in node.op_type else "AveragePoolGrad"
    return [g.node(op_type, [dys[0], x], g.shape(x), domain=DOMAIN, hint="d" + node.op_type,
                   **attrs)]


def _piecewise_grad(op_type):
    # dX = <op>Grad(dY, X) with the forward node's attributes: Y cannot tell which side
    # of a kink X was on.
    def rule(g, node, dys, needs):
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        return [g.node(op_type, [dys[0], node.input[0]], g.shape(node.input[0]), domain=DOMAIN,
                       hint="d" + node.op_type, **attrs)]
    return rule


def grad_clip(g, node, dys, needs):
    # dX = dY where min <= X <= max; min and max (optional inputs) must be constants.
    if any(needs[1:]):
        raise UnsupportedOpError(f"Clip node '{node.name}': min and max get no gradient; "
                                 f"freeze them or make them constants")
    bounds = {}
    for index, name in ((1, "min"), (2, "max")):
        if len(node.input) > index and node.input[index]:
            value = g.constant_value(node.input[index])
            if value is None or np.size(value) != 1:
                raise UnsupportedOpError(f"Clip node '{node.name}': input '{name}' must be a "
                                         f"constant scalar")
            bounds[name] = float(np.reshape(value, ()))
    dx = g.node("ClipGrad", [dys[0], node.input[0]], g.shape(node.input[0]), domain=DOMAIN,
                hint="dClip", **bounds)
    return [dx] + [None] * (len(node.input) - 1)


def grad_conv(g, node, dys, needs):
    # Y = Conv(X, W[, B]), auto_pad resolved into pads: dX = ConvGradInput(dY, W) (only when
    # X needs it: never for the first trainable layer), dW = ConvGradWeight(dY, X),
    # dB = dY summed over images and positions.
    x, w = node.input[0], node.input[1]
    attrs = conv_attributes(node, g.shape(x), g.shape(w), f"Conv node '{node.name}'")
    shared = {k: attrs[k] for k in ("strides", "pads", "dilations", "group")}
    dy = dys[0]
    grads = [None] * len(node.input)
    if needs[0]:
        grads[0] = g.node("ConvGradInput", [dy, w], g.shape(x), domain=DOMAIN, hint="dConvX",
                          input_shape=list(g.shape(x)), **shared)
    if needs[1]:
        grads[1] = g.node("ConvGradWeight", [dy, x], g.shape(w), domain=DOMAIN, hint="dConvW",
                          kernel_shape=attrs["kernel_shape"], **shared)
    if len(node.input) > 2 and node.input[2] and needs[2]:
        axes = [0] + list(range(2, len(g.shape(dy))))
        grads[2] = g.node("ReduceSum", [dy, g.constant("axes", np.array(axes, np.int64))],
                          g.shape(node.input[2]), hint="dConvB", keepdims=0)
    return grads


def grad_batch_norm(g, node, dys, needs):
    # BatchNormalizationGrad(dY, X, scale[, mean, var]) -> dX, dscale, dbias, each only when
    # needed. Training mode: the batch statistics, recomputed from X by the kernel (Y does
    # not depend on the running-statistics inputs). Inference mode: the running statistics.
    x, scale, bias, mean, var = node.input[:5]
    training = batch_norm_training(node)
    if any(d is not None for d in dys[1:]):
        raise UnsupportedOpError(f"BatchNormalization node '{node.name}': its running "
                                 f"statistics outputs feed the loss; they have no gradient")
    if not training and (needs[3] or needs[4]):
        raise UnsupportedOpError(f"BatchNormalization node '{node.name}': inference form with "
                                 f"a mean or variance computed from trainable parameters")
    outputs = [g.fresh(f"d{node.name}_{part}") if need else ""
               for part, need in zip(("X", "scale", "bias"), needs[:3])]
    g.node("BatchNormalizationGrad", [dys[0], x, scale] + ([] if training else [mean, var]),
           [g.shape(x), g.shape(scale), g.shape(bias)], outputs=outputs, domain=DOMAIN,
           epsilon=attr(node, "epsilon", 1e-5), training_mode=int(training))
    return [o or None for o in outputs] + [None, None]


def grad_dropout(g, node, dys, needs):
    # Training: dX = dY * mask / (1 - ratio), from the forward's mask output. Otherwise (and
    # for ratio 0) Dropout is the identity.
    ratio, training = dropout_config(node, g.constant_value, f"Dropout node '{node.name}'")
    rest = [None] * (len(node.input) - 1)
    if not training or ratio == 0.0:
        return [dys[0]] + rest
    if len(node.output) < 2 or not node.output[1]:
        raise UnsupportedOpError(f"Dropout node '{node.name}' needs its mask output for the "
                                 f"gradient")
    return [g.node("DropoutGrad", [dys[0], node.output[1]], g.shape(node.input[0]),
                   domain=DOMAIN, hint="dDropout", ratio=ratio)] + rest


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
    "LeakyRelu": _piecewise_grad("LeakyReluGrad"),
    "Clip": grad_clip,
    "HardSigmoid": _piecewise_grad("HardSigmoidGrad"),
    "HardSwish": _piecewise_grad("HardSwishGrad"),
    "MaxPool": grad_pool,
    "AveragePool": grad_pool,
    "GlobalMaxPool": grad_pool,
    "GlobalAveragePool": grad_pool,
    "Conv": grad_conv,
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
    "Expand": grad_expand,
    "Transpose": grad_transpose,
    "Slice": grad_slice,
    "Concat": grad_concat,
    "Split": grad_split,
    "Pad": grad_pad,
    "Gather": grad_gather,
    "Tile": grad_tile,
    "Reciprocal": grad_reciprocal,
    "BatchNormalization": grad_batch_norm,
    "Dropout": grad_dropout,
}


def build_gradients(g, forward_nodes, loss, trainable, seeds=None):
    """Emit the backward pass of `forward_nodes` into g; returns {param: gradient name}.
    The pass starts from d loss = 1, or from seeds {output: name of its gradient} when the
    loss is computed outside the graph."""
    needs_grad = set(trainable)
    for node in forward_nodes:
        if any(i in needs_grad for i in node.input if i):
            needs_grad.update(o for o in node.output if o)
    grads = dict(seeds) if seeds else {loss: g.constant("loss_grad", np.float32(1.0))}
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
