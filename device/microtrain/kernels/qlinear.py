# int8 inference kernels: the quantized forms of Gemm, Conv, Add, Concat, average pooling
# (global and windowed), max pooling and Relu / Clip, as onnxruntime's QGemm / QLinearConv /
# QLinearAdd / QLinearGlobalAveragePool / QLinearAveragePool compute them, plus
# QuantizeLinear and DequantizeLinear between the float and the byte arena.
#
# Byte tensors live in the byte arena Q (a bytearray, first element of every args tuple here):
# uint8 as is, int8 as its two's complement byte. Weights are int8 (zero point 0),
# activations uint8 or int8 (flag `signed`). Gemm and Conv read their weight from the buffer
# last in their args: Q, or - for a constant weight (plan.WEIGHT_ARGUMENT on the host) - the
# blob itself where it lies in flash, or the one buffer of such weights a blob loaded from a
# file gets (loader.load_into_arenas): frozen weights need no arena space.
#
# Requantization, integers only: acc = sum (x - x_zp) * w + bias (int32 bias) becomes
#   y = clamp(round_half_even(acc * m0 / 2**shift) + y_zp, lo, hi)
# where m0 / 2**shift is exactly the float32 multiplier onnxruntime computes,
# float32(float32(x_scale * w_scale) / y_scale) (m0 its 24-bit mantissa, so m0 < 2**24).
# The rounding is exact, so a fast path that computes the same integers gives the same
# bytes. lo, hi: the quantized bounds of a fused Relu / Clip, or the type's range.
#
# Int32 tensor `req` of a layer with C output channels: [x_zp, y_zp, lo, hi, then (m0,
# shift) for each channel]. A blob stores the first four; the (m0, shift) pairs are derived
# at load from the step's tensors' scales (fixedpoint.derive_requant, by the checkers), so the
# blob holds each scale once and the device trusts no multiplier it did not compute. (Blobs
# that store the whole tensor are read as they are.)
#
# A Conv also gets an int32 scratch tensor of out_h * out_w elements (the viper path's one
# output plane; the pure-Python kernel does not need it).
#
# The requantization and float32 multipliers are kernels/fixedpoint.py's (shared with integer
# training): 12-bit limbs on 32-bit boards, so no big int below 2**24.
import math
from array import array
from microtrain.blob import ROLE_NAMES
from microtrain.kernels.fixedpoint import (derive_requant, f32, given_requant,
                                          quantization, requant, requant_head, scale_check,
                                          weight_scales, zero_point_check)


def _scale(c, k):
    # The scale(s) of the step's tensor argument k (quantization parameters in the blob)
    return quantization(c, k)[0]


def _derive_channels(c, k, x, w, y, channels):
    # real[c] = float32(float32(x_scale * w_scale[c]) / y_scale), onnxruntime's order
    if c.tensors[k] not in c.blob.derived:
        return given_requant(c, k, (x, y))
    sx = _scale(c, x)[0]
    sw = weight_scales(c, w, channels, True)
    sy = _scale(c, y)[0]
    derive_requant(c, k, (x, y), (f32(f32(sx * sw[i]) / sy) for i in range(channels)))


def _store(Q, i, acc, m0, shift, y_zp, lo, hi):
    v = requant(acc, m0, shift) + y_zp
    if v < lo:
        v = lo
    elif v > hi:
        v = hi
    Q[i] = v & 255


def quantize_linear(F, I, args):
    # y = clamp(round_half_even(x / scale) + zp) (onnxruntime's QuantizeLinear: the float32
    # quotient, rounded half to even); qp = [scale, zp, scratch] floats.
    Q, y, x, qp, n, qmin, qmax = args
    scale = F[qp]
    zp = int(F[qp + 1])
    for i in range(n):
        F[qp + 2] = F[x + i] / scale
        v = F[qp + 2]
        if -1e9 < v < 1e9:
            q = round(v) + zp
        else:
            q = qmax if v > 0.0 else qmin   # inf, NaN: an end of the range
        if q < qmin:
            q = qmin
        elif q > qmax:
            q = qmax
        Q[y + i] = q & 255


