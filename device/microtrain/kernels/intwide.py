# The input gradient of a wide convolution or Gemm (kernels/intgrad.py int_conv_grad_input
# when an element sums cout_g * taps >= FULL_TERMS = 128 products of a 16-bit gradient
# mantissa and an int8 weight): gathered element by element and summed exactly, so that the
# mantissas keep their 16 bits however many terms (a scatter would have to round every
# mantissa first to keep 128+ products below 2**30).
#
# Each element's sum S (|S| <= MAX_TERMS * 2**23 = 2**35) is kept in two small ints, S =
# high * 2**16 + low: low adds at most CHUNK = 127 products (each |v * w| <= 2**23, so
# |low| < 2**30), then its bits from 2**16 up carry into high (|high| <= 2**19). S is then
# rounded to odd (the floor, its lowest bit set when a nonzero remainder is dropped) to
# acc * 2**t with |acc| < 2**24 (t = 0, exact, below 2**24 - 2**16), stored packed as acc * 32
# + t (an int32, as intgrad._fold_sum's running sums); common_exponent() rounds every
# element to odd again at the tensor's largest t, T, and intgrad's _normalize then to 16
# bits, half to even, by e >= 7 bits when T > 0 (the largest |acc| at T is >= 2**22). A
# rounding to odd followed by one to nearest 2 or more bits coarser is the rounding to
# nearest of the exact value (Boldo and Melquiond): the mantissas are S / 2**(T + e)
# rounded once, half to even, whatever the number of terms.
#
# The classifier input's gradient D of kernels/inttrain.py int_gemm_grad_input, when its n
# outputs leave D fewer than GRAD_BITS extra bits (n > 31: |D| < 2**30 at a unit fixed at
# load), likewise: gemm_grad_input_wide takes each term with `wide` more bits (the
# GRAD_BITS of 31 outputs), sums them exactly and rounds the sum once to D's unit, rather
# than rounding n terms each to D's unit.
# Everything stays below 2**30 and nothing is allocated (runs under heap_lock); the viper
# twin (kernels/intwide_viper.py) gives the same integers.
from microtrain.kernels.fixedpoint import requant, round_shift

CHUNK = 127          # products added to the low limb between carries
GEMM_CHUNK = 31      # the same for gemm_grad_input_wide's products (each below 2**25 + 2**7)
_LOW_MASK = 0xFFFF   # the low limb after a carry: 0 <= low < 2**16
_LIMB = 1 << 24


def gather_wide(I, args):
    # G_x[n, ci, iy, ix] = sum over the output channels mo of ci's group and the taps (ky, kx)
    # whose output (oy, ox) = ((iy + pad_t - ky * d_h) / s_h, (ix + pad_l - kx * d_w) / s_w)
    # is a whole position inside the output of W[mo, c, ky, kx] * G[n, mo, oy, ox], written
    # packed (exact_packed) into G_x's mantissas; G_x's exponent is the caller's
    (_, gx, g, w, m, groups, cin_g, cout_g, in_h, in_w, out_h, out_w, k_h, k_w, s_h, s_w, d_h,
     d_w, pad_t, pad_l, W) = args      # W: the weight's buffer (in place or Q)
    out_plane = out_h * out_w
    taps = k_h * k_w
    channels = groups * cout_g
    w_step = cin_g * taps          # from W[mo, c] to W[mo + 1, c]
    at = gx + 1
    for n in range(m):
        for ci in range(groups * cin_g):
            first = (ci // cin_g) * cout_g      # the first output channel of ci's group
            w_first = w + (first * cin_g + ci % cin_g) * taps
            g_first = g + 1 + (n * channels + first) * out_plane
            for iy in range(in_h):
                for ix in range(in_w):
                    high = 0
                    low = 0
                    done = 0
                    pg = g_first
                    pw = w_first
                    for _ in range(cout_g):
                        for ky in range(k_h):
                            ty = iy + pad_t - ky * d_h
                            if ty < 0:      # (and for every larger ky)
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
                                v = I[row + ox]
                                if v:
                                    low += v * ((W[pk + kx] ^ 128) - 128)
                                    done += 1
                                    if done == CHUNK:
                                        high += low >> 16
                                        low &= _LOW_MASK
                                        done = 0
                        pg += out_plane
                        pw += w_step
                    I[at] = exact_packed(high, low)
                    at += 1


def exact_packed(high, low):
    # S = high * 2**16 + low (|low| < 2**30, |high| < 2**22) rounded to odd to acc * 2**t,
    # |acc| < 2**24, packed acc * 32 + t
    high += low >> 16
    low &= _LOW_MASK
    top = -high if high < 0 else high
    t = 0
    while top >> t >= 256:      # then |high << (16 - t)| < 2**24
        t += 1
    acc = _odd_shift(high, low, t)
    while acc >= _LIMB or acc <= -_LIMB:     # (low's bits reached 2**24)
        t += 1
        acc = _odd_shift(high, low, t)
    return acc * 32 + t


def _odd_shift(high, low, t):
    # high * 2**16 + low (0 <= low < 2**16, t <= 15) over 2**t rounded to odd: the floor,
    # (high << (16 - t)) + (low >> t), with bit 0 set when low's lowest t bits are not 0
    acc = (high << (16 - t)) + (low >> t)
    if low & ((1 << t) - 1):
        acc |= 1
    return acc


def common_exponent(I, gx, count):
    # the packed sums of gather_wide unpacked, each rounded to odd at the largest power of
    # two T among them; returns T (then |I[i]| < 2**24: _normalize's input)
    top = 0
    for i in range(gx + 1, gx + 1 + count):
        t = I[i] & 31
        top = t if t > top else top
    for i in range(gx + 1, gx + 1 + count):
        v = I[i]
        acc = v >> 5
        shift = top - (v & 31)
        rounded = acc >> shift
        if acc & ((1 << shift) - 1):
            rounded |= 1
        I[i] = rounded
    return top


def gemm_grad_input_wide(I, args, wide):
    # kernels/inttrain.py int_gemm_grad_input, D[i, c] = sum_j h[i, j] * W[j, c], with each
    # h = round(g * factor_j * 2**wide) (|h| <= 2**14 * 2**GRAD_BITS) and the exact sum
    # rounded half to even by `wide` bits (1..7, as n is at most 2048): D in its units
    Q, d, g, w, factors, m, k, n = args
    for i in range(m):
        gi = g + i * n
        for c in range(k):
            high = 0
            low = 0
            done = 0
            pw = w + c
            for j in range(n):
                h = requant(I[gi + j], I[factors + 2 * j], I[factors + 2 * j + 1] - wide)
                low += h * ((Q[pw] ^ 128) - 128)
                pw += k
                done += 1
                if done == GEMM_CHUNK:
                    high += low >> 16
                    low &= _LOW_MASK
                    done = 0
            high += low >> 16
            I[d + i * k + c] = (high << (16 - wide)) + round_shift(low & _LOW_MASK, wide)


# This module and its viper forms (kernels/intwide_viper.py) are imported only for a model
# with a wide layer: the checkers of kernels/intgrad.py and kernels/inttrain.py load it
# (fastpath.load_helper, calling use_fast as their family is switched), so that a board whose
# model has none keeps its module and its machine code out of its RAM; a family's use_fast
# then switches these with its own kernels.
_FAST_NAMES = ("gather_wide", "common_exponent", "gemm_grad_input_wide")


def use_fast(on=True):
    from microtrain.kernels import fastpath
    return fastpath.use_fast(globals(), _FAST_NAMES, on, "intwide_viper")
