# The viper int8 kernels against the pure-Python ones on random geometries and data
# (signed and unsigned activations, negative and huge biases, accumulators past 2**24 that
# take the exact slow path, multipliers and shifts out of the derived range, kernels of more
# than 16 taps, multipliers whose products end exactly halfway): Gemm, Conv, global and
# windowed average pooling, Add, lookup, and Gemms built so that most outputs are ties.
# Prints "cases N different M".
import random
from array import array
from microtrain.kernels import qlinear
from microtrain.kernels import qlinear_viper as fast

random.seed(7)
pure = qlinear._pure
pure_gemm, pure_conv = pure['qlinear_gemm'], pure['qlinear_conv']


def req(channels, x_zp, y_zp, lo, hi):
    r = [x_zp, y_zp, lo, hi]
    for _ in range(channels):
        kind = random.randint(0, 4)
        if kind > 1:
            r += [random.randint(1 << 23, 1 << 24), random.randint(18, 40)]
        elif kind == 1:
            # a multiplier of two or three bits (1/2, 3/4, 5/8 of 2**24): a product then often
            # ends exactly halfway between two integers, where only round half to even is right
            r += [random.choice((1 << 23, 3 << 22, 5 << 21)), random.randint(18, 30)]
        else:   # as a crafted blob may hold them: m0 0 or beyond 2**24, shift 0 or past 62
            r += [random.choice((0, 1 << 23, (1 << 24) + 1)), random.choice((0, 62, 63, 70))]
    return r


def biases(channels):
    kind = random.randint(0, 3)
    if kind == 3:
        return [random.randint(-(1 << 29), 1 << 29) for _ in range(channels)]  # huge
    return [random.randint(-5000, 5000) for _ in range(channels)]


def weight_buffer(Q, at, n):
    # (offset, buffer) of the weights Q[at:at + n]: in the byte arena itself, or half the time
    # in a read-only bytes object of their own behind some other bytes, as a blob in flash
    # holds them
    if random.randint(0, 1):
        return at, Q
    before = random.randint(0, 40)
    return before, bytes(random.getrandbits(8) for _ in range(before)) + bytes(Q[at:at + n])


