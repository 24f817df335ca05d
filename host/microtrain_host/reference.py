"""Numpy reference implementations of the ai.microtrain ops, for onnx.reference.

With these the training and optimizer graphs run on the host like any ONNX graph:

    outputs = reference_evaluator("training_model.onnx").run(None, feeds)

Semantics follow the device kernels (device/microtrain/kernels) and the ORT ops they stand
in for. The activation gradients take the forward *output* Y, except where Y cannot tell
which side of a kink X was on (LeakyRelu, Clip, HardSigmoid, HardSwish take X); the pooling
gradients take X."""
import math
import os

import numpy as np
import onnx
from onnx.reference import ReferenceEvaluator
from onnx.reference.op_run import OpRun

from .graph import DOMAIN


class _MicrotrainOp(OpRun):
    op_domain = DOMAIN


class ReluGrad(_MicrotrainOp):
    """dX = dY where Y > 0, else 0."""

    def _run(self, dy, y):
        return (np.where(y > 0, dy, np.zeros_like(dy)),)


class SigmoidGrad(_MicrotrainOp):
    """dX = dY * Y * (1 - Y)."""

    def _run(self, dy, y):
        return ((dy * y * (1 - y)).astype(dy.dtype),)


class TanhGrad(_MicrotrainOp):
    """dX = dY * (1 - Y^2)."""

    def _run(self, dy, y):
        return ((dy * (1 - y * y)).astype(dy.dtype),)


class SoftmaxGrad(_MicrotrainOp):
    """Y = softmax(X, axis): dX = Y * (dY - sum(dY * Y, axis))."""

    def _run(self, dy, y, axis=-1):
        dot = np.sum(dy * y, axis=axis, keepdims=True)
        return ((y * (dy - dot)).astype(dy.dtype),)


class LogSoftmaxGrad(_MicrotrainOp):
    """Y = log_softmax(X, axis): dX = dY - exp(Y) * sum(dY, axis)."""

    def _run(self, dy, y, axis=-1):
        total = np.sum(dy, axis=axis, keepdims=True)
        return ((dy - np.exp(y) * total).astype(dy.dtype),)


class SoftmaxCrossEntropyLossGrad(_MicrotrainOp):
    """Gradient of SoftmaxCrossEntropyLoss w.r.t. the scores [N, C, d...]:
    (softmax - one_hot(labels)) * dloss, divided by the label count for reduction "mean"."""

    def _run(self, dloss, log_prob, labels, reduction="mean"):
        if isinstance(reduction, bytes):
            reduction = reduction.decode()
        classes = log_prob.shape[1]
        one_hot = np.moveaxis(np.eye(classes, dtype=log_prob.dtype)[labels], -1, 1)
        diff = np.exp(log_prob) - one_hot
        if reduction == "none":
            scale = np.expand_dims(dloss, 1)
        elif reduction == "sum":
            scale = dloss
        else:
            scale = dloss / labels.size
        return ((diff * scale).astype(log_prob.dtype),)


class GradAccumulate(_MicrotrainOp):
    """ORT's InPlaceAccumulatorV2: buffer' = value if lazy_reset_grad else buffer + value."""

    def _run(self, buffer, value, lazy_reset_grad):
        if bool(np.asarray(lazy_reset_grad).reshape(-1)[0]):
            return (np.array(value, dtype=buffer.dtype, copy=True),)
        return ((buffer + value).astype(buffer.dtype),)


def _penalized(g, p, l1_penalty, l2_penalty, clip_coef):
    """The gradient the update uses: (g + l1 sign(p) + 2 l2 p) * clip_coef (1 if absent)."""
    d = g + l1_penalty * np.sign(p) + 2.0 * l2_penalty * p
    return d if clip_coef is None else d * clip_coef.reshape(-1)[0]


