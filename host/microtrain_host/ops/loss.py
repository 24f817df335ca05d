"""Losses computed inside the graph that need ops of their own: SoftmaxCrossEntropyLoss
(reduction mean, class-index labels) and its gradient. (MSE, L1 and BCEWithLogits are built
from elementwise ops and reductions by pipeline/losses.py.) Device kernels: kernels/loss.py."""
import numpy as np

from .. import opcodes as op
from ..errors import UnsupportedOpError
from ..graph import DOMAIN, attr, optional_input
from ..reference import MicrotrainOp
from ..registry import gradient, lowering


@gradient("SoftmaxCrossEntropyLoss")
def grad_softmax_cross_entropy(g, node, dys, needs):
    scores, labels = node.input[0], node.input[1]
    if len(node.output) < 2 or not node.output[1]:
        raise UnsupportedOpError(f"SoftmaxCrossEntropyLoss node '{node.name}' needs its log_prob "
                                 f"output for the gradient")
    return [g.node("SoftmaxCrossEntropyLossGrad", [dys[0], node.output[1], labels],
                   g.shape(scores), domain=DOMAIN, hint="dScores", reduction="mean"), None]


def _check_cross_entropy(ctx, node):
    scores = node.input[0]
    if len(ctx.shape(scores)) != 2:
        raise UnsupportedOpError(f"{ctx.where(node)}: scores must be [batch, classes], got "
                                 f"{list(ctx.shape(scores))}")
    if attr(node, "reduction", "mean") != "mean":
        raise UnsupportedOpError(f"{ctx.where(node)}: only reduction='mean' is supported")
    if attr(node, "ignore_index") is not None:
        raise UnsupportedOpError(f"{ctx.where(node)}: ignore_index is not supported")
    return ctx.shape(scores)


@lowering("SoftmaxCrossEntropyLoss")
def lower_softmax_cross_entropy(ctx, node):
    n, c = _check_cross_entropy(ctx, node)
    if optional_input(node, 2):
        raise UnsupportedOpError(f"{ctx.where(node)}: class weights are not supported")
    loss = ctx.define(node.output[0], ())
    log_prob = (ctx.define(node.output[1]) if len(node.output) > 1 and node.output[1]
                else ctx.define("", (n, c)))  # scratch: the kernel always writes it
    ctx.step(op.SOFTMAX_CE, [loss, log_prob, ctx.t(node.input[0]), ctx.t(node.input[1])], [n, c])


@lowering("SoftmaxCrossEntropyLossGrad")
def lower_softmax_cross_entropy_grad(ctx, node):
    dloss, log_prob, labels = node.input
    n, c = ctx.shape(log_prob)
    dx = ctx.define(node.output[0])
    ctx.step(op.SOFTMAX_CE_GRAD, [dx, ctx.t(dloss), ctx.t(log_prob), ctx.t(labels)], [n, c])


class SoftmaxCrossEntropyLossGrad(MicrotrainOp):
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
