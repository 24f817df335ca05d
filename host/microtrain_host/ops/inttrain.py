"""Integer training ops (issue 11): an int8 classifier Gemm trained in integers, every
device step integer-only (device kernels: kernels/inttrain.py, which documents the fixed
point). quant/inttrain.py builds the graphs that use them.

  IntGemmLogits(X, W, B) -> Z          int32 logits, LOGIT_BITS fractional bits, of the
                                       int8 input X (its scale / zero point on the tensor),
                                       int8 W [n, k] (per-channel scales), int32 bias B
  IntSoftmaxCrossEntropy(Z, L) -> (loss, G)
                                       loss ints [m, 2] (max - z_label, sum of exp in Q14)
                                       and the gradient p - onehot in Q14 [m, n]
  IntGemmUpdate(W, B, X, G) -> (W', B')
                                       the QAS-scaled SGD update of W and B in place (W', B'
                                       name the same storage), multipliers derived on the
                                       device from the learning rate and the scales;
                                       stochastic=1: weight steps rounded stochastically
                                       (an int32 xorshift16 state, "<W>.dither")

`exp_table()` is the Q14 exp table the loss step reads; `logits`, `softmax_ce` and `update`
are their numpy mirrors (the same integers as the device), for tools and tests."""
import math

import numpy as np

from .. import opcodes as op
from ..errors import UnsupportedOpError
from ..graph import attr
from ..ir import (ACTIVATION, CONSTANT, INT32, INT8, NO_TENSOR, OPTIMIZER_STATE,
                              PARAM, UINT8, Tensor)
from ..registry import lowering
from .qlinear import requant_multiplier, requant_values

LOGIT_BITS = 12   # (device kernels/inttrain.py: with 8, p - onehot carried 2**-9 of a logit)
PROB_BITS = 14
ONE = 1 << PROB_BITS
EXP_HI, EXP_MID, EXP_LO = 12, 64, 64    # device kernels/fixedpoint.py exp_q14's levels
LOGIT_LIMIT = 1 << 24
BIAS_LIMIT = 1 << 23
UNUSED_BIAS = -BIAS_LIMIT - 1     # a class slot not in use (its weights zero): no logit,
UNUSED_LOGIT = -LOGIT_LIMIT - 1   # probability 0, no update (device kernels/inttrain.py)
MAX_BATCH = 127     # (kernels/inttrain.py: m * 2**14 * 255 per update sum)
MAX_K = 4096      # inputs per output (device kernels/inttrain.py: accumulators below 2**28)
MAX_GRAD_OUTPUTS = 2048   # outputs of IntGemmGradInput (device kernels/inttrain.py: fewer
                          # bits of D beyond 511, so that its sums stay below 2**30)
EXP_TABLE = "inttrain.exp_table"


def exp_table():
    """int32 [exp(-a) for a < 12] + [exp(-b / 64) for b < 64] + [exp(-c / 4096) for c <
    64], Q14, rounded: exp(-d / 2**12) = the product of the three levels' entries for
    d >> 12, (d >> 6) & 63 and d & 63 (exp_q14)."""
    hi = [round(math.exp(-a) * ONE) for a in range(EXP_HI)]
    mid = [round(math.exp(-b * 64 / 2 ** LOGIT_BITS) * ONE) for b in range(EXP_MID)]
    lo = [round(math.exp(-c / 2 ** LOGIT_BITS) * ONE) for c in range(EXP_LO)]
    return np.array(hi + mid + lo, np.int32)


def exp_q14(d):
    """exp(-d / 2**12) in Q14 for int64 d >= 0, as the device's fixedpoint.exp_q14."""
    table = exp_table().astype(np.int64)
    d = np.asarray(d, np.int64)
    a = d >> 12
    e = ((((table[np.minimum(a, EXP_HI - 1)] * table[EXP_HI + ((d >> 6) & 63)]) + 8192)
          >> 14) * table[EXP_HI + EXP_MID + (d & 63)] + 8192) >> 14
    return np.where(a < EXP_HI, e, 0)


