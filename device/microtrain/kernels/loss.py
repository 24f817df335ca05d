# Loss kernels that ONNX expresses as one node (SoftmaxCrossEntropyLoss); the other losses
# are composed of elementwise and reduce kernels.
import math
from microtrain.kernels.activation import EXP_LIMIT, largest


def softmax_cross_entropy(F, I, args):
    # scores [n, c], labels [n] (int arena, checked in range by the Module)
    # log_prob = log_softmax(scores); loss = -mean_i log_prob[i, label_i]
    loss, log_prob, scores, labels, n, c = args
    e = math.exp
    total = 0.0
    for i in range(n):
        row = scores + i * c
        top = largest(F, row, c, 1)
        s = 0.0
        for j in range(c):
            s += e(F[row + j] - top)
        shift = top + math.log(s)
        out = log_prob + i * c
        for j in range(c):
            F[out + j] = F[row + j] - shift
        total -= F[out + I[labels + i]]
    F[loss] = total / n


def softmax_cross_entropy_check(args, c):
    n, classes = c.ints
    c.positive(n, classes)
    c.holds(0, 1)
    c.holds(1, n * classes)
    c.holds(2, n * classes)
    c.holds(3, n)
    # The labels are checked to lie in [0, num_classes) when they are copied in.
    c.role(3, "label")
    c.equal(c.blob.num_classes, classes, "the blob's class count")


def softmax_cross_entropy_grad(F, I, args):
    # dscores[i, j] = (softmax[i, j] - [j == label_i]) * dloss / n
    dscores, dloss, log_prob, labels, n, c = args
    e = math.exp
    scale = F[dloss] / n
    for i in range(n):
        row = i * c
        for j in range(c):
            v = F[log_prob + row + j]  # <= 0 from the forward; guarded all the same
            F[dscores + row + j] = (e(v) if not v > EXP_LIMIT else math.inf) * scale
        F[dscores + row + I[labels + i]] -= scale


def softmax_cross_entropy_grad_check(args, c):
    n, classes = c.ints
    c.positive(n, classes)
    c.holds(0, n * classes)
    c.holds(1, 1)
    c.holds(2, n * classes)
    c.holds(3, n)
    c.role(3, "label")
    c.equal(c.blob.num_classes, classes, "the blob's class count")
