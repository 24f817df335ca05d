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
# extreme values) is requantized by the exact pure-Python helper instead.
import micropython
from micropython import const

_LIMIT = const(16777216)   # 2**24: |acc| below it keeps every limb product below 2**25
_BIAS = const(1073741824)  # 2**30: accumulator planes hold acc + 2**30, positive
_SAFE = const(268435456)   # 2**28: a bias within it keeps acc + 2**30 in [0, 2**31)


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
    x_signed = int(args[13])
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
            if x_signed:
                for _ in range(k):
                    acc += (((int(q[px]) ^ 0x80) - 0x80) - x_zp) * ((int(q[pw]) ^ 0x80) - 0x80)
                    px += sx_k
                    pw += sw_k
            else:
                for _ in range(k):
                    acc += (int(q[px]) - x_zp) * ((int(q[pw]) ^ 0x80) - 0x80)
                    px += sx_k
                    pw += sw_k
            m0 = r[req + 4 + 2 * j]
            shift = r[req + 5 + 2 * j]
            if shift < 1:
                shift = 1
            if acc > 0 - _LIMIT and acc < _LIMIT and m0 >= 0 and m0 <= _LIMIT:
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
                   hi: int) -> int:
    # y[p] = clamp(requant(acc[p] - _BIAS) + y_zp) for p < count; the requantization of
    # _requant inlined (one call per output plane, not per element).
    qb = ptr8(q)
    a = ptr32(r)
    for p in range(count):
        v = a[acc + p] - _BIAS
        if v > 0 - _LIMIT and v < _LIMIT and m0 >= 0 and m0 <= _LIMIT:
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
def qlinear_conv(F, I, args) -> int:
    # Y = requant(Conv(X - x_zp, W) + bias) with the taps outermost, as kernels/conv.py: per
    # image and output channel, an int32 accumulator plane (the step's scratch tensor, offset
    # by _BIAS so that it stays positive in a 32-bit word) gathers every tap's rectangle in a
    # tight loop; then the plane is requantized (_requant_plane).
    q = ptr8(args[0])
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
    flip = 0
    if int(args[23]):
        flip = 0x80
    x_zp = int(I[req])
    y_zp = int(I[req + 1])
    lo = int(I[req + 2])
    hi = int(I[req + 3])
    channels = groups * cout_g
    in_plane = in_h * in_w
    out_plane = out_h * out_w
    taps = k_h * k_w
    for nimg in range(n_images):
        x_image = x + nimg * groups * cin_g * in_plane
        for mo in range(channels):
            start = 0
            if bias >= 0:
                start = int(I[bias + mo])
            if start <= 0 - _SAFE or start >= _SAFE:
                _pure_conv(F, I, args)        # a bias that could push a plane past 2**31
                return 0
            for p in range(scratch, scratch + out_plane):
                a[p] = start + _BIAS
            x_group = x_image + (mo // cout_g) * cin_g * in_plane
            w_m = w + mo * cin_g * taps
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
                    w_tap = w_m + ky * k_w + kx
                    first = scratch + oy_lo * out_w + ox_lo
                    x_tap = x_group + (oy_lo * s_h + off_y) * in_w + ox_lo * s_w + off_x
                    for c in range(cin_g):
                        wv = (int(q[w_tap + c * taps]) ^ 0x80) - 0x80
                        pa = first
                        pb = x_tap + c * in_plane
                        for _ in range(lines):
                            i = pa
                            b = pb
                            for _ in range(count):
                                a[i] += (((int(q[b]) ^ flip) - flip) - x_zp) * wv
                                i += 1
                                b += s_w
                            pa += out_w
                            pb += s_h * in_w
            shift = int(a[req + 5 + 2 * mo])
            if shift < 1:
                shift = 1
            _requant_plane(args[0], I, y, scratch, out_plane, int(a[req + 4 + 2 * mo]), shift,
                           y_zp, lo, hi)
            y += out_plane
    return 0


_pure_conv = None   # set by qlinear.py: its pure-Python kernel
_slow = None   # set by qlinear.py: its exact pure-Python _requant
