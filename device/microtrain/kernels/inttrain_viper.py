# @micropython.viper fast paths of kernels/inttrain.py (imported by it only under
# MicroPython with the viper emitter). The same integers as the pure-Python kernels: exact
# accumulators, kernels/fixedpoint_viper.py's requantization, rounding, dither and clamps;
# nothing is allocated, so they run under micropython.heap_lock(). Signed int32 values
# (biases, zero points, gradients, logits) are read through the array object (a ptr32 load
# is unsigned on 64-bit ports) and written through ptr32. A helper gets the args tuple and
# reads what it needs rather than a dozen converted arguments.
import micropython
from micropython import const
from microtrain.kernels.fixedpoint_viper import requant, round_shift
from microtrain.kernels.intsgd_viper import descend_bias, dither, update_step, update_weight

_LOGIT_LIMIT = const(16777216)  # kernels/inttrain.py LOGIT_LIMIT
_BIAS_LIMIT = const(8388608)    # kernels/intsgd.py BIAS_LIMIT
_UNUSED_BIAS = const(-8388609)  # kernels/inttrain.py UNUSED_BIAS, UNUSED_LOGIT: a class
_UNUSED_LOGIT = const(-16777217)  # slot not in use
_FINE_M0 = const(2)             # kernels/intsgd.py FINE_M0, FINE_SHIFT: 1 / 2**8
_FINE_SHIFT = const(9)
_GRAD_BITS = const(4)            # kernels/inttrain.py GRAD_BITS


@micropython.viper
def _dot(b8: ptr8, px: int, pw: int, k: int, zp: int, flip: int) -> int:
    # sum over k of (x ^ flip - zp) * w, zp including the flip
    acc = 0
    for _ in range(k):
        acc += ((int(b8[px]) ^ flip) - zp) * ((int(b8[pw]) ^ 0x80) - 0x80)
        px += 1
        pw += 1
    return acc


@micropython.viper
def int_gemm_logits(F, I, args) -> int:
    r = ptr32(I)
    z = int(args[1])
    x = int(args[2])
    w = int(args[3])
    bias = int(args[4])
    req = int(args[5])
    m = int(args[6])
    k = int(args[7])
    n = int(args[8])
    flip = 0
    if int(args[9]):
        flip = 0x80
    x_zp = int(I[req])
    for i in range(m):
        xi = x + i * k
        for j in range(n):
            acc = int(I[bias + j])
            if acc == _UNUSED_BIAS:
                r[z] = _UNUSED_LOGIT
                z += 1
                continue
            acc += int(_dot(args[0], xi, w + j * k, k, x_zp + flip, flip))
            v = int(requant(acc, r[req + 1 + 2 * j], r[req + 2 + 2 * j]))
            if v > _LOGIT_LIMIT:
                v = _LOGIT_LIMIT
            elif v < 0 - _LOGIT_LIMIT:
                v = 0 - _LOGIT_LIMIT
            r[z] = v
            z += 1
    return 0


@micropython.viper
def _column(b8: ptr8, I, px: int, pg: int, m: int, k: int, n: int, zp: int, flip: int) -> int:
    # sum over the batch of g[i, j] * (x[i, t] ^ flip - zp)
    acc = 0
    for _ in range(m):
        acc += int(I[pg]) * ((int(b8[px]) ^ flip) - zp)
        px += k
        pg += n
    return acc


@micropython.viper
def _column_sum(I, pg: int, m: int, n: int) -> int:
    # sum over the batch of g[i, j] (the bias' gradient)
    acc = 0
    for _ in range(m):
        acc += int(I[pg])
        pg += n
    return acc


