"""Quantization-aware training: standard QuantizeLinear -> DequantizeLinear (QDQ) pairs in
the training and eval graphs, lowered to one fake-quantization step each, with the
straight-through gradient, and the ai.microtrain ops that compute the quantization
parameters while training. Device kernels: kernels/quant.py. The pass that inserts the
pairs is quant/quantize.py.

  AbsMaxScale(W) -> scale          per-channel symmetric weight scale, max|W| / qmax >= eps
  MinMaxObserver(X, range) -> (scale, zero_point, range_out)
                                   training: moves the frozen parameter `range` = [min, max]
                                   towards X's (PyTorch's MovingAverageMinMaxObserver), then
                                   the affine qparams of the range
  QuantParams(range) -> (scale, zero_point)   eval: the qparams of the frozen range
  FakeQuantGrad(dY, X, scale, zero_point) -> dX   dY where X quantizes inside [qmin, qmax]

The int8 export a device runs from a QAT blob (Module.export_model_for_inferencing, program
"export": quant/qat_export.py), each the float32 computation of quant/qdq.py:
  FoldBatchNorm(W, B, gamma, beta, mean, var) -> (W', B')   B optional; axis, epsilon
  QuantizeWeight(W, scale) -> int8 W                        axis
  QuantizeBias(B, x_scale, w_scale) -> int32 B
  RequantHeader(x_zp, [b_zp,] y_zp, y_scale) -> int32 [x_zp, (b_zp,) y_zp, lo, hi]
                                   qmin, qmax, clamp_min / clamp_max (absent: none)
  ZeroPointInt(zp) -> int32 zp

Gradients: DequantizeLinear passes dY to its quantized input unchanged and QuantizeLinear
masks it (FakeQuantGrad), so a QDQ pair's gradient is PyTorch's fake_quantize backward.
Scales and zero points get no gradient (PyTorch computes them without autograd too).

The numpy functions below compute what the device kernels compute, in float32 with
PyTorch's formula q = nearbyint(x * (1 / scale)) + zero_point (ONNX's QuantizeLinear
divides; the two differ by at most one float32 rounding before the round to integer)."""
import numpy as np
from onnx import TensorProto

from .. import opcodes as op
from ..errors import UnsupportedOpError
from ..graph import DOMAIN, attr, optional_input
from ..reference import MicrotrainOp
from ..ir import ACTIVATION, INT8, INT32, NO_TENSOR, Tensor
from ..registry import gradient, lowering

QUANT_RANGES = {TensorProto.UINT8: (0, 255), TensorProto.INT8: (-128, 127)}
NUMPY_TYPES = {TensorProto.UINT8: np.uint8, TensorProto.INT8: np.int8}
FLOAT32_EPS = float(np.finfo(np.float32).eps)   # PyTorch observers' smallest scale
WEIGHT_QMAX = 127                                # symmetric int8 weights: [-127, 127]


# -- numpy mirrors of the device kernels ----------------------------------------------------

def channel_view(shape, axis, channels):
    """(outer, channels, inner) of a tensor of `shape` quantized along `axis` with
    `channels` scales (1: per tensor)."""
    size = int(np.prod(shape, dtype=np.int64))
    if channels == 1:
        return 1, 1, size
    axis %= len(shape)
    return (int(np.prod(shape[:axis], dtype=np.int64)), shape[axis],
            int(np.prod(shape[axis + 1:], dtype=np.int64)))


def _per_channel(value, shape, axis):
    value = np.asarray(value)
    if value.size == 1:
        return value.reshape(())
    view = [1] * len(shape)
    view[axis % len(shape)] = value.size
    return value.reshape(view)


def quantize_values(x, scale, zero_point, qmin, qmax, axis=1):
    """(q, inside) of PyTorch's fake_quantize: q = clamp(nearbyint(x * inv) + zp) with
    inv = float32(1 / scale), inside = the unclamped value lies in [qmin, qmax]."""
    x = np.asarray(x, np.float32)
    scale = _per_channel(np.asarray(scale, np.float32), x.shape, axis)
    zp = _per_channel(np.asarray(zero_point, np.int64), x.shape, axis)
    inv = (np.float32(1.0) / scale).astype(np.float32)
    with np.errstate(invalid="ignore", over="ignore"):
        v = (x * inv).astype(np.float32)
        bounded = np.abs(v) < 2.0 ** 30
        r = np.where(bounded, np.rint(np.where(bounded, v, 0)), 0).astype(np.int64) + zp
        r = np.where(bounded, r, np.where(v > 0, qmax + 1, qmin - 1))  # NaN: below
    return np.clip(r, qmin, qmax), (r >= qmin) & (r <= qmax)


