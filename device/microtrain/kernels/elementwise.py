# Elementwise arithmetic. Binary ops broadcast through strides: the host collapses the
# output shape to (d0, d1, d2) and gives each input's stride per dimension (0 where the
# input is broadcast). The inner row is a plain loop; one call per row, never per element.
import math
from microtrain.kernels.activation import EXP_LIMIT


def _binary(row):
    # The kernel of a binary op, given its row: Y (d0, d1, d2) contiguous, A and B through
    # their strides; row(F, y, pa, sa, pb, sb, n) does one row of d2 elements.
    def kernel(F, I, args):
        y, a, b, d0, d1, d2, sa0, sa1, sa2, sb0, sb1, sb2 = args
        for i0 in range(d0):
            pa0 = a + i0 * sa0
            pb0 = b + i0 * sb0
            for i1 in range(d1):
                row(F, y, pa0 + i1 * sa1, sa2, pb0 + i1 * sb1, sb2, d2)
                y += d2
    return kernel


def _binary_check(args, c):
    y, a, b = c.offsets
    d0, d1, d2, sa0, sa1, sa2, sb0, sb1, sb2 = c.ints
    c.positive(d0, d1, d2)
    c.span(0, y, (d0, d1, d2), (d1 * d2, d2, 1))
    c.span(1, a, (d0, d1, d2), (sa0, sa1, sa2))
    c.span(2, b, (d0, d1, d2), (sb0, sb1, sb2))


def _unary_check(args, c):
    # y, x: both hold n elements
    n, = c.ints
    c.each_holds(2, n)


# Each binary op is written as its row (y contiguous, a and b `sa`, `sb` apart), which
# _binary turns into the op's kernel.

@_binary
def add(F, y, pa, sa, pb, sb, n):
    for y in range(y, y + n):
        F[y] = F[pa] + F[pb]
        pa += sa
        pb += sb


add_check = _binary_check


@_binary
def sub(F, y, pa, sa, pb, sb, n):
    for y in range(y, y + n):
        F[y] = F[pa] - F[pb]
        pa += sa
        pb += sb


sub_check = _binary_check


@_binary
def mul(F, y, pa, sa, pb, sb, n):
    for y in range(y, y + n):
        F[y] = F[pa] * F[pb]
        pa += sa
        pb += sb


mul_check = _binary_check


@_binary
def div(F, y, pa, sa, pb, sb, n):
    for y in range(y, y + n):
        d = F[pb]
        F[y] = F[pa] / d if d != 0.0 else _over_zero(F[pa], d)
        pa += sa
        pb += sb


div_check = _binary_check


def _over_zero(a, d):
    # a / +-0.0: Python raises ZeroDivisionError where float math gives +-inf (NaN for 0/0)
    if a != a or a == 0.0:
        return math.nan
    return math.inf if (a > 0.0) == (math.copysign(1.0, d) > 0.0) else -math.inf


def _pow_not_positive(v, p):
    # v ** p for v <= 0 (or NaN): Python raises for 0 ** -p and goes complex for a negative
    # v and a fractional p; float math gives inf and NaN.
    if v == 0.0 and p < 0.0:
        return math.copysign(math.inf, v) if p % 2.0 == 1.0 else math.inf
    if v < 0.0 and p % 1.0 != 0.0:
        return math.nan
    return _pow_positive(v, p)


def _pow_positive(v, p):
    # CPython raises OverflowError where float math gives inf (e.g. 1e30 ** 20.0)
    try:
        return v ** p
    except OverflowError:
        return math.inf


def expand(F, I, args):
    # Y = X broadcast to Y's shape (the gradient of a reduction).
    y, x, d0, d1, d2, sx0, sx1, sx2 = args
    for i0 in range(d0):
        for i1 in range(d1):
            px = x + i0 * sx0 + i1 * sx1
            for _ in range(d2):
                F[y] = F[px]
                y += 1
                px += sx2


