# @micropython.viper fast paths of kernels/qlinear.py (imported by it only under MicroPython
# with the viper emitter; a build without one raises SyntaxError on import and qlinear.py
# keeps its pure-Python kernels). Same integers as the pure-Python kernels, byte for byte:
# the accumulators, the 12-bit limb product of the requantization and its round half to
# even are exact in 32-bit machine words (boards) as in 64-bit ones (the Unix port), and
# nothing is allocated, so they run under micropython.heap_lock().
#
# Signed int32 values (zero points, clamp bounds, biases) are read through the array object
# (a ptr32 load is unsigned on 64-bit ports); multipliers and shifts are positive.
#
# An output whose accumulator reaches 2**24 (a large bias, or more than ~500 terms of
# extreme values) is requantized by the exact pure-Python helper instead. On 64-bit ports
# (_WIDE) one machine-word product replaces the limbs.
import micropython
from micropython import const

_LIMIT = const(16777216)   # 2**24: |acc| below it keeps every limb product below 2**25
_SAFE = const(268435456)   # 2**28: a bias within it keeps acc + 2**30 in [0, 2**31)
# Accumulator planes hold acc + 2**30, positive. 2**30 is built at run time inside the viper
# functions (a machine word): as a constant (const() or a folded 1 << 30) it is a big-int
# object on 32-bit ports, whose small ints end below 2**30, and viper code would not compile
# there.


@micropython.viper
def _requant64(acc: int, m0: int, shift: int) -> int:
    # The same with one product, on ports whose machine word is 64 bits (|acc * m0| < 2**48)
    p = acc * m0
    q = p >> shift
    rem = p - (q << shift)
    half = 1 << (shift - 1)
    if rem > half:
        q += 1
    elif rem == half and (q & 1):
        q += 1
    return q


@micropython.viper
def _requant(acc: int, m0: int, shift: int) -> int:
    # round_half_even(acc * m0 / 2**shift) for |acc| < 2**24, 0 <= m0 <= 2**24, shift >= 1
    negative = 0
    a = acc
    if acc < 0:
        negative = 1
        a = -acc
    a1 = a >> 12
    a0 = a & 0xFFF
    m1 = m0 >> 12
    ml = m0 & 0xFFF
    mid = a1 * ml + a0 * m1
    t = a0 * ml + ((mid & 0xFFF) << 12)
    low = t & 0xFFFFFF
    high = a1 * m1 + (mid >> 12) + (t >> 24)      # product = high * 2**24 + low
    if shift >= 24:
        s2 = shift - 24
        if s2 > 25:
            return 0                               # product < 2**49 <= 2**(shift - 1)
        q = high >> s2
        if s2 == 0:
            rem = low
            half = 0x800000
            tail = 0
        else:
            rem = high & ((1 << s2) - 1)
            half = 1 << (s2 - 1)
            tail = low                             # the remainder's low 24 bits
        if rem > half:
            q += 1
        elif rem == half:
            if tail > 0:
                q += 1
            elif q & 1:
                q += 1
    else:
        s1 = 24 - shift
        if high >= (1 << (29 - s1)):
            q = 1 << 29                            # far beyond any clamp bound
        else:
            q = (high << s1) + (low >> shift)
            rem = low & ((1 << shift) - 1)
            half = 1 << (shift - 1)
            if rem > half:
                q += 1
            elif rem == half and (q & 1):
                q += 1
    if negative:
        return 0 - q
    return q


@micropython.viper
def _dot(b8: ptr8, px: int, pw: int, k: int, sx: int, sw: int, zp: int, flip: int) -> int:
    # sum over k of (x ^ flip - zp) * w, zp including the flip (128 for int8 inputs): the
    # pointers and indexes first, the locals viper keeps in registers
    acc = 0
    for _ in range(k):
        acc += ((int(b8[px]) ^ flip) - zp) * ((int(b8[pw]) ^ 0x80) - 0x80)
        px += sx
        pw += sw
    return acc


@micropython.viper
def qlinear_gemm(F, I, args) -> int:
    q = ptr8(args[0])
    r = ptr32(I)
    y = int(args[1])
    x = int(args[2])
    w = int(args[3])
    bias = int(args[4])
    req = int(args[5])
    m = int(args[6])
    k = int(args[7])
    n = int(args[8])
    sx_m = int(args[9])
    sx_k = int(args[10])
    sw_k = int(args[11])
    sw_n = int(args[12])
    flip = 0
    if int(args[13]):
        flip = 0x80
    wide = int(_WIDE)
    x_zp = int(I[req])
    y_zp = int(I[req + 1])
    lo = int(I[req + 2])
    hi = int(I[req + 3])
    for i in range(m):
        for j in range(n):
            acc = 0
            if bias >= 0:
                acc = int(I[bias + j])
            px = x + i * sx_m
            pw = w + j * sw_n
            acc += int(_dot(args[0], px, pw, k, sx_k, sw_k, x_zp + flip, flip))
            m0 = r[req + 4 + 2 * j]
            shift = r[req + 5 + 2 * j]
            if shift < 1:
                shift = 1
            if acc > 0 - _LIMIT and acc < _LIMIT and m0 >= 0 and m0 <= _LIMIT:
                if wide:
                    v = int(_requant64(acc, m0, shift)) + y_zp
                else:
                    v = int(_requant(acc, m0, shift)) + y_zp
            else:
                v = int(_slow(acc, m0, shift)) + y_zp
            if v < lo:
                v = lo
            elif v > hi:
                v = hi
            q[y] = v & 0xFF
            y += 1
    return 0


