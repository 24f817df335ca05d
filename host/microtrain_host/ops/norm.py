"""Normalisation and Dropout: BatchNormalization (training and inference forms) and its
gradient op, Dropout and DropoutGrad; which initializers are running statistics, which
BatchNormalization layers fold into constants, the inference form of a forward graph.
Device kernels: kernels/norm.py.

Running statistics are initializers BatchNormalization reads as its mean and variance. The
training-mode forward pass updates them (in place on the device); nothing trains them, so
they are frozen by default and naming one in requires_grad is an error. (ORT's
generate_artifacts makes them trainable unless frozen by hand, and then does not update
them.)"""
import numpy as np
from onnx import helper

from .. import opcodes as op
from ..errors import ArtifactError, UnsupportedOpError
from ..graph import DOMAIN, attr
from ..ir import ACTIVATION, CONTROL, INT32, NO_TENSOR, PARAM, Tensor
from ..reference import MicrotrainOp
from ..registry import gradient, lowering

# The device's dropout generator draws integers in [1, RANDOM_SPAN] (kernels/norm.py: the
# first Lehmer modulus 2**30 - 35, minus one); an element is dropped when its draw is at
# most ratio * RANDOM_SPAN.
RANDOM_SPAN = 2**30 - 36


def batch_norm_training(node):
    """True when a BatchNormalization node normalizes with batch statistics: training_mode=1
    (opset 14+), or more than one output (opset 9-13, where the mode is implied)."""
    mode = attr(node, "training_mode", None)
    if mode is not None:
        return bool(mode)
    return sum(1 for o in node.output if o) > 1


def running_statistics(graph):
    """{initializer name: BatchNormalization node name} of every running mean and variance."""
    initializers = {i.name for i in graph.initializer}
    return {name: node.name for node in graph.node if node.op_type == "BatchNormalization"
            for name in node.input[3:5] if name in initializers}


def check_requires_grad(graph, requires_grad):
    statistics = running_statistics(graph)
    for name in requires_grad:
        if name in statistics:
            raise ArtifactError(f"'{name}' is a running statistic of BatchNormalization node "
                                f"'{statistics[name]}': the forward pass updates it, nothing "
                                f"trains it; leave it out of requires_grad")


def folded_parameters(graph, frozen):
    """Frozen parameters that become constants of the model: the scale, bias, mean and var of
    every inference-form BatchNormalization whose four inputs are all frozen parameters or
    constants and that no other node reads. The lowering then folds the layer into one
    per-channel multiply-add; the checkpoint no longer carries them (repack to change them)."""
    frozen = set(frozen)
    constants = {o for node in graph.node if node.op_type == "Constant" for o in node.output}
    readers = {}
    for node in graph.node:
        for name in node.input:
            readers[name] = readers.get(name, 0) + 1
    folded = []
    for node in graph.node:
        if node.op_type != "BatchNormalization" or batch_norm_training(node):
            continue
        inputs = node.input[1:5]
        if all(name in frozen or name in constants for name in inputs):
            folded += [name for name in inputs if name in frozen and readers[name] == 1
                       and name not in folded]
    return folded


def inference_form(nodes):
    """The forward nodes as the eval graph runs them: BatchNormalization with its running
    statistics (training_mode=0, one output) and Dropout as Identity."""
    read = {name for node in nodes for name in node.input if name}
    result = []
    for node in nodes:
        if node.op_type == "BatchNormalization" and batch_norm_training(node):
            extra, kind = node.output[1:], "running statistics outputs"
            inference = helper.make_node("BatchNormalization", node.input[:5], node.output[:1],
                                         name=node.name, domain=node.domain)
            inference.attribute.extend(a for a in node.attribute if a.name != "training_mode")
        elif node.op_type == "Dropout":
            extra, kind = node.output[1:], "mask output"
            inference = helper.make_node("Identity", node.input[:1], node.output[:1],
                                         name=node.name)
        else:
            result.append(node)
            continue
        used = [o for o in extra if o in read]
        if used:
            raise UnsupportedOpError(f"{node.op_type} node '{node.name}': its {kind} "
                                     f"{', '.join(used)} feed other nodes; the eval graph runs "
                                     f"the node in inference form, which has no such outputs")
        result.append(inference)
    return result