def expand_check(args, c):
    y, x = c.offsets
    d0, d1, d2, sx0, sx1, sx2 = c.ints
    c.positive(d0, d1, d2)
    c.span(0, y, (d0, d1, d2), (d1 * d2, d2, 1))
    c.span(1, x, (d0, d1, d2), (sx0, sx1, sx2))


def copy(F, I, args):
    y, x, n = args
    for i in range(n):
        F[y + i] = F[x + i]


copy_check = _unary_check


def neg(F, I, args):
    y, x, n = args
    for i in range(n):
        F[y + i] = -F[x + i]


neg_check = _unary_check


def absolute(F, I, args):
    y, x, n = args
    for i in range(n):
        F[y + i] = abs(F[x + i])


absolute_check = _unary_check


def sign(F, I, args):
    y, x, n = args
    for i in range(n):
        v = F[x + i]
        F[y + i] = 1.0 if v > 0.0 else (-1.0 if v < 0.0 else 0.0)


sign_check = _unary_check


def exp(F, I, args):
    y, x, n = args
    e = math.exp
    for i in range(n):
        v = F[x + i]
        # past EXP_LIMIT float32 overflows (a board's math.exp raises; CPython's past 709)
        F[y + i] = e(v) if not v > EXP_LIMIT else math.inf


exp_check = _unary_check


def log(F, I, args):
    y, x, n = args
    ln = math.log
    for i in range(n):
        v = F[x + i]
        F[y + i] = ln(v) if v > 0.0 else (-math.inf if v == 0.0 else math.nan)


log_check = _unary_check


def sqrt(F, I, args):
    y, x, n = args
    root = math.sqrt
    for i in range(n):
        v = F[x + i]
        F[y + i] = root(v) if v >= 0.0 else math.nan


sqrt_check = _unary_check


def power(F, I, args):
    y, x, n, exponent = args
    if exponent == 2.0:
        for i in range(n):
            v = F[x + i]
            F[y + i] = v * v
    else:
        for i in range(n):
            v = F[x + i]
            F[y + i] = _pow_positive(v, exponent) if v > 0.0 else _pow_not_positive(v, exponent)


power_check = _unary_check


# -- Max, Min (folded pairwise by the host) and their gradient: ties share dY equally ---------

@_binary
def maximum(F, y, pa, sa, pb, sb, n):
    for y in range(y, y + n):
        a = F[pa]
        b = F[pb]
        F[y] = a if a >= b or a != a else b  # NaN wins, as in torch.maximum
        pa += sa
        pb += sb


maximum_check = _binary_check


@_binary
def minimum(F, y, pa, sa, pb, sb, n):
    for y in range(y, y + n):
        a = F[pa]
        b = F[pb]
        F[y] = a if a <= b or a != a else b
        pa += sa
        pb += sb


minimum_check = _binary_check


@_binary
def count_equal(F, y, pa, sa, pb, sb, n):
    # count += 1 where Y == X_i: how many inputs of Max / Min gave the output (one step per
    # input after the count is zeroed).
    for y in range(y, y + n):
        if F[pa] == F[pb]:
            F[y] += 1.0
        pa += sa
        pb += sb


count_equal_check = _binary_check


def tie_share(F, I, args):
    # dX_i (Y's shape) = dY / count where X_i == Y, else 0 (torch.amax / amin's split on ties;
    # count >= 1 wherever X_i == Y). dx, dy, y, count contiguous; X_i through strides.
    dx, dy, y, count, x, d0, d1, d2, sx0, sx1, sx2 = args
    i = 0
    for i0 in range(d0):
        for i1 in range(d1):
            px = x + i0 * sx0 + i1 * sx1
            for _ in range(d2):
                F[dx + i] = F[dy + i] / F[count + i] if F[px] == F[y + i] else 0.0
                i += 1
                px += sx2


