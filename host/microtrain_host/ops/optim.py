"""Gradient accumulation and parameter updates, all in place: GradAccumulate (ORT's
InPlaceAccumulatorV2), SGD (torch.optim.SGD with momentum, dampening, Nesterov, weight
decay), AdamW (ORT's rule), the elastic penalties and ClipGradNorm. pipeline/optimizers/
builds the optimizer graph from these ops. Device kernels: kernels/optim.py."""
import math

import numpy as np

from .. import opcodes as op
from ..errors import UnsupportedOpError
from ..graph import attr
from ..ir import GRAD, LAZY_RESET_GRAD, LEARNING_RATE, NO_TENSOR, STEP, STEP_SIZE
from ..reference import MicrotrainOp
from ..registry import lowering


@lowering("GradAccumulate")
def lower_grad_accumulate(ctx, node):
    buf, value, _ = node.input
    reset = ctx.control(LAZY_RESET_GRAD)
    produced_by = ctx.producer.get(ctx.t(value))
    producer = ctx.steps[produced_by] if produced_by is not None else None
    fusable = producer is not None and ctx.uses.get(value) == 1
    if fusable and producer.op == op.GEMM and producer.tensors[3] == NO_TENSOR:
        # The gradient comes from a GEMM nothing else reads: let the GEMM accumulate
        # straight into the buffer, and the temporary (weight-sized) disappears.
        producer.op = op.GEMM_ACCUMULATE
        producer.tensors = [ctx.t(buf)] + producer.tensors[1:3] + [reset]
        producer.ints = producer.ints[:7]
        producer.floats = producer.floats[:1]
    elif fusable and producer.op in (op.CONV_GRAD_WEIGHT, op.CONV_3D_GRAD_WEIGHT):
        # Likewise a convolution's weight gradient: given the reset flag, its kernel adds
        # into the buffer itself.
        producer.tensors = [ctx.t(buf)] + producer.tensors[1:3] + [reset]
    else:
        fusable = False
        ctx.step(op.ACCUMULATE, [ctx.t(buf), ctx.t(value), reset],
                 [ctx.tensors[ctx.t(buf)].size])
    if fusable:  # the gradient temporary now names the buffer's space
        fused = ctx.tensors[ctx.t(value)]
        fused.storage, fused.role, fused.program = ctx.tensors[ctx.t(buf)].storage, GRAD, ""
    ctx.alias_in_place(node.output[0], buf)


class GradAccumulate(MicrotrainOp):
    """ORT's InPlaceAccumulatorV2: buffer' = value if lazy_reset_grad else buffer + value."""

    def _run(self, buffer, value, lazy_reset_grad):
        if bool(np.asarray(lazy_reset_grad).reshape(-1)[0]):
            return (np.array(value, dtype=buffer.dtype, copy=True),)
        return ((buffer + value).astype(buffer.dtype),)


def _optional_inputs(node, count):
    return list(node.input) + [""] * (count - len(node.input))


def _penalties(ctx, node):
    l1, l2 = attr(node, "l1_penalty", 0.0), attr(node, "l2_penalty", 0.0)
    if l1 < 0 or l2 < 0:
        raise UnsupportedOpError(f"{ctx.where(node)}: l1_penalty and l2_penalty must be >= 0, "
                                 f"got {l1}, {l2}")
    return [l1, l2]


def _penalized(g, p, l1_penalty, l2_penalty, clip_coef):
    """The gradient the update uses: (g + l1 sign(p) + 2 l2 p) * clip_coef (1 if absent)."""
    d = g + l1_penalty * np.sign(p) + 2.0 * l2_penalty * p
    return d if clip_coef is None else d * clip_coef.reshape(-1)[0]


@lowering("ClipGradNorm")
def lower_clip_grad_norm(ctx, node):
    # Inputs g1, p1, g2, p2, ...: one pass summing the squared penalized gradients into the
    # output, then that sum becomes the clipping factor in place.
    max_norm = attr(node, "max_norm", 1.0)
    if not max_norm > 0 or len(node.input) % 2:
        raise UnsupportedOpError(f"{ctx.where(node)}: needs (gradient, parameter) pairs and "
                                 f"max_norm > 0, got {len(node.input)} inputs, max_norm {max_norm}")
    coef = ctx.define(node.output[0], (1,))
    penalties = _penalties(ctx, node)
    for k in range(0, len(node.input), 2):
        g, p = ctx.t(node.input[k]), ctx.t(node.input[k + 1])
        ctx.step(op.GRAD_NORM_SQUARED, [coef, g, p], [ctx.tensors[p].size, int(k == 0)],
                 penalties)
    ctx.step(op.CLIP_COEF, [coef], [], [max_norm])


class ClipGradNorm(MicrotrainOp):
    """Inputs g1, p1, g2, p2, ...: the factor torch.nn.utils.clip_grad_norm_ scales every
    gradient by, min(1, max_norm / (norm + 1e-6)), norm = the L2 norm of all the penalized
    gradients together."""

    def _run(self, *pairs, max_norm=1.0, l1_penalty=0.0, l2_penalty=0.0):
        total = sum(float(np.sum(np.square(_penalized(g, p, l1_penalty, l2_penalty, None),
                                           dtype=np.float64)))
                    for g, p in zip(pairs[0::2], pairs[1::2]))
        coef = min(1.0, max_norm / (math.sqrt(total) + 1e-6))
        return (np.array([coef], dtype=pairs[0].dtype),)


