# @micropython.viper fast paths of kernels/qlinear.py (imported by it only under MicroPython
# with the viper emitter; a build without one raises SyntaxError on import and qlinear.py
# keeps its pure-Python kernels). Same integers as the pure-Python kernels, byte for byte:
# the accumulators are exact in 32-bit machine words (boards) as in 64-bit ones (the Unix
# port), the requantization is kernels/fixedpoint_viper.py's (12-bit limbs, or one product
# on 64-bit ports, and its round half to even), and nothing is allocated, so they run under
# micropython.heap_lock().
#
# Signed int32 values (zero points, clamp bounds, biases) are read through the array object,
# or as (v ^ 2**31) - 2**31 of a ptr32 load (which is unsigned on 64-bit ports); multipliers
# and shifts are positive. The hot loops live in viper functions without arguments that read
# their state from module arrays (_GEO, _TAB, _GEMM, _BUF): such a function keeps its first
# three locals in machine registers (the moving pointers and the weight or accumulator), and
# no call converts a dozen Python arguments (~0.16 us for a call of twelve).
#
# An output whose accumulator reaches 2**24 (a large bias, or more than ~500 terms of
# extreme values) is requantized by the exact pure-Python helper instead.
import micropython
from array import array
from micropython import const
from microtrain.kernels import fixedpoint_viper
from microtrain.kernels.fixedpoint_viper import requant_plane, requant_store

_LIMIT = const(16777216)   # 2**24: multipliers up to it take the machine-word requantization
_SAFE = const(268435456)   # 2**28: a bias within it keeps acc + 2**30 in [0, 2**31)
# Accumulator planes hold acc + 2**30, positive. 2**30 is built at run time inside the viper
# functions (a machine word): as a constant (const() or a folded 1 << 30) it is a big-int
# object on 32-bit ports, whose small ints end below 2**30, and viper code would not compile
# there.


# qlinear_conv's state for _taps below, filled once per call (see the top).
# _GEO: cin_g, in_plane, taps, flip, x_zp + flip + 4096 (positive: a ptr32 load is unsigned
# on 64-bit ports), then per output channel x_group and w_m, the rows of _TAB in use, s_w,
# and whether _taps takes its plain loops.
# _TAB: per tap of the kernel (up to _ROWS at a time), its rectangle of the output plane:
# first accumulator (I index), first input offset (from x_group), tap index (weight offset),
# count (elements per line), lines, skip_a (bytes from the end of a line to the next, in the
# plane), skip_b (the same in the input plane), both + _SKEW (they can be negative, and a ptr32
# load is unsigned on 64-bit ports); count 0: the tap never meets the image.
_ROWS = const(16)            # 3x3 and 4x4 kernels in one table, larger ones in parts
_SKEW = const(536870912)     # 2**29, a small int on every port
_GEO = array("i", bytes(4 * 10))
_TAB = array("i", bytes(4 * 7 * _ROWS))
_BUF = [None, None, None]    # the int32 arena, the byte arena, the weights' buffer


@micropython.viper
def _tap_table(args, t0: int, t1: int) -> int:
    # the rectangles of taps t0 .. t1 - 1 into _TAB, as kernels/conv.py clips a tap's
    # rectangle to the image: oy_lo .. oy_lo + rows - 1 meet input rows 0 .. in_h - 1
    t = ptr32(_TAB)
    scratch = int(args[6])
    in_h = int(args[11])
    in_w = int(args[12])
    out_h = int(args[13])
    out_w = int(args[14])
    k_w = int(args[16])
    s_h = int(args[17])
    s_w = int(args[18])
    d_h = int(args[19])
    d_w = int(args[20])
    pad_t = int(args[21])
    pad_l = int(args[22])
    row_step = s_h * in_w
    r = 0
    for tap in range(t0, t1):
        t[r + 3] = 0
        ky = tap // k_w
        kx = tap - ky * k_w
        off_y = ky * d_h - pad_t
        off_x = kx * d_w - pad_l
        r += 7
        if off_y > in_h - 1 or off_x > in_w - 1:
            continue
        oy_lo = 0
        if off_y < 0:
            oy_lo = (s_h - 1 - off_y) // s_h
        rows = (in_h - 1 - off_y) // s_h + 1
        if rows > out_h:
            rows = out_h
        rows -= oy_lo
        ox_lo = 0
        if off_x < 0:
            ox_lo = (s_w - 1 - off_x) // s_w
        count = (in_w - 1 - off_x) // s_w + 1
        if count > out_w:
            count = out_w
        count -= ox_lo
        if rows <= 0 or count <= 0:
            continue
        lines = rows
        if count == out_w and row_step == count * s_w:
            count *= rows      # full rows back to back: one long line
            lines = 1
        t[r - 7] = scratch + oy_lo * out_w + ox_lo
        t[r - 6] = (oy_lo * s_h + off_y) * in_w + ox_lo * s_w + off_x
        t[r - 5] = tap
        t[r - 4] = count
        t[r - 3] = lines
        t[r - 2] = 4 * (out_w - count) + _SKEW
        t[r - 1] = row_step - count * s_w + _SKEW
    return 0