def fake_quant_values(x, scale, zero_point, qmin, qmax, axis=1):
    q, _ = quantize_values(x, scale, zero_point, qmin, qmax, axis)
    x = np.asarray(x, np.float32)
    scale = _per_channel(np.asarray(scale, np.float32), x.shape, axis)
    zp = _per_channel(np.asarray(zero_point, np.int64), x.shape, axis)
    return ((q - zp).astype(np.float32) * scale).astype(np.float32)


def abs_max_scale_values(w, axis, qmax=WEIGHT_QMAX, eps=FLOAT32_EPS):
    w = np.asarray(w, np.float32)
    axes = tuple(i for i in range(w.ndim) if i != axis % w.ndim)
    scale = (np.abs(w).max(axis=axes) / np.float32(qmax)).astype(np.float32)
    return np.maximum(scale, np.float32(eps)).astype(np.float32)


def qparams_values(low, high, qmin, qmax, eps=FLOAT32_EPS):
    """(scale, zero point) of a range, PyTorch's affine rule in float32 (kernels/quant.py
    _qparams); (1, 0) for a range never observed (inf, -inf)."""
    low, high = np.float32(low), np.float32(high)
    if low == np.inf and high == -np.inf:
        return np.float32(1.0), 0
    neg, pos = min(low, np.float32(0)), max(high, np.float32(0))
    scale = np.float32(np.float32(pos - neg) / np.float32(qmax - qmin))
    if not scale >= eps:
        scale = np.float32(eps)
    v = np.float32(neg / scale)
    q = int(np.rint(v)) if -65536.0 < v < 65536.0 else 0
    return scale, int(min(max(qmin - q, qmin), qmax))


def observe_values(value_range, x, momentum):
    """The observer's range after seeing x (kernels/quant.py observe_min_max)."""
    low, high = (np.float32(v) for v in value_range)
    x = np.asarray(x, np.float32)
    lo, hi = x.min(), x.max()
    if not (np.isfinite(lo) and np.isfinite(hi)):
        return np.array([low, high], np.float32)
    if low == np.inf and high == -np.inf:
        return np.array([lo, hi], np.float32)
    c = np.float32(momentum)
    return np.array([low + np.float32(c * np.float32(lo - low)),
                     high + np.float32(c * np.float32(hi - high))], np.float32)


def fold_batch_norm_values(w, b, gamma, beta, mean, var, eps, axis=0):
    """(W', B') of a layer followed by BatchNormalization, float32 after every operation as
    kernels/quant.py fold_batch_norm: a = gamma / sqrt(var + eps), W' = W * a per output
    channel, B' = beta + (B - mean) * a (B = 0 when None)."""
    f = np.float32
    w = np.asarray(w, f)
    with np.errstate(all="ignore"):
        s = np.sqrt((np.asarray(var, f) + f(eps)).astype(f)).astype(f)
        a = np.where(s != 0, (np.asarray(gamma, f) / np.where(s != 0, s, f(1))).astype(f),
                     f(np.nan)).astype(f)
        view = [1] * w.ndim
        view[axis % w.ndim] = -1
        w2 = (w * a.reshape(view)).astype(f)
        b0 = np.zeros(len(a), f) if b is None else np.asarray(b, f)
        b2 = (np.asarray(beta, f) + ((b0 - np.asarray(mean, f)).astype(f) * a).astype(f))
    return w2, b2.astype(f)


INT32_MAX = 2**31 - 1


def quantize_bias_values(b, x_scale, w_scale):
    """(int32 bias, its float32 scale x_scale * w_scale): round half to even of the float32
    quotient b / scale (onnxruntime's quantizer), clamped to +-(2**31 - 1), NaN -> 0."""
    f = np.float32
    scale = (f(x_scale) * np.asarray(w_scale, f)).astype(f)
    with np.errstate(all="ignore"):
        v = np.where(scale != 0, (np.asarray(b, f) / np.where(scale != 0, scale, f(1))
                                  ).astype(f), f(np.nan)).astype(np.float64)
        q = np.where(np.abs(v) < 3e9, np.rint(np.nan_to_num(v)), np.where(
            v > 0, INT32_MAX, np.where(v < 0, -INT32_MAX, 0)))
    return np.clip(q, -INT32_MAX, INT32_MAX).astype(np.int32), scale