@lowering("SGD")
def lower_sgd(ctx, node):
    _, p, g, step, buf, coef = _optional_inputs(node, 6)
    momentum, dampening = attr(node, "momentum", 0.0), attr(node, "dampening", 0.0)
    nesterov, weight_decay = attr(node, "nesterov", 0), attr(node, "weight_decay", 0.0)
    penalties = _penalties(ctx, node)
    if momentum < 0 or weight_decay < 0 or nesterov not in (0, 1):
        raise UnsupportedOpError(f"{ctx.where(node)}: momentum {momentum} and weight_decay "
                                 f"{weight_decay} must be >= 0, nesterov 0 or 1")
    if bool(momentum) != bool(buf) or (buf and not step):
        raise UnsupportedOpError(f"{ctx.where(node)}: momentum {momentum} needs the momentum "
                                 f"buffer and step inputs exactly when it is not 0")
    if nesterov and (not momentum or dampening):
        raise UnsupportedOpError(f"{ctx.where(node)}: nesterov needs momentum > 0 and "
                                 f"dampening 0, got momentum {momentum}, dampening {dampening}")
    size = ctx.tensors[ctx.t(p)].size
    lr = ctx.control(LEARNING_RATE)
    if not (buf or coef or weight_decay or any(penalties)):
        ctx.step(op.SGD, [ctx.t(p), ctx.t(g), lr], [size])  # plain SGD: the fast kernel
    else:
        ctx.step(op.SGD_GENERAL, [ctx.t(p), ctx.t(g), lr,
                                  ctx.control(STEP) if buf else NO_TENSOR,
                                  ctx.t(buf) if buf else NO_TENSOR,
                                  ctx.t(coef) if coef else NO_TENSOR],
                 [size, nesterov], [momentum, dampening, weight_decay] + penalties)
    for out, inp in zip(node.output, (p, buf)):
        ctx.alias_in_place(out, inp)


class SGD(MicrotrainOp):
    """torch.optim.SGD on the penalized, clipped gradient (`step` is the 1-based step):
    d = (g + l1 sign(p) + 2 l2 p) * clip_coef + weight_decay * p;
    with momentum: buf' = d at step 1, else momentum * buf + (1 - dampening) * d, and
    d = d + momentum * buf' (nesterov) or buf';  p' = p - lr * d."""

    def _run(self, lr, p, g, step=None, buf=None, clip_coef=None, momentum=0.0, dampening=0.0,
             nesterov=0, weight_decay=0.0, l1_penalty=0.0, l2_penalty=0.0):
        rate = lr.reshape(-1)[0]
        d = _penalized(g, p, l1_penalty, l2_penalty, clip_coef) + weight_decay * p
        if buf is None:
            return ((p - rate * d).astype(p.dtype),)
        if int(step.reshape(-1)[0]) == 1:
            buf = d
        else:
            buf = momentum * buf + (1.0 - dampening) * d
        d = d + momentum * buf if nesterov else buf
        return (p - rate * d).astype(p.dtype), buf.astype(p.dtype)


@lowering("AdamW")
def lower_adamw(ctx, node):
    _, _, p, g, m, v, coef = _optional_inputs(node, 7)
    if attr(node, "correct_bias", 1) not in (0, 1):
        raise UnsupportedOpError(f"{ctx.where(node)}: correct_bias must be 0 or 1")
    if attr(node, "adam_mode", 1) != 1:
        raise UnsupportedOpError(f"{ctx.where(node)}: only adam_mode 1 (the Hugging Face "
                                 f"AdamW rule) is supported")
    penalties = _penalties(ctx, node)
    tensors = [ctx.t(p), ctx.t(g), ctx.t(m), ctx.t(v), ctx.control(LEARNING_RATE),
               ctx.control(STEP_SIZE)]
    floats = [attr(node, "alpha", 0.9), attr(node, "beta", 0.999),
              attr(node, "epsilon", 1e-6), attr(node, "weight_decay", 0.0)]
    size = [ctx.tensors[ctx.t(p)].size]
    if coef or any(penalties):
        ctx.step(op.ADAMW_GENERAL, tensors + [ctx.t(coef) if coef else NO_TENSOR], size,
                 floats + penalties)
    else:
        ctx.step(op.ADAMW, tensors, size, floats)
    for out, inp in zip(node.output, (p, m, v)):
        ctx.alias_in_place(out, inp)


class AdamW(MicrotrainOp):
    """ORT's AdamW, adam_mode=1 (Hugging Face rule); `step` is the 1-based step being taken:
    m' = b1 m + (1-b1) g;  v' = b2 v + (1-b2) g^2;
    p' = p - step_size * m' / (sqrt(v') + eps), step_size = lr sqrt(1-b2^t) / (1-b1^t)
    (just lr without bias correction); then p' -= lr * weight_decay * p'. g is first
    penalized and clipped as for SGD."""

    def _run(self, lr, step, p, g, m, v, clip_coef=None, alpha=0.9, beta=0.999, epsilon=1e-6,
             weight_decay=0.0, correct_bias=1, adam_mode=1, l1_penalty=0.0, l2_penalty=0.0):
        if adam_mode != 1:
            raise NotImplementedError("AdamW reference: only adam_mode=1 is implemented")
        dtype = p.dtype
        g = _penalized(g, p, l1_penalty, l2_penalty, clip_coef)
        rate = float(lr.reshape(-1)[0])
        t = int(step.reshape(-1)[0])
        m = alpha * m + (1 - alpha) * g
        v = beta * v + (1 - beta) * g * g
        step_size = rate * math.sqrt(1 - beta ** t) / (1 - alpha ** t) if correct_bias else rate
        p = p - step_size * m / (np.sqrt(v) + epsilon)
        p = p - rate * weight_decay * p
        return tuple(x.astype(dtype, copy=False) for x in (p, m, v))