@micropython.viper
def _taps() -> int:
    # Every tap of one output channel (the rows of _TAB in use) into its accumulator plane,
    # per tap and input channel over the tap's rectangle, lines unrolled by four:
    # plain (g[9]: unsigned inputs, unit stride along x, three or more input channels per
    # group): a[p] += x * w, then the zero point once per tap: (x - zp) * w = x * w - zp * w,
    # summed over the channels; else (any inputs, any stride along x): a[p] += (x ^ flip) *
    # w - (zp + flip) * w (flip 0x80 makes an int8 byte's value + 0x80; few input channels
    # per group, e.g. depthwise, take the zero point here, not in a pass of its own).
    pa = ptr32(_BUF[0])
    pb = ptr8(_BUF[1])
    wv = 0
    g = ptr32(_GEO)
    t = ptr32(_TAB)
    a0 = uint(pa)
    b0 = uint(pb)
    wb = ptr8(uint(ptr8(_BUF[2])) + g[6])   # this channel's weights
    xb = b0 + g[5]             # and its group's input
    cin_g = g[0]
    in_plane = g[1]
    taps = g[2]
    flip = g[3]
    zpf = g[4] - 4096
    s1 = g[8]
    s2 = s1 + s1
    s3 = s2 + s1
    s4 = s2 + s2
    plain = g[9]
    for r in range(0, 7 * g[7], 7):
        count = t[r + 3]
        if count == 0:
            continue
        first = a0 + 4 * t[r]
        x_tap = xb + t[r + 1]
        w_tap = t[r + 2]
        lines = t[r + 4]
        skip_a = t[r + 5] - _SKEW
        skip_b = t[r + 6] - _SKEW
        if plain:
            wsum = 0
            for c in range(cin_g):
                wv = (int(wb[w_tap + c * taps]) ^ 0x80) - 0x80
                if wv == 0:
                    continue
                wsum += wv
                pa = ptr32(first)
                pb = ptr8(x_tap + c * in_plane)
                for _ in range(lines):
                    n = count >> 2
                    while n > 0:
                        pa[0] = pa[0] + int(pb[0]) * wv
                        pa[1] = pa[1] + int(pb[1]) * wv
                        pa[2] = pa[2] + int(pb[2]) * wv
                        pa[3] = pa[3] + int(pb[3]) * wv
                        pa = ptr32(uint(pa) + 16)
                        pb = ptr8(uint(pb) + 4)
                        n -= 1
                    n = count & 3
                    while n > 0:
                        pa[0] = pa[0] + int(pb[0]) * wv
                        pa = ptr32(uint(pa) + 4)
                        pb = ptr8(uint(pb) + 1)
                        n -= 1
                    pa = ptr32(uint(pa) + skip_a)
                    pb = ptr8(uint(pb) + skip_b)
            if wsum != 0:
                wv = zpf * wsum
                pa = ptr32(first)
                for _ in range(lines):
                    n = count
                    while n > 0:
                        pa[0] = pa[0] - wv
                        pa = ptr32(uint(pa) + 4)
                        n -= 1
                    pa = ptr32(uint(pa) + skip_a)
            continue
        for c in range(cin_g):
            wv = (int(wb[w_tap + c * taps]) ^ 0x80) - 0x80
            if wv == 0:
                continue
            zw = zpf * wv
            pa = ptr32(first)
            pb = ptr8(x_tap + c * in_plane)
            for _ in range(lines):
                n = count >> 2
                while n > 0:
                    pa[0] = pa[0] + (int(pb[0]) ^ flip) * wv - zw
                    pa[1] = pa[1] + (int(pb[s1]) ^ flip) * wv - zw
                    pa[2] = pa[2] + (int(pb[s2]) ^ flip) * wv - zw
                    pa[3] = pa[3] + (int(pb[s3]) ^ flip) * wv - zw
                    pa = ptr32(uint(pa) + 16)
                    pb = ptr8(uint(pb) + s4)
                    n -= 1
                n = count & 3
                while n > 0:
                    pa[0] = pa[0] + (int(pb[0]) ^ flip) * wv - zw
                    pa = ptr32(uint(pa) + 4)
                    pb = ptr8(uint(pb) + s1)
                    n -= 1
                pa = ptr32(uint(pa) + skip_a)
                pb = ptr8(uint(pb) + skip_b)
    return 0