def clamp_bound(value, scale, zero_point, qmin, qmax):
    """The quantized value of a Relu / Clip bound: zp + round(float32(value / scale))."""
    f = np.float32
    with np.errstate(all="ignore"):
        v = float(f(f(value) / f(scale))) if f(scale) != 0 else float("nan")
    if -1e6 < v < 1e6:
        return int(zero_point) + int(np.rint(v))
    return qmax if v > 0 else qmin


def requant_head(zero_points, y_scale, qmin, qmax, clamp_min=None, clamp_max=None):
    """[zero points..., lo, hi] (kernels/quant.py requant_header): lo / hi the type's range
    narrowed by the fused Relu / Clip bounds."""
    y_zp = int(zero_points[-1])
    lo, hi = qmin, qmax
    if clamp_min is not None:
        lo = max(lo, clamp_bound(clamp_min, y_scale, y_zp, qmin, qmax))
    if clamp_max is not None:
        hi = min(hi, clamp_bound(clamp_max, y_scale, y_zp, qmin, qmax))
    return [int(z) for z in zero_points] + [lo, hi]


# -- gradient rules -------------------------------------------------------------------------

@gradient("DequantizeLinear")
def grad_dequantize(g, node, dys, needs):
    # The gradient with respect to the dequantized value, handed to the QuantizeLinear that
    # made the input (a QDQ pair is one fake quantization; its mask is applied there).
    return [dys[0]] + [None] * (len(node.input) - 1)


@gradient("QuantizeLinear")
def grad_quantize(g, node, dys, needs):
    x, scale = node.input[:2]
    zp = optional_input(node, 2)
    if zp is None:
        raise UnsupportedOpError(f"QuantizeLinear node '{node.name}': training through it "
                                 f"needs an explicit zero point input")
    dx = g.node("FakeQuantGrad", [dys[0], x, scale, zp], g.shape(x), domain=DOMAIN,
                hint="dFakeQuant", axis=attr(node, "axis", 1))
    return [dx] + [None] * (len(node.input) - 1)


# -- lowerings ------------------------------------------------------------------------------

def _zero_point_range(ctx, node, zp):
    elem = ctx.shapes[zp][0] if zp else TensorProto.UINT8
    if elem not in QUANT_RANGES:
        raise UnsupportedOpError(f"{ctx.where(node)}: zero point type {elem} is not supported;"
                                 f" uint8 and int8 are")
    return QUANT_RANGES[elem]


def _float_tensor(ctx, name):
    """The device tensor of a scale or zero point: a float constant for a known value (an
    int8 zero point becomes floats), else the tensor computing it."""
    value = ctx.value(name)
    if value is not None and value.dtype != np.float32:
        alias = f"{name}(float)"
        if ctx.value(alias) is None and alias not in ctx.local:
            ctx._constant(alias, np.asarray(value, np.float32))
        return ctx.t(alias)
    return ctx.t(name)


def _fake_quant_args(ctx, node, x, scale, zp):
    shape = ctx.shape(x)
    scale_id = _float_tensor(ctx, scale)
    channels = ctx.tensors[scale_id].size
    view = channel_view(shape, attr(node, "axis", 1), channels)
    if view[1] != channels:
        raise UnsupportedOpError(f"{ctx.where(node)}: {channels} scales for axis "
                                 f"{attr(node, 'axis', 1)} of shape {list(shape)}")
    zp_id = _float_tensor(ctx, zp) if zp else _float_tensor(ctx, _zero_constant(ctx))
    return [scale_id, zp_id], list(view) + list(_zero_point_range(ctx, node, zp))


def _zero_constant(ctx):
    name = "quant_zero_point(0)"
    if name not in ctx.local and ctx.value(name) is None:
        ctx._constant(name, np.zeros((), np.float32))
    return name


@lowering("QuantizeLinear")
def lower_quantize(ctx, node):
    # Only as the first half of a QDQ pair: the DequantizeLinear reading its output emits
    # the fake quantization (no int8 tensor exists in a training graph).
    pending = ctx.__dict__.setdefault("pending_quantize", {})
    pending[(ctx.program_name, node.output[0])] = node


