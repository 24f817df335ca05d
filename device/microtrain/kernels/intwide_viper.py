# @micropython.viper forms of kernels/intwide.py (the wide input gradients; imported by its
# use_fast, at the load of a model with a wide layer, under MicroPython with the viper
# emitter). The same integers: every sum is exact, then rounded
# to odd as there; nothing is allocated. As in
# kernels/intgrad_viper.py, signed int32 values are read through the array object and
# written through ptr32, and the loops are split into helpers (branch reach on Thumb and
# Xtensa).
import micropython
from array import array
from micropython import const
from microtrain.kernels.fixedpoint_viper import requant, round_shift

_CHUNK = const(127)        # kernels/intwide.py CHUNK
_GEMM_CHUNK = const(31)    # kernels/intwide.py GEMM_CHUNK
_LOW_MASK = const(0xFFFF)
_LIMB = const(16777216)    # 2**24


# gather_wide's geometry, read by _element_sum: written once per call of gather_wide rather
# than converted from args in each call of _element_sum (once per input element): cout_g,
# out_h, out_w, k_h, k_w, s_h, s_w, d_h, d_w, pad_t, pad_l, out_plane, w_step (none negative)
_GEO = array("i", bytes(4 * 13))


@micropython.viper
def _element_sum(I, args, pg: int, pw: int, iy: int, ix: int) -> int:
    # kernels/intwide.py gather_wide's sum for the input element (iy, ix) of one channel:
    # pg, pw the gradient plane and the weights of its group's first output channel
    q = ptr8(args[20])
    geo = ptr32(_GEO)
    cout_g = geo[0]
    out_h = geo[1]
    out_w = geo[2]
    k_h = geo[3]
    k_w = geo[4]
    s_h = geo[5]
    s_w = geo[6]
    d_h = geo[7]
    d_w = geo[8]
    pad_t = geo[9]
    pad_l = geo[10]
    out_plane = geo[11]
    w_step = geo[12]
    high = 0
    low = 0
    done = 0
    for _ in range(cout_g):
        for ky in range(k_h):
            ty = iy + pad_t - ky * d_h
            if ty < 0:
                break
            oy = ty // s_h
            if oy * s_h != ty or oy >= out_h:
                continue
            row = pg + oy * out_w
            pk = pw + ky * k_w
            for kx in range(k_w):
                tx = ix + pad_l - kx * d_w
                if tx < 0:
                    break
                ox = tx // s_w
                if ox * s_w != tx or ox >= out_w:
                    continue
                v = int(I[row + ox])
                if v:
                    low += v * ((int(q[pk + kx]) ^ 0x80) - 0x80)
                    done += 1
                    if done == _CHUNK:
                        high += low >> 16
                        low &= _LOW_MASK
                        done = 0
        pg += out_plane
        pw += w_step
    return int(exact_packed(high, low))


@micropython.viper
def gather_wide(I, args) -> int:
    # kernels/intwide.py gather_wide
    r = ptr32(I)
    gx = int(args[1])
    g = int(args[2])
    w = int(args[3])
    m = int(args[4])
    groups = int(args[5])
    cin_g = int(args[6])
    cout_g = int(args[7])
    in_h = int(args[8])
    in_w = int(args[9])
    out_plane = int(args[10]) * int(args[11])
    taps = int(args[12]) * int(args[13])
    channels = groups * cout_g
    geo = ptr32(_GEO)
    geo[0] = cout_g
    for i in range(1, 11):
        geo[i] = int(args[i + 9])      # out_h .. pad_l
    geo[11] = out_plane
    geo[12] = cin_g * taps
    at = gx + 1
    for n in range(m):
        for ci in range(groups * cin_g):
            group = ci // cin_g
            first = group * cout_g
            w_first = w + (first * cin_g + ci - group * cin_g) * taps
            g_first = g + 1 + (n * channels + first) * out_plane
            for iy in range(in_h):
                for ix in range(in_w):
                    r[at] = int(_element_sum(I, args, g_first, w_first, iy, ix))
                    at += 1
    return 0


@micropython.viper
def gemm_grad_input_wide(I, args, wide: int) -> int:
    # kernels/intwide.py gemm_grad_input_wide
    r = ptr32(I)
    b8 = ptr8(args[0])
    d = int(args[1])
    g = int(args[2])
    w = int(args[3])
    factors = int(args[4])
    m = int(args[5])
    k = int(args[6])
    n = int(args[7])
    for i in range(m):
        gi = g + i * n
        for c in range(k):
            high = 0
            low = 0
            done = 0
            pw = w + c
            for j in range(n):
                h = int(requant(int(I[gi + j]), r[factors + 2 * j],
                                r[factors + 2 * j + 1] - wide))
                low += h * ((int(b8[pw]) ^ 0x80) - 0x80)
                pw += k
                done += 1
                if done == _GEMM_CHUNK:
                    high += low >> 16
                    low &= _LOW_MASK
                    done = 0
            high += low >> 16
            r[d + i * k + c] = (high << (16 - wide)) + int(round_shift(low & _LOW_MASK, wide))
    return 0


@micropython.viper
def exact_packed(high: int, low: int) -> int:
    # kernels/intwide.py exact_packed
    high += low >> 16
    low &= _LOW_MASK
    top = high
    if top < 0:
        top = 0 - top
    t = 0
    while (top >> t) >= 256:
        t += 1
    acc = int(_odd_shift(high, low, t))
    while acc >= _LIMB or acc <= 0 - _LIMB:
        t += 1
        acc = int(_odd_shift(high, low, t))
    return acc * 32 + t


@micropython.viper
def _odd_shift(high: int, low: int, t: int) -> int:
    # kernels/intwide.py _odd_shift
    acc = (high << (16 - t)) + (low >> t)
    if low & ((1 << t) - 1):
        acc |= 1
    return acc


@micropython.viper
def common_exponent(I, gx: int, count: int) -> int:
    # kernels/intwide.py common_exponent
    r = ptr32(I)
    top = 0
    for i in range(gx + 1, gx + 1 + count):
        t = int(I[i]) & 31
        if t > top:
            top = t
    for i in range(gx + 1, gx + 1 + count):
        v = int(I[i])
        acc = v >> 5
        shift = top - (v & 31)
        rounded = acc >> shift
        if acc & ((1 << shift) - 1):
            rounded |= 1
        r[i] = rounded
    return top