def _byte(ctx, name, node):
    tid = ctx.t(name)
    t = ctx.tensors[tid]
    if t.dtype not in (INT8, UINT8) or not len(t.scale):
        raise UnsupportedOpError(f"{ctx.where(node)}: '{name}' must be a quantized int8 / "
                                 f"uint8 tensor")
    return tid, t


def _int_tensor(ctx, name, shape):
    tid = ctx.add(Tensor(name, INT32, ACTIVATION, tuple(shape), program=ctx.program_name))
    ctx.local[name] = tid
    return tid


def _derived(ctx, key, size):
    # a derived int32 constant with no given values (kernels/inttrain.py computes it)
    if key in ctx.persistent:
        ctx.local[key] = ctx.persistent[key]
        return ctx.persistent[key]
    tid = ctx.add(Tensor(key, INT32, CONSTANT, (size,), data=b"", derived=True))
    ctx.persistent[key] = ctx.local[key] = tid
    return tid


def _layer(ctx, node, w_name, b_name, x_name):
    xid, x = _byte(ctx, x_name, node)
    wid, w = _byte(ctx, w_name, node)
    bid = ctx.t(b_name)
    if w.role != PARAM or w.dtype != INT8 or ctx.tensors[bid].role != PARAM or \
            ctx.tensors[bid].dtype != INT32:
        raise UnsupportedOpError(f"{ctx.where(node)}: W must be an int8 parameter and B an "
                                 f"int32 parameter")
    n, k = w.shape
    if len(x.shape) != 2 or x.shape[1] != k:
        raise UnsupportedOpError(f"{ctx.where(node)}: input shape {list(x.shape)} does not "
                                 f"match the weight's {[n, k]}")
    if k > MAX_K:
        raise UnsupportedOpError(f"{ctx.where(node)}: {k} inputs per output; integer training "
                                 f"takes at most {MAX_K} (accumulators below 2**28, exact in "
                                 f"the 32-bit ports' requantization)")
    if len(w.scale) != n or ctx.tensors[bid].size != n:
        raise UnsupportedOpError(f"{ctx.where(node)}: W needs one scale and B one value per "
                                 f"output channel ({n})")
    if x.shape[0] > MAX_BATCH:
        raise UnsupportedOpError(f"{ctx.where(node)}: batch {x.shape[0]}; integer training "
                                 f"takes at most {MAX_BATCH} samples a step (the update's "
                                 f"sums below 2**29 on 32-bit ports)")
    return xid, x, wid, bid, x.shape[0], k, n


@lowering("IntGemmLogits")
def lower_int_gemm_logits(ctx, node):
    xid, x, wid, bid, m, k, n = _layer(ctx, node, node.input[1], node.input[2], node.input[0])
    z = _int_tensor(ctx, node.output[0], (m, n))
    req = _derived(ctx, f"{node.input[1]}.logit_requant", 1 + 2 * n)
    ctx.step(op.INT_GEMM_LOGITS, [z, xid, wid, bid, req], [m, k, n, int(x.dtype == INT8)])


@lowering("IntSoftmaxCrossEntropy")
def lower_int_softmax_ce(ctx, node):
    zid = ctx.t(node.input[0])
    m, n = ctx.tensors[zid].shape
    label = ctx.t(node.input[1])
    if ctx.tensors[label].size != m:
        raise UnsupportedOpError(f"{ctx.where(node)}: {ctx.tensors[label].size} labels for "
                                 f"{m} samples")
    loss, grad = loss_tensors(ctx, node, m, n, 2)
    ctx.step(op.INT_SOFTMAX_CE, [zid, grad, loss, label, exp_table_tensor(ctx)], [m, n])


def loss_tensors(ctx, node, m, n, words):
    """An integer loss's outputs: the loss (int32 [m, words] per sample) and the gradient of
    the logits (int32 [m, n])."""
    return _int_tensor(ctx, node.output[0], (m, words)), _int_tensor(ctx, node.output[1], (m, n))


def exp_table_tensor(ctx):
    """The exp table constant (once per blob; ops/intloss.py's sigmoid reads it too)."""
    if EXP_TABLE in ctx.persistent:
        table = ctx.local[EXP_TABLE] = ctx.persistent[EXP_TABLE]
    else:
        table = ctx.add(Tensor(EXP_TABLE, INT32, CONSTANT, (EXP_HI + EXP_MID + EXP_LO,),
                               data=exp_table().astype("<i4").tobytes()))
        ctx.persistent[EXP_TABLE] = ctx.local[EXP_TABLE] = table
    return table