class ClipGradNorm(_MicrotrainOp):
    """Inputs g1, p1, g2, p2, ...: the factor torch.nn.utils.clip_grad_norm_ scales every
    gradient by, min(1, max_norm / (norm + 1e-6)), norm = the L2 norm of all the penalized
    gradients together."""

    def _run(self, *pairs, max_norm=1.0, l1_penalty=0.0, l2_penalty=0.0):
        total = sum(float(np.sum(np.square(_penalized(g, p, l1_penalty, l2_penalty, None),
                                           dtype=np.float64)))
                    for g, p in zip(pairs[0::2], pairs[1::2]))
        coef = min(1.0, max_norm / (math.sqrt(total) + 1e-6))
        return (np.array([coef], dtype=pairs[0].dtype),)


class SGD(_MicrotrainOp):
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


class AdamW(_MicrotrainOp):
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


class FusedMatMul(_MicrotrainOp):
    """Y = alpha * op(A) @ op(B), op = swapping the last two axes where transA / transB
    (ORT's com.microsoft op of that name, without transBatch)."""

    def _run(self, a, b, alpha=1.0, transA=0, transB=0):
        a = np.swapaxes(a, -1, -2) if transA else a
        b = np.swapaxes(b, -1, -2) if transB else b
        return ((alpha * np.matmul(a, b)).astype(a.dtype),)


class SliceGrad(_MicrotrainOp):
    """dX = zeros(shape) with dY where Slice(X, starts, ends, axes, steps) read it."""

    def _run(self, dy, shape, starts, ends, axes=None, steps=None):
        window = [slice(None)] * len(shape)
        axes = range(len(starts)) if axes is None else axes
        steps = [1] * len(starts) if steps is None else steps
        for start, end, axis, step in zip(starts, ends, axes, steps):
            window[int(axis)] = slice(int(start), int(end), int(step))
        dx = np.zeros(tuple(int(d) for d in shape), dtype=dy.dtype)
        dx[tuple(window)] = dy
        return (dx,)


class GatherGrad(_MicrotrainOp):
    """dX = zeros(shape) plus dY's slice added at every index Gather read (ORT's op)."""

    def _run(self, shape, indices, dy, axis=0):
        dx = np.zeros(tuple(int(d) for d in shape), dtype=dy.dtype)
        np.add.at(dx, (slice(None),) * (axis % dx.ndim) + (indices,), dy)
        return (dx,)


