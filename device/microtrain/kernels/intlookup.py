# The integer backward of a lookup-table activation (issue 22): a Relu / Clip that the int8
# conversion could not fuse into the layer before it (or another activation) runs as
# qlinear_lookup, Y[i] = table[X[i]]; its gradient is the output's gradient times the
# activation's slope at X[i]'s dequantized value, a value that depends on X's byte only.
#
#   int_lookup_grad   G_x[i] = G[i] * slopes[X[i]] (slopes: 256 int32, indexed by the raw
#                     byte as the forward's table is), renormalized to MANT_BITS; real
#                     unit u_G * slope_unit. The host writes |slopes| <= 2**SLOPE_BITS (a
#                     Relu / Clip: 0 outside the clamp, 2**SLOPE_BITS inside), so each
#                     product stays below 2**28: small ints on 32-bit ports.
#
# Gradient tensors as kernels/intgrad.py's: [e, then mantissas], real = mantissa * u * 2**e.
# Integer only, nothing allocated: runs under micropython.heap_lock().
from microtrain.kernels.fixedpoint import f32
from microtrain.kernels.intgrad import _normalize, _record_unit, _unit

SLOPE_BITS = 15


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
    for v in array("i", raw):       # products of 13-bit mantissas below 2**28
        c.within(v, -top, top, "slope")
    c.within(slope_unit, 1e-30, 1e30, "slope unit")
    unit, exp = _unit(c, 1)
    _record_unit(c, 0, f32(unit * slope_unit), exp)