def _walk_check(c, optional, contiguous, strided):
    # The gradients' walk over (d0, d1, d2): tensor arguments `optional` (when present)
    # and `contiguous` hold its d0*d1*d2 elements in order, the `strided` ones are read
    # through their strides (three ints each, after the counts).
    d0, d1, d2 = counts = c.ints[:3]
    c.positive(d0, d1, d2)
    n = d0 * d1 * d2
    for k in optional:
        if c.present(k):
            c.holds(k, n)
    for k in contiguous:
        c.holds(k, n)
    at = 3
    for k in strided:
        c.span(k, c.offsets[k], counts, c.ints[at:at + 3])
        at += 3


def tie_share_check(args, c):
    # dx, dy, y, count contiguous; x strided
    _walk_check(c, (), (0, 1, 2, 3), (4,))


# -- PRelu: y = x where x > 0, else slope * x, the slope broadcast ----------------------------

@_binary
def prelu(F, y, pa, sa, pb, sb, n):
    for y in range(y, y + n):
        v = F[pa]
        F[y] = v if v > 0.0 else v * F[pb]
        pa += sa
        pb += sb


prelu_check = _binary_check


def prelu_grad(F, I, args):
    # dx = dy where x > 0, else dy * slope; dslope (X's shape, summed over the broadcast
    # dimensions by the host) = 0 where x > 0, else dy * x. Either output may be absent (-1).
    dx, dslope, dy, x, slope, d0, d1, d2, ss0, ss1, ss2 = args
    i = 0
    for i0 in range(d0):
        for i1 in range(d1):
            ps = slope + i0 * ss0 + i1 * ss1
            for _ in range(d2):
                v = F[x + i]
                g = F[dy + i]
                if v > 0.0:
                    if dx >= 0:
                        F[dx + i] = g
                    if dslope >= 0:
                        F[dslope + i] = 0.0
                else:
                    if dx >= 0:
                        F[dx + i] = g * F[ps]
                    if dslope >= 0:
                        F[dslope + i] = g * v
                i += 1
                ps += ss2


def prelu_grad_check(args, c):
    # dx, dslope (either absent), dy, x contiguous; slope strided
    _walk_check(c, (0, 1), (2, 3), (4,))


# -- Pow with a tensor exponent (broadcast through strides, like the binary ops above) -------

@_binary
def power_tensor(F, y, pa, sa, pb, sb, n):
    for y in range(y, y + n):
        v = F[pa]
        p = F[pb]
        F[y] = _pow_positive(v, p) if v > 0.0 else _pow_not_positive(v, p)
        pa += sa
        pb += sb


power_tensor_check = _binary_check


def _log(v):
    # math.log raises where float math gives -inf (0) and NaN (negative)
    if v > 0.0:
        return math.log(v)
    return -math.inf if v == 0.0 else math.nan


def power_tensor_grad(F, I, args):
    # Y = X ** P: dX = dY * P * X ** (P - 1), 0 where P == 0; dP = dY * Y * ln(X), 0 where
    # X == 0 and P >= 0 (torch's pow backward; the limits where the formulas give NaN).
    # Both in Y's shape (the host sums them to X's and P's), either absent (-1); dy and y
    # contiguous, X and P through strides.
    dx, dp, dy, y, x, p, d0, d1, d2, sx0, sx1, sx2, sp0, sp1, sp2 = args
    i = 0
    for i0 in range(d0):
        for i1 in range(d1):
            px = x + i0 * sx0 + i1 * sx1
            pp = p + i0 * sp0 + i1 * sp1
            for _ in range(d2):
                v = F[px]
                e = F[pp]
                g = F[dy + i]
                if dx >= 0:
                    if e == 0.0:
                        F[dx + i] = 0.0
                    else:
                        e1 = e - 1.0
                        F[dx + i] = g * e * (_pow_positive(v, e1) if v > 0.0
                                             else _pow_not_positive(v, e1))
                if dp >= 0:
                    F[dp + i] = 0.0 if v == 0.0 and e >= 0.0 else g * F[y + i] * _log(v)
                i += 1
                px += sx2
                pp += sp2


def power_tensor_grad_check(args, c):
    # dx, dp (either absent), dy, y contiguous; x and p strided
    _walk_check(c, (0, 1), (2, 3), (4, 5))
