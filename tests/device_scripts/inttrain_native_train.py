# tests/test_board_natmod_train.py's check of the native module's other integer training
# kernels of kernels/inttrain.py (device/native/inttrain_native.c): int_gemm_grad_input,
# int_conv1x1_update and int_gemm_update_momentum on the board, the pure-Python ones in
# CPython's run of this script (PURE = True; tests/micropython_random.py as `random`: the
# same cases), CASES random cases each (KERNELS: which), their CRC-32s of the int and byte
# arenas compared. Geometries: batches 1-5, 1-40 inputs, 1-40 outputs for the input
# gradient (beyond 31: intwide.py's exact sums, the pure kernel's path), 1x1 convolutions
# of 1-12 in and 1-8 out channels over 1-40 positions (a quarter over 100-300 at batch 2-3:
# the native kernel's clamp mask on the stack holds 512); int8 and uint8
# inputs and outputs. Values: gradients up to 2**14 and beyond (2**22, 2**29: the fallback),
# D of any int32 (mantissa shifts up to 32), multipliers of few bits (exact halves) and
# large ones with small shifts (requant_narrow's saturation at 2**29), shifts 0-70,
# velocities at and near their clamps, momenta 0 .. 1 - 2**-14, unused biases, biases at the
# clamp, generator states 0 (unseeded), 16-bit and beyond, no generator (-1). Crafted cases
# (multipliers outside [0, 2**24], gradients or zero points beyond the module's domain) go
# to the pure kernel: counted as "fallback". Input gradients whose sums leave the int32
# arena (the board's array store keeps their low 32 bits, CPython's raises) are compared on
# the board with its own pure kernel ("different": how many differ; CPython prints
# "crafted" for them). Prints "case NAME I CRC" per case and "NAME cases N fallback F
# different D" per kernel.
import gc
import random
from array import array
from binascii import crc32

from microtrain.kernels import inttrain, intwide

random.seed(2411)
inttrain.intwide = intwide      # (the checker of a wide layer loads it)
try:
    CASES
except NameError:
    CASES = 200
try:
    KERNELS
except NameError:
    KERNELS = ("int_gemm_grad_input", "int_conv1x1_update", "int_gemm_update_momentum")
UNUSED = -(1 << 23) - 1
OUTSIDE = (-1, (1 << 24) + 1)       # multipliers the module hands to the pure kernel


def multiplier():
    kind = random.randint(0, 9)
    if kind == 0:
        return random.choice((1 << 23, 3 << 22, 5 << 21, 1 << 24, 1, 0)), random.randint(0, 70)
    if kind == 1:       # large multipliers, small shifts: results of 2**29 and more
        return random.randint(1 << 22, 1 << 24), random.randint(0, 23)
    if kind == 2:       # few bits: exact halves
        return random.randint(1, 7) << random.randint(0, 20), random.randint(1, 40)
    return random.randint(1, 1 << 24), random.randint(9, 40)


def state():
    return random.choice((0, random.randint(1, 0xFFFF), random.randint(1, 0xFFFF),
                          random.choice((1, -1)) * (random.getrandbits(16) << 15)))


def signed_bytes(count):
    Q = bytearray(random.getrandbits(8) for _ in range(count))
    if random.randint(0, 4) == 0:
        for i in range(count):
            Q[i] = random.choice((0, 1, 127, 128, 129, 255))
    return Q


def biases(n):
    return [random.choice((random.randint(-(1 << 23), 1 << 23), UNUSED, 1 << 23, -(1 << 23),
                           random.randint(-300, 300))) for _ in range(n)]


def zero_point(signed):
    return random.randint(-128, 127) if signed else random.randint(0, 255)


def case_grad_input():
    # (Q, d, g, w, factors, m, k, n): D [m, k] first in I, then g [m, n], the factors
    m, k = random.randint(1, 5), random.randint(1, 40)
    n = random.randint(1, 31) if random.randint(0, 5) else random.randint(32, 40)
    W = signed_bytes(n * k)
    factors = []
    if random.randint(0, 2):      # as the checker derives them: factors of at most 16
        top = random.choice((3, 300, 1 << 14, 1 << 14))
        for _ in range(n):
            factors += [random.choice((random.randint(1, 1 << 24), 1 << 23, 1 << 24,
                                       random.randint(1, 7) << random.randint(0, 20))),
                        random.randint(20, 40)]
    else:
        top = random.choice((3, 300, 1 << 14, 1 << 17, 1 << 22, (1 << 29) + 5))
        for _ in range(n):
            factors += multiplier()
    g = [random.randint(-top, top) for _ in range(m * n)]
    crafted = top > 1 << 29 or n > 31
    if random.randint(0, 30) == 0:
        factors[2 * random.randint(0, n - 1)] = random.choice(OUTSIDE)
        crafted = True
    # D's bound: does a sum leave the int32 arena? (then compared on the board)
    bound = 0
    for j in range(n):
        m0, shift = factors[2 * j], max(1, factors[2 * j + 1])
        bound += min(((top * abs(m0)) >> shift) + 1, 1 << 29) * 128
    wraps = bound >= 1 << 31 or crafted
    I = array("i", [0] * (m * k) + g + factors)
    return W, I, (W, 0, m * k, 0, m * k + m * n, m, k, n), crafted, wraps


