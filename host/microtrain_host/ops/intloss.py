"""Integer losses of the last Gemm besides ops/inttrain.py's softmax cross-entropy (issue 22):
the device kernels are kernels/intloss.py, which documents the fixed point. quant/inttrain.py
builds the graphs that use them.

  IntMeanSquaredError(Z, T) -> (loss, G)
                          Z: int32 outputs (IntGemmLogits, 2**-8 units) [m, n]; T: the
                          int8 / uint8 target (its scale and zero point on the tensor);
                          loss ints [m, 2] (sum of squares, hi * 2**18 + lo, in 2**-16),
                          G = clamp(Z - t, +-2**14) [m, n]
  IntBCEWithLogits(Z, T) -> (loss, G)
                          T: int32 target probabilities in Q14; loss ints [m, 4] (hi, lo,
                          k, P), G = sigmoid(z) - t in Q14 [m, n]; reads ops/inttrain.py's
                          exp table

`mse` and `bce_with_logits` are their numpy mirrors (the device's integers) and the loss
values as the device reports them, for tools and tests."""
import math

import numpy as np

from .. import opcodes as op
from ..errors import UnsupportedOpError
from ..ir import INT32, INT8, UINT8
from ..registry import lowering
from .inttrain import LOGIT_BITS, ONE, _derived, exp_q14, exp_table_tensor, loss_tensors
from .qlinear import requant_multiplier, requant_values

GRAD_LIMIT = 1 << 14
MAX_OUTPUTS = 2048


def _outputs(ctx, node):
    zid = ctx.t(node.input[0])
    z = ctx.tensors[zid]
    if z.dtype != INT32 or len(z.shape) != 2:
        raise UnsupportedOpError(f"{ctx.where(node)}: '{node.input[0]}' must be the int32 "
                                 f"[batch, outputs] output of IntGemmLogits")
    m, n = z.shape
    if n > MAX_OUTPUTS:
        raise UnsupportedOpError(f"{ctx.where(node)}: {n} outputs per sample; the integer "
                                 f"loss takes at most {MAX_OUTPUTS}")
    tid = ctx.t(node.input[1])
    if ctx.tensors[tid].size != m * n:
        raise UnsupportedOpError(f"{ctx.where(node)}: the target '{node.input[1]}' has "
                                 f"{ctx.tensors[tid].size} values, the output {m * n}")
    return zid, tid, m, n


@lowering("IntMeanSquaredError")
def lower_int_mse(ctx, node):
    zid, tid, m, n = _outputs(ctx, node)
    t = ctx.tensors[tid]
    if t.dtype not in (INT8, UINT8) or len(t.scale) != 1:
        raise UnsupportedOpError(f"{ctx.where(node)}: the target '{node.input[1]}' must be "
                                 f"an int8 / uint8 tensor with one scale")
    loss, grad = loss_tensors(ctx, node, m, n, 2)
    req = _derived(ctx, f"{node.input[1]}.target_requant", 3)
    ctx.step(op.INT_MSE, [zid, grad, loss, tid, req], [m, n, int(t.dtype == INT8)])


@lowering("IntBCEWithLogits")
def lower_int_bce_with_logits(ctx, node):
    zid, tid, m, n = _outputs(ctx, node)
    if ctx.tensors[tid].dtype != INT32:
        raise UnsupportedOpError(f"{ctx.where(node)}: the target '{node.input[1]}' must be "
                                 f"int32 probabilities in Q14")
    loss, grad = loss_tensors(ctx, node, m, n, 4)
    ctx.step(op.INT_BCE_LOGITS, [zid, grad, loss, tid, exp_table_tensor(ctx)], [m, n])


# -- numpy mirrors (the device's integers) and the loss values ------------------------------
def target_fixed(tq, t_zp, st):
    """The target in the outputs' fixed point (2**-LOGIT_BITS units), as int_mse computes
    it."""
    real = float(np.float32(np.float32(st) * 2 ** LOGIT_BITS))
    return requant_values(np.asarray(tq, np.int64) - t_zp, *requant_multiplier(real))


def _to_8(v):
    # v (2**-LOGIT_BITS units) in 2**-8 units, rounded half to even (fixedpoint.round_shift)
    return requant_values(np.asarray(v, np.int64), 1, LOGIT_BITS - 8)


def mse(z, tq, t_zp, st):
    """(loss value, gradient [m, n]) of int_mse: the value as Module reports it (the mean
    over all elements), G = clamp(d, +-2**14), d = z - t in 2**-8 units."""
    d = _to_8(np.asarray(z, np.int64) - target_fixed(tq, t_zp, st).reshape(np.shape(z)))
    a = np.minimum(np.abs(d), 1 << 18)
    return float((a * a).sum()) / 2 ** 16 / d.size, np.clip(d, -GRAD_LIMIT, GRAD_LIMIT)


def bce_with_logits(z, t):
    """(loss value, gradient Q14 [m, n]) of int_bce_logits (t: Q14 ints)."""
    z = np.asarray(z, np.int64)
    t = np.clip(np.asarray(t, np.int64).reshape(z.shape), 0, ONE)
    a = np.abs(z)
    e = exp_q14(a)
    s = ((ONE << 14) + ((ONE + e) >> 1)) // (ONE + e)
    g = np.where(z >= 0, s, ONE - s) - t
    a = np.minimum(_to_8(a), 1 << 15)
    linear = np.where(z >= 0, a * (ONE - t), a * t).sum()
    logs = 0.0
    for row in e:
        p, k = ONE, 0
        for v in row:
            p = (p * (ONE + int(v)) + 8192) >> 14
            if p >= 2 * ONE:
                p, k = p >> 1, k + 1
        logs += k * math.log(2.0) + math.log(p / ONE)
    return (float(linear) / 2 ** (8 + 14) + logs) / z.size, g
