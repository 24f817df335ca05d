# The integer backward of a lookup-table activation (issue 22): a Relu / Clip that the int8
# conversion could not fuse into the layer before it (or another activation) runs as
# qlinear_lookup, Y[i] = table[X[i]]; its gradient is the output's gradient times the
# activation's slope at X[i]'s dequantized value, a value that depends on X's byte only.
#
#   int_lookup_grad   G_x[i] = G[i] * slopes[X[i]] (slopes: 256 int32, indexed by the raw
#                     byte as the forward's table is), renormalized to MANT_BITS; real
#                     unit u_G * slope_unit. The host writes |slopes| <= 2**SLOPE_BITS (a
#                     Relu / Clip: 0 outside the clamp, 2**SLOPE_BITS inside), so each
#                     product of a mantissa (|m| <= 2**MANT_BITS = 2**16) and a slope
#                     stays within 2**29: small ints on 32-bit ports.
#   int_clamp_grad    a layer the gradient passes whose bias does not train (a named
#                     parameter set, --requires-grad / --frozen): intgrad.py's
#                     int_clamp_bias_grad without the bias step - G *= mask, then
#                     G[c] *= s_w[c] / max(s_w), in place
#
# Gradient tensors as kernels/intgrad.py's: [e, then mantissas], real = mantissa * u * 2**e.
# Integer only, nothing allocated: runs under micropython.heap_lock().
from microtrain.kernels.fixedpoint import f32, requant, requant_pair
from microtrain.kernels.intgrad import MANT_BITS, _normalize, _record_unit, _unit
from microtrain.kernels.intsgd import derive_once, layer_scales

SLOPE_BITS = 29 - MANT_BITS     # 13


def int_lookup_grad(F, I, args):
    Q, gx, g, x, slopes, count, _ = args
    at = gx + 1
    for i in range(g + 1, g + 1 + count):
        I[at] = I[i] * I[slopes + Q[x]]
        at += 1
        x += 1
    I[gx] = I[g] + _normalize(I, gx, count)


def int_lookup_grad_check(args, c):
    count, = c.ints
    slope_unit, = c.floats
    c.positive(count)
    c.holds(0, 1 + count)
    c.holds(1, 1 + count)
    c.holds(2, count)
    c.holds(3, 256)
    c.role(3, "constant")
    c.apart(0, 1, 3)
    raw = c.blob.constant_data(c.tensors[3])
    if raw is None:
        c.fail("the slope table is not a constant with data")
    from array import array
    top = 1 << SLOPE_BITS
    for v in array("i", raw):       # products with the mantissas within 2**29
        c.within(v, -top, top, "slope")
    c.within(slope_unit, 1e-30, 1e30, "slope unit")
    unit, exp = _unit(c, 1)
    _record_unit(c, 0, f32(unit * slope_unit), exp)


def int_clamp_grad(F, I, args):
    # (the weight w gives its scales to the checker only: its buffer W is not read here)
    Q, g, mask, folds, w, m, channels, plane, W = args
    for c in range(channels):
        m0 = I[folds + 2 * c]
        shift = I[folds + 2 * c + 1]
        for i in range(m):
            at = (i * channels + c) * plane
            pg = g + 1 + at
            for p in range(at, at + plane):
                if (Q[mask + (p >> 3)] >> (p & 7)) & 1:
                    I[pg] = requant(I[pg], m0, shift)
                else:
                    I[pg] = 0
                pg += 1


def int_clamp_grad_check(args, c):
    m, channels, plane = c.ints
    c.positive(m, channels, plane)
    c.holds(0, 1 + m * channels * plane)
    c.holds(1, (m * channels * plane + 7) >> 3)
    c.holds(2, 2 * channels)
    c.apart(0, 2)
    _unit(c, 0)     # (the gradient's unit is unchanged: the fold keeps max(s_w)'s channel)
    sw = layer_scales(c, 1, 3, channels, True)[2]
    top = max(sw)
    folds = []
    for s in sw:    # int_clamp_bias_grad's fold: s_w[c] / max(s_w), a shift capped at 62
        m0, shift = requant_pair(f32(s / top), False)
        folds += [m0, shift if shift < 62 else 62]
    derive_once(c, 2, folds)