def _derive_qparams(c, k, q):
    # A derived [scale, zero point, scratch] float constant (argument k): the scale and zero
    # point of the byte tensor (argument q) the step writes or reads
    tid = c.tensors[k]
    if tid not in c.blob.derived:
        _stored_qparams(c, k, q)     # older blobs
        return
    if c.blob.derived.pop(tid):
        c.fail("derived quantization parameters have given values")
    scales, zero_points, _ = quantization(c, q)
    c.blob.derive(tid, bytes(array("f", (scales[0], zero_points[0], 0.0))))


def _stored_qparams(c, k, q):
    # [scale, zero point] stored whole: the kernel reads them as they are at load, so they
    # must be a constant (not a tensor a program writes) holding what a derived one would
    tid = c.tensors[k]
    role = ROLE_NAMES[c.blob.roles[tid]]
    if role != "constant":
        c.fail("the quantization parameters of tensor '%s' (tensor %d) have role '%s'; the "
               "kernel reads them as constants: they must be a constant (an initializer), "
               "not a tensor a program writes" % (c.blob.names[c.tensors[q]], tid, role))
    data = c.blob.constant_data(tid)
    if data is not None:
        values = array("f", data)
        scale_check(c, q, values[0])
        z = values[1]
        if not (-1e9 < z < 1e9 and z == int(z)):
            c.fail("zero point of tensor '%s' is %r; a zero point must be an integer"
                   % (c.blob.names[c.tensors[q]], z))
        zero_point_check(c, q, int(z))


def quantize_linear_check(args, c):
    n, qmin, qmax = c.ints
    c.positive(n)
    c.holds(0, n)
    c.holds(1, n)
    c.holds(2, 3)
    c.within(qmin, -128, 0, "qmin")
    c.within(qmax, 127, 255, "qmax")
    _derive_qparams(c, 2, 0)


def dequantize_linear(F, I, args):
    # y = (q - zp) * scale, float32
    Q, y, x, qp, n, signed = args
    scale = F[qp]
    zp = int(F[qp + 1])
    for i in range(n):
        v = Q[x + i]
        if signed and v > 127:
            v -= 256
        F[y + i] = (v - zp) * scale


def dequantize_linear_check(args, c):
    n, signed = c.ints
    c.positive(n)
    c.holds(0, n)
    c.holds(1, n)
    c.holds(2, 2)
    _derive_qparams(c, 2, 1)


def qlinear_gemm(F, I, args):
    # Y[i, j] = requant(sum_k (X[i, k] - x_zp) * W[k, j] + bias[j]), W strided (transB).
    Q, y, x, w, bias, req, m, k, n, sx_m, sx_k, sw_k, sw_n, x_signed, y_signed, W = args
    x_zp, y_zp, lo, hi = I[req:req + 4]
    for i in range(m):
        for j in range(n):
            acc = I[bias + j] if bias >= 0 else 0
            px = x + i * sx_m
            pw = w + j * sw_n
            for _ in range(k):
                xv = Q[px]
                if x_signed and xv > 127:
                    xv -= 256
                wv = W[pw]
                if wv > 127:
                    wv -= 256
                acc += (xv - x_zp) * wv
                px += sx_k
                pw += sw_k
            _store(Q, y, acc, I[req + 4 + 2 * j], I[req + 5 + 2 * j], y_zp, lo, hi)
            y += 1


def qlinear_gemm_check(args, c):
    y, x, w, bias, req = c.offsets
    m, k, n, sx_m, sx_k, sw_k, sw_n, x_signed, y_signed = c.ints
    c.span(0, y, (m, n), (n, 1))
    c.span(1, x, (m, k), (sx_m, sx_k))
    c.span(2, w, (k, n), (sw_k, sw_n))
    if c.present(3):
        c.holds(3, n)
    c.holds(4, 4 + 2 * n)
    _derive_channels(c, 4, 1, 2, 0, n)


