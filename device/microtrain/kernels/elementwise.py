# Elementwise arithmetic. Binary ops broadcast through strides: the host collapses the
# output shape to (d0, d1, d2) and gives each input's stride per dimension (0 where the
# input is broadcast). The inner row is a plain loop; one call per row, never per element.
import math


def _each_row(F, args, row):
    y, a, b, d0, d1, d2, sa0, sa1, sa2, sb0, sb1, sb2 = args
    for i0 in range(d0):
        pa0 = a + i0 * sa0
        pb0 = b + i0 * sb0
        for i1 in range(d1):
            row(F, y, pa0 + i1 * sa1, sa2, pb0 + i1 * sb1, sb2, d2)
            y += d2


def _binary_check(args, c):
    y, a, b, d0, d1, d2, sa0, sa1, sa2, sb0, sb1, sb2 = args
    c.positive(d0, d1, d2)
    c.span(0, y, (d0, d1, d2), (d1 * d2, d2, 1))
    c.span(1, a, (d0, d1, d2), (sa0, sa1, sa2))
    c.span(2, b, (d0, d1, d2), (sb0, sb1, sb2))


def _unary_check(args, c):
    # y, x, n: both hold n elements
    c.each_holds(2, args[2])


def _add_row(F, y, pa, sa, pb, sb, n):
    for _ in range(n):
        F[y] = F[pa] + F[pb]
        y += 1
        pa += sa
        pb += sb


def _sub_row(F, y, pa, sa, pb, sb, n):
    for _ in range(n):
        F[y] = F[pa] - F[pb]
        y += 1
        pa += sa
        pb += sb


def _mul_row(F, y, pa, sa, pb, sb, n):
    for _ in range(n):
        F[y] = F[pa] * F[pb]
        y += 1
        pa += sa
        pb += sb


def _div_row(F, y, pa, sa, pb, sb, n):
    for _ in range(n):
        d = F[pb]
        F[y] = F[pa] / d if d != 0.0 else _over_zero(F[pa], d)
        y += 1
        pa += sa
        pb += sb


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


def add(F, I, args):
    _each_row(F, args, _add_row)


add_check = _binary_check


def sub(F, I, args):
    _each_row(F, args, _sub_row)


sub_check = _binary_check


def mul(F, I, args):
    _each_row(F, args, _mul_row)


mul_check = _binary_check


def div(F, I, args):
    _each_row(F, args, _div_row)


div_check = _binary_check


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
    y, x, d0, d1, d2, sx0, sx1, sx2 = args
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
        # float32 overflows past 88.72; CPython's math.exp would raise past 709.
        F[y + i] = e(v) if v < 88.8 else math.inf


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