class TileGrad(_MicrotrainOp):
    """dX = the sum of the tiles of dY = Tile(X, repeats)."""

    def _run(self, dy, repeats):
        view = [v for r, d in zip(repeats, dy.shape) for v in (int(r), d // int(r))]
        return (dy.reshape(view).sum(axis=tuple(range(0, len(view), 2))).astype(dy.dtype),)


class PadGrad(_MicrotrainOp):
    """Pad backward in edge / reflect mode (pads: begins then ends of every axis): each dY
    element is added to the X element it is a copy of (np.pad of X's indices says which)."""

    def _run(self, dy, pads, mode="edge"):
        mode = mode.decode() if isinstance(mode, bytes) else mode
        rank = dy.ndim
        widths = [(int(pads[i]), int(pads[i + rank])) for i in range(rank)]
        shape = tuple(d - b - e for d, (b, e) in zip(dy.shape, widths))
        source = np.pad(np.arange(int(np.prod(shape))).reshape(shape), widths, mode=mode)
        dx = np.bincount(source.reshape(-1), weights=dy.reshape(-1).astype(np.float64),
                         minlength=source.size)
        return (dx[:int(np.prod(shape))].reshape(shape).astype(dy.dtype),)


class LeakyReluGrad(_MicrotrainOp):
    """dX = dY where X > 0, else alpha * dY (alpha also at X = 0, as torch)."""

    def _run(self, dy, x, alpha=0.01):
        return (np.where(x > 0, dy, alpha * dy).astype(dy.dtype),)


class ClipGrad(_MicrotrainOp):
    """dX = dY where min <= X <= max, else 0 (the bounds pass, as torch.clamp)."""

    def _run(self, dy, x, min=-np.inf, max=np.inf):
        return (np.where((x >= min) & (x <= max), dy, 0).astype(dy.dtype),)


class HardSigmoidGrad(_MicrotrainOp):
    """dX = alpha * dY where 0 < alpha * X + beta < 1, else 0 (0 at the kinks, as torch)."""

    def _run(self, dy, x, alpha=0.2, beta=0.5):
        t = alpha * x + beta
        return (np.where((t > 0) & (t < 1), alpha * dy, 0).astype(dy.dtype),)


class HardSwishGrad(_MicrotrainOp):
    """dX = dY * (X / 3 + 1/2) where -3 < X < 3, 0 for X <= -3, dY for X >= 3 (as torch)."""

    def _run(self, dy, x):
        inside = np.where(x >= 3, dy, dy * (x / 3 + 0.5))
        return (np.where(x <= -3, 0, inside).astype(dy.dtype),)


def _pool_windows(in_size, out_size, kernel_shape, strides, pads, dilations):
    """For each output position: the input indices of its window along each spatial axis,
    and the window's length along each axis clipped to the padded input."""
    rank = len(in_size)
    for out in np.ndindex(*out_size):
        taps, padded = [], []
        for i in range(rank):
            start = out[i] * strides[i] - pads[i]
            index = start + dilations[i] * np.arange(kernel_shape[i])
            taps.append(index[(index >= 0) & (index < in_size[i])])
            padded.append(min(start + kernel_shape[i], in_size[i] + pads[rank + i]) - start)
        yield out, taps, padded


class MaxPoolGrad(_MicrotrainOp):
    """dX = each window's dY added at the window's first maximum of X (row-major order)."""

    def _run(self, dy, x, kernel_shape=None, strides=None, pads=None, dilations=None,
             ceil_mode=0):
        dx = np.zeros_like(x)
        for out, taps, _ in _pool_windows(x.shape[2:], dy.shape[2:], kernel_shape, strides,
                                          pads, dilations):
            grid = np.stack(np.meshgrid(*taps, indexing="ij"), -1).reshape(-1, len(taps))
            window = x[(slice(None), slice(None)) + np.ix_(*taps)].reshape(x.shape[:2] + (-1,))
            first_max = np.argmax(window, axis=-1)
            for plane in np.ndindex(*x.shape[:2]):
                dx[plane + tuple(grid[first_max[plane]])] += dy[plane + out]
        return (dx,)


class AveragePoolGrad(_MicrotrainOp):
    """dX = each window's dY / count spread over the window's input elements; count = the
    elements of the input in it, or with count_include_pad the window clipped to the padded
    input. X only gives the shape."""

    def _run(self, dy, x, kernel_shape=None, strides=None, pads=None, dilations=None,
             ceil_mode=0, count_include_pad=0):
        dx = np.zeros_like(x)
        for out, taps, padded in _pool_windows(x.shape[2:], dy.shape[2:], kernel_shape, strides,
                                               pads, dilations):
            count = np.prod(padded) if count_include_pad else np.prod([len(t) for t in taps])
            share = dy[(slice(None), slice(None)) + out] / count
            dx[(slice(None), slice(None)) + np.ix_(*taps)] += share.reshape(
                share.shape + (1,) * len(taps))
        return (dx,)


def _conv_taps(kernel_shape, strides, dilations, out_spatial):
    """(tap, slices of the padded input that tap reads for all outputs) for every kernel tap."""
    for tap in np.ndindex(*kernel_shape):
        yield tap, tuple(slice(k * d, k * d + (o - 1) * s + 1, s)
                         for k, d, s, o in zip(tap, dilations, strides, out_spatial))


def _conv_groups(group, out_channels, in_channels):
    """(output channel slice, input channel slice) of each group."""
    m, c = out_channels // group, in_channels // group
    return [(slice(g * m, (g + 1) * m), slice(g * c, (g + 1) * c)) for g in range(group)]


class ConvGradInput(_MicrotrainOp):
    """dX of Y = Conv(X, W) (pads explicit, no auto_pad): every tap spreads dY, weighted by
    W, back over the padded input positions it read; then the padding is cut off.
    input_shape is X's shape."""

    def _run(self, dy, w, input_shape=None, strides=None, pads=None, dilations=None, group=1):
        rank = len(input_shape) - 2
        begins, ends = pads[:rank], pads[rank:]
        padded = np.zeros(list(input_shape[:2]) + [d + b + e for d, b, e in
                                                   zip(input_shape[2:], begins, ends)], dy.dtype)
        groups = _conv_groups(group, w.shape[0], input_shape[1])
        for tap, window in _conv_taps(w.shape[2:], strides, dilations, dy.shape[2:]):
            for outs, ins in groups:
                padded[(slice(None), ins) + window] += np.einsum(
                    "nm...,mc->nc...", dy[:, outs], w[(outs, slice(None)) + tap])
        inside = tuple(slice(b, b + d) for b, d in zip(begins, input_shape[2:]))
        return (padded[(slice(None), slice(None)) + inside],)


class ConvGradWeight(_MicrotrainOp):
    """dW of Y = Conv(X, W) (pads explicit, no auto_pad): for every tap, dY times the padded
    input positions that tap read, summed over images and output positions."""

    def _run(self, dy, x, kernel_shape=None, strides=None, pads=None, dilations=None, group=1):
        rank = x.ndim - 2
        padded = np.pad(x, [(0, 0), (0, 0)] + list(zip(pads[:rank], pads[rank:])))
        dw = np.zeros((dy.shape[1], x.shape[1] // group) + tuple(kernel_shape), dy.dtype)
        groups = _conv_groups(group, dy.shape[1], x.shape[1])
        for tap, window in _conv_taps(kernel_shape, strides, dilations, dy.shape[2:]):
            for outs, ins in groups:
                taken = padded[(slice(None), ins) + window]
                dw[(outs, slice(None)) + tap] = np.einsum(
                    "nmp,ncp->mc", dy[:, outs].reshape(dy.shape[0], -1, taken[0, 0].size),
                    taken.reshape(taken.shape[0], taken.shape[1], -1))
        return (dw,)


class BatchNormalizationGrad(_MicrotrainOp):
    """dX, dscale, dbias of Y = BatchNormalization(X, scale, bias, mean, var) over X of shape
    (N, C, ...). training_mode=1: batch statistics (biased variance), recomputed from X;
    otherwise the running mean and var inputs, which are then constants."""

    def _run(self, dy, x, scale, mean=None, var=None, epsilon=1e-5, training_mode=0):
        axes = (0,) + tuple(range(2, x.ndim))
        per_channel = (1, -1) + (1,) * (x.ndim - 2)
        if training_mode:
            mean, var = x.mean(axis=axes), x.var(axis=axes)
        inv_std = (1.0 / np.sqrt(var + epsilon)).reshape(per_channel)
        xhat = (x - mean.reshape(per_channel)) * inv_std
        dbias = dy.sum(axis=axes)
        dscale = (dy * xhat).sum(axis=axes)
        dx = dy
        if training_mode:
            count = x.size // x.shape[1]
            dx = dy - (dbias.reshape(per_channel) + xhat * dscale.reshape(per_channel)) / count
        dx = dx * scale.reshape(per_channel) * inv_std
        return tuple(t.astype(x.dtype) for t in (dx, dscale, dbias))


class DropoutGrad(_MicrotrainOp):
    """dX = dY * mask / (1 - ratio)."""

    def _run(self, dy, mask, ratio=0.5):
        return ((dy * mask / (1.0 - ratio)).astype(dy.dtype),)


OPS = [ReluGrad, SigmoidGrad, TanhGrad, SoftmaxGrad, LogSoftmaxGrad,
       LeakyReluGrad, ClipGrad, HardSigmoidGrad, HardSwishGrad, MaxPoolGrad, AveragePoolGrad,
       SoftmaxCrossEntropyLossGrad, GradAccumulate, FusedMatMul, SliceGrad, PadGrad,
       GatherGrad, TileGrad, ClipGradNorm, SGD, AdamW, ConvGradInput, ConvGradWeight,
       BatchNormalizationGrad, DropoutGrad]


def reference_evaluator(model_or_path, **kwargs):
    """onnx.reference.ReferenceEvaluator for a model (or path) that may use ai.microtrain ops."""
    if not isinstance(model_or_path, onnx.ModelProto):
        model_or_path = os.fspath(model_or_path)
    return ReferenceEvaluator(model_or_path, new_ops=OPS, **kwargs)
