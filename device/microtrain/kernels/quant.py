# Quantization-aware training: fake quantization (a QuantizeLinear -> DequantizeLinear pair)
# and its straight-through gradient, the per-channel weight scale, the moving-average
# min/max observer of activations, side by side. Everything here is float: the training
# graph keeps float tensors and only rounds them to the int8 / uint8 grid.
#
# Layout: a tensor is viewed as (outer, channels, inner) around its quantization axis; a
# per-tensor quantization has channels = 1. Scales and zero points are float tensors of
# `channels` elements (zero points hold small integers exactly).
#
# Float32 on every interpreter: PyTorch's fake_quantize computes
#   q = clamp(nearbyint(x * inv_scale) + zero_point, qmin, qmax), inv_scale = 1.0f / scale,
#   y = (q - zero_point) * scale
# in float32. Here arithmetic is double on CPython and the Unix port, float32 on boards; each
# float32 rounding PyTorch does is reproduced by storing the value into the float32 arena and
# reading it back (a product or quotient of float32 values computed in double and rounded
# once to float32 is the correctly rounded float32 result). round() is round-half-even on
# CPython and MicroPython alike, like nearbyint.
import math
from array import array

_INF = float("inf")
_NAN = float("nan")


def _fake_quant_channel(F, y, x, count, scale, lo, hi):
    # y[i] = clamp(round(x[i] * inv), lo, hi) * scale for i < count, lo/hi = q bounds minus
    # the zero point. y[0] is scratch for rounding inv to float32 before it is overwritten.
    F[y] = 1.0 / scale
    inv = F[y]
    below = lo - 1
    above = hi + 1
    for i in range(count):
        F[y + i] = F[x + i] * inv
        v = F[y + i]
        if below < v < above:      # round() only where it is small: no inf, no NaN
            q = round(v)
            if q < lo:
                q = lo
            elif q > hi:
                q = hi
        elif v > 0.0:
            q = hi
        else:
            q = lo                 # -inf and NaN: PyTorch's cast of NaN clamps to qmin
        F[y + i] = q * scale


def fake_quant(F, I, args):
    # Y = DequantizeLinear(QuantizeLinear(X, scale, zero_point)), per tensor or per channel.
    y, x, s, z, outer, channels, inner, qmin, qmax = args
    for o in range(outer):
        for c in range(channels):
            zp = int(F[z + c])
            at = (o * channels + c) * inner
            _fake_quant_channel(F, y + at, x + at, inner, F[s + c], qmin - zp, qmax - zp)


def _geometry_check(c):
    # fake_quant's (4 tensors) and its gradient's (5): the last two are scale, zero point
    tensors = len(c.offsets)
    outer, channels, inner, qmin, qmax = c.ints
    c.positive(outer, channels, inner)
    c.within(qmin, -32768, qmax - 1, "qmin")
    c.within(qmax, qmin + 1, 65535, "qmax")
    for k in range(tensors - 2):
        c.holds(k, outer * channels * inner)
    c.holds(tensors - 2, channels)   # scale
    c.holds(tensors - 1, channels)   # zero point


def fake_quant_check(args, c):
    _geometry_check(c)


def fake_quant_grad(F, I, args):
    # Straight-through estimator (PyTorch's fake_quantize backward): dX = dY where the
    # unclamped quantized value nearbyint(x * inv) + zero_point lies in [qmin, qmax], else 0
    # (dY * mask, so a negative dY gives -0.0 as PyTorch's does).
    dx, dy, x, s, z, outer, channels, inner, qmin, qmax = args
    for o in range(outer):
        for c in range(channels):
            zp = int(F[z + c])
            lo = qmin - zp
            hi = qmax - zp
            below = lo - 1
            above = hi + 1
            at = (o * channels + c) * inner
            F[dx + at] = 1.0 / F[s + c]
            inv = F[dx + at]
            for i in range(at, at + inner):
                F[dx + i] = F[x + i] * inv
                v = F[dx + i]
                keep = 0.0
                if below < v < above:
                    q = round(v)
                    if lo <= q <= hi:
                        keep = 1.0
                F[dx + i] = F[dy + i] * keep    # -0.0 for a negative dY, as PyTorch's mask


def fake_quant_grad_check(args, c):
    _geometry_check(c)


def abs_max_scale(F, I, args):
    # Symmetric per-channel weight scale: scale[c] = max(max |w[., c, .]| / qmax, eps),
    # recomputed from the current weights at every step (eps keeps an all-zero channel from
    # dividing by zero).
    scale, w, outer, channels, inner, qmax, eps = args
    for c in range(channels):
        m = 0.0
        for o in range(outer):
            at = w + (o * channels + c) * inner
            for i in range(at, at + inner):
                v = F[i]
                if v < 0.0:
                    v = -v
                if v > m:
                    m = v
        F[scale + c] = m / qmax
        if not F[scale + c] >= eps:    # NaN too
            F[scale + c] = eps