@micropython.viper
def _requant_plane(q, r, y: int, acc: int, count: int, m0: int, shift: int, y_zp: int, lo: int,
                   hi: int, wide: int) -> int:
    # y[p] = clamp(requant(acc[p] - 2**30) + y_zp) for p < count; the requantization of
    # _requant inlined (one call per output plane, not per element).
    qb = ptr8(q)
    a = ptr32(r)
    offset = 16384
    offset <<= 16          # 2**30, built at run time (see the top of this module)
    for p in range(count):
        v = a[acc + p] - offset
        if wide and v > 0 - _LIMIT and v < _LIMIT and m0 >= 0 and m0 <= _LIMIT:
            pr = v * m0            # a 64-bit machine word holds the product
            z = pr >> shift
            rem = pr - (z << shift)
            half = 1 << (shift - 1)
            if rem > half:
                z += 1
            elif rem == half and (z & 1):
                z += 1
        elif v > 0 - _LIMIT and v < _LIMIT and m0 >= 0 and m0 <= _LIMIT:
            negative = 0
            if v < 0:
                negative = 1
                v = 0 - v
            a1 = v >> 12
            a0 = v & 0xFFF
            m1 = m0 >> 12
            ml = m0 & 0xFFF
            mid = a1 * ml + a0 * m1
            t = a0 * ml + ((mid & 0xFFF) << 12)
            low = t & 0xFFFFFF
            high = a1 * m1 + (mid >> 12) + (t >> 24)
            if shift >= 24:
                s2 = shift - 24
                if s2 > 25:
                    z = 0
                else:
                    z = high >> s2
                    if s2 == 0:
                        rem = low
                        half = 0x800000
                        tail = 0
                    else:
                        rem = high & ((1 << s2) - 1)
                        half = 1 << (s2 - 1)
                        tail = low
                    if rem > half:
                        z += 1
                    elif rem == half:
                        if tail > 0:
                            z += 1
                        elif z & 1:
                            z += 1
            else:
                s1 = 24 - shift
                if high >= (1 << (29 - s1)):
                    z = 1 << 29
                else:
                    z = (high << s1) + (low >> shift)
                    rem = low & ((1 << shift) - 1)
                    half = 1 << (shift - 1)
                    if rem > half:
                        z += 1
                    elif rem == half and (z & 1):
                        z += 1
            if negative:
                z = 0 - z
        else:
            z = int(_slow(v, m0, shift))
        z += y_zp
        if z < lo:
            z = lo
        elif z > hi:
            z = hi
        qb[y + p] = z & 0xFF
    return 0


@micropython.viper
def _rect(a: ptr32, b8: ptr8, i: int, b: int, inner: int, outer: int, da: int, db: int,
          oa: int, ob: int, wv: int, zw: int) -> int:
    # a[i + k * da + j * oa] += x[b + k * db + j * ob] * w - zw for k < inner, j < outer: one
    # weight over a rectangle of the accumulator plane, zw = zero point * w. (The first
    # locals of a viper function live in registers: here the pointers and the index.)
    for _ in range(outer):
        pa = i
        pb = b
        for _ in range(inner):
            a[i] += int(b8[b]) * wv - zw
            i += da
            b += db
        i = pa + oa
        b = pb + ob
    return 0


@micropython.viper
def _rect_signed(a: ptr32, b8: ptr8, i: int, b: int, inner: int, outer: int, da: int,
                 db: int, oa: int, ob: int, wv: int, zw: int) -> int:
    # the same for int8 inputs: (v ^ 0x80) - 0x80 is the signed byte; zw includes 0x80 * w
    for _ in range(outer):
        pa = i
        pb = b
        for _ in range(inner):
            a[i] += (int(b8[b]) ^ 0x80) * wv - zw
            i += da
            b += db
        i = pa + oa
        b = pb + ob
    return 0


