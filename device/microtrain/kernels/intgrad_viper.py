# @micropython.viper fast paths of kernels/intgrad.py (imported by it only under MicroPython
# with the viper emitter). The same integers as the pure-Python kernels: the same
# normalization, kernels/fixedpoint_viper.py's rounding, dither order and clamps; nothing is
# allocated, so they run under micropython.heap_lock(). Signed int32 values are read
# through the array object (a ptr32 load is unsigned on 64-bit ports) and written through
# ptr32; helpers get the array objects (a pointer passed between viper functions becomes an
# int object). The loops are split into helpers: Thumb and Xtensa branches reach only so
# far.
import micropython
from micropython import const
from microtrain.kernels.fixedpoint_viper import requant, round_shift
from microtrain.kernels.intsgd_viper import descend_bias, update_step, update_weight

_TOP = const(65536)             # kernels/intgrad.py 2**MANT_BITS
_HALF_TOP = const(32768)
_LIMB = const(16777216)         # 2**24
_SATURATED = const(536870912)   # 2**29
_MAX_SUM = const(63)            # kernels/intgrad.py MAX_SUM
_MAX_BIAS_SUM = const(8191)     # kernels/intgrad.py MAX_BIAS_SUM
_FULL_TERMS = const(128)        # kernels/intgrad.py FULL_TERMS


@micropython.viper
def _normalize(I, g: int, count: int) -> int:
    r = ptr32(I)
    top = 0
    for i in range(g + 1, g + 1 + count):
        v = int(I[i])
        if v < 0:
            v = 0 - v
        if v > top:
            top = v
    e = 0
    if top:
        while top >= _TOP:
            top >>= 1
            e += 1
        while top < _HALF_TOP:
            top <<= 1
            e -= 1
    if e > 0:
        for i in range(g + 1, g + 1 + count):
            r[i] = int(round_shift(int(I[i]), e))
    elif e < 0:
        for i in range(g + 1, g + 1 + count):
            r[i] = int(I[i]) << (0 - e)
    return e


@micropython.viper
def _gstep(q, I, at: int, acc: int, m0: int, shift: int, e: int, random: int) -> int:
    # kernels/intgrad.py _step: the shift less the exponent, clamped, acc within the limbs.
    # at < 0: returns the step (a bias'); else descends the int8 weight Q[at] by it, as
    # intsgd.descend_weight(Q, at, _step(...)) (intsgd_viper.update_weight: one call for
    # the step and the clamp, not three)
    if acc == 0 or m0 == 0:
        if at >= 0:
            b = ptr8(q)
            if b[at] == 0x80:
                b[at] = 0x81     # a step of 0 still clamps -128 to -127 (and draws nothing)
        return 0
    shift -= e
    while acc >= _LIMB or acc <= 0 - _LIMB:
        acc = int(round_shift(acc, 1))
        shift -= 1
    if shift < 1:
        if at >= 0:
            b = ptr8(q)
            b[at] = 0x7F         # a step of -2**29: the weight clamped to 127
            if acc > 0:
                b[at] = 0x81     # of 2**29: to -127
            return 0
        if acc > 0:
            return _SATURATED
        return 0 - _SATURATED
    if shift > 62:
        shift = 62
    if at < 0:
        return int(update_step(I, acc, m0, shift, random))
    update_weight(q, I, at, acc, m0, shift, random)
    return 0


@micropython.viper
def int_pool_grad(F, I, args) -> int:
    r = ptr32(I)
    g = int(args[0])
    d = int(args[1])
    m = int(args[2])
    channels = int(args[3])
    plane = int(args[4])
    at = g + 1
    for i in range(m * channels):
        v = int(I[d + i])
        for _ in range(plane):
            r[at] = v
            at += 1
    r[g] = int(_normalize(I, g, m * channels * plane))
    return 0


@micropython.viper
def int_clamp_mask(F, I, args) -> int:
    q = ptr8(args[0])
    mask = int(args[1])
    y = int(args[2])
    req = int(args[3])
    count = int(args[4])
    fy = 0
    if int(args[5]):
        fy = 0x80
    lo = int(I[req + 2])
    hi = int(I[req + 3])
    i = 0
    for at in range(mask, mask + ((count + 7) >> 3)):
        bits = 0
        for b in range(8):
            if i < count:
                v = (int(q[y + i]) ^ fy) - fy
                if v > lo and v < hi:
                    bits |= 1 << b
            i += 1
        q[at] = bits
    return 0