def abs_max_scale_check(args, c):
    outer, channels, inner = c.ints
    qmax, eps = c.floats
    c.positive(outer, channels, inner)
    c.holds(0, channels)
    c.holds(1, outer * channels * inner)
    c.within(qmax, 1.0, 65535.0, "qmax")
    c.within(eps, 1e-38, 1.0, "eps")


def _qparams(F, s, z, r, qmin, qmax, eps):
    # PyTorch's affine qparams of a min/max range (MinMaxObserver._calculate_qparams), in
    # float32: scale = max((max(hi, 0) - min(lo, 0)) / (qmax - qmin), eps),
    # zero_point = clamp(qmin - round(min(lo, 0) / scale), qmin, qmax). A range never
    # observed (inf, -inf) gives scale 1, zero point 0, as PyTorch does.
    lo = F[r]
    hi = F[r + 1]
    if lo == _INF and hi == -_INF:
        F[s] = 1.0
        F[z] = 0.0
        return
    neg = lo if lo < 0.0 else 0.0
    pos = hi if hi > 0.0 else 0.0
    F[s] = pos - neg
    F[s] = F[s] / (qmax - qmin)
    if not F[s] >= eps:                # a collapsed range (constant activation), NaN
        F[s] = eps
    F[z] = neg / F[s]
    v = F[z]
    q = round(v) if -65536.0 < v < 65536.0 else 0   # bounded: an inf scale makes it NaN
    zp = qmin - q
    if zp < qmin:
        zp = qmin
    elif zp > qmax:
        zp = qmax
    F[z] = zp


def observe_min_max(F, I, args):
    # Training forward of an activation observer (PyTorch's MovingAverageMinMaxObserver):
    # the first batch sets the range [min, max], later ones move it by momentum:
    # min += momentum * (batch_min - min) (float32, step by step as PyTorch rounds), then
    # the qparams of the range. A batch whose min or max is not finite leaves the range as
    # it was, so one bad batch cannot poison it (the loss shows the NaN anyway).
    s, z, r, x, n, qmin, qmax, momentum, eps = args
    lo = hi = F[x]
    for i in range(x + 1, x + n):
        v = F[i]
        if v < lo:
            lo = v
        elif v > hi:
            hi = v
    if -_INF < lo and hi < _INF:      # NaN fails these too
        if F[r] == _INF and F[r + 1] == -_INF:
            F[r] = lo
            F[r + 1] = hi
        else:
            for k, v in ((r, lo), (r + 1, hi)):
                old = F[k]
                F[k] = v - old
                F[k] = momentum * F[k]
                F[k] = old + F[k]
    _qparams(F, s, z, r, qmin, qmax, eps)


def observe_min_max_check(args, c):
    n, qmin, qmax = c.ints
    momentum, eps = c.floats
    c.positive(n)
    c.holds(0, 1)
    c.holds(1, 1)
    c.holds(2, 2)
    c.holds(3, n)
    c.role(2, "param")
    c.kept(2)
    c.within(qmin, -32768, qmax - 1, "qmin")
    c.within(qmax, qmin + 1, 65535, "qmax")
    c.within(momentum, 0.0, 1.0, "momentum")
    c.within(eps, 1e-38, 1.0, "eps")


def quant_params(F, I, args):
    # Eval forward of an observer: the qparams of the frozen range.
    s, z, r, qmin, qmax, eps = args
    _qparams(F, s, z, r, qmin, qmax, eps)


def quant_params_check(args, c):
    qmin, qmax = c.ints
    eps, = c.floats
    c.holds(0, 1)
    c.holds(1, 1)
    c.holds(2, 2)
    c.within(qmin, -32768, qmax - 1, "qmin")
    c.within(qmax, qmin + 1, 65535, "qmax")
    c.within(eps, 1e-38, 1.0, "eps")


# -- int8 export on the device (Module.export_model_for_inferencing of a QAT blob) ----------
# The "export" program of a quantization-aware training blob computes, from the current
# float weights and the frozen observer ranges, what the int8 inference blob holds: BatchNorm
# folded into the weights, int8 weights with per-channel scales, int32 biases, zero points
# and the clamp bounds of each requantization. Every float32 rounding the host's QDQ export
# (quant/qdq.py) makes is made here the same way (a store into a float32 array), so both
# give the same bytes, on boards with float32 arithmetic too.
_S = array("f", [0.0])    # float32 scratch: _S[0] = v rounds v to float32


