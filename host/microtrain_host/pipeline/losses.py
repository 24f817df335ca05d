"""Loss blocks appended to the forward graph, as ORT's generate_artifacts does.

Each takes the model output and returns the loss name and the new graph input (labels or
target). All reduce with mean, as ORT's defaults do."""
import enum

import numpy as np
from onnx import TensorProto

from ..errors import ArtifactError


class LossType(enum.IntEnum):
    """ORT's LossType values."""
    MSELoss = 1
    CrossEntropyLoss = 2
    BCEWithLogitsLoss = 3
    L1Loss = 4


def _target_like(g, output):
    target = g.fresh("target")
    g.shapes[target] = (TensorProto.FLOAT, g.shape(output))
    return target


def mse_loss(g, output):
    # mean((output - target)^2): Sub -> Pow(2) -> ReduceMean, as ORT builds it.
    target = _target_like(g, output)
    shape = g.shape(output)
    diff = g.node("Sub", [output, target], shape, hint="mse_diff")
    square = g.node("Pow", [diff, g.constant("mse_exponent", np.float32(2.0))], shape,
                    hint="mse_square")
    return g.node("ReduceMean", [square], (), hint="loss", keepdims=0), target


def l1_loss(g, output):
    # mean(|output - target|): Sub -> Abs -> ReduceMean.
    target = _target_like(g, output)
    shape = g.shape(output)
    diff = g.node("Sub", [output, target], shape, hint="l1_diff")
    absolute = g.node("Abs", [diff], shape, hint="l1_abs")
    return g.node("ReduceMean", [absolute], (), hint="loss", keepdims=0), target


def bce_with_logits_loss(g, output):
    # mean(softplus(x) - x*t): the same value as ORT's
    # -(t*log(sigmoid(x)) + (1-t)*log(1-sigmoid(x))), written with ONNX's Softplus so that
    # nothing overflows for large logits and the gradient is sigmoid(x) - t everywhere,
    # x = 0 included (a max(x,0) + log(1+exp(-|x|)) form gets x = 0 wrong).
    target = _target_like(g, output)
    shape = g.shape(output)
    softplus = g.node("Softplus", [output], shape, hint="bce_softplus")
    x_times_t = g.node("Mul", [output, target], shape, hint="bce_xt")
    total = g.node("Sub", [softplus, x_times_t], shape, hint="bce_sum")
    return g.node("ReduceMean", [total], (), hint="loss", keepdims=0), target


def cross_entropy_loss(g, output):
    # SoftmaxCrossEntropyLoss(scores [N, C], labels [N] int64), reduction mean. log_prob is
    # kept as a second output: the gradient needs it.
    shape = g.shape(output)
    if len(shape) != 2:
        raise ArtifactError(f"CrossEntropyLoss needs a [batch, classes] output; '{output}' has "
                            f"shape {list(shape)}")
    labels = g.fresh("labels")
    g.shapes[labels] = (TensorProto.INT64, (shape[0],))
    loss, _ = g.node("SoftmaxCrossEntropyLoss", [output, labels], [(), shape],
                     outputs=[g.fresh("loss"), g.fresh("log_prob")], reduction="mean")
    return loss, labels


LOSS_BLOCKS = {
    LossType.MSELoss: mse_loss,
    LossType.CrossEntropyLoss: cross_entropy_loss,
    LossType.BCEWithLogitsLoss: bce_with_logits_loss,
    LossType.L1Loss: l1_loss,
}
