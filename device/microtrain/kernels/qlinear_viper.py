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
def qlinear_conv(F, I, args) -> int:
    q = ptr8(args[0])
    r = ptr32(I)
    y = int(args[1])
    x = int(args[2])
    w = int(args[3])
    bias = int(args[4])
    req = int(args[5])
    n_images = int(args[6])
    groups = int(args[7])
    cin_g = int(args[8])
    cout_g = int(args[9])
    in_h = int(args[10])
    in_w = int(args[11])
    out_h = int(args[12])
    out_w = int(args[13])
    k_h = int(args[14])
    k_w = int(args[15])
    s_h = int(args[16])
    s_w = int(args[17])
    d_h = int(args[18])
    d_w = int(args[19])
    pad_t = int(args[20])
    pad_l = int(args[21])
    x_flip = 0
    if int(args[22]):
        x_flip = 0x80
    x_zp = int(I[req])
    y_zp = int(I[req + 1])
    lo = int(I[req + 2])
    hi = int(I[req + 3])
    channels = groups * cout_g
    in_plane = in_h * in_w
    taps = k_h * k_w
    for nimg in range(n_images):
        x_image = x + nimg * groups * cin_g * in_plane
        for mo in range(channels):
            m0 = r[req + 4 + 2 * mo]
            shift = r[req + 5 + 2 * mo]
            if shift < 1:
                shift = 1
            start = 0
            if bias >= 0:
                start = int(I[bias + mo])
            x_group = x_image + (mo // cout_g) * cin_g * in_plane
            w_m = w + mo * cin_g * taps
            for oy in range(out_h):
                iy0 = oy * s_h - pad_t
                for ox in range(out_w):
                    ix0 = ox * s_w - pad_l
                    acc = start
                    for c in range(cin_g):
                        x_c = x_group + c * in_plane
                        w_c = w_m + c * taps
                        for ky in range(k_h):
                            iy = iy0 + ky * d_h
                            if iy < 0 or iy >= in_h:
                                continue
                            row = x_c + iy * in_w
                            pw = w_c + ky * k_w
                            ix = ix0
                            for kx in range(k_w):
                                if ix >= 0 and ix < in_w:
                                    acc += ((((int(q[row + ix]) ^ x_flip) - x_flip) - x_zp)
                                            * ((int(q[pw + kx]) ^ 0x80) - 0x80))
                                ix += d_w
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


_slow = None   # set by qlinear.py: its exact pure-Python _requant
