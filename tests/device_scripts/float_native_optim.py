# The native float updates (device/native/float: sgd, sgd_general, adamw, adamw_general,
# accumulate) against kernels/optim.py's pure-Python kernels on the same board (single-
# precision floats): random sizes, hyper-parameters and data of several magnitudes
# (parameters, gradients from tiny to huge, moments; a few negative or huge second moments
# and gradients that overflow: the elements the kernels refuse and count; in one region of
# five subnormals, zeros, infinities and NaNs: sprinkle), clipping
# coefficients, L1/L2 penalties, momentum with and without Nesterov, first steps and later
# ones, lazy resets. F compared byte for byte (but a NaN equals any NaN, as in
# float_native.py) and optim.refused's count after each call. CASES cases in turn over the
# five kernels. Prints "fast B", then "cases N different D refused R".
import random
from array import array
from microtrain.kernels import optim
from microtrain.kernels import float_native as native

random.seed(2024)
pure = optim._pure
print("fast", optim.adamw is native.adamw and optim.sgd_general is native.sgd_general)


def f32(x):
    return array("f", [x])[0]


def bits(scale):
    e = 127 + scale + random.randint(-3, 3)
    e = 1 if e < 1 else (254 if e > 254 else e)
    return random.getrandbits(1) << 31 | e << 23 | random.getrandbits(23)


def region(words, start, n, scale, zeros=False, positive=False):
    for i in range(start, start + n):
        w = bits(scale)
        if positive:
            w &= 0x7FFFFFFF
        if zeros and random.getrandbits(3) == 0:
            w = 0
        words[i] = w


def same(F1, F2):
    if bytes(F1) == bytes(F2):
        return True
    for i in range(len(F1)):
        x, y = F1[i], F2[i]
        if not (x == y or (x != x and y != y)) or (x == 0.0 and bytes(F1[i:i + 1])
                                                      != bytes(F2[i:i + 1])):
            return False
    return True


def check(kernel, words, args):
    F = array("f", bytes(words))
    F1 = array("f", F)
    F2 = array("f", F)
    before = optim.refused
    pure[kernel](F1, None, args)
    refused_pure = optim.refused - before
    before = optim.refused
    getattr(native, kernel)(F2, None, args)
    refused_native = optim.refused - before
    return (not same(F1, F2)) or refused_pure != refused_native, refused_pure


def edge():
    # one float32 at the ends of the format: a subnormal, a zero, an infinity, a NaN (any
    # payload), the largest finite, the smallest normal; either sign
    kind = random.randint(0, 5)
    w = (random.getrandbits(23) or 1, 0, 0x7F800000, 0x7F800000 | (random.getrandbits(22) or 1)
         | random.getrandbits(1) << 22, 0x7F7FFFFF, 0x00800000)[kind]
    return random.getrandbits(1) << 31 | w


def sprinkle(words, start, count):
    # in one case of 5, edge values among the region's: 1 in 4, 16 or 64
    if random.randint(0, 4) == 0:
        every = random.choice((4, 16, 64))
        for i in range(start, start + count):
            if random.randrange(every) == 0:
                words[i] = edge()


def arena(n, extra):
    # parameter, gradient, two state tensors of n elements, then the scalars
    words = array("I", bytes(4 * (4 * n + extra)))
    region(words, 0, n, random.randint(-8, 4), zeros=True)             # parameters
    g_scale = random.choice((-30, -12, -4, 0, 6, 60))
    region(words, n, n, g_scale, zeros=True)                           # gradients
    region(words, 2 * n, n, g_scale - 2)                               # first moment
    region(words, 3 * n, n, 2 * g_scale - 4, positive=True)            # second moment
    if random.getrandbits(2) == 0:                                     # crafted elements
        for _ in range(3):
            i = random.randrange(n)
            words[n + i] = 0x7F000000 | random.getrandbits(23)         # huge gradient
            words[3 * n + random.randrange(n)] |= 0x80000000           # negative moment
        words[n + random.randrange(n)] = 0x7F800000 | random.getrandbits(1) << 31   # inf
    for start in range(0, 4 * n, n):                                   # edge values
        sprinkle(words, start, n)
    return words


def scalars(words, at, values):
    for i, v in enumerate(values):
        words[at + i] = array("I", bytes(array("f", [v])))[0]


def lr():
    return f32(random.choice((0.001, 0.01, 0.1, 1.0)) * random.uniform(0.5, 2.0))


def sgd_case(n):
    words = arena(n, 1)
    scalars(words, 4 * n, [lr()])
    return check("sgd", words, (0, n, 4 * n, n))


def adam_hyper():
    return (f32(random.choice((0.9, 0.5, 0.0, 0.99))), f32(random.choice((0.999, 0.9, 0.0))),
            f32(random.choice((1e-8, 1e-6, 1e-3, 1e-30))),
            f32(random.choice((0.0, 0.01, 0.1, 1e-4))))


def adamw_case(n):
    words = arena(n, 2)
    scalars(words, 4 * n, [lr(), f32(random.uniform(1e-4, 1.0))])    # lr, step size
    return check("adamw", words, (0, n, 2 * n, 3 * n, 4 * n, 4 * n + 1, n) + adam_hyper())


def penalties():
    return (f32(random.choice((0.0, 0.0, 1e-4, 0.01))),
            f32(random.choice((0.0, 0.0, 1e-3, 0.05))))


def adamw_general_case(n):
    words = arena(n, 3)
    scalars(words, 4 * n, [lr(), f32(random.uniform(1e-4, 1.0)), f32(random.uniform(0.1, 1.0))])
    coef = 4 * n + 2 if random.getrandbits(1) else -1
    return check("adamw_general", words, (0, n, 2 * n, 3 * n, 4 * n, 4 * n + 1, coef, n)
                 + adam_hyper() + penalties())


def sgd_general_case(n):
    words = arena(n, 3)
    step = random.choice((1.0, 1.0, 2.0, 7.0))
    scalars(words, 4 * n, [lr(), step, f32(random.uniform(0.1, 1.0))])
    buf = 2 * n if random.randint(0, 3) else -1
    coef = 4 * n + 2 if random.getrandbits(1) else -1
    momentum = f32(random.choice((0.0, 0.9, 0.5)))
    dampening = f32(random.choice((0.0, 0.1, -0.5)))
    weight_decay = f32(random.choice((0.0, 1e-4, 0.01)))
    return check("sgd_general", words, (0, n, 4 * n, 4 * n + 1, buf, coef, n,
                                        random.getrandbits(1), momentum, dampening,
                                        weight_decay) + penalties())


def accumulate_case(n):
    words = arena(n, 1)
    scalars(words, 4 * n, [random.choice((0.0, 1.0))])
    return check("accumulate", words, (0, n, 4 * n, n))


different = refused = 0
kinds = (sgd_case, adamw_case, sgd_general_case, adamw_general_case, accumulate_case)
for case in range(CASES):  # noqa: F821 (prepended by the test)
    n = random.choice((1, 2, 3, 10, 17, 64))
    d, r = kinds[case % 5](n)
    different += d
    refused += r
print("cases", CASES, "different", different, "refused", refused)  # noqa: F821
