# Integer gradients through the rest of an int8 network (issue 22): residual Adds, pools, and
# tensors read by two layers, so that the sparse update's backward (kernels/intgrad.py) reaches
# every layer of a ResNet, a LeNet or an MLP, not only a chain of convolutions.
#
# Gradient tensors as intgrad.py's: [e, then mantissas], real = mantissa * unit * 2**e,
# |mantissa| <= 2**MANT_BITS, the unit fixed at load (blob.int_units: each checker records the
# unit of what its step writes), e chosen by the step that writes it. Steps are integer only
# and allocate nothing (they run under micropython.heap_lock()).
#
#   int_grad_sum           G = A + B: the two gradients of a tensor two layers read (a
#                          residual block's input feeds its body and its shortcut). The
#                          one of the smaller unit is brought to the larger unit by a
#                          derived multiplier (its unit over the other's, shifted by the
#                          exponents' difference), both rounded to a common exponent that
#                          keeps every term within 2**(MANT_BITS + 4), the sum renormalized
#                          to MANT_BITS.
#   int_add_grad           GA = GB = G where the Add's output lies strictly inside its clamp
#                          (lo < y < hi: its fused ReLU, or the int8 range), else 0 - the
#                          gradient of each input of y = a + b; GB optional (a branch that
#                          needs no gradient gets none)
#   int_concat_grad        G_x = X's part of G (the Concat's `blocks` runs of `size` at
#                          `offset`, `stride` apart: qlinear_concat's geometry), 0 where X's
#                          requantization to Y saturated: X outside [keep_lo, keep_hi], the
#                          bytes whose requantized value lies in Y's range (derived at load
#                          with the forward's multiplier; all of them for a plain copy), then
#                          renormalized
#   int_max_pool_grad      G_x = 0, then G_x[p] += G[q] for the first maximum p of each
#                          window q (qlinear_max_pool's windows and comparison)
#   int_average_pool_grad  G_x = 0, then G_x[p] += G[q] * 2**8 / count(q) over the elements
#                          p each window q counts (qlinear_average_pool's windows, so counts
#                          that vary at a padded edge are right); unit_x = unit / 2**8
# A pool's requantization clamp is taken as straight-through (an int8 pool of an int8 tensor
# saturates only where its input did).
import math

from microtrain.blob import INT8
from microtrain.kernels.fixedpoint import (f32, pairs_of, quantization, requant,
                                          requant_pair, round_shift)
from microtrain.kernels.intgrad import MANT_BITS, _normalize, _record_unit, _unit
from microtrain.kernels.intsgd import derive_once
from microtrain.kernels.qlinear import average_windows, max_windows

POOL_FRACTION = 8        # int_average_pool_grad's extra bits: 1 / count in 2**-8 steps
# the windows an element of int_average_pool_grad's output sums, each share at most
# 2**(MANT_BITS + POOL_FRACTION): below 2**30
MAX_AVERAGE_WINDOWS = (1 << (30 - MANT_BITS - POOL_FRACTION)) - 1


# -- a tensor read twice: the sum of its gradients ---------------------------------------
def int_grad_sum(F, I, args):
    g, a, b, ratio, count = args
    if I[ratio]:        # B has the larger unit: it is the reference
        a, b = b, a
    m0 = I[ratio + 1]
    s = I[ratio + 2] - (I[b] - I[a])     # B's mantissa in A's unit * 2**e_A: * m0 / 2**s
    up = 20 - s if s < 20 else 0         # then every term is within 2**(MANT_BITS + 4)
    for i in range(1, count + 1):        # (m0 < 2**24): 4 bits finer than the sum's
        va = I[a + i]                    # normalized mantissas
        if up:      # |va| <= 2**MANT_BITS: shifted MANT_BITS + 2 or more places it is 0
            va = round_shift(va, up) if up < MANT_BITS + 2 else 0
        vb = requant(I[b + i], m0, s + up) if s + up <= 62 else 0
        I[g + i] = va + vb
    I[g] = I[a] + up + _normalize(I, g, count)