@micropython.viper
def _masked(args, I, start: int, end: int) -> int:
    # kernels/intgrad.py _masked_sum: G zeroed in [start, end) where the mask bit is 0, the
    # sum of the rest
    q = ptr8(args[0])
    r = ptr32(I)
    g = int(args[1])
    mask = int(args[2])
    acc = 0
    pg = g + 1 + start
    for p in range(start, end):
        if (int(q[mask + (p >> 3)]) >> (p & 7)) & 1:
            acc += int(I[pg])
        else:
            r[pg] = 0
        pg += 1
    return acc


@micropython.viper
def _fold(args, I, c: int, m0: int, shift: int) -> int:
    r = ptr32(I)
    g = int(args[1])
    m = int(args[7])
    channels = int(args[8])
    plane = int(args[9])
    for i in range(m):
        pg = g + 1 + (i * channels + c) * plane
        for p in range(pg, pg + plane):
            r[p] = int(requant(int(I[p]), m0, shift))
    return 0


@micropython.viper
def int_clamp_bias_grad(F, I, args) -> int:
    g = int(args[1])
    bias = int(args[3])
    rates = int(args[4])
    random = int(args[5])
    m = int(args[7])
    channels = int(args[8])
    plane = int(args[9])
    e = int(I[g])
    for c in range(channels):
        at = rates + 4 * c
        total = 0      # kernels/intgrad.py int_clamp_bias_grad: folded chunk by chunk
        for i in range(m):
            start = (i * channels + c) * plane
            stop = start + plane
            while start < stop:
                end = start + _MAX_BIAS_SUM
                if end > stop:
                    end = stop
                total = int(_fold_sum(total, int(_masked(args, I, start, end))))
                start = end
        descend_bias(I, bias + c, int(_gstep(None, I, -1, total >> 5, int(I[at]),
                                             int(I[at + 1]), e + (total & 31), random)))
        shift = int(I[at + 3])
        if shift > 62:
            shift = 62
        _fold(args, I, c, int(I[at + 2]), shift)
    return 0


