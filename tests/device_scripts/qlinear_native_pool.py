# The native int8 GlobalAveragePool (device/native qlinear_native.c) against the pure-Python
# kernel (kernels/qlinear.py qlinear_global_average_pool) on random planes: 1-70 planes of
# 1-400 bytes (a few of 2,000-6,000), unsigned and signed inputs, zero points over their
# whole range, bytes at their ends, output zero points and clamps, multipliers in the
# derived range, of few bits (exact halves) and at the requantization's edges (the shifts
# where its 32-bit limbs' cases meet), and crafted ones (m0 0 or past 2**24, shifts 0 or
# past 62: a multiplier past 2**24 goes to the pure kernel, counted as a fallback). Output
# planes before, after or among the inputs. Prints "case N CRC what" per case (what: on
# the host's run), then "cases N fallback F"; tests/test_board_natmod.py compares the
# board's run with CPython's (tests/device_scripts/native_oracle.py).
import random
from array import array
from microtrain.kernels import qlinear

random.seed(23)
POOL = kernel_of(qlinear, 'qlinear_global_average_pool')  # noqa: F821


def pool_req():
    lo, hi = random.choice(((-128, 127), (0, 255), (0, 127), (-20, 40)))
    y_zp = lo if random.randint(0, 2) == 0 else random.randint(-128, 255)
    kind = random.randint(0, 7)
    crafted = False
    if kind < 4:        # derived: x_scale / (y_scale * count), 2**23 <= m0 <= 2**24
        m0, shift = random.randint(1 << 23, 1 << 24), random.randint(14, 45)
    elif kind == 4:     # few bits: many sums end exactly halfway
        m0, shift = random.choice((1 << 23, 3 << 22, 5 << 21)), random.randint(18, 32)
    elif kind == 5:     # the edges of the limbs' cases
        m0 = random.choice((1, 2, 3, (1 << 24) - 1, 1 << 24, random.randint(1, 1 << 24)))
        shift = random.choice((2, 3, 15, 16, 17, 18, 24, 31, 32, 33, 46, 47, 48, 49, 61, 62))
    else:               # as a crafted blob may hold them
        m0 = random.choice((0, 1 << 23, 1 << 24, (1 << 24) + 1, 1 << 30))
        shift = random.choice((0, 1, 62, 63, 70))
        crafted = m0 > 1 << 24
    return [y_zp, lo, hi, m0, shift], crafted


def pool_case():
    planes = random.randint(1, 70)
    count = random.choice((1, 2, 3, 7, 25, 125, random.randint(1, 400)))
    if random.randint(0, 15) == 0:
        planes, count = random.randint(1, 2), random.randint(2000, 6000)
    n = planes * count
    where = random.randint(0, 2)            # the outputs before, after or among the inputs
    y, x = (0, planes) if where == 0 else (n, 0) if where == 1 else (n // 2, 0)
    Q = bytearray(n + planes)       # filled in place: a generator's growing copy runs out
    ends = random.randint(0, 4) == 0
    for i in range(len(Q)):
        Q[i] = random.choice((0, 1, 127, 128, 129, 255)) if ends else random.getrandbits(8)
    signed = random.randint(0, 1)
    x_zp = random.randint(-128, 127) if signed else random.randint(0, 255)
    rest, crafted = pool_req()
    I = array("i", [random.randint(-9, 9), x_zp] + rest)   # req at 1
    return Q, I, (Q, y, x, 1, planes, count, signed, random.randint(0, 1)), crafted


def draw(done):
    Q, I, args, crafted = pool_case()
    return POOL, I, args, crafted, (Q,), "pool" + repr(args[1:]) + (" crafted" if crafted else "")


run_cases(300, draw)  # noqa: F821 (native_cases.py's)