def int_grad_sum_check(args, c):
    count, = c.ints
    c.positive(count)
    c.holds(0, 1 + count)
    c.holds(1, 1 + count)
    c.holds(2, 1 + count)
    c.holds(3, 3)
    c.apart(0, 3)       # the sum written while its multiplier is read
    # units u / 2**E (intgrad._unit): compared by their binary exponents, the ratio of the
    # smaller to the larger as a float32 mantissa ratio in (0.5, 2) and the exponents'
    # difference, which goes into the pair's shift (not capped: the kernel clamps)
    ua, ea = _unit(c, 1)
    ub, eb = _unit(c, 2)
    ma, xa = math.frexp(ua)
    mb, xb = math.frexp(ub)
    swap = 1 if (xb - eb, mb) > (xa - ea, ma) else 0
    small, large = ((ma, xa - ea), (mb, xb - eb)) if swap else ((mb, xb - eb), (ma, xa - ea))
    m0, shift = pairs_of([f32(small[0] / large[0])], False)
    derive_once(c, 3, [swap, m0, shift + large[1] - small[1]])
    _record_unit(c, 0, *_unit(c, 2 if swap else 1))


# -- a residual Add ----------------------------------------------------------------------
def int_add_grad(F, I, args):
    Q, ga, gb, g, y, count, lo, hi, y_signed = args
    fy = 128 if y_signed else 0
    I[ga] = I[g]
    if gb >= 0:
        I[gb] = I[g]
    for i in range(count):
        v = (Q[y + i] ^ fy) - fy
        t = I[g + 1 + i] if lo < v < hi else 0
        I[ga + 1 + i] = t
        if gb >= 0:
            I[gb + 1 + i] = t


def int_add_grad_check(args, c):
    count, lo, hi, y_signed = c.ints
    c.positive(count)
    c.within(y_signed, 0, 1, "signed flag")
    c.within(lo, -128, 255, "clamp bound")
    c.within(hi, -128, 255, "clamp bound")
    c.holds(0, 1 + count)
    c.holds(2, 1 + count)
    c.holds(3, count)
    unit = _unit(c, 2)
    _record_unit(c, 0, *unit)
    if c.present(1):
        c.holds(1, 1 + count)
        c.apart(1, 0)
        _record_unit(c, 1, *unit)


# -- a Concat ----------------------------------------------------------------------------
def int_concat_grad(F, I, args):
    Q, gx, g, x, y, keep, blocks, size, stride, offset, x_signed = args
    flip = 128 if x_signed else 0
    lo = I[keep]
    hi = I[keep + 1]
    out = gx + 1
    for b in range(blocks):
        at = g + 1 + offset + b * stride
        for i in range(x + b * size, x + (b + 1) * size):
            v = (Q[i] ^ flip) - flip
            I[out] = I[at] if lo <= v <= hi else 0
            out += 1
            at += 1
    I[gx] = I[g] + _normalize(I, gx, blocks * size)


def int_concat_grad_check(args, c):
    blocks, size, stride, offset, x_signed = c.ints
    c.positive(blocks, size, stride)
    c.within(offset, 0, stride - size, "offset")
    c.within(x_signed, 0, 1, "signed flag")
    c.holds(0, 1 + blocks * size)
    c.holds(1, 1 + blocks * stride)
    c.holds(2, blocks * size)
    c.holds(3, blocks * stride)
    c.holds(4, 2)
    c.apart(0, 1)
    # the X bytes qlinear_concat does not saturate: its requantization (the same
    # multiplier, the same rounding) of each byte X can hold, kept where inside Y's range
    sx, zx = quantization(c, 2)[:2]
    sy, zy = quantization(c, 3)[:2]
    m0, shift = requant_pair(f32(sx[0] / sy[0]))
    first = -128 if x_signed else 0
    y_lo, y_hi = (-128, 127) if c.blob.dtypes[c.tensors[3]] == INT8 else (0, 255)
    kept = [v for v in range(first, first + 256)
            if y_lo <= requant(v - zx[0], m0, shift) + zy[0] <= y_hi]
    derive_once(c, 4, [kept[0], kept[-1]] if kept else [1, 0])
    _record_unit(c, 0, *_unit(c, 1))