@micropython.viper
def qlinear_conv(F, I, args) -> int:
    # Y = requant(Conv(X - x_zp, W) + bias) with the taps outermost, as kernels/conv.py: per
    # image and output channel, an int32 accumulator plane (the step's scratch tensor, offset
    # by 2**30 so that it stays positive in a 32-bit word) gathers every tap's rectangle in
    # tight loops (_taps); then the plane is requantized (fixedpoint_viper.requant_plane).
    a = ptr32(I)
    y = int(args[1])
    x = int(args[2])
    w = int(args[3])
    bias = int(args[4])
    req = int(args[5])
    scratch = int(args[6])
    n_images = int(args[7])
    groups = int(args[8])
    cin_g = int(args[9])
    cout_g = int(args[10])
    in_plane = int(args[11]) * int(args[12])
    out_plane = int(args[13]) * int(args[14])
    taps = int(args[15]) * int(args[16])
    s_w = int(args[18])
    flip = 0
    if int(args[23]):
        flip = 0x80
    x_zp = int(I[req])
    y_zp = int(I[req + 1])
    lo = int(I[req + 2])
    hi = int(I[req + 3])
    channels = groups * cout_g
    if bias >= 0:
        for mo in range(channels):
            start = int(I[bias + mo])
            if start <= 0 - _SAFE or start >= _SAFE:
                # a bias that could push a plane past 2**31: the pure-Python kernel
                _pure["qlinear_conv"](F, I, args)
                return 0
    q = args[0]
    buf = _BUF
    buf[0] = I
    buf[1] = q
    buf[2] = args[25]
    g = ptr32(_GEO)
    g[0] = cin_g
    g[1] = in_plane
    g[2] = taps
    g[3] = flip
    g[4] = x_zp + flip + 4096
    g[8] = s_w
    g[9] = 0
    if flip == 0 and cin_g >= 3 and s_w == 1:
        g[9] = 1
    one_table = 0
    if taps <= _ROWS:
        one_table = 1
        _tap_table(args, 0, taps)
    for nimg in range(n_images):
        x_image = x + nimg * groups * cin_g * in_plane
        for mo in range(channels):
            start = 0
            if bias >= 0:
                start = int(I[bias + mo])
            offset = 16384
            offset <<= 16      # 2**30, built at run time (see the top of this module)
            for p in range(scratch, scratch + out_plane):
                a[p] = start + offset
            g[5] = x_image + (mo // cout_g) * cin_g * in_plane
            g[6] = w + mo * cin_g * taps
            t0 = 0
            while t0 < taps:
                t1 = t0 + _ROWS
                if t1 > taps:
                    t1 = taps
                if not one_table:
                    _tap_table(args, t0, t1)
                g[7] = t1 - t0
                _taps()
                t0 = t1
            requant_plane(I, q, out_plane, scratch, y, int(a[req + 4 + 2 * mo]),
                          int(a[req + 5 + 2 * mo]), y_zp, lo, hi)
            y += out_plane
    buf[0] = None
    buf[1] = None
    buf[2] = None
    return 0


# qlinear_gemm's state for _gemm_rows: y, x, w, bias + 1, req, m, k, n, sx_m, sx_k, sw_k, sw_n,
# flip, wide (none negative: a ptr32 load is unsigned on 64-bit ports).
_GEMM = array("i", bytes(4 * 14))


@micropython.viper
def _gemm_rows() -> int:
    # Every output of qlinear_gemm: the dot product over k in a loop unrolled by four, the
    # moving pointers and the accumulator in registers (the first locals of an argument-less
    # viper function), then the requantization inline on 64-bit ports (as
    # fixedpoint_viper.requant_plane) or by requant_store.
    px = ptr8(_BUF[1])
    pw = ptr8(_BUF[1])
    acc = 0
    q = _BUF[1]
    r = ptr32(_BUF[0])
    g = ptr32(_GEMM)
    b0 = uint(px)
    qb = ptr8(b0)
    h = 1
    h <<= 31               # sign extension of a ptr32 load: (v ^ 2**31) - 2**31, any port
    y = g[0]
    x = b0 + g[1]
    w = uint(ptr8(_BUF[2])) + g[2]
    bias = g[3] - 1
    req = g[4]
    m = g[5]
    k = g[6]
    n = g[7]
    sx_m = g[8]
    sx = g[9]
    sw = g[10]
    sw_n = g[11]
    flip = g[12]
    wide = g[13]
    sx2 = sx + sx
    sx3 = sx2 + sx
    sw2 = sw + sw
    sw3 = sw2 + sw
    zpf = ((r[req] ^ h) - h) + flip
    y_zp = (r[req + 1] ^ h) - h
    lo = (r[req + 2] ^ h) - h
    hi = (r[req + 3] ^ h) - h
    for i in range(m):
        for j in range(n):
            acc = 0
            px = ptr8(x + i * sx_m)
            pw = ptr8(w + j * sw_n)
            c = k >> 2
            while c > 0:
                acc += ((int(px[0]) ^ flip) - zpf) * ((int(pw[0]) ^ 0x80) - 0x80) + \
                    ((int(px[sx]) ^ flip) - zpf) * ((int(pw[sw]) ^ 0x80) - 0x80) + \
                    ((int(px[sx2]) ^ flip) - zpf) * ((int(pw[sw2]) ^ 0x80) - 0x80) + \
                    ((int(px[sx3]) ^ flip) - zpf) * ((int(pw[sw3]) ^ 0x80) - 0x80)
                px = ptr8(uint(px) + sx2 + sx2)
                pw = ptr8(uint(pw) + sw2 + sw2)
                c -= 1
            c = k & 3
            while c > 0:
                acc += ((int(px[0]) ^ flip) - zpf) * ((int(pw[0]) ^ 0x80) - 0x80)
                px = ptr8(uint(px) + sx)
                pw = ptr8(uint(pw) + sw)
                c -= 1
            if bias >= 0:
                acc += (r[bias + j] ^ h) - h
            m0 = r[req + 4 + 2 * j]
            shift = r[req + 5 + 2 * j]
            if wide and m0 >= 0 and m0 <= _LIMIT and shift >= 1 and shift <= 62:
                # |acc| < 2**33 (an int32 bias, k < 2**16 terms below 2**16): |p| < 2**57
                p = acc * m0
                z = ((p + (1 << (shift - 1)) - 1 + ((p >> shift) & 1)) >> shift) + y_zp
                if z < lo:
                    z = lo
                elif z > hi:
                    z = hi
                qb[y] = z
            else:
                requant_store(q, y, acc, m0, shift, y_zp, lo, hi)
            y += 1
    return 0


@micropython.viper
def qlinear_gemm(F, I, args) -> int:
    g = ptr32(_GEMM)
    for i in range(1, 13):
        g[i - 1] = int(args[i])      # y, x, w, bias, req, m, k, n, sx_m, sx_k, sw_k, sw_n
    g[3] = int(args[4]) + 1          # bias + 1: -1 (none) kept positive
    g[12] = 0
    if int(args[13]):
        g[12] = 0x80
    g[13] = int(fixedpoint_viper.WIDE)
    buf = _BUF
    buf[0] = I
    buf[1] = args[0]
    buf[2] = args[15]
    _gemm_rows()
    buf[0] = None
    buf[1] = None
    buf[2] = None
    return 0


_pure = None   # set by kernels/fastpath.py: the family's pure-Python kernels


@micropython.viper
def qlinear_global_average_pool(F, I, args) -> int:
    q = ptr8(args[0])
    r = ptr32(I)
    y = int(args[1])
    x = int(args[2])
    req = int(args[3])
    planes = int(args[4])
    count = int(args[5])
    flip = 0
    if int(args[6]):
        flip = 0x80
    x_zp = int(I[req])
    y_zp = int(I[req + 1])
    lo = int(I[req + 2])
    hi = int(I[req + 3])
    m0 = r[req + 4]
    shift = r[req + 5]
    for p in range(planes):
        acc = 0
        i = x + p * count
        for _ in range(count):
            acc += ((int(q[i]) ^ flip) - flip) - x_zp
            i += 1
        requant_store(args[0], y + p, acc, m0, shift, y_zp, lo, hi)
    return 0


@micropython.viper
def qlinear_average_pool(F, I, args) -> int:
    q = ptr8(args[0])
    r = ptr32(I)
    y = int(args[1])
    x = int(args[2])
    req = int(args[3])
    planes = int(args[4])
    H = int(args[5])
    W = int(args[6])
    OH = int(args[7])
    OW = int(args[8])
    kH = int(args[9])
    kW = int(args[10])
    sH = int(args[11])
    sW = int(args[12])
    pT = int(args[13])
    pL = int(args[14])
    ch0 = int(args[15])
    ch1 = int(args[16])
    cw0 = int(args[17])
    cw1 = int(args[18])
    flip = 0
    if int(args[19]):
        flip = 0x80
    x_zp = int(I[req])
    y_zp = int(I[req + 1])
    lo = int(I[req + 2])
    hi = int(I[req + 3])
    for p in range(planes):
        base = x + p * H * W
        for oh in range(OH):
            h0 = oh * sH - pT
            h1 = h0 + kH
            rows = ch1 - ch0
            if h1 < ch1:
                rows = h1 - ch0
            if h0 > ch0:
                rows -= h0 - ch0
            r0 = h0
            if r0 < 0:
                r0 = 0
            r1 = h1
            if r1 > H:
                r1 = H
            for ow in range(OW):
                w0 = ow * sW - pL
                w1 = w0 + kW
                cols = cw1 - cw0
                if w1 < cw1:
                    cols = w1 - cw0
                if w0 > cw0:
                    cols -= w0 - cw0
                count = rows * cols
                c0 = w0
                if c0 < 0:
                    c0 = 0
                c1 = w1
                if c1 > W:
                    c1 = W
                acc = 0
                for h in range(r0, r1):
                    i = base + h * W + c0
                    for _ in range(c1 - c0):
                        acc += ((int(q[i]) ^ flip) - flip) - x_zp
                        i += 1
                if count < 1:
                    acc = 0
                    count = 1
                requant_store(args[0], y, acc, r[req + 2 + 2 * count], r[req + 3 + 2 * count],
                              y_zp, lo, hi)
                y += 1
    return 0


@micropython.viper
def qlinear_add(F, I, args) -> int:
    q = ptr8(args[0])
    r = ptr32(I)
    y = int(args[1])
    a = int(args[2])
    b = int(args[3])
    req = int(args[4])
    n = int(args[5])
    fa = 0
    if int(args[6]):
        fa = 0x80
    fb = 0
    if int(args[7]):
        fb = 0x80
    a_zp = int(I[req])
    b_zp = int(I[req + 1])
    y_zp = int(I[req + 2])
    lo = int(I[req + 3])
    hi = int(I[req + 4])
    ma = r[req + 5]
    mb = r[req + 6]
    s = r[req + 7]
    half = 1 << (s - 1)
    for i in range(n):
        acc = (((int(q[a + i]) ^ fa) - fa) - a_zp) * ma + (((int(q[b + i]) ^ fb) - fb) - b_zp) * mb
        v = acc >> s
        rem = acc - (v << s)
        if rem > half:
            v += 1
        elif rem == half and (v & 1):
            v += 1
        v += y_zp
        if v < lo:
            v = lo
        elif v > hi:
            v = hi
        q[y + i] = v & 0xFF
    return 0


@micropython.viper
def qlinear_lookup(F, I, args) -> int:
    q = ptr8(args[0])
    y = int(args[1])
    x = int(args[2])
    table = int(args[3])
    n = int(args[4])
    for i in range(n):
        q[y + i] = q[table + int(q[x + i])]
    return 0