def dropout_config(node, value_of, where):
    """(ratio, training) of a Dropout node (opset 12+: ratio and training_mode inputs,
    defaults 0.5 and false); value_of(name) gives a constant's value or None."""
    def constant(index, default, what):
        if len(node.input) <= index or not node.input[index]:
            return default
        value = value_of(node.input[index])
        if value is None:
            raise UnsupportedOpError(f"{where}: {what} must be a constant")
        return np.asarray(value).reshape(-1)[0]

    ratio = float(constant(1, 0.5, "ratio"))
    training = bool(constant(2, False, "training_mode"))
    if not 0.0 <= ratio < 1.0:
        raise UnsupportedOpError(f"{where}: ratio {ratio} is outside [0, 1)")
    return ratio, training


# -- BatchNormalization ---------------------------------------------------------------------

@gradient("BatchNormalization")
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


def _channel_view(ctx, node, x):
    # (N, C, inner): the BatchNormalization kernels walk channel planes of `inner` elements.
    shape = ctx.shape(x)
    if len(shape) < 2:
        raise UnsupportedOpError(f"{ctx.where(node)}: the input must be (N, C, ...), got "
                                 f"{list(shape)}")
    return [shape[0], shape[1], int(np.prod(shape[2:], dtype=np.int64))]


def _batch_norm_multiplier(ctx, scale, var, eps):
    # a = scale / sqrt(var + eps) of constant inputs, computed here in float64 once.
    return ctx.value(scale).astype(np.float64) / np.sqrt(ctx.value(var).astype(np.float64) + eps)


def _folded_batch_norm(ctx, scale, bias, mean, var, eps):
    # A BatchNormalization whose inputs are all constants is y = x * a + b per channel with
    # b = bias - mean * a: one multiply-add.
    a = _batch_norm_multiplier(ctx, scale, var, eps)
    b = ctx.value(bias).astype(np.float64) - ctx.value(mean).astype(np.float64) * a
    multiplier = f"batch_norm_multiplier({scale},{var})"
    offset = f"batch_norm_offset({scale},{bias},{mean},{var})"
    ctx._constant(multiplier, a.astype(np.float32))
    ctx._constant(offset, b.astype(np.float32))
    return ctx.t(multiplier), ctx.t(offset)


@lowering("BatchNormalization")
def lower_batch_norm(ctx, node):
    x, scale, bias, mean, var = node.input[:5]
    view = _channel_view(ctx, node, x)
    eps = attr(node, "epsilon", 1e-5)
    if batch_norm_training(node):
        _lower_batch_norm_training(ctx, node, view, eps)
        return
    y = ctx.define(node.output[0])
    if all(ctx.value(name) is not None for name in (scale, bias, mean, var)):
        a, b = _folded_batch_norm(ctx, scale, bias, mean, var, eps)
        ctx.step(op.CHANNEL_AFFINE, [y, ctx.t(x), a, b], view)
    else:
        ctx.step(op.BATCH_NORM_INFERENCE, [y] + [ctx.t(name) for name in node.input[:5]], view,
                 [eps])


def _lower_batch_norm_training(ctx, node, view, eps):
    # Running statistics that are parameters are updated in place, and the node's running
    # statistics outputs name them; computed ones (track_running_stats=False) are not.
    x, scale, bias, mean, var = node.input[:5]
    n, _, inner = view
    if n * inner < 2:
        raise UnsupportedOpError(f"{ctx.where(node)}: training mode needs more than one value "
                                 f"per channel, the input has shape {list(ctx.shape(x))}")
    if any(node.output[3:]):
        raise UnsupportedOpError(f"{ctx.where(node)}: the saved mean and variance outputs "
                                 f"(opset 9-13) are not supported; export with opset >= 15")
    stats = []
    for stat, out in zip((mean, var), (list(node.output[1:3]) + ["", ""])[:2]):
        tid = ctx.local.get(stat)
        updated = tid is not None and ctx.tensors[tid].role == PARAM
        stats.append(tid if updated else NO_TENSOR)
        if out and updated:
            ctx.alias_in_place(out, stat)
        elif out and ctx.uses.get(out):
            raise UnsupportedOpError(f"{ctx.where(node)}: output '{out}' reads the running "
                                     f"statistic '{stat}', which is not a parameter")
    y = ctx.define(node.output[0])
    ctx.step(op.BATCH_NORM_TRAINING, [y, ctx.t(x), ctx.t(scale), ctx.t(bias)] + stats, view,
             [eps, attr(node, "momentum", 0.9)])