def conv_case():
    groups = random.choice((1, 1, 2, 3))
    cin, cout = groups * random.randint(1, 3), groups * random.randint(1, 3)
    H, W = random.randint(1, 9), random.randint(1, 9)
    kh, kw = random.randint(1, min(4, H + 2)), random.randint(1, min(4, W + 2))
    if random.randint(0, 4) == 0:   # more taps than the viper kernel's table holds (16)
        H, W = random.randint(5, 12), random.randint(5, 12)
        kh, kw = random.randint(5, min(8, H + 2)), random.randint(5, min(8, W + 2))
    sh, sw, dh, dw = random.randint(1, 2), random.randint(1, 2), random.randint(1, 2), \
        random.randint(1, 2)
    pt, pl = random.randint(0, 2), random.randint(0, 2)
    OH = (H + 2 * pt - (kh - 1) * dh - 1) // sh + 1
    OW = (W + 2 * pl - (kw - 1) * dw - 1) // sw + 1
    if OH < 1 or OW < 1:
        return None
    n = random.randint(1, 2)
    nx, nw, ny = n * cin * H * W, cout * (cin // groups) * kh * kw, n * cout * OH * OW
    Q = bytearray(random.getrandbits(8) for _ in range(nx + nw + ny))
    signed = random.randint(0, 1)
    lo, hi = (-128, 127) if random.randint(0, 1) else (0, 255)
    I = array("i", biases(cout) + req(cout, random.randint(-128, 255), random.randint(-20, 20),
                                      lo, hi) + [0] * (OH * OW))
    w_at, weights = weight_buffer(Q, nx, nw)
    args = (Q, nx + nw, 0, w_at, 0 if random.randint(0, 3) else -1, cout, cout + 4 + 2 * cout,
            n, groups, cin // groups, cout // groups, H, W, OH, OW, kh, kw, sh, sw, dh, dw, pt,
            pl, signed, 0, weights)
    return Q, I, args, pure_conv, fast.qlinear_conv


def gemm_case():
    m, k, n = random.randint(1, 4), random.choice((1, 5, 64, 700)), random.randint(1, 6)
    Q = bytearray(random.getrandbits(8) for _ in range(m * k + k * n + m * n))
    if k == 700:
        for i in range(m * k + k * n):
            Q[i] = random.choice((0, 127, 128, 255))   # extreme values: accumulators past 2**24
    lo, hi = (-128, 127) if random.randint(0, 1) else (0, 255)
    I = array("i", biases(n) + req(n, random.randint(-128, 255), random.randint(-20, 20), lo, hi))
    trans = random.randint(0, 1)
    sw_k, sw_n = (1, k) if trans else (n, 1)
    w_at, weights = weight_buffer(Q, m * k, k * n)
    args = (Q, m * k + k * n, 0, w_at, 0 if random.randint(0, 3) else -1, n, m, k, n, k, 1,
            sw_k, sw_n, random.randint(0, 1), 0, weights)
    return Q, I, args, pure_gemm, fast.qlinear_gemm


def tie_case():
    # a Gemm whose every output is (bias + 1) / 2**e: x - x_zp = 1, k = 1, every weight 1,
    # m0 = 2**23, shift 23 + e; biases of both signs give exact halves inside the clamp range
    # at most positions, so a kernel that rounds them up, away from zero or to odd differs
    n, e = random.randint(1, 9), random.randint(1, 3)
    Q = bytearray([random.randint(0, 255)] + [1] * n + [0] * n)     # x, W[1, n], Y[1, n]
    r = [Q[0] - 1, random.randint(-20, 20), -128, 127]
    for _ in range(n):
        r += [1 << 23, 23 + e]
    I = array("i", [random.randint(-300, 300) for _ in range(n)] + r)
    w_at, weights = weight_buffer(Q, 1, n)
    args = (Q, 1 + n, 0, w_at, 0, n, 1, 1, n, 1, 1, n, 1, 0, 0, weights)
    return Q, I, args, pure_gemm, fast.qlinear_gemm


def pairs(count):
    r = []
    for _ in range(count):
        r += [random.randint(1 << 23, (1 << 24) - 1), random.randint(6, 40)]
    return r


def pool_case():
    H, W = random.randint(1, 9), random.randint(1, 9)
    kh, kw = random.randint(1, min(4, H)), random.randint(1, min(4, W))
    sh, sw = random.randint(1, 3), random.randint(1, 3)
    pt, pl = random.randint(0, kh - 1), random.randint(0, kw - 1)
    pb, pr = random.randint(0, kh - 1), random.randint(0, kw - 1)
    OH, OW = (H + pt + pb - kh) // sh + 1, (W + pl + pr - kw) // sw + 1
    if OH < 1 or OW < 1:
        return None
    planes = random.randint(1, 3)
    Q = bytearray(random.getrandbits(8) for _ in range(planes * (H * W + OH * OW)))
    include = random.randint(0, 1)
    ch0, ch1, cw0, cw1 = (-pt, H + pb, -pl, W + pr) if include else (0, H, 0, W)
    lo, hi = (-128, 127) if random.randint(0, 1) else (0, 255)
    I = array("i", [random.randint(-128, 255), random.randint(-20, 20), lo, hi]
              + pairs(kh * kw))
    args = (Q, planes * H * W, 0, 0, planes, H, W, OH, OW, kh, kw, sh, sw, pt, pl, ch0, ch1,
            cw0, cw1, random.randint(0, 1), 0)
    return Q, I, args, pure["qlinear_average_pool"], fast.qlinear_average_pool


def global_pool_case():
    planes, count = random.randint(1, 5), random.choice((1, 7, 64, 300))
    Q = bytearray(random.getrandbits(8) for _ in range(planes * (count + 1)))
    lo, hi = (-128, 127) if random.randint(0, 1) else (0, 255)
    I = array("i", [random.randint(-128, 255), random.randint(-20, 20), lo, hi] + pairs(1))
    args = (Q, planes * count, 0, 0, planes, count, random.randint(0, 1), 0)
    return Q, I, args, pure["qlinear_global_average_pool"], fast.qlinear_global_average_pool


def add_case():
    n = random.randint(1, 40)
    Q = bytearray(random.getrandbits(8) for _ in range(3 * n))
    lo, hi = (-128, 127) if random.randint(0, 1) else (0, 255)
    scales = [random.uniform(0.001, 0.1) for _ in range(3)]
    ma, mb, s = qlinear.add_multipliers(scales[0] / scales[2], scales[1] / scales[2])
    I = array("i", [random.randint(-128, 255), random.randint(-128, 255),
                    random.randint(-20, 20), lo, hi, ma, mb, s])
    args = (Q, 2 * n, 0, n, 0, n, random.randint(0, 1), random.randint(0, 1), 0)
    return Q, I, args, pure["qlinear_add"], fast.qlinear_add


def lookup_case():
    n = random.randint(1, 40)
    Q = bytearray(random.getrandbits(8) for _ in range(256 + 2 * n))
    args = (Q, 256 + n, 256, 0, n)
    return Q, I, args, pure["qlinear_lookup"], fast.qlinear_lookup


try:
    CASES                  # a board runs fewer (tests/test_board_qemu.py sets it)
except NameError:
    CASES = 600
I = array("i", [0])
MAKERS = (gemm_case, conv_case, pool_case, global_pool_case, add_case, lookup_case, tie_case)
NAMES = ("gemm", "conv", "average_pool", "global_average_pool", "add", "lookup", "gemm ties")
cases = different = 0
while cases < CASES:
    case = MAKERS[cases % len(MAKERS)]()
    if case is None:
        continue
    Q, I, args, pure_kernel, viper = case
    Q2 = bytearray(Q)
    pure_kernel(None, I, args)
    viper(None, I, (Q2,) + args[1:])
    cases += 1
    if bytes(Q) != bytes(Q2):
        different += 1
        print("different:", NAMES[(cases - 1) % len(MAKERS)], args[1:])
print("cases", cases, "different", different)
