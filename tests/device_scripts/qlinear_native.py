# The native int8 Gemm and Conv (device/native, a dynamic native module) against the
# pure-Python kernels on random geometries and data. The board runs the native kernels and
# prints each case's CRC-32 of Q; tests/test_board_natmod.py runs this script again under
# CPython with PURE = True (the pure-Python kernels) and tests/micropython_random.py as
# `random` (the board's draws: the same cases) and compares the two. Gemm: unsigned and
# signed activations, both weight layouts (W[n, k] and W[k, n], each with its hand-written
# Thumb-1 loop on ARM; a third of them 8-19 rows: blocks of eight rows transposed, mt_t8),
# odd and even k, column counts that leave 0-3 columns past the blocks of four. Conv:
# groups, strides, dilations, paddings, kernels larger than the image, depthwise. Both:
# negative and huge biases, accumulators past 2**24, weights in the arena or in a bytes
# object of their own, multipliers and shifts out of the derived range (the module hands
# those to the pure-Python kernel), multipliers whose products often end exactly halfway
# (ties). Pointwise Convs (1x1, stride 1, no padding: the module's four-pixel loop) every
# fourth Conv case, half of those with the requantization's edge multipliers and shifts and
# accumulators near +-2**23 and +-2**24 (edge_req). Convs of one input channel per group and
# 4-8 output channels (the module's im2col path) every fourth Conv case, half of them with
# edge_req; 3x3 depthwise Convs (the module's row loops over padded rows: 1-16 wide, 1-12 or
# 40-70 high, strides, dilation along y) every fourth, half of them with edge_req; Convs of
# 2-6 input and 4-8 output channels per group (the im2col path for any Conv) every eighth.
# Conv kinds per eight Conv cases: 0 1 3 4 5 2 3 4 (CONV_KINDS; kinds 6 and 7, Convs shaped
# for the direct path, only when the test asks for them).
# Gemm and Conv cases alternate; every eighth Gemm case is a tie case (tie_case).
# Prints "case I CRC" per case, then "cases N fallback F" (F: crafted cases,
# which the module hands to the pure-Python kernel).
import random
from array import array
from microtrain.kernels import qlinear

random.seed(11)
KERNELS = kernel_of(qlinear, 'qlinear_gemm'), kernel_of(qlinear, 'qlinear_conv')  # noqa: F821


def y_zp_for(lo):
    # a third of the cases a plain Relu's bounds (lo = y_zp: the requantization's Relu run,
    # in the armv7m build without a lower clamp), else a zero point near 0
    return lo if random.randint(0, 2) == 0 else random.randint(-20, 20)


def req(channels, x_zp, y_zp, lo, hi):
    r = [x_zp, y_zp, lo, hi]
    crafted = False
    for _ in range(channels):
        kind = random.randint(0, 6)
        if kind > 1:
            r += [random.randint(1 << 23, 1 << 24), random.randint(14, 40)]
        elif kind == 1:
            # multipliers of few bits (1/2, 3/4, 5/8 ... times a power of two): many
            # products end exactly halfway, where round half to even decides
            r += [random.choice((1 << 23, 3 << 22, 5 << 21)), random.randint(18, 30)]
        else:   # as a crafted blob may hold them: m0 0 or beyond 2**24, shift 0 or past 62
            m0 = random.choice((0, 1 << 23, 1 << 24, (1 << 24) + 1))
            crafted = crafted or m0 > 1 << 24
            r += [m0, random.choice((0, 1, 62, 63, 70))]
    return r, crafted


def gemm_case():
    m, n = random.randint(1, 4), random.randint(1, 9)
    k = random.choice((1, 2, 3, 4, 5, 16, 33, 64, 127, 700))
    if k < 700 and random.randint(0, 2) == 0:
        m = random.randint(8, 19)       # rows in blocks of eight (k <= 96: rows8 and mt_t8)
    Q = bytearray(random.getrandbits(8) for _ in range(m * k + k * n + m * n))
    if k == 700 or random.randint(0, 5) == 0:
        for i in range(m * k + k * n):
            Q[i] = random.choice((0, 127, 128, 255))   # extreme values
    lo, hi = (-128, 127) if random.randint(0, 1) else (0, 255)
    if random.randint(0, 3) == 0:
        b = [random.randint(-(1 << 29), 1 << 29) for _ in range(n)]    # huge biases
        if random.randint(0, 2) == 0:   # at int32's ends: the sum plus the bias overflows
            b = [random.choice((1, -1)) * ((1 << 31) - 1 - random.randint(0, 1 << 16))
                 for _ in range(n)]
    else:
        b = [random.randint(-5000, 5000) for _ in range(n)]
    signed = random.randint(0, 1)
    x_zp = random.randint(-128, 127) if signed else random.randint(0, 255)
    r, crafted = req(n, x_zp, y_zp_for(lo), lo, hi)
    I = array("i", b + r)
    trans = random.randint(0, 1)
    sw_k, sw_n = (1, k) if trans else (n, 1)
    w_at, weights = m * k, Q
    if random.randint(0, 1):
        before = random.randint(0, 40)
        w_at = before
        weights = bytes(random.getrandbits(8) for _ in range(before)) + \
            bytes(Q[m * k:m * k + k * n])
    args = (Q, m * k + k * n, 0, w_at, 0 if random.randint(0, 3) else -1, n, m, k, n, k, 1,
            sw_k, sw_n, signed, 0, weights)
    return Q, I, args, crafted, 0