def qlinear_conv(F, I, args):
    # Y = requant(Conv(X - x_zp, W) + bias), geometry as kernels/conv.py: one output element
    # at a time, its taps clipped to the image.
    (Q, y, x, w, bias, req, scratch, n_images, groups, cin_g, cout_g, in_h, in_w, out_h,
     out_w, k_h, k_w, s_h, s_w, d_h, d_w, pad_t, pad_l, x_signed, y_signed, W) = args
    x_zp, y_zp, lo, hi = I[req:req + 4]
    channels = groups * cout_g
    in_plane = in_h * in_w
    taps = k_h * k_w
    for nimg in range(n_images):
        x_image = x + nimg * groups * cin_g * in_plane
        for mo in range(channels):
            m0 = I[req + 4 + 2 * mo]
            shift = I[req + 5 + 2 * mo]
            start = I[bias + mo] if bias >= 0 else 0
            x_group = x_image + (mo // cout_g) * cin_g * in_plane
            w_m = w + mo * cin_g * taps
            for oy in range(out_h):
                for ox in range(out_w):
                    acc = start
                    for c in range(cin_g):
                        x_c = x_group + c * in_plane
                        w_c = w_m + c * taps
                        for ky in range(k_h):
                            iy = oy * s_h - pad_t + ky * d_h
                            if iy < 0 or iy >= in_h:
                                continue
                            for kx in range(k_w):
                                ix = ox * s_w - pad_l + kx * d_w
                                if ix < 0 or ix >= in_w:
                                    continue
                                xv = Q[x_c + iy * in_w + ix]
                                if x_signed and xv > 127:
                                    xv -= 256
                                wv = W[w_c + ky * k_w + kx]
                                if wv > 127:
                                    wv -= 256
                                acc += (xv - x_zp) * wv
                    _store(Q, y, acc, m0, shift, y_zp, lo, hi)
                    y += 1


def qlinear_conv_check(args, c):
    # tensor 5: an int32 scratch plane of out_h * out_w accumulators (the viper kernel's)
    (n_images, groups, cin_g, cout_g, in_h, in_w, out_h, out_w, k_h, k_w, s_h, s_w, d_h, d_w,
     pad_t, pad_l, x_signed, y_signed) = c.ints
    c.positive(n_images, groups, cin_g, cout_g, in_h, in_w, out_h, out_w, k_h, k_w, s_h, s_w,
               d_h, d_w)
    c.holds(0, n_images * groups * cout_g * out_h * out_w)
    c.holds(1, n_images * groups * cin_g * in_h * in_w)
    c.holds(2, groups * cout_g * cin_g * k_h * k_w)
    if c.present(3):
        c.holds(3, groups * cout_g)
    c.holds(4, 4 + 2 * groups * cout_g)
    c.holds(5, out_h * out_w)
    _derive_channels(c, 4, 1, 2, 0, groups * cout_g)


def qlinear_global_average_pool(F, I, args):
    # Y[p] = requant(sum over the plane of (X - x_zp)), the multiplier x_scale / (y_scale *
    # count) (onnxruntime's MLAS formula, float32).
    Q, y, x, req, planes, count, x_signed, y_signed = args
    x_zp, y_zp, lo, hi, m0, shift = I[req:req + 6]
    for p in range(planes):
        acc = 0
        for i in range(x + p * count, x + (p + 1) * count):
            v = Q[i]
            if x_signed and v > 127:
                v -= 256
            acc += v - x_zp
        _store(Q, y + p, acc, m0, shift, y_zp, lo, hi)


def qlinear_global_average_pool_check(args, c):
    planes, count, x_signed, y_signed = c.ints
    c.positive(planes, count)
    c.holds(0, planes)
    c.holds(1, planes * count)
    c.holds(2, 6)
    if c.tensors[2] in c.blob.derived:
        derive_requant(c, 2, (1, 0), [f32(_scale(c, 1)[0] / f32(_scale(c, 0)[0] * count))])
    else:
        given_requant(c, 2, (1, 0))


def average_windows(Q, I, out, x, gx, planes, H, W, OH, OW, kH, kW, sH, sW, pT, pL, ch0, ch1,
                    cw0, cw1, req, flip):
    # Windows of kernels/pool.py's geometry (no dilation): the elements inside the image,
    # counted inside rows [ch0, ch1) x columns [cw0, cw1) (the padded input when pads count).
    # Forward (gx < 0): Q[out + o] = sum of (X - x_zp) requantized by (m0, shift) of its
    # count, req = [x_zp, y_zp, lo, hi, (m0, shift) for counts 1 .. kH * kW]. Backward
    # (intflow.py): I[gx + each element] += requant(I[out + o], req's pair for its count).
    if gx < 0:
        x_zp, y_zp, lo, hi = I[req:req + 4]
    for p in range(planes):
        base = (x if gx < 0 else gx) + p * H * W
        for oh in range(OH):
            h0 = oh * sH - pT
            h1 = h0 + kH
            rows = (h1 if h1 < ch1 else ch1) - (h0 if h0 > ch0 else ch0)
            r0 = h0 if h0 > 0 else 0
            r1 = h1 if h1 < H else H
            for ow in range(OW):
                w0 = ow * sW - pL
                w1 = w0 + kW
                count = rows * ((w1 if w1 < cw1 else cw1) - (w0 if w0 > cw0 else cw0))
                c0 = base + (w0 if w0 > 0 else 0)
                c1 = base + (w1 if w1 < W else W)
                if gx < 0:
                    acc = 0
                    for h in range(r0, r1):
                        for i in range(c0 + h * W, c1 + h * W):
                            acc += ((Q[i] ^ flip) - flip) - x_zp
                    if count < 1:      # nothing to count (ceil_mode): the value 0
                        acc = 0
                        count = 1
                    _store(Q, out, acc, I[req + 2 + 2 * count], I[req + 3 + 2 * count], y_zp,
                           lo, hi)
                else:
                    v = I[out]
                    if count >= 1 and v != 0:   # (a window of padding only: its output is 0)
                        share = requant(v, I[req + 2 * count - 2], I[req + 2 * count - 1])
                        for h in range(r0, r1):
                            for i in range(c0 + h * W, c1 + h * W):
                                I[i] += share
                out += 1


def qlinear_average_pool(F, I, args):
    (Q, y, x, req, planes, H, W, OH, OW, kH, kW, sH, sW, pT, pL, ch0, ch1, cw0, cw1,
     x_signed, y_signed) = args
    average_windows(Q, I, y, x, -1, planes, H, W, OH, OW, kH, kW, sH, sW, pT, pL, ch0, ch1,
                    cw0, cw1, req, 128 if x_signed else 0)


def qlinear_average_pool_check(args, c):
    (planes, H, W, OH, OW, kH, kW, sH, sW, pT, pL, ch0, ch1, cw0, cw1, x_signed,
     y_signed) = c.ints
    c.positive(planes, H, W, OH, OW, kH, kW, sH, sW)
    c.within(pT, 0, kH - 1, "top padding")
    c.within(pL, 0, kW - 1, "left padding")
    c.within(ch0, -pT, 0, "first counted row")
    c.within(cw0, -pL, 0, "first counted column")
    c.within(ch1, H, H + kH, "counted rows")
    c.within(cw1, W, W + kW, "counted columns")
    c.holds(0, planes * OH * OW)
    c.holds(1, planes * H * W)
    c.holds(2, 4 + 2 * kH * kW)
    sx = _scale(c, 1)[0]
    sy = _scale(c, 0)[0]
    derive_requant(c, 2, (1, 0), [f32(sx / f32(sy * n)) for n in range(1, kH * kW + 1)])


def qlinear_add(F, I, args):
    # Y = A + B of quantized tensors of one shape (onnxruntime's QLinearAdd), fixed point:
    # y = clamp(round_half_even(((a - a_zp) * MA + (b - b_zp) * MB) / 2**S) + y_zp, lo, hi),
    # MA / 2**S and MB / 2**S the ratios a_scale / y_scale and b_scale / y_scale (float32)
    # with 21 significant bits, so |sum| < 2**30: small ints everywhere.
    # req = [a_zp, b_zp, y_zp, lo, hi, MA, MB, S].
    Q, y, a, b, req, n, a_signed, b_signed, y_signed = args
    a_zp, b_zp, y_zp, lo, hi, ma, mb, s = I[req:req + 8]
    fa = 128 if a_signed else 0
    fb = 128 if b_signed else 0
    half = 1 << (s - 1)
    for i in range(n):
        acc = (((Q[a + i] ^ fa) - fa) - a_zp) * ma + (((Q[b + i] ^ fb) - fb) - b_zp) * mb
        v = acc >> s
        r = acc - (v << s)
        if r > half or (r == half and v & 1):
            v += 1
        v += y_zp
        if v < lo:
            v = lo
        elif v > hi:
            v = hi
        Q[y + i] = v & 255


ADD_BITS = 21    # MA, MB <= 2**21: |(a - a_zp) * MA + (b - b_zp) * MB| <= 2 * 255 * 2**21 < 2**30


def add_multipliers(ra, rb):
    # (MA, MB, S) of the float32 ratios: S = 21 - exponent of the larger (within [1, 30])
    e = math.frexp(ra if ra > rb else rb)[1]
    s = ADD_BITS - e
    if s > 30:
        s = 30
    elif s < 1:
        s = 1
    top = 1 << ADD_BITS
    return (min(round(ra * (1 << s)), top) if ra < 1e30 else top,
            min(round(rb * (1 << s)), top) if rb < 1e30 else top, s)


def qlinear_add_check(args, c):
    n, a_signed, b_signed, y_signed = c.ints
    c.positive(n)
    c.each_holds(3, n)
    c.holds(3, 8)
    # always derived (the multipliers must keep the sum below 2**30)
    sy = _scale(c, 0)[0]
    ra = f32(_scale(c, 1)[0] / sy)
    rb = f32(_scale(c, 2)[0] / sy)
    if not (0.0 < ra < 3.4e38 and 0.0 < rb < 3.4e38):
        c.fail("scale ratios %r, %r are not positive and finite" % (ra, rb))
    values = requant_head(c, 3, (1, 2, 0))
    if values is None:
        return
    for v in add_multipliers(ra, rb):
        values.append(v)
    c.blob.derive(c.tensors[3], bytes(values))


def max_windows(Q, I, out, x, gx, planes, H, W, OH, OW, kH, kW, sH, sW, pT, pL, signed):
    # The first maximum of each window (kernels/pool.py's geometry, no padding reads) of
    # int8 / uint8 values X, int8 bytes compared as v ^ 128. Forward (gx < 0): Q[out + o] =
    # window o's maximum (0 for a window of padding only). Backward (intflow.py
    # int_max_pool_grad): I[gx + p - x] += I[out + o] for its maximum p.
    flip = 128 if signed else 0
    for p in range(planes):
        base = x + p * H * W
        for oh in range(OH):
            h0 = oh * sH - pT
            for ow in range(OW):
                w0 = ow * sW - pL
                best = -1
                at = -1
                for h in range(h0 if h0 > 0 else 0, min(h0 + kH, H)):
                    for i in range(base + h * W + (w0 if w0 > 0 else 0),
                                   base + h * W + min(w0 + kW, W)):
                        v = Q[i] ^ flip
                        if v > best:
                            best = v
                            at = i
                if gx < 0:
                    Q[out] = Q[at] if at >= 0 else 0
                elif at >= 0:
                    I[gx + at - x] += I[out]
                out += 1


def qlinear_max_pool(F, I, args):   # the scale and zero point stay
    Q, y, x, planes, H, W, OH, OW, kH, kW, sH, sW, pT, pL, signed = args
    max_windows(Q, I, y, x, -1, planes, H, W, OH, OW, kH, kW, sH, sW, pT, pL, signed)


def qlinear_max_pool_check(args, c):
    planes, H, W, OH, OW, kH, kW, sH, sW, pT, pL, signed = c.ints
    c.positive(planes, H, W, OH, OW, kH, kW, sH, sW)
    c.holds(0, planes * OH * OW)
    c.holds(1, planes * H * W)


def qlinear_lookup(F, I, args):
    # Y[i] = table[X[i]] (a 256-byte constant indexed by the byte): Relu, Relu6 / Clip (and
    # any requantization between two scales) of a quantized tensor, the table computed on
    # the host as onnxruntime's DequantizeLinear -> op -> QuantizeLinear computes it.
    Q, y, x, table, n = args
    for i in range(n):
        Q[y + i] = Q[table + Q[x + i]]


def qlinear_lookup_check(args, c):
    n, = c.ints
    c.positive(n)
    c.each_holds(2, n)
    c.holds(2, 256)


def qlinear_concat(F, I, args):
    # One input X of a Concat into its place in Y: `blocks` runs of `size` bytes (X's part of
    # each slice before the axis), Y's runs `stride` apart from `offset`. Requantized to
    # Y's scale and zero point as qlinear_gemm requantizes (req = [x_zp, y_zp, lo, hi, m0,
    # shift], real = float32(x_scale / y_scale)), or copied where X has Y's parameters (the
    # multiplier 1 is m0 = 2**23, shift 23: the same bytes, sooner).
    Q, y, x, req, blocks, size, stride, offset, x_signed, y_signed = args
    # (pairs assign without a tuple: Concat, no fast path, runs under heap_lock)
    x_zp, y_zp = I[req], I[req + 1]
    lo, hi = I[req + 2], I[req + 3]
    m0, shift = I[req + 4], I[req + 5]
    copy = m0 == 8388608 and shift == 23 and x_zp == y_zp and x_signed == y_signed
    flip = 128 if x_signed else 0
    for b in range(blocks):
        out = y + offset + b * stride
        if copy:
            for i in range(x + b * size, x + (b + 1) * size):
                Q[out] = Q[i]
                out += 1
            continue
        for i in range(x + b * size, x + (b + 1) * size):
            _store(Q, out, ((Q[i] ^ flip) - flip) - x_zp, m0, shift, y_zp, lo, hi)
            out += 1


def qlinear_concat_check(args, c):
    blocks, size, stride, offset, x_signed, y_signed = c.ints
    c.positive(blocks, size, stride)
    c.within(offset, 0, stride - size, "offset")
    c.holds(0, blocks * stride)
    c.holds(1, blocks * size)
    c.holds(2, 6)
    derive_requant(c, 2, (1, 0), [f32(_scale(c, 1)[0] / _scale(c, 0)[0])])


# The viper fast paths (kernels/qlinear_viper.py, MicroPython with the viper emitter), and
# before them the native Gemm and Conv where kernels/qlinear_native.mpy (device/native) is
# installed: the same bytes, no allocation (heap_lock). use_fast(False): the pure-Python
# kernels, which may allocate (a requant record in one slice) where a fast path exists.
_FAST_NAMES = ("qlinear_gemm", "qlinear_conv", "qlinear_add", "qlinear_average_pool",
               "qlinear_global_average_pool", "qlinear_lookup")


def use_fast(on=True):
    from microtrain.kernels import fastpath
    return fastpath.use_fast(globals(), _FAST_NAMES, on, "qlinear_viper", "qlinear_native")


FAST = use_fast()