@lowering("IntGemmUpdate")
def lower_int_gemm_update(ctx, node):
    xid, x, wid, bid, m, k, n = _layer(ctx, node, node.input[0], node.input[1], node.input[2])
    g = ctx.t(node.input[3])
    if tuple(ctx.tensors[g].shape) != (m, n):
        raise UnsupportedOpError(f"{ctx.where(node)}: gradient shape "
                                 f"{list(ctx.tensors[g].shape)}, expected {[m, n]}")
    rates = _derived(ctx, f"{node.input[0]}.update_rates", 1 + 4 * n)
    random = _dither(ctx, node, node.input[0])
    momentum = float(attr(node, "momentum", 0.0))
    if momentum:
        # int16 weight velocities (2 bytes each) and int32 bias velocities
        vw, vb = f"{node.input[0]}.velocity", f"{node.input[1]}.velocity"
        for key, dtype, size in ((vw, INT8, 2 * n * k), (vb, INT32, n)):
            if key not in ctx.persistent:
                ctx.persistent[key] = ctx.add(Tensor(key, dtype, OPTIMIZER_STATE, (size,)))
            ctx.local[key] = ctx.persistent[key]
        ctx.step(op.INT_GEMM_UPDATE_MOMENTUM,
                 [wid, bid, xid, g, rates, random, ctx.persistent[vw], ctx.persistent[vb]],
                 [m, k, n, int(x.dtype == INT8), round(momentum * ONE)])
    else:
        ctx.step(op.INT_GEMM_UPDATE, [wid, bid, xid, g, rates, random],
                 [m, k, n, int(x.dtype == INT8)])
    ctx.alias_in_place(node.output[0], node.input[0])
    ctx.alias_in_place(node.output[1], node.input[1])


@lowering("IntGemmGradInput")
def lower_int_gemm_grad_input(ctx, node):
    # D = the classifier input's gradient in units of max(s_w) / 2**14 (kernels/inttrain.py)
    g = ctx.t(node.input[0])
    wid, w = _byte(ctx, node.input[1], node)
    n, k = w.shape
    m = ctx.tensors[g].shape[0]
    if tuple(ctx.tensors[g].shape) != (m, n) or len(w.scale) != n:
        raise UnsupportedOpError(f"{ctx.where(node)}: gradient {list(ctx.tensors[g].shape)} "
                                 f"and weight {[n, k]} do not match")
    if n > MAX_GRAD_OUTPUTS:        # (kernels/inttrain.py int_gemm_grad_input_check)
        raise UnsupportedOpError(f"{ctx.where(node)}: {n} outputs; the integer backward "
                                 f"below the last Gemm takes at most {MAX_GRAD_OUTPUTS}")
    d = _int_tensor(ctx, node.output[0], (m, k))
    factors = _derived(ctx, f"{node.input[1]}.input_factors", 2 * n)
    ctx.step(op.INT_GEMM_GRAD_INPUT, [d, g, wid, factors], [m, k, n])


def _dither(ctx, node, weight):
    if not attr(node, "stochastic", 0):
        return NO_TENSOR
    key = f"{weight}.dither"
    if key not in ctx.persistent:
        ctx.persistent[key] = ctx.add(Tensor(key, INT32, OPTIMIZER_STATE, (1,)))
    ctx.local[key] = ctx.persistent[key]
    return ctx.persistent[key]