@micropython.viper
def _channel(args, I, scratch: int, x_group: int, w_m: int, flip: int, x_zp: int) -> int:
    # Every tap of one output channel into its accumulator plane (qlinear_conv's inner
    # loops, a function of their own: in one body the loops outgrow the xtensa emitter's
    # branch range).
    cin_g = int(args[9])
    in_h = int(args[11])
    in_w = int(args[12])
    out_h = int(args[13])
    out_w = int(args[14])
    k_h = int(args[15])
    k_w = int(args[16])
    s_h = int(args[17])
    s_w = int(args[18])
    d_h = int(args[19])
    d_w = int(args[20])
    pad_t = int(args[21])
    pad_l = int(args[22])
    in_plane = in_h * in_w
    taps = k_h * k_w
    row_step = s_h * in_w
    q = args[0]
    b8 = ptr8(q)
    for ky in range(k_h):
        off_y = ky * d_h - pad_t
        if off_y > in_h - 1:
            continue
        oy_lo = 0
        if off_y < 0:
            oy_lo = (s_h - 1 - off_y) // s_h
        rows = (in_h - 1 - off_y) // s_h + 1
        if rows > out_h:
            rows = out_h
        rows -= oy_lo
        if rows <= 0:
            continue
        for kx in range(k_w):
            off_x = kx * d_w - pad_l
            if off_x > in_w - 1:
                continue
            ox_lo = 0
            if off_x < 0:
                ox_lo = (s_w - 1 - off_x) // s_w
            count = (in_w - 1 - off_x) // s_w + 1
            if count > out_w:
                count = out_w
            count -= ox_lo
            if count <= 0:
                continue
            lines = rows
            if count == out_w and s_h * in_w == count * s_w:
                count *= rows      # full rows back to back: one long row
                lines = 1
            # the longer of rows and columns is the inner loop (tall narrow planes: the
            # DS-CNN's 25 x 5); the zero point is taken out once per weight:
            # (x - zp) * w = x * w - zp * w
            first = scratch + oy_lo * out_w + ox_lo
            x_tap = x_group + (oy_lo * s_h + off_y) * in_w + ox_lo * s_w + off_x
            w_tap = w_m + ky * k_w + kx
            inner = count
            da = 1
            db = s_w
            outer = lines
            oa = out_w
            ob = row_step
            if lines > count:
                inner = lines
                da = out_w
                db = row_step
                outer = count
                oa = 1
                ob = s_w
            for c in range(cin_g):
                wv = (int(b8[w_tap + c * taps]) ^ 0x80) - 0x80
                if flip:
                    _rect_signed(I, q, first, x_tap + c * in_plane, inner, outer, da, db, oa,
                                 ob, wv, (x_zp + 0x80) * wv)
                else:
                    _rect(I, q, first, x_tap + c * in_plane, inner, outer, da, db, oa, ob, wv,
                          x_zp * wv)
    return 0


@micropython.viper
def qlinear_conv(F, I, args) -> int:
    # Y = requant(Conv(X - x_zp, W) + bias) with the taps outermost, as kernels/conv.py: per
    # image and output channel, an int32 accumulator plane (the step's scratch tensor, offset
    # by 2**30 so that it stays positive in a 32-bit word) gathers every tap's rectangle in a
    # tight loop (_channel, _rect); then the plane is requantized (_requant_plane).
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
    flip = 0
    if int(args[23]):
        flip = 0x80
    x_zp = int(I[req])
    y_zp = int(I[req + 1])
    lo = int(I[req + 2])
    hi = int(I[req + 3])
    channels = groups * cout_g
    wide = int(_WIDE)
    for nimg in range(n_images):
        x_image = x + nimg * groups * cin_g * in_plane
        for mo in range(channels):
            start = 0
            if bias >= 0:
                start = int(I[bias + mo])
            if start <= 0 - _SAFE or start >= _SAFE:
                _pure_conv(F, I, args)        # a bias that could push a plane past 2**31
                return 0
            offset = 16384
            offset <<= 16      # 2**30, built at run time (see the top of this module)
            for p in range(scratch, scratch + out_plane):
                a[p] = start + offset
            _channel(args, I, scratch, x_image + (mo // cout_g) * cin_g * in_plane,
                     w + mo * cin_g * taps, flip, x_zp)
            shift = int(a[req + 5 + 2 * mo])
            if shift < 1:
                shift = 1
            _requant_plane(args[0], I, y, scratch, out_plane, int(a[req + 4 + 2 * mo]), shift,
                           y_zp, lo, hi, wide)
            y += out_plane
    return 0


_pure_conv = None   # set by qlinear.py: its pure-Python kernel
_WIDE = 0           # set by qlinear.py: 1 on ports whose machine word (and small int) is 64 bits
_slow = None   # set by qlinear.py: its exact pure-Python _requant


@micropython.viper
def _requant_store(q, y: int, acc: int, m0: int, shift: int, y_zp: int, lo: int,
                   hi: int) -> int:
    # Q[y] = clamp(requant(acc) + y_zp, lo, hi): _requant when it applies, else the exact
    # pure-Python helper (an accumulator of 2**24 or more).
    if shift < 1:
        shift = 1
    if acc > 0 - _LIMIT and acc < _LIMIT and m0 >= 0 and m0 <= _LIMIT:
        if int(_WIDE):
            v = int(_requant64(acc, m0, shift)) + y_zp
        else:
            v = int(_requant(acc, m0, shift)) + y_zp
    else:
        v = int(_slow(acc, m0, shift)) + y_zp
    if v < lo:
        v = lo
    elif v > hi:
        v = hi
    b = ptr8(q)
    b[y] = v & 0xFF
    return 0


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
        _requant_store(args[0], y + p, acc, m0, shift, y_zp, lo, hi)
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
                _requant_store(args[0], y, acc, r[req + 2 + 2 * count], r[req + 3 + 2 * count],
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