@lowering("DequantizeLinear")
def lower_dequantize(ctx, node):
    q = node.input[0]
    source = ctx.__dict__.get("pending_quantize", {}).get((ctx.program_name, q))
    if source is None:
        raise UnsupportedOpError(f"{ctx.where(node)}: DequantizeLinear of '{q}', which no "
                                 f"QuantizeLinear of this graph produces, is not supported")
    if ctx.uses.get(q, 0) != 1 or list(node.input[1:]) != list(source.input[1:]) \
            or attr(node, "axis", 1) != attr(source, "axis", 1):
        raise UnsupportedOpError(f"{ctx.where(node)}: a QuantizeLinear output must feed one "
                                 f"DequantizeLinear with the same scale, zero point and axis")
    x, scale = source.input[:2]
    zp = source.input[2] if len(source.input) > 2 and source.input[2] else None
    qparams, ints = _fake_quant_args(ctx, node, x, scale, zp)
    y = ctx.define(node.output[0])
    ctx.step(op.FAKE_QUANT, [y, ctx.t(x)] + qparams, ints)


@lowering("FakeQuantGrad")
def lower_fake_quant_grad(ctx, node):
    dy, x, scale, zp = node.input
    qparams, ints = _fake_quant_args(ctx, node, x, scale, zp)
    dx = ctx.define(node.output[0])
    ctx.step(op.FAKE_QUANT_GRAD, [dx, ctx.t(dy), ctx.t(x)] + qparams, ints)


@lowering("AbsMaxScale")
def lower_abs_max_scale(ctx, node):
    w = node.input[0]
    shape = ctx.shape(w)
    axis = attr(node, "axis", 0)
    view = channel_view(shape, axis, shape[axis % len(shape)])
    ctx.step(op.ABS_MAX_SCALE, [ctx.define(node.output[0]), ctx.t(w)], view,
             [attr(node, "qmax", WEIGHT_QMAX), attr(node, "eps", FLOAT32_EPS)])


def _observer_ints(node):
    return [attr(node, "qmin", 0), attr(node, "qmax", 255)]


@lowering("MinMaxObserver")
def lower_min_max_observer(ctx, node):
    x, value_range = node.input
    scale, zp, range_out = node.output
    r = ctx.t(value_range)
    if ctx.tensors[r].role != 2:  # PARAM: the frozen parameter updated in place
        raise UnsupportedOpError(f"{ctx.where(node)}: the range '{value_range}' must be a "
                                 f"parameter")
    ctx.alias_in_place(range_out, value_range)
    ctx.step(op.OBSERVE_MIN_MAX, [ctx.define(scale), ctx.define(zp), r, ctx.t(x)],
             [ctx.tensors[ctx.t(x)].size] + _observer_ints(node),
             [attr(node, "momentum", 0.01), attr(node, "eps", FLOAT32_EPS)])


@lowering("QuantParams")
def lower_quant_params(ctx, node):
    scale, zp = node.output
    ctx.step(op.QUANT_PARAMS, [ctx.define(scale), ctx.define(zp), ctx.t(node.input[0])],
             _observer_ints(node), [attr(node, "eps", FLOAT32_EPS)])


# -- the device's int8 export (quant/qat_export.py) ------------------------------------------

@lowering("FoldBatchNorm")
def lower_fold_batch_norm(ctx, node):
    w, b, gamma, beta, mean, var = node.input
    shape = ctx.shape(w)
    axis = attr(node, "axis", 0)
    view = channel_view(shape, axis, shape[axis % len(shape)])
    ctx.step(op.FOLD_BATCH_NORM, [ctx.define(node.output[0]), ctx.define(node.output[1]),
                                  ctx.t(w), ctx.t(b) if b else NO_TENSOR, ctx.t(gamma),
                                  ctx.t(beta), ctx.t(mean), ctx.t(var)],
             view, [attr(node, "epsilon", 1e-5)])


def _int_activation(ctx, name, dtype, shape):
    tid = ctx.add(Tensor(name, dtype, ACTIVATION, tuple(shape), program=ctx.program_name))
    ctx.local[name] = tid
    return tid


@lowering("QuantizeWeight")
def lower_quantize_weight(ctx, node):
    w, scale = node.input
    shape = ctx.shape(w)
    axis = attr(node, "axis", 0)
    view = channel_view(shape, axis, shape[axis % len(shape)])
    ctx.step(op.QUANTIZE_WEIGHT, [_int_activation(ctx, node.output[0], INT8, shape), ctx.t(w),
                                  ctx.t(scale)], view)


