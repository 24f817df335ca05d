"""Numpy reference implementations of the ai.microtrain ops, for onnx.reference.

With these the training and optimizer graphs run on the host like any ONNX graph:

    outputs = reference_evaluator("training_model.onnx").run(None, feeds)

Semantics follow the device kernels (device/microtrain/kernels) and the ORT ops they stand
in for. Every backward op takes the forward *output* Y, not the input."""
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


class SGD(_MicrotrainOp):
    """p' = p - lr * g."""

    def _run(self, lr, p, g):
        rate = lr.reshape(-1)[0]
        return ((p - rate * g).astype(p.dtype),)


class AdamW(_MicrotrainOp):
    """ORT's AdamW, adam_mode=1 (Hugging Face rule); `step` is the 1-based step being taken:
    m' = b1 m + (1-b1) g;  v' = b2 v + (1-b2) g^2;
    p' = p - step_size * m' / (sqrt(v') + eps), step_size = lr sqrt(1-b2^t) / (1-b1^t)
    (just lr without bias correction); then p' -= lr * weight_decay * p'."""

    def _run(self, lr, step, p, g, m, v, alpha=0.9, beta=0.999, epsilon=1e-6,
             weight_decay=0.0, correct_bias=1, adam_mode=1):
        if adam_mode != 1:
            raise NotImplementedError("AdamW reference: only adam_mode=1 is implemented")
        dtype = p.dtype
        rate = float(lr.reshape(-1)[0])
        t = int(step.reshape(-1)[0])
        m = alpha * m + (1 - alpha) * g
        v = beta * v + (1 - beta) * g * g
        step_size = rate * math.sqrt(1 - beta ** t) / (1 - alpha ** t) if correct_bias else rate
        p = p - step_size * m / (np.sqrt(v) + epsilon)
        p = p - rate * weight_decay * p
        return tuple(x.astype(dtype, copy=False) for x in (p, m, v))


OPS = [ReluGrad, SigmoidGrad, TanhGrad, SoftmaxGrad, LogSoftmaxGrad,
       SoftmaxCrossEntropyLossGrad, GradAccumulate, SGD, AdamW]


def reference_evaluator(model_or_path, **kwargs):
    """onnx.reference.ReferenceEvaluator for a model (or path) that may use ai.microtrain ops."""
    if not isinstance(model_or_path, onnx.ModelProto):
        model_or_path = os.fspath(model_or_path)
    return ReferenceEvaluator(model_or_path, new_ops=OPS, **kwargs)
