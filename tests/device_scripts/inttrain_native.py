# tests/test_board_natmod.py's integer update check: the native module's int_gemm_update
# (device/native/inttrain_native.c) on the board, kernels/inttrain.py's pure-Python kernel
# in CPython's run of this script (PURE = True; tests/micropython_random.py as `random`: the
# same cases), each case's CRC-32s of Q and I compared, on random geometries (batch 1-5,
# 1-40 inputs, 1-10 outputs), int8 and uint8 inputs, gradients of every size up to 2**14
# (and some far beyond: the pure kernel's fallback), multipliers of few bits (exact halves),
# shifts 0-70 (below 24 with large multipliers: requant_narrow's saturation at 2**29; above
# 8: the stochastic step), unused biases, biases at their clamp, generator states 0
# (unseeded), 16-bit and beyond. Prints "case N CRC" per case, then "cases N fallback F".
import random
from array import array
from microtrain.kernels import inttrain

random.seed(5)
update = kernel_of(inttrain, "int_gemm_update")  # noqa: F821 (native_oracle.py's)
UNUSED = -(1 << 23) - 1


def multiplier():
    kind = random.randint(0, 9)
    if kind == 0:
        return random.choice((1 << 23, 3 << 22, 5 << 21, 1 << 24, 1, 0)), random.randint(0, 70)
    if kind == 1:       # large multipliers, small shifts: steps of 2**29 and more
        return random.randint(1 << 22, 1 << 24), random.randint(0, 23)
    return random.randint(1, 1 << 24), random.randint(9, 40)


def case():
    m, k, n = random.randint(1, 5), random.randint(1, 40), random.randint(1, 10)
    signed = random.randint(0, 1)
    x_zp = random.randint(-128, 127) if signed else random.randint(0, 255)
    Q = bytearray(random.getrandbits(8) for _ in range(n * k + m * k))
    if random.randint(0, 4) == 0:
        for i in range(len(Q)):
            Q[i] = random.choice((0, 1, 127, 128, 129, 255))
    w, x = 0, n * k
    bias = [random.choice((random.randint(-(1 << 23), 1 << 23), UNUSED, 1 << 23, -(1 << 23),
                           random.randint(-300, 300))) for _ in range(n)]
    top = random.choice((3, 300, 1 << 10, 1 << 14, 1 << 14, 1 << 14, 1 << 22))
    g = [random.randint(-top, top) for _ in range(m * n)]
    rates = [x_zp]
    crafted = top == 1 << 22
    for _ in range(n):
        for _ in range(2):
            m0, shift = multiplier()
            if random.randint(0, 40) == 0:
                m0 = random.choice((-1, (1 << 24) + 1))      # outside: the pure kernel's
                crafted = True
            rates += [m0, shift]
    state = random.choice((0, random.randint(1, 0xFFFF), random.randint(1, 0xFFFF),
                           random.choice((1, -1)) * (random.getrandbits(16) << 15)))
    I = array("i", bias + g + rates + [state])
    gen = len(I) - 1 if random.randint(0, 3) else -1
    args = (Q, w, 0, x, n, n + m * n, gen, m, k, n, signed)
    return Q, I, args, crafted


def draw(done):
    Q, I, args, crafted = case()
    return update, I, args, crafted, (Q, I), repr(args[1:])


run_cases(200, draw)  # noqa: F821 (native_cases.py's)