@micropython.viper
def int_gemm_update(F, I, args) -> int:
    w = int(args[1])
    bias = int(args[2])
    x = int(args[3])
    g = int(args[4])
    rates = int(args[5])
    random = int(args[6])
    m = int(args[7])
    k = int(args[8])
    n = int(args[9])
    flip = 0
    if int(args[10]):
        flip = 0x80
    zp = int(I[rates]) + flip
    r = ptr32(I)
    for j in range(n):
        if int(I[bias + j]) == _UNUSED_BIAS:
            continue
        at = rates + 1 + 4 * j
        pw = w + j * k
        for t in range(k):
            update_weight(args[0], I, pw + t,
                          int(_column(args[0], I, x + t, g + j, m, k, n, zp, flip)), r[at],
                          r[at + 1], random)
        descend_bias(I, bias + j, int(update_step(I, int(_column_sum(I, g + j, m, n)),
                                                  r[at + 2], r[at + 3], random)))
    return 0


@micropython.viper
def int_gemm_grad_input(F, I, args) -> int:
    r = ptr32(I)
    d = int(args[1])
    g = int(args[2])
    w = int(args[3])
    factors = int(args[4])
    m = int(args[5])
    k = int(args[6])
    n = int(args[7])
    b8 = ptr8(args[0])
    wide = 0        # kernels/inttrain.py: beyond 31 outputs, exact sums (intwide.py)
    while (n << _GRAD_BITS) > (511 << wide):
        wide += 1
    if wide:        # the pure kernel's call of intwide's (viper) sum: intwide loads lazily
        _pure["int_gemm_grad_input"](F, I, args)
        return 0
    for i in range(m):
        gi = g + i * n
        for c in range(k):
            acc = 0
            pw = w + c
            for j in range(n):
                h = int(requant(int(I[gi + j]), r[factors + 2 * j], r[factors + 2 * j + 1]))
                acc += h * ((int(b8[pw]) ^ 0x80) - 0x80)
                pw += k
            r[d + i * k + c] = acc
    return 0


@micropython.viper
def _mantissa(I, d: int, c: int, m: int, k: int, limit: int) -> int:
    top = 0
    for i in range(m):
        v = int(I[d + i * k + c])
        if v < 0:
            v = 0 - v
        if v > top:
            top = v
    e = 0
    while top >= limit:
        top >>= 1
        e += 1
    return e


@micropython.viper
def _masked_sum(b8: ptr8, py: int, px: int, plane: int, fy: int, fx: int, lo: int, hi: int,
                zp: int) -> int:
    # sum over the positions whose output lies inside (lo, hi) of x - x_zp (zp with the flip)
    part = 0
    for p in range(plane):
        v = (int(b8[py + p]) ^ fy) - fy
        if v > lo and v < hi:
            part += (int(b8[px + p]) ^ fx) - zp
    return part


@micropython.viper
def _count(b8: ptr8, py: int, plane: int, fy: int, lo: int, hi: int) -> int:
    count = 0
    for p in range(plane):
        v = (int(b8[py + p]) ^ fy) - fy
        if v > lo and v < hi:
            count += 1
    return count


@micropython.viper
def _conv_weights(args, I, c: int, e: int, wshift: int, m0: int, lo: int, hi: int, zp: int,
                  fx: int, fy: int) -> int:
    # one output channel's weights (split from int_conv1x1_update: Thumb and Xtensa branches
    # reach only so far)
    w = int(args[1])
    x = int(args[3])
    y = int(args[4])
    d = int(args[5])
    random = int(args[8])
    m = int(args[9])
    cin = int(args[10])
    cout = int(args[11])
    plane = int(args[12])
    pw = w + c * cin
    for t in range(cin):
        acc = 0
        for i in range(m):
            dc = int(round_shift(int(I[d + i * cout + c]), e))
            if dc != 0:
                acc += dc * int(_masked_sum(args[0], y + (i * cout + c) * plane,
                                            x + (i * cin + t) * plane, plane, fy, fx, lo, hi,
                                            zp))
        update_weight(args[0], I, pw + t, acc, m0, wshift, random)
    return 0


