# int8 inference kernels: the quantized forms of Gemm, Conv and global average pooling, as
# onnxruntime's QGemm / QLinearConv / QLinearGlobalAveragePool compute them, plus
# QuantizeLinear and DequantizeLinear between the float and the byte arena.
#
# Byte tensors live in the byte arena Q (a bytearray, first element of every args tuple here):
# uint8 as is, int8 as its two's complement byte. Weights are int8 (zero point 0),
# activations uint8 or int8 (flag `signed`).
#
# Requantization, integers only: acc = sum (x - x_zp) * w + bias (int32 bias) becomes
#   y = clamp(round_half_even(acc * m0 / 2**shift) + y_zp, lo, hi)
# with m0 in [2**23, 2**24] and shift from the real multiplier x_scale * w_scale / y_scale
# (host: ops/qlinear.py requant_multiplier), so 24 significant bits as in onnxruntime's
# float32 multiplier. The rounding is exact here (Python integers), so a fast path that
# computes the same integers gives the same bytes. lo, hi: the quantized bounds of a fused
# Relu / Clip, or the type's range.
#
# A convolution also gets an int32 scratch tensor of out_h * out_w elements (the viper path
# accumulates one output plane there; the pure-Python kernel does not need it).
#
# Int32 tensor `req` of a layer with C output channels: [x_zp, y_zp, lo, hi, then (m0,
# shift) for each channel]. A global average pool has one channel pair for every plane.


def _requant(acc, m0, shift):
    if shift < 1:       # the host writes 1..62; a crafted blob must not make this raise
        shift = 1
    p = acc * m0
    q = p >> shift
    r = p - (q << shift)
    half = 1 << (shift - 1)
    if r > half or (r == half and q & 1):
        q += 1
    return q


def _get(Q, i, signed):
    v = Q[i]
    return v - 256 if signed and v > 127 else v


def _store(Q, i, acc, m0, shift, y_zp, lo, hi):
    v = _requant(acc, m0, shift) + y_zp
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


def quantize_linear_check(args, c):
    Q, y, x, qp, n, qmin, qmax = args
    c.positive(n)
    c.holds(0, n)
    c.holds(1, n)
    c.holds(2, 3)
    c.within(qmin, -128, 0, "qmin")
    c.within(qmax, 127, 255, "qmax")


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
    Q, y, x, qp, n, signed = args
    c.positive(n)
    c.holds(0, n)
    c.holds(1, n)
    c.holds(2, 2)


def _req_check(c, k, channels):
    c.holds(k, 4 + 2 * channels)


def qlinear_gemm(F, I, args):
    # Y[i, j] = requant(sum_k (X[i, k] - x_zp) * W[k, j] + bias[j]), W strided (transB).
    Q, y, x, w, bias, req, m, k, n, sx_m, sx_k, sw_k, sw_n, x_signed, y_signed = args
    x_zp = I[req]
    y_zp = I[req + 1]
    lo = I[req + 2]
    hi = I[req + 3]
    for i in range(m):
        for j in range(n):
            acc = I[bias + j] if bias >= 0 else 0
            px = x + i * sx_m
            pw = w + j * sw_n
            for _ in range(k):
                xv = Q[px]
                if x_signed and xv > 127:
                    xv -= 256
                wv = Q[pw]
                if wv > 127:
                    wv -= 256
                acc += (xv - x_zp) * wv
                px += sx_k
                pw += sw_k
            _store(Q, y, acc, I[req + 4 + 2 * j], I[req + 5 + 2 * j], y_zp, lo, hi)
            y += 1


def qlinear_gemm_check(args, c):
    Q, y, x, w, bias, req, m, k, n, sx_m, sx_k, sw_k, sw_n = args[:13]
    c.span(0, y, (m, n), (n, 1))
    c.span(1, x, (m, k), (sx_m, sx_k))
    c.span(2, w, (k, n), (sw_k, sw_n))
    if c.present(3):
        c.holds(3, n)
    _req_check(c, 4, n)


