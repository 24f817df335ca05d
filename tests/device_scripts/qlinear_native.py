# The native int8 Gemm (device/native, a dynamic native module) against the pure-Python
# kernel on random geometries and data, as tests/device_scripts/qlinear_fast.py checks the
# viper kernels: unsigned and signed activations, both weight layouts (transposed: unit
# strides along k, the hand-written Thumb-1 loop; and not), odd and even k, column counts
# that leave 0-3 columns past the blocks of four, negative and huge biases, accumulators
# past 2**24, weights in the arena or in a bytes object of their own, and multipliers and
# shifts out of the derived range (the module hands those to the pure-Python kernel).
# Prints "cases N different M fallback F".
import random
from array import array
from microtrain.kernels import qlinear
from microtrain.kernels import qlinear_native as native

random.seed(11)
pure_gemm = qlinear._pure['qlinear_gemm']
native._pure = qlinear._pure


def req(channels, x_zp, y_zp, lo, hi):
    r = [x_zp, y_zp, lo, hi]
    crafted = False
    for _ in range(channels):
        if random.randint(0, 6):
            r += [random.randint(1 << 23, 1 << 24), random.randint(14, 40)]
        else:   # as a crafted blob may hold them: m0 0 or beyond 2**24, shift 0 or past 62
            m0 = random.choice((0, 1 << 23, 1 << 24, (1 << 24) + 1))
            crafted = crafted or m0 > 1 << 24
            r += [m0, random.choice((0, 1, 62, 63, 70))]
    return r, crafted


def gemm_case():
    m, n = random.randint(1, 4), random.randint(1, 9)
    k = random.choice((1, 2, 3, 4, 5, 16, 33, 64, 127, 700))
    Q = bytearray(random.getrandbits(8) for _ in range(m * k + k * n + m * n))
    if k == 700 or random.randint(0, 5) == 0:
        for i in range(m * k + k * n):
            Q[i] = random.choice((0, 127, 128, 255))   # extreme values
    lo, hi = (-128, 127) if random.randint(0, 1) else (0, 255)
    if random.randint(0, 3) == 0:
        b = [random.randint(-(1 << 29), 1 << 29) for _ in range(n)]    # huge biases
    else:
        b = [random.randint(-5000, 5000) for _ in range(n)]
    signed = random.randint(0, 1)
    x_zp = random.randint(-128, 127) if signed else random.randint(0, 255)
    r, crafted = req(n, x_zp, random.randint(-20, 20), lo, hi)
    I = array("i", b + r)
    trans = random.randint(0, 1)
    sw_k, sw_n = (1, k) if trans else (n, 1)
    w_at, weights = m * k, Q
    if random.randint(0, 1):
        before = random.randint(0, 40)
        w_at = before
        weights = bytes(random.getrandbits(8) for _ in range(before)) + \
            bytes(Q[m * k:m * k + k * n])
    args = (Q, m * k + k * n, 0, w_at, 0 if random.randint(0, 3) else -1, n, m, k, n, k, 1,
            sw_k, sw_n, signed, 0, weights)
    return Q, I, args, crafted


try:
    CASES                  # tests/test_board_natmod.py sets it
except NameError:
    CASES = 300
cases = different = fallback = 0
while cases < CASES:
    Q, I, args, crafted = gemm_case()
    Q2 = bytearray(Q)
    pure_gemm(None, I, args)
    native.qlinear_gemm(None, I, (Q2,) + args[1:])
    cases += 1
    fallback += crafted
    if bytes(Q) != bytes(Q2):
        different += 1
        print("different:", args[1:15])
print("cases", cases, "different", different, "fallback", fallback)