@lowering("IntConv1x1Update")
def lower_int_conv1x1_update(ctx, node):
    # IntConv1x1Update(W, B, X, Y, D) -> (W', B'): the 1x1 convolution Y = clamp(W X + B)
    # (its QLinearConv node named by attribute `conv`: the clamp bounds) before a
    # GlobalAveragePool and the classifier, from D (IntGemmGradInput)
    w_name, b_name, x_name, y_name, d_name = node.input
    wid, w = _byte(ctx, w_name, node)
    xid, x = _byte(ctx, x_name, node)
    yid, y = _byte(ctx, y_name, node)
    bid = ctx.t(b_name)
    d = ctx.t(d_name)
    cout, cin = w.shape[0], int(np.prod(w.shape[1:]))
    m = x.shape[0]
    plane = int(np.prod(x.shape[2:]))
    if w.role != PARAM or ctx.tensors[bid].role != PARAM or x.shape[1] != cin or \
            tuple(y.shape) != (m, cout) + tuple(x.shape[2:]) or \
            tuple(ctx.tensors[d].shape) != (m, cout):
        raise UnsupportedOpError(f"{ctx.where(node)}: shapes W {list(w.shape)}, X "
                                 f"{list(x.shape)}, Y {list(y.shape)}, D "
                                 f"{list(ctx.tensors[d].shape)} are not a 1x1 convolution's")
    req = ctx.local[f"{attr(node, 'conv')}.requant"]
    rates = _derived(ctx, f"{w_name}.update_rates", 1 + 4 * cout)
    ctx.step(op.INT_CONV1X1_UPDATE, [wid, bid, xid, yid, d, req, rates, _dither(ctx, node, w_name)],
             [m, cin, cout, plane, int(x.dtype == INT8), int(y.dtype == INT8)])
    ctx.alias_in_place(node.output[0], w_name)
    ctx.alias_in_place(node.output[1], b_name)


# -- numpy mirrors (the device's integers) ------------------------------------------------
def _f32(v):
    return float(np.float32(v))


def logits(xq, x_zp, w, bias, sx, sw):
    """int32 logits [m, n] as int_gemm_logits computes them."""
    acc = (xq.astype(np.int64) - x_zp) @ w.astype(np.int64).T + bias.astype(np.int64)
    out = np.empty_like(acc)
    for j in range(w.shape[0]):
        m0, shift = requant_multiplier(_f32(_f32(_f32(sx) * _f32(sw[j])) * 2 ** LOGIT_BITS))
        out[:, j] = requant_values(acc[:, j], m0, shift)
    return np.where(np.asarray(bias) == UNUSED_BIAS, UNUSED_LOGIT,
                    np.clip(out, -LOGIT_LIMIT, LOGIT_LIMIT))


def softmax_ce(z, labels):
    """(loss ints [m, 2], gradient Q14 [m, n]) as int_softmax_ce computes them."""
    z = np.asarray(z, np.int64)
    d = z.max(axis=1, keepdims=True) - z
    rows = np.arange(len(z))
    counted = z != UNUSED_LOGIT
    counted[rows, labels] = True
    e = np.where(counted, exp_q14(d), 0)
    total = e.sum(axis=1, keepdims=True)
    g = ((e << 14) + (total >> 1)) // total
    g[rows, labels] -= ONE
    loss = np.stack([d[rows, labels], total[:, 0]], axis=1)
    return loss, g


def update_reals(sx, sw, m, lr):
    """[(real_w, real_b)] per channel, float32 as kernels/inttrain.py update_reals."""
    f = np.float32
    unit = f(ONE * m)
    return [(float(f(f(f(f(lr) * f(sx)) / f(s)) / unit)),
             float(f(f(f(lr) / f(f(sx) * f(s))) / unit))) for s in sw]


def update(w, bias, xq, x_zp, g, sx, sw, lr):
    """(W', B') after int_gemm_update (round half to even, clamps)."""
    m = xq.shape[0]
    acc_w = g.astype(np.int64).T @ (xq.astype(np.int64) - x_zp)        # [n, k]
    acc_b = g.astype(np.int64).sum(axis=0)
    w2, b2 = w.astype(np.int64).copy(), bias.astype(np.int64).copy()
    for j, (rw, rb) in enumerate(update_reals(sx, sw, m, lr)):
        if bias[j] == UNUSED_BIAS:
            continue
        w2[j] -= requant_values(acc_w[j], *requant_multiplier(rw))
        b2[j] -= requant_values(acc_b[j:j + 1], *requant_multiplier(rb))[0]
    return (np.clip(w2, -127, 127).astype(np.int8),
            np.where(b2 == UNUSED_BIAS, b2, np.clip(b2, -BIAS_LIMIT, BIAS_LIMIT)).astype(np.int32))
