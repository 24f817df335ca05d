# Smooth activations, forward and backward side by side: the exponential-linear units (Elu,
# Selu, Celu: one kernel), Gelu (exact and tanh approximation), Erf, Softsign. Backward
# kernels read the forward *input* x.
import math

_TWO_OVER_SQRT_PI = 1.1283791670955126
_INV_SQRT2 = 0.7071067811865476
_INV_SQRT_2PI = 0.3989422804014327
_SQRT_2_OVER_PI = 0.7978845608028654
_CUBIC = 0.044715          # the tanh approximation's cubic coefficient (as torch's)


def _erf_without_libm(x):
    # For ports built without MICROPY_PY_MATH_SPECIAL_FUNCTIONS. Near 0 the Taylor series
    # (relative error ~1e-16 within 8 terms for |x| < 0.5), elsewhere 1 - erfc with erfc
    # from the Chebyshev fit of Numerical Recipes (section 6.2), whose fractional error is
    # below 1.2e-7 everywhere: float32 accuracy.
    z = abs(x)
    if z < 0.5:
        x2 = x * x
        term = x
        total = x
        for n in range(1, 10):
            term *= -x2 / n
            total += term / (2 * n + 1)
        return _TWO_OVER_SQRT_PI * total
    t = 1.0 / (1.0 + 0.5 * z)
    poly = -1.26551223 + t * (1.00002368 + t * (0.37409196 + t * (0.09678418 + t * (
        -0.18628806 + t * (0.27886807 + t * (-1.13520398 + t * (1.48851587 + t * (
            -0.82215223 + t * 0.17087277))))))))
    erfc = t * math.exp(-z * z + poly)
    return 1.0 - erfc if x > 0.0 else erfc - 1.0


erf_function = getattr(math, "erf", _erf_without_libm)


def _unary_check(args, c):
    # y, x, n, ...: both hold n elements
    c.each_holds(2, c.ints[0])


def _grad_check(args, c):
    # dx, dy, x, n, ...: all three hold n elements
    c.each_holds(3, c.ints[0])


# -- Elu, Selu, Celu: y = scale * (x if x > 0 else alpha * (exp(k * x) - 1)) ----------------
# Elu: scale 1, k 1. Selu: scale gamma, k 1. Celu: scale 1, k 1 / alpha. k > 0 (checked), so
# exp(k * x) <= 1 on the branch that takes it: no overflow.

def exp_linear(F, I, args):
    y, x, n, alpha, scale, k = args
    e = math.exp
    for i in range(n):
        v = F[x + i]
        F[y + i] = scale * v if v > 0.0 else scale * alpha * (e(k * v) - 1.0)


def _exp_linear_check(c):
    alpha, scale, k = c.floats
    c.within(alpha, -3e38, 3e38, "alpha")
    c.within(scale, -3e38, 3e38, "scale")
    c.within(k, 1e-30, 3e38, "input scale")


def exp_linear_check(args, c):
    _unary_check(args, c)
    _exp_linear_check(c)


def exp_linear_grad(F, I, args):
    # dx = dy * scale where x > 0, dy * scale * alpha * k * exp(k * x) where x <= 0 (torch's
    # side at x = 0)
    dx, dy, x, n, alpha, scale, k = args
    e = math.exp
    slope = scale * alpha * k
    for i in range(n):
        v = F[x + i]
        F[dx + i] = F[dy + i] * (scale if v > 0.0 else slope * e(k * v))


def exp_linear_grad_check(args, c):
    _grad_check(args, c)
    _exp_linear_check(c)


# -- Erf, Gelu ------------------------------------------------------------------------------

def erf(F, I, args):
    y, x, n = args
    f = erf_function
    for i in range(n):
        F[y + i] = f(F[x + i])


erf_check = _unary_check


def erf_grad(F, I, args):
    # dx = dy * 2 / sqrt(pi) * exp(-x^2)
    dx, dy, x, n = args
    e = math.exp
    for i in range(n):
        v = F[x + i]
        F[dx + i] = F[dy + i] * _TWO_OVER_SQRT_PI * e(-v * v)


erf_grad_check = _grad_check


def gelu(F, I, args):
    # approximate 0: x/2 * (1 + erf(x / sqrt 2)); 1: x/2 * (1 + tanh(sqrt(2/pi) (x + c x^3)))
    y, x, n, approximate = args
    if approximate:
        t = math.tanh
        for i in range(n):
            v = F[x + i]
            F[y + i] = 0.5 * v * (1.0 + t(_SQRT_2_OVER_PI * (v + _CUBIC * v * v * v)))
    else:
        f = erf_function
        for i in range(n):
            v = F[x + i]
            F[y + i] = 0.5 * v * (1.0 + f(v * _INV_SQRT2))


def gelu_check(args, c):
    _unary_check(args, c)
    c.within(c.ints[1], 0, 1, "approximate")


def gelu_grad(F, I, args):
    dx, dy, x, n, approximate = args
    e = math.exp
    if approximate:
        t = math.tanh
        for i in range(n):
            v = F[x + i]
            h = t(_SQRT_2_OVER_PI * (v + _CUBIC * v * v * v))
            slope = 0.5 * (1.0 + h) + 0.5 * v * (1.0 - h * h) * _SQRT_2_OVER_PI * (
                1.0 + 3.0 * _CUBIC * v * v)
            F[dx + i] = F[dy + i] * slope
    else:
        f = erf_function
        for i in range(n):
            v = F[x + i]
            slope = 0.5 * (1.0 + f(v * _INV_SQRT2)) + v * _INV_SQRT_2PI * e(-0.5 * v * v)
            F[dx + i] = F[dy + i] * slope


def gelu_grad_check(args, c):
    _grad_check(args, c)
    c.within(c.ints[1], 0, 1, "approximate")


# -- Softsign: y = x / (1 + |x|) --------------------------------------------------------------

def softsign(F, I, args):
    y, x, n = args
    for i in range(n):
        v = F[x + i]
        F[y + i] = v / (1.0 + abs(v))


softsign_check = _unary_check


def softsign_grad(F, I, args):
    # dx = dy / (1 + |x|)^2
    dx, dy, x, n = args
    for i in range(n):
        d = 1.0 + abs(F[x + i])
        F[dx + i] = F[dy + i] / (d * d)


softsign_grad_check = _grad_check