def fold_batch_norm(F, I, args):
    # W'[.., c, ..] = W * a[c], B'[c] = beta[c] + (B[c] - mean[c]) * a[c] (B = 0 when absent),
    # a[c] = gamma[c] / sqrt(var[c] + eps): float32 after every operation.
    w2, b2, w, b, gamma, beta, mean, var, outer, channels, inner, eps = args
    for c in range(channels):
        _S[0] = F[var + c] + eps
        v = _S[0]
        _S[0] = math.sqrt(v) if v >= 0.0 else _NAN
        _S[0] = F[gamma + c] / _S[0] if _S[0] != 0.0 else _NAN
        a = _S[0]
        for o in range(outer):
            at = (o * channels + c) * inner
            for i in range(at, at + inner):
                F[w2 + i] = F[w + i] * a
        F[b2 + c] = (F[b + c] if b >= 0 else 0.0) - F[mean + c]
        F[b2 + c] = F[b2 + c] * a
        F[b2 + c] = F[beta + c] + F[b2 + c]


def fold_batch_norm_check(args, c):
    outer, channels, inner = c.ints
    c.positive(outer, channels, inner)
    c.holds(0, outer * channels * inner)
    c.holds(2, outer * channels * inner)
    c.holds(1, channels)
    if c.present(3):
        c.holds(3, channels)
    for k in range(4, 8):
        c.holds(k, channels)


def quantize_weight(F, I, args):
    # int8 weight q = clamp(round(w * float32(1 / scale[c])), -127, 127) (the rounding of
    # fake_quant, so the exported weights are the ones training saw), into the byte arena
    Q, q, w, scale, outer, channels, inner = args
    for c in range(channels):
        _S[0] = 1.0 / F[scale + c]
        inv = _S[0]
        for o in range(outer):
            at = (o * channels + c) * inner
            for i in range(at, at + inner):
                _S[0] = F[w + i] * inv
                v = _S[0]
                if -128.0 < v < 128.0:
                    k = round(v)
                    if k < -127:
                        k = -127
                    elif k > 127:
                        k = 127
                elif v > 0.0:
                    k = 127
                else:
                    k = -127          # -inf, NaN: as fake_quant's lower bound
                Q[q + i] = k & 255


def quantize_weight_check(args, c):
    outer, channels, inner = c.ints
    c.positive(outer, channels, inner)
    c.each_holds(2, outer * channels * inner)
    c.holds(2, channels)


_I32 = 2147483647


def quantize_bias(F, I, args):
    # int32 bias q[c] = round_half_even(float32(b[c] / float32(x_scale * w_scale[c]))),
    # clamped to +-(2**31 - 1); NaN gives 0 (onnxruntime's quantizer divides in float32)
    q, b, x_scale, w_scale, channels = args
    for c in range(channels):
        _S[0] = F[x_scale] * F[w_scale + c]
        _S[0] = F[b + c] / _S[0] if _S[0] != 0.0 else _NAN
        v = _S[0]
        if -3e9 < v < 3e9:
            k = round(v)
            if k > _I32:
                k = _I32
            elif k < -_I32:
                k = -_I32
        elif v > 0.0:
            k = _I32
        elif v < 0.0:
            k = -_I32
        else:
            k = 0
        I[q + c] = k


def quantize_bias_check(args, c):
    channels, = c.ints
    c.positive(channels)
    c.holds(0, channels)
    c.holds(1, channels)
    c.holds(2, 1)
    c.holds(3, channels)


def requant_header(F, I, args):
    # The given head of a requantization tensor: the zero points (x, [second input of an
    # Add,] y) and the output's clamp bounds: the type's range, narrowed by a fused Relu /
    # Clip: y_zp + round(float32(bound / y_scale)).
    h, zx, zb, zy, sy, qmin, qmax, has_min, has_max, cmin, cmax = args
    I[h] = int(F[zx])
    k = h + 1
    if zb >= 0:
        I[k] = int(F[zb])
        k += 1
    y_zp = int(F[zy])
    I[k] = y_zp
    lo = qmin
    hi = qmax
    if has_min:
        lo = _bound(cmin, F[sy], y_zp, qmin, qmax, lo, 1)
    if has_max:
        hi = _bound(cmax, F[sy], y_zp, qmin, qmax, hi, 0)
    I[k + 1] = lo
    I[k + 2] = hi


def _bound(value, scale, zp, qmin, qmax, current, lower):
    _S[0] = value / scale if scale != 0.0 else _NAN
    v = _S[0]
    q = zp + round(v) if -1e6 < v < 1e6 else (qmax if v > 0.0 else qmin)
    if lower:
        return q if q > current else current
    return q if q < current else current


def requant_header_check(args, c):
    n = 5 if c.present(2) else 4
    c.holds(0, n)
    for k in (1, 2, 3, 4):
        if k != 2 or c.present(2):
            c.holds(k, 1)
    qmin, qmax, has_min, has_max = c.ints
    c.within(qmin, -128, 0, "qmin")
    c.within(qmax, 127, 255, "qmax")


def zero_point_int(F, I, args):
    # the zero point QUANT_PARAMS computed (a float holding an integer) as an int32
    I[args[0]] = int(F[args[1]])


def zero_point_int_check(args, c):
    c.holds(0, 1)
    c.holds(1, 1)
