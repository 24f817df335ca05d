# The viper int8 kernels against the pure-Python ones on random geometries and data
# (signed and unsigned activations, negative and huge biases, accumulators past 2**24 that
# take the exact slow path). Prints "cases N different M".
import random
from array import array
from microtrain.kernels import qlinear
from microtrain.kernels import qlinear_viper as fast

random.seed(7)
pure_gemm, pure_conv = qlinear._pure


def req(channels, x_zp, y_zp, lo, hi):
    r = [x_zp, y_zp, lo, hi]
    for _ in range(channels):
        r += [random.randint(1 << 23, 1 << 24), random.randint(18, 40)]
    return r


def biases(channels):
    kind = random.randint(0, 3)
    if kind == 3:
        return [random.randint(-(1 << 29), 1 << 29) for _ in range(channels)]  # huge
    return [random.randint(-5000, 5000) for _ in range(channels)]


def conv_case():
    groups = random.choice((1, 1, 2, 3))
    cin, cout = groups * random.randint(1, 3), groups * random.randint(1, 3)
    H, W = random.randint(1, 9), random.randint(1, 9)
    kh, kw = random.randint(1, min(4, H + 2)), random.randint(1, min(4, W + 2))
    sh, sw, dh, dw = random.randint(1, 2), random.randint(1, 2), random.randint(1, 2), 1
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
    args = (Q, nx + nw, 0, nx, 0 if random.randint(0, 3) else -1, cout, cout + 4 + 2 * cout, n,
            groups, cin // groups, cout // groups, H, W, OH, OW, kh, kw, sh, sw, dh, dw, pt, pl,
            signed, 0)
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
    args = (Q, m * k + k * n, 0, m * k, 0 if random.randint(0, 3) else -1, n, m, k, n, k, 1,
            sw_k, sw_n, random.randint(0, 1), 0)
    return Q, I, args, pure_gemm, fast.qlinear_gemm


cases = different = 0
while cases < 300:
    case = conv_case() if cases % 2 else gemm_case()
    if case is None:
        continue
    Q, I, args, pure, viper = case
    Q2 = bytearray(Q)
    pure(None, I, args)
    viper(None, I, (Q2,) + args[1:])
    cases += 1
    if bytes(Q) != bytes(Q2):
        different += 1
print("cases", cases, "different", different)