@micropython.viper
def int_conv1x1_update(F, I, args) -> int:
    r = ptr32(I)
    bias = int(args[2])
    y = int(args[4])
    d = int(args[5])
    req = int(args[6])
    rates = int(args[7])
    random = int(args[8])
    m = int(args[9])
    cout = int(args[11])
    plane = int(args[12])
    fx = 0
    if int(args[13]):
        fx = 0x80
    fy = 0
    if int(args[14]):
        fy = 0x80
    zp = int(I[rates]) + fx
    lo = int(I[req + 2])
    hi = int(I[req + 3])
    big = 1 << 24
    wlimit = big // (plane * 255 * m) + 1
    blimit = big // (plane * m) + 1
    for c in range(cout):
        at = rates + 1 + 4 * c
        e = int(_mantissa(I, d, c, m, cout, wlimit))
        eb = int(_mantissa(I, d, c, m, cout, blimit))
        wshift = r[at + 1] - e
        bshift = r[at + 3] - eb
        if wshift < 1:
            wshift = 1
        if bshift < 1:
            bshift = 1
        _conv_weights(args, I, c, e, wshift, r[at], lo, hi, zp, fx, fy)
        acc = 0
        for i in range(m):
            dc = int(round_shift(int(I[d + i * cout + c]), eb))
            acc += dc * int(_count(args[0], y + (i * cout + c) * plane, plane, fy, lo, hi))
        descend_bias(I, bias + c, int(update_step(I, acc, r[at + 2], bshift, random)))
    return 0


@micropython.viper
def _velocity_row(args, I, j: int, m0: int, shift: int, mu: int) -> int:
    # one output channel's weights of int_gemm_update_momentum
    q = ptr8(args[0])
    w = int(args[1])
    x = int(args[3])
    g = int(args[4])
    rates = int(args[5])
    random = int(args[6])
    vw = int(args[7])
    m = int(args[9])
    k = int(args[10])
    n = int(args[11])
    flip = 0
    if int(args[12]):
        flip = 0x80
    zp = int(I[rates]) + flip
    pw = w + j * k
    pv = vw + 2 * j * k
    for t in range(k):
        acc = int(_column(args[0], I, x + t, g + j, m, k, n, zp, flip))
        v = int(q[pv]) | (((int(q[pv + 1]) ^ 0x80) - 0x80) << 8)
        v = ((v * mu + 8192) >> 14) + int(requant(acc, m0, shift))
        if v > 32767:
            v = 32767
        elif v < -32767:
            v = -32767
        q[pv] = v & 0xFF
        q[pv + 1] = (v >> 8) & 0xFF
        pv += 2
        # W -= update_step(I, v, FINE_M0, FINE_SHIFT, random), written out: update_weight's
        # seven arguments would cost the kernel a third of its instructions
        if random >= 0:
            step = (v + (int(dither(I, random)) & 0xFF)) >> 8
        else:
            step = int(round_shift(v, 8))
        v = ((int(q[pw + t]) ^ 0x80) - 0x80) - step
        if v > 127:
            v = 127
        elif v < -127:
            v = -127
        q[pw + t] = v & 0xFF
    return 0


@micropython.viper
def int_gemm_update_momentum(F, I, args) -> int:
    r = ptr32(I)
    bias = int(args[2])
    g = int(args[4])
    rates = int(args[5])
    random = int(args[6])
    vb = int(args[8])
    m = int(args[9])
    n = int(args[11])
    mu = int(args[13])
    for j in range(n):
        if int(I[bias + j]) == _UNUSED_BIAS:
            continue
        at = rates + 1 + 4 * j
        shift = 1
        if r[at + 1] > 8:
            shift = r[at + 1] - 8
        _velocity_row(args, I, j, r[at], shift, mu)
        shift = 1
        if r[at + 3] > 8:
            shift = r[at + 3] - 8
        v = int(I[vb + j])
        hi = v >> 14
        v = hi * mu + (((v - (hi << 14)) * mu + 8192) >> 14) + \
            int(requant(int(_column_sum(I, g + j, m, n)), r[at + 2], shift))
        if v > _BIAS_LIMIT:
            v = _BIAS_LIMIT
        elif v < 0 - _BIAS_LIMIT:
            v = 0 - _BIAS_LIMIT
        r[vb + j] = v
        descend_bias(I, bias + j, int(update_step(I, v, _FINE_M0, _FINE_SHIFT, random)))
    return 0


_pure = None   # set by kernels/fastpath.py: the family's pure-Python kernels