def tie_case():
    # a Gemm whose every output is acc / 2**e, acc odd or a multiple of 2**(e - 1): many
    # exact halves in the clamp range, where round half to even (not up, not away) decides
    n = random.randint(1, 9)
    Q = bytearray([random.randint(0, 255)] + [1] * n + [0] * n)     # x, W[k=1, n], Y
    x_zp = Q[0] - 1                                                 # x - x_zp = 1
    e = random.randint(1, 3)
    r = [x_zp, random.randint(-20, 20), -128, 127]
    for _ in range(n):
        r += [1 << 23, 23 + e]
    I = array("i", [random.randint(-300, 300) for _ in range(n)] + r)
    args = (Q, 1 + n, 0, 1, 0, n, 1, 1, n, 1, 1, n, 1, 0, 0, Q)
    return Q, I, args, False, 0


def edge_req(channels, x_zp, y_zp, lo, hi):
    # the requantization's edges: the smallest and largest multipliers, the shifts where
    # the 32-bit limbs' cases meet (2, 16-17, 31-33, 47-48, 61-62) and few-bit multipliers
    # (exact halves), besides the derived range
    r = [x_zp, y_zp, lo, hi]
    for _ in range(channels):
        m0 = random.choice((1, 2, 3, 1 << 23, 3 << 22, (1 << 24) - 1, 1 << 24,
                            random.randint(1 << 23, 1 << 24), random.randint(1, 1 << 24)))
        r += [m0, random.choice((2, 3, 15, 16, 17, 18, 24, 30, 31, 32, 33, 34, 40, 46, 47, 48,
                                 49, 61, 62))]
    return r, False