def case_conv1x1():
    # (Q, w, bias, x, y, d, req, rates, random, m, cin, cout, plane, x_signed, y_signed)
    m, cin, cout = random.randint(1, 3), random.randint(1, 12), random.randint(1, 8)
    plane = random.randint(1, 40)
    if random.randint(0, 3) == 0:     # beyond the mask's 512 bytes at batch 2-3
        m, plane = random.randint(2, 3), random.randint(100, 300)
    x_signed, y_signed = random.randint(0, 1), random.randint(0, 1)
    Q = signed_bytes(cout * cin) + signed_bytes(m * cin * plane) + signed_bytes(
        m * cout * plane)
    x, y = cout * cin, cout * cin + m * cin * plane
    x_zp = zero_point(x_signed)
    crafted = False
    if random.randint(0, 25) == 0:       # beyond the module's exact sums
        x_zp = random.choice((70000, -70000, 1 << 20))
        crafted = True
    kind = random.randint(0, 3)
    if kind == 0:
        D = [random.choice((1, -1)) * random.getrandbits(random.randint(0, 31))
             for _ in range(m * cout)]
    elif kind == 1:     # few bits: exact halves when shifted
        D = [random.choice((-1, 1)) * (random.randint(0, 15) << random.randint(0, 26))
             for _ in range(m * cout)]
    else:
        top = random.choice((1, 255, 1 << 12, 1 << 16, 1 << 20))
        D = [random.randint(-top, top) for _ in range(m * cout)]
    if random.randint(0, 15) == 0:
        D[0] = random.choice((-(1 << 31), (1 << 31) - 1))
    y_lo, y_hi = (-128, 127) if y_signed else (0, 255)
    lo = random.choice((y_lo - 1, y_lo, random.randint(y_lo, y_hi)))
    hi = random.choice((y_hi + 1, y_hi, random.randint(y_lo, y_hi)))
    req = [0, 0, lo, hi]
    rates = [x_zp]
    limit = (1 << 24) // (m * plane * 255) + 1
    for c in range(cout):
        step = multiplier()
        if plane >= 100:
            # weight steps of ~1-255 quanta (most random rates clamp or zero them): the
            # shift past _mantissa's e of the channel
            top, e = max(abs(D[i * cout + c]) for i in range(m)), 0
            while top >= limit:
                top >>= 1
                e += 1
            step = (random.randint(1 << 23, 1 << 24), e + random.randint(36, 44))
        rates += step + multiplier()
    if random.randint(0, 30) == 0:
        rates[1 + random.randint(0, 4 * cout - 1) // 2 * 2] = random.choice(OUTSIDE)
        crafted = True
    bias = [random.choice((random.randint(-(1 << 23), 1 << 23), 1 << 23, -(1 << 23),
                           random.randint(-300, 300))) for _ in range(cout)]
    I = array("i", bias + D + req + rates + [state()])
    gen = len(I) - 1 if random.randint(0, 3) else -1
    d = cout
    args = (Q, 0, 0, x, y, d, d + m * cout, d + m * cout + 4, gen, m, cin, cout, plane,
            x_signed, y_signed)
    return Q, I, args, crafted, False


def case_momentum():
    # (Q, w, bias, x, g, rates, random, vw, vb, m, k, n, x_signed, mu)
    m, k, n = random.randint(1, 5), random.randint(1, 40), random.randint(1, 10)
    signed = random.randint(0, 1)
    x_zp = zero_point(signed)
    V = bytearray()
    for _ in range(n * k):
        v = random.choice((random.randint(-32767, 32767), 32767, -32767, 32766, -32766,
                           random.randint(-300, 300), 0))
        V += bytearray((v & 255, (v >> 8) & 255))
    Q = signed_bytes(n * k) + signed_bytes(m * k) + V
    w, x, vw = 0, n * k, n * k + m * k
    top = random.choice((3, 300, 1 << 10, 1 << 14, 1 << 14, 1 << 14, 1 << 22))
    g = [random.randint(-top, top) for _ in range(m * n)]
    crafted = top == 1 << 22
    rates = [x_zp]
    for _ in range(n):
        rates += multiplier() + multiplier()
    if random.randint(0, 40) == 0:
        rates[1 + random.randint(0, 4 * n - 1) // 2 * 2] = random.choice(OUTSIDE)
        crafted = True
    vb = [random.choice((random.randint(-(1 << 23), 1 << 23), 1 << 23, -(1 << 23),
                         (1 << 23) - 1, random.randint(-300, 300), 0)) for _ in range(n)]
    mu = random.choice((0, 16383, 8192, 14746, random.randint(0, 16383)))
    I = array("i", biases(n) + g + rates + vb + [state()])
    gen = len(I) - 1 if random.randint(0, 3) else -1
    g0 = n
    r0 = g0 + m * n
    args = (Q, w, 0, x, g0, r0, gen, vw, r0 + 1 + 4 * n, m, k, n, signed, mu)
    return Q, I, args, crafted, False


MAKE = {"int_gemm_grad_input": case_grad_input, "int_conv1x1_update": case_conv1x1,
        "int_gemm_update_momentum": case_momentum}
for name in KERNELS:
    kernel = kernel_of(inttrain, name)  # noqa: F821 (native_oracle.py's)
    cases = fallback = wrapped_different = 0
    while cases < CASES:
        seed = random.getrandbits(30)
        gc.collect()
        random.seed(seed)
        Q, I, args, crafted, wraps = MAKE[name]()
        if PURE and wraps:
            result = "crafted"    # CPython's array raises where the board's wraps: below
        else:
            kernel(None, I, args)
            result = "%d/%d" % (crc32(I, crc32(Q)), len(I))
        if wraps and not PURE:    # the board's own pure kernel on the same case
            Q = I = args = None
            gc.collect()
            random.seed(seed)
            Q, I, args, crafted, wraps = MAKE[name]()
            inttrain._pure[name](None, I, args)
            wrapped_different += result != "%d/%d" % (crc32(I, crc32(Q)), len(I))
        cases += 1
        fallback += crafted
        print("case", name, cases, result, "seed %d" % seed if PURE else "")
        Q = I = args = None
    print(name, "cases", cases, "fallback", fallback, "different", wrapped_different)