@micropython.viper
def _scatter(args, I, n: int, mo: int) -> int:
    # the contributions of output channel mo of image n to int_conv_grad_input's G_x
    q = ptr8(args[20])      # the weight's buffer (in place, or the byte arena)
    r = ptr32(I)
    gx = int(args[1])
    g = int(args[2])
    w = int(args[3])
    groups = int(args[5])
    cin_g = int(args[6])
    cout_g = int(args[7])
    in_h = int(args[8])
    in_w = int(args[9])
    out_h = int(args[10])
    out_w = int(args[11])
    k_h = int(args[12])
    k_w = int(args[13])
    s_h = int(args[14])
    s_w = int(args[15])
    d_h = int(args[16])
    d_w = int(args[17])
    pad_t = int(args[18])
    pad_l = int(args[19])
    in_plane = in_h * in_w
    taps = k_h * k_w
    channels = groups * cout_g
    x_group = gx + 1 + n * groups * cin_g * in_plane + (mo // cout_g) * cin_g * in_plane
    pg = g + 1 + (n * channels + mo) * out_h * out_w
    w_m = w + mo * cin_g * taps
    for oy in range(out_h):
        for ox in range(out_w):
            v = int(I[pg])
            pg += 1
            if v == 0:
                continue
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
                        at = x_c + iy * in_w + ix
                        r[at] = int(I[at]) + v * ((int(q[w_c + ky * k_w + kx]) ^ 0x80) - 0x80)
    return 0


@micropython.viper
def int_conv_grad_input(F, I, args) -> int:
    # kernels/intgrad.py int_conv_grad_input: scattered below _FULL_TERMS terms per element,
    # gathered and summed exactly from _FULL_TERMS on (kernels/intwide.py)
    r = ptr32(I)
    gx = int(args[1])
    g = int(args[2])
    m = int(args[4])
    groups = int(args[5])
    cin_g = int(args[6])
    cout_g = int(args[7])
    count = m * groups * cin_g * int(args[8]) * int(args[9])
    if cout_g * int(args[12]) * int(args[13]) >= _FULL_TERMS:
        # the pure kernel's calls of intwide's (viper) sums: intwide loads lazily
        _pure["int_conv_grad_input"](F, I, args)
        return 0
    for i in range(gx + 1, gx + 1 + count):
        r[i] = 0
    for n in range(m):
        for mo in range(groups * cout_g):
            _scatter(args, I, n, mo)
    r[gx] = int(I[g]) + int(_normalize(I, gx, count))
    return 0


@micropython.viper
def _fold_sum(total: int, part: int) -> int:
    # kernels/intgrad.py _fold_sum: the running sum acc * 32 + t with a chunk's sum added
    acc = total >> 5
    t = total & 31
    part = int(round_shift(part, t))
    while part >= _SATURATED or part <= 0 - _SATURATED:
        part = int(round_shift(part, 1))
        acc = int(round_shift(acc, 1))
        t += 1
    acc += part
    while acc >= _LIMB or acc <= 0 - _LIMB:
        acc = int(round_shift(acc, 1))
        t += 1
    return acc * 32 + t


@micropython.viper
def _weight_sum(args, I, mo: int, c: int, ky: int, kx: int, zp: int, fx: int) -> int:
    # kernels/intgrad.py _weight_sum: sum over the batch and the outputs of G[mo] * (X -
    # x_zp) for one weight of int_conv_update (zp includes the flip), folded every _MAX_SUM
    # positions of the rows inside the image
    q = ptr8(args[0])
    x = int(args[2])
    g = int(args[3])
    m = int(args[6])
    groups = int(args[7])
    cin_g = int(args[8])
    cout_g = int(args[9])
    in_h = int(args[10])
    in_w = int(args[11])
    out_h = int(args[12])
    out_w = int(args[13])
    s_h = int(args[16])
    s_w = int(args[17])
    d_h = int(args[18])
    d_w = int(args[19])
    pad_t = int(args[20])
    pad_l = int(args[21])
    channels = groups * cout_g
    in_plane = in_h * in_w
    out_plane = out_h * out_w
    first = (mo // cout_g) * cin_g
    total = 0
    part = 0
    done = 0
    for n in range(m):
        pg = g + 1 + (n * channels + mo) * out_plane
        px = x + (n * groups * cin_g + first + c) * in_plane
        for oy in range(out_h):
            iy = oy * s_h - pad_t + ky * d_h
            if iy < 0 or iy >= in_h:
                pg += out_w
                continue
            row = px + iy * in_w
            for ox in range(out_w):
                v = int(I[pg])
                pg += 1
                if v != 0:
                    ix = ox * s_w - pad_l + kx * d_w
                    if ix >= 0 and ix < in_w:
                        part += v * ((int(q[row + ix]) ^ fx) - zp)
                done += 1
                if done == _MAX_SUM:
                    total = int(_fold_sum(total, part))
                    part = 0
                    done = 0
    return int(_fold_sum(total, part))


@micropython.viper
def int_conv_update(F, I, args) -> int:
    w = int(args[1])
    g = int(args[3])
    rates = int(args[4])
    random = int(args[5])
    groups = int(args[7])
    cin_g = int(args[8])
    cout_g = int(args[9])
    k_h = int(args[14])
    k_w = int(args[15])
    fx = 0
    if int(args[22]):
        fx = 0x80
    zp = int(I[rates]) + fx
    e = int(I[g])
    for mo in range(groups * cout_g):
        m0 = int(I[rates + 1 + 2 * mo])
        shift = int(I[rates + 2 + 2 * mo])
        for c in range(cin_g):
            for ky in range(k_h):
                for kx in range(k_w):
                    total = int(_weight_sum(args, I, mo, c, ky, kx, zp, fx))
                    _gstep(args[0], I, w + ((mo * cin_g + c) * k_h + ky) * k_w + kx,
                           total >> 5, m0, shift, e + (total & 31), random)
    return 0


_pure = None   # set by kernels/fastpath.py: the family's pure-Python kernels