# -- pools -------------------------------------------------------------------------------
def int_max_pool_grad(F, I, args):
    Q, gx, g, x, planes, H, W, OH, OW, kH, kW, sH, sW, pT, pL, signed = args
    for i in range(gx + 1, gx + 1 + planes * H * W):
        I[i] = 0
    max_windows(Q, I, g + 1, x, gx + 1, planes, H, W, OH, OW, kH, kW, sH, sW, pT, pL, signed)
    I[gx] = I[g] + _normalize(I, gx, planes * H * W)


def int_max_pool_grad_check(args, c):
    planes, H, W, OH, OW, kH, kW, sH, sW, pT, pL, signed = c.ints
    _pool_check(c, planes, H, W, OH, OW, kH, kW, sH, sW, pT, pL)
    c.within(signed, 0, 1, "signed flag")
    c.holds(2, planes * H * W)
    # each element sums at most the windows that reach it: within 2**(MANT_BITS + 10)
    c.within(((kH + sH - 1) // sH) * ((kW + sW - 1) // sW), 1, 1024, "windows per element")
    _record_unit(c, 0, *_unit(c, 1))


def int_average_pool_grad(F, I, args):
    (gx, g, factors, planes, H, W, OH, OW, kH, kW, sH, sW, pT, pL, ch0, ch1, cw0,
     cw1) = args
    for i in range(gx + 1, gx + 1 + planes * H * W):
        I[i] = 0
    average_windows(None, I, g + 1, -1, gx + 1, planes, H, W, OH, OW, kH, kW, sH, sW, pT, pL,
                    ch0, ch1, cw0, cw1, factors, 0)
    I[gx] = I[g] + _normalize(I, gx, planes * H * W)


def int_average_pool_grad_check(args, c):
    planes, H, W, OH, OW, kH, kW, sH, sW, pT, pL, ch0, ch1, cw0, cw1 = c.ints
    _pool_check(c, planes, H, W, OH, OW, kH, kW, sH, sW, pT, pL)
    c.within(ch0, -pT, 0, "first counted row")
    c.within(cw0, -pL, 0, "first counted column")
    c.within(ch1, H, H + kH, "counted rows")
    c.within(cw1, W, W + kW, "counted columns")
    c.within(((kH + sH - 1) // sH) * ((kW + sW - 1) // sW), 1, MAX_AVERAGE_WINDOWS,
             "windows per element")
    c.holds(2, 2 * kH * kW)
    c.apart(0, 2)
    # 2**8 / count for counts 1 .. kH * kW: a share within 2**(MANT_BITS + 8)
    derive_once(c, 2, pairs_of(f32((1 << POOL_FRACTION) / n) for n in range(1, kH * kW + 1)))
    unit, exp = _unit(c, 1)
    _record_unit(c, 0, f32(unit / (1 << POOL_FRACTION)), exp)


def _pool_check(c, planes, H, W, OH, OW, kH, kW, sH, sW, pT, pL):
    c.positive(planes, H, W, OH, OW, kH, kW, sH, sW)
    c.within(pT, 0, kH - 1, "top padding")
    c.within(pL, 0, kW - 1, "left padding")
    c.within((OH - 1) * sH - pT, 0, H - 1, "windows")     # every window starts in the image
    c.within((OW - 1) * sW - pL, 0, W - 1, "windows")
    c.holds(0, 1 + planes * H * W)
    c.holds(1, 1 + planes * OH * OW)
    c.apart(0, 1)