def qlinear_conv(F, I, args):
    # Y = requant(Conv(X - x_zp, W) + bias), geometry as kernels/conv.py: one output element
    # at a time, its taps clipped to the image.
    (Q, y, x, w, bias, req, scratch, n_images, groups, cin_g, cout_g, in_h, in_w, out_h,
     out_w, k_h, k_w, s_h, s_w, d_h, d_w, pad_t, pad_l, x_signed, y_signed) = args
    x_zp = I[req]
    y_zp = I[req + 1]
    lo = I[req + 2]
    hi = I[req + 3]
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
                                wv = Q[w_c + ky * k_w + kx]
                                if wv > 127:
                                    wv -= 256
                                acc += (xv - x_zp) * wv
                    _store(Q, y, acc, m0, shift, y_zp, lo, hi)
                    y += 1


def qlinear_conv_check(args, c):
    # tensor 5: an int32 scratch plane of out_h * out_w accumulators (the viper kernel's)
    (n_images, groups, cin_g, cout_g, in_h, in_w, out_h, out_w, k_h, k_w, s_h, s_w, d_h,
     d_w) = args[7:21]
    c.positive(n_images, groups, cin_g, cout_g, in_h, in_w, out_h, out_w, k_h, k_w, s_h, s_w,
               d_h, d_w)
    c.holds(0, n_images * groups * cout_g * out_h * out_w)
    c.holds(1, n_images * groups * cin_g * in_h * in_w)
    c.holds(2, groups * cout_g * cin_g * k_h * k_w)
    if c.present(3):
        c.holds(3, groups * cout_g)
    _req_check(c, 4, groups * cout_g)
    c.holds(5, out_h * out_w)


def qlinear_global_average_pool(F, I, args):
    # Y[p] = requant(sum over the plane of (X - x_zp)), the multiplier x_scale / (y_scale *
    # count) folded into (m0, shift) by the host.
    Q, y, x, req, planes, count, x_signed, y_signed = args
    x_zp = I[req]
    y_zp = I[req + 1]
    lo = I[req + 2]
    hi = I[req + 3]
    m0 = I[req + 4]
    shift = I[req + 5]
    for p in range(planes):
        acc = 0
        for i in range(x + p * count, x + (p + 1) * count):
            v = Q[i]
            if x_signed and v > 127:
                v -= 256
            acc += v - x_zp
        _store(Q, y + p, acc, m0, shift, y_zp, lo, hi)


def qlinear_global_average_pool_check(args, c):
    Q, y, x, req, planes, count = args[:6]
    c.positive(planes, count)
    c.holds(0, planes)
    c.holds(1, planes * count)
    _req_check(c, 2, 1)


def qlinear_max_pool(F, I, args):
    # Max over each window (kernels/pool.py's geometry, no padding reads) of int8 / uint8
    # values: the scale and zero point stay. int8 bytes are compared as v ^ 128.
    Q, y, x, planes, H, W, OH, OW, kH, kW, sH, sW, pT, pL, signed = args
    flip = 128 if signed else 0
    for p in range(planes):
        base = x + p * H * W
        for oh in range(OH):
            h0 = oh * sH - pT
            for ow in range(OW):
                w0 = ow * sW - pL
                best = -1
                for h in range(h0 if h0 > 0 else 0, min(h0 + kH, H)):
                    for i in range(base + h * W + (w0 if w0 > 0 else 0),
                                   base + h * W + min(w0 + kW, W)):
                        v = Q[i] ^ flip
                        if v > best:
                            best = v
                Q[y] = (best if best >= 0 else flip) ^ flip
                y += 1


def qlinear_max_pool_check(args, c):
    Q, y, x, planes, H, W, OH, OW, kH, kW, sH, sW, pT, pL = args[:14]
    c.positive(planes, H, W, OH, OW, kH, kW, sH, sW)
    c.holds(0, planes * OH * OW)
    c.holds(1, planes * H * W)


# The viper fast paths (MicroPython with the viper emitter): same bytes, no allocation.
# `use_fast(False)` switches back to the pure-Python kernels (tests compare the two).
_pure = (qlinear_gemm, qlinear_conv)


def use_fast(on=True):
    global qlinear_gemm, qlinear_conv
    qlinear_gemm, qlinear_conv = _pure
    if on:
        try:
            from microtrain.kernels import qlinear_viper as fast
        except (ImportError, SyntaxError):   # CPython; a MicroPython without viper
            return False
        fast._slow = _requant
        fast._pure_conv = _pure[1]
        qlinear_gemm, qlinear_conv = fast.qlinear_gemm, fast.qlinear_conv
    return on


FAST = use_fast()