def conv_case(kind=0):
    # kind 1: pointwise (1x1, stride 1, no padding: the eight- and four-pixel loops, with
    # 0-3 pixels past their blocks); kind 2: pointwise with the requantization's edges and
    # accumulators near +-2**23 (the per-channel requantization's bound) or +-2**24 (the
    # limbs'), and few-bit weights and inputs
    # kind 3: one input channel per group and 4-8 output channels (the im2col path,
    # conv_patches: the KWS DS-CNN's first Conv), kernels up to 10 taps a side, half of them
    # padded by up to 9 on top (groups of eight pixels whose first rows of taps all read
    # padding: summed over the others only); kind 4: 3x3 depthwise (conv_dw3x3); kind 5:
    # 2-6 input and 4-8 output channels per group (the im2col path, K = cin_g * taps <= 96:
    # its gather inside the image and at its edges), images up to 14 wide, paddings up to 3;
    # kind 8: 3x3 depthwise with "same" padding and stride 1 (below)
    groups = random.choice((1, 1, 2, 3))
    cin, cout = groups * random.randint(1, 3), groups * random.randint(1, 3)
    if kind in (1, 2):
        cin = groups * random.randint(1, 40)
    if kind != 3 and random.randint(0, 5) == 0:            # depthwise
        groups = cin = cout = random.randint(1, 6)
    if kind == 3:
        groups = random.choice((1, 1, 2))
        cin, cout = groups, groups * random.randint(4, 8)
    if kind == 5:
        groups = random.choice((1, 1, 1, 2))
        cin, cout = groups * random.randint(2, 6), groups * random.randint(4, 8)
    H, W = random.randint(1, 9), random.randint(1, 9)
    if kind in (3, 5):
        W = random.randint(1, 14)
    side = 10 if kind == 3 else 4
    kh, kw = random.randint(1, min(side, H + 2)), random.randint(1, min(side, W + 2))
    sh, sw, dh, dw = random.randint(1, 2), random.randint(1, 2), random.randint(1, 2), \
        random.randint(1, 2)
    pt, pl = random.randint(0, 2), random.randint(0, 2)
    if kind == 5:
        pt, pl = random.randint(0, 3), random.randint(0, 3)
    if kind == 3 and random.randint(0, 1):
        pt = random.randint(0, 9)
    if kind == 4:
        groups = cin = cout = random.randint(1, 6)
        kh = kw = 3
        dw = 1
        # up to 16 wide: padded rows of at most 14 bytes take the Thumb-1 row loop, wider
        # ones the C loop; up to 70 high: several bands of rows
        H, W = random.choice((random.randint(1, 12), random.randint(40, 70))), \
            random.randint(1, 16)
    if kind == 8:
        # 3x3 depthwise, "same" padding, stride 1: the armv7m build's pairs of rows
        # (qconv_native.c's dw3_pairs) where H + 2 rows of 8 words (W <= 6) or 16 (W <= 14)
        # fit its 256, the row loop beyond
        groups = cin = cout = random.randint(1, 6)
        kh = kw = 3
        sh = sw = dh = dw = 1
        pt = pl = 1
        W = random.randint(1, 14)
        H = random.randint(1, 40 if W <= 6 else 20)
    if kind in (1, 2):
        kh = kw = sh = sw = 1
        pt = pl = 0
    if kind in (6, 7):
        # 1-8 input and 4-8 output channels per group, kernels up to 5x5, paddings up to 3
        # (some wider than the kernel), for the ARM builds' direct path (qconv_direct.c,
        # when K <= 72). Kind 6: stride 1, outputs that often tile (rows of eight, or
        # blocks of four columns by two rows at most 16 band columns wide); kind 7: strides
        # and dilations 1 or 2, 8-25 rows of 1-12 outputs (columns of eight rows when the
        # transposed input fits; the last out_h mod 8 rows the im2col path's)
        groups = random.choice((1, 1, 2))
        cin, cout = groups * random.randint(1, 8), groups * random.randint(4, 8)
        kh, kw = random.choice((1, 2, 3, 3, 4, 5)), random.choice((1, 2, 3, 3, 4, 5))
        sh = sw = dh = dw = 1
        pt, pl = random.randint(0, 3), random.randint(0, 3)
        OW = random.choice((4, 8, 12, 16, 24, random.randint(1, 14)))
        OH = random.choice((2, 4, 6, 8, random.randint(1, 9)))
        if kind == 7:
            cin = groups * random.randint(1, 3)
            sh, sw = random.choice((1, 2)), random.choice((1, 2))
            dh, dw = random.choice((1, 1, 2)), random.choice((1, 1, 2))
            OW, OH = random.randint(1, 12), random.randint(8, 25)
        H = (OH - 1) * sh + (kh - 1) * dh + 1 - 2 * pt
        W = (OW - 1) * sw + (kw - 1) * dw + 1 - 2 * pl
        if H < 1 or W < 1:
            return None
    OH = (H + 2 * pt - (kh - 1) * dh - 1) // sh + 1
    OW = (W + 2 * pl - (kw - 1) * dw - 1) // sw + 1
    if OH < 1 or OW < 1:
        return None
    n = random.randint(1, 2)
    nx, nw, ny = n * cin * H * W, cout * (cin // groups) * kh * kw, n * cout * OH * OW
    Q = bytearray(random.getrandbits(8) for _ in range(nx + nw + ny))
    if random.randint(0, 5) == 0:
        for i in range(nx + nw):
            Q[i] = random.choice((0, 127, 128, 255))
    signed = random.randint(0, 1)
    x_zp = random.randint(-128, 127) if signed else random.randint(0, 255)
    lo, hi = (-128, 127) if random.randint(0, 1) else (0, 255)
    if random.randint(0, 3) == 0:
        b = [random.randint(-(1 << 29), 1 << 29) for _ in range(cout)]
    else:
        b = [random.randint(-5000, 5000) for _ in range(cout)]
    if kind == 2 or (kind in (3, 4, 8) and random.randint(0, 1)):
        if random.randint(0, 1):
            for i in range(nx + nw):
                Q[i] = random.choice((0, 1, 2, 127, 128, 129, 254, 255))
        # the fast requantization's bound (|acc| < 2**23) and requant_narrow's (2**24)
        b = [random.choice((1, -1)) * (random.choice((1 << 23, 1 << 24)) +
                                       random.randint(-3000, 3000)) for _ in range(cout)]
        r, crafted = edge_req(cout, x_zp, y_zp_for(lo), lo, hi)
    else:
        r, crafted = req(cout, x_zp, y_zp_for(lo), lo, hi)
        while kind == 6 and crafted and random.randint(0, 3):   # mostly the module's own
            r, crafted = req(cout, x_zp, y_zp_for(lo), lo, hi)
    I = array("i", b + r + [0] * (OH * OW))
    w_at, weights = nx, Q
    if random.randint(0, 1):
        before = random.randint(0, 40)
        w_at = before
        weights = bytes(random.getrandbits(8) for _ in range(before)) + bytes(Q[nx:nx + nw])
    args = (Q, nx + nw, 0, w_at, 0 if random.randint(0, 3) else -1, cout, cout + 4 + 2 * cout,
            n, groups, cin // groups, cout // groups, H, W, OH, OW, kh, kw, sh, sw, dh, dw, pt,
            pl, signed, 0, weights)
    return Q, I, args, crafted, 1


try:
    CONV_KINDS             # tests/test_board_natmod.py's direct-path check sets it
except NameError:
    CONV_KINDS = (0, 1, 3, 4, 5, 2, 3, 4)


def draw(done):
    if done % 2 == 0:
        case = (tie_case if done % 16 == 0 else gemm_case)()
    else:       # every eighth Conv case pointwise and another on the requantization's edges
        case = conv_case(CONV_KINDS[done % 16 // 2 % len(CONV_KINDS)])
    if case is None:
        return None
    Q, I, args, crafted, kind = case
    return (KERNELS[kind], I, args, crafted, (Q,),
            ("gemm", "conv")[kind] + repr(args[1:-1]) + (" crafted" if crafted else ""))


run_cases(480, draw)  # noqa: F821 (native_cases.py's)