@lowering("BatchNormalizationGrad")
def lower_batch_norm_grad(ctx, node):
    dy, x, scale = node.input[:3]
    training = attr(node, "training_mode", 0)
    eps = attr(node, "epsilon", 1e-5)
    view = _channel_view(ctx, node, x)
    dx, dscale, dbias = (list(node.output) + ["", ""])[:3]
    stats = node.input[3:5]
    if (not training and not dscale and not dbias
            and all(ctx.value(name) is not None for name in (scale, stats[1]))):
        # Constant scale and statistics: dx = dy * a (the forward's multiplier when folded).
        multiplier = f"batch_norm_multiplier({scale},{stats[1]})"
        ctx._constant(multiplier, _batch_norm_multiplier(ctx, scale, stats[1], eps)
                      .astype(np.float32))
        ctx.step(op.CHANNEL_AFFINE, [ctx.define(dx), ctx.t(dy), ctx.t(multiplier), NO_TENSOR],
                 view)
        return
    outs = [ctx.define(name) if name else NO_TENSOR for name in (dx, dscale, dbias)]
    stat_ids = [NO_TENSOR, NO_TENSOR] if training else [ctx.t(name) for name in stats]
    ctx.step(op.BATCH_NORM_GRAD, outs + [ctx.t(dy), ctx.t(x), ctx.t(scale)] + stat_ids, view,
             [eps])


class BatchNormalizationGrad(MicrotrainOp):
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


# -- Dropout ------------------------------------------------------------------------------

RANDOM_STATE = ".random_state"   # suffix of each Dropout's generator state (Module.set_seed)


@gradient("Dropout")
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


@lowering("Dropout")
def lower_dropout(ctx, node):
    # Training: y = x * mask / (1 - ratio) with a mask drawn on the device, kept bit-packed
    # in the int arena for the backward (1 bit per element instead of a 4-byte float).
    # Inference, or ratio 0: the identity, no step.
    ratio, training = dropout_config(node, ctx.value, ctx.where(node))
    x = node.input[0]
    mask = node.output[1] if len(node.output) > 1 else ""
    if not training or ratio == 0.0:
        if mask and ctx.uses.get(mask):
            raise UnsupportedOpError(f"{ctx.where(node)}: the mask of a Dropout that drops "
                                     f"nothing is not supported")
        ctx.alias(node.output[0], x)
        return
    size = ctx.tensors[ctx.t(x)].size
    y = ctx.define(node.output[0])
    mask_id = ctx.add(Tensor(mask, INT32, ACTIVATION, ((size + 29) // 30,),
                             program=ctx.program_name))
    if mask:
        ctx.local[mask] = mask_id
    stream = sum(1 for t in ctx.tensors if t.name.endswith(RANDOM_STATE))
    state = ctx.add(Tensor(ctx.node_name + RANDOM_STATE, INT32, CONTROL, (2,)))
    ctx.step(op.DROPOUT, [y, ctx.t(x), mask_id, state],
             [size, round(ratio * RANDOM_SPAN), attr(node, "seed", 0) % RANDOM_SPAN, stream],
             [1.0 / (1.0 - ratio)])


@lowering("DropoutGrad")
def lower_dropout_grad(ctx, node):
    dy, mask = node.input
    dx = ctx.define(node.output[0])
    ctx.step(op.DROPOUT_GRAD, [dx, ctx.t(dy), ctx.t(mask)], [ctx.tensors[dx].size],
             [1.0 / (1.0 - attr(node, "ratio", 0.5))])


class DropoutGrad(MicrotrainOp):
    """dX = dY * mask / (1 - ratio)."""

    def _run(self, dy, mask, ratio=0.5):
        return ((dy * mask / (1.0 - ratio)).astype(dy.dtype),)