@lowering("QuantizeBias")
def lower_quantize_bias(ctx, node):
    b, x_scale, w_scale = node.input
    n = ctx.tensors[ctx.t(b)].size
    ctx.step(op.QUANTIZE_BIAS, [_int_activation(ctx, node.output[0], INT32, (n,)), ctx.t(b),
                                ctx.t(x_scale), ctx.t(w_scale)], [n])


@lowering("RequantHeader")
def lower_requant_header(ctx, node):
    zps, scale = list(node.input[:-1]), node.input[-1]
    head = _int_activation(ctx, node.output[0], INT32, (len(zps) + 2,))
    cmin, cmax = attr(node, "clamp_min", None), attr(node, "clamp_max", None)
    ctx.step(op.REQUANT_HEADER, [head, ctx.t(zps[0]), ctx.t(zps[1]) if len(zps) == 3
                                 else NO_TENSOR, ctx.t(zps[-1]), ctx.t(scale)],
             [attr(node, "qmin", 0), attr(node, "qmax", 255), int(cmin is not None),
              int(cmax is not None)], [cmin or 0.0, cmax or 0.0])


@lowering("ZeroPointInt")
def lower_zero_point_int(ctx, node):
    ctx.step(op.ZERO_POINT_INT, [_int_activation(ctx, node.output[0], INT32, (1,)),
                                 ctx.t(node.input[0])])


# -- numpy references of the ai.microtrain ops ------------------------------------------------

class FakeQuantGrad(MicrotrainOp):
    """dX = dY where X quantizes inside [qmin, qmax] (qmin, qmax of the zero point's type)."""

    def _run(self, dy, x, scale, zero_point, axis=1):
        qmin, qmax = (0, 255) if zero_point.dtype == np.uint8 else (-128, 127)
        _, inside = quantize_values(x, scale, zero_point, qmin, qmax, axis)
        return (np.where(inside, dy, 0).astype(dy.dtype),)


class AbsMaxScale(MicrotrainOp):
    """scale[c] = max(max |W| over every axis but `axis` / qmax, eps)."""

    def _run(self, w, axis=0, qmax=WEIGHT_QMAX, eps=FLOAT32_EPS):
        return (abs_max_scale_values(w, axis, qmax, eps),)


def _qparams_outputs(value_range, qmin, qmax, eps):
    scale, zp = qparams_values(value_range[0], value_range[1], qmin, qmax, eps)
    return (np.array(scale, np.float32),
            np.array(zp, np.uint8 if qmin == 0 else np.int8))


class MinMaxObserver(MicrotrainOp):
    """(scale, zero point, updated range) of the range moved towards X's min and max."""

    def _run(self, x, value_range, momentum=0.01, qmin=0, qmax=255, eps=FLOAT32_EPS):
        updated = observe_values(value_range, x, momentum)
        return _qparams_outputs(updated, qmin, qmax, eps) + (updated,)


class QuantParams(MicrotrainOp):
    """(scale, zero point) of a frozen range."""

    def _run(self, value_range, qmin=0, qmax=255, eps=FLOAT32_EPS):
        return _qparams_outputs(value_range, qmin, qmax, eps)


class FoldBatchNorm(MicrotrainOp):
    def _run(self, w, b, gamma, beta, mean, var, axis=0, epsilon=1e-5):
        return fold_batch_norm_values(w, b, gamma, beta, mean, var, epsilon, axis)


class QuantizeWeight(MicrotrainOp):
    def _run(self, w, scale, axis=0):
        q, _ = quantize_values(w, scale, np.zeros(len(scale), np.int64), -WEIGHT_QMAX,
                               WEIGHT_QMAX, axis)
        return (q.astype(np.int8),)


class QuantizeBias(MicrotrainOp):
    def _run(self, b, x_scale, w_scale):
        return (quantize_bias_values(b, np.asarray(x_scale).reshape(-1)[0], w_scale)[0],)


class RequantHeader(MicrotrainOp):
    def _run(self, *inputs, qmin=0, qmax=255, clamp_min=None, clamp_max=None):
        zps, scale = inputs[:-1], inputs[-1]
        return (np.array(requant_head([np.asarray(z).reshape(-1)[0] for z in zps],
                                      np.asarray(scale).reshape(-1)[0], qmin, qmax,
                                      clamp_min, clamp_max), np.int32),)


class ZeroPointInt(MicrotrainOp):
    def _run(self, zp):
        return (np.asarray(zp).reshape(1).astype(np.int32),)
