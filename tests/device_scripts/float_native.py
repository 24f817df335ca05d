# The native float Gemm kernels (device/native/float, a dynamic native module) against the
# pure-Python kernels of kernels/dense.py on the same board, whose floats are single
# precision: random geometries (transposed operands, broadcast and in-place C, strides of
# batched products, k past the armv7m loop's 128-term buffer) and random float32 data of
# several magnitudes with zeros (as after a ReLU), short significands (products and sums
# that end exactly halfway: ties), products near the ends of the float32 range (the cases
# the module's fast paths leave to the compiler's float arithmetic), in one case of five
# subnormals, zeros, infinities and NaNs among them (sprinkle), and alpha, beta of all
# kinds; F compared byte for byte after each call (but a NaN equals any NaN: same()). CASES
# cases in turn: gemm, gemm_accumulate, batched_gemm. Prints "fast B", "nan_bits N" (cases
# equal only as NaNs), then "cases N different D".
import random
from array import array
from microtrain.kernels import dense
from microtrain.kernels import float_native as native

random.seed(24)
pure = dense._pure
print("fast", dense.gemm is native.gemm and dense.FAST)


def bits(scale, mode):
    # one float32's bits: +-1.m * 2**(scale +- 3); mode 1: short significands (ties);
    # mode 2: zeros among them
    if mode == 2 and random.getrandbits(2) == 0:
        return random.getrandbits(1) << 31
    e = 127 + scale + random.randint(-3, 3)
    e = 1 if e < 1 else (254 if e > 254 else e)
    m = random.getrandbits(23)
    if mode == 1:
        m &= random.choice((0x7F0000, 0x7FFC00, 0x700000))
    return random.getrandbits(1) << 31 | e << 23 | m


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


def arena(size, regions):
    # F of `size` floats, filled region by region [(start, count, scale, mode)]; the rest
    # small random values
    words = array("I", bytes(4 * size))    # in place: a list of big ints would not fit
    for i in range(size):
        words[i] = bits(-2, 0)
    for start, count, scale, mode in regions:
        for i in range(start, start + count):
            words[i] = bits(scale, mode)
        sprinkle(words, start, count)
    return array("f", bytes(words))


def scalar():
    # alpha, beta: 1.0, 0.0, -1.0 or a random float32
    kind = random.randint(0, 4)
    if kind < 3:
        return (1.0, 0.0, -1.0)[kind]
    return array("f", bytes(array("I", [bits(random.randint(-4, 4), 0)])))[0]


def scales():
    # magnitudes of A and B: moderate, or both small / both large (products near the
    # subnormal range or past float32's largest: the fallback), mode of the data
    kind = random.randint(0, 9)
    if kind == 0:
        return -62, -62 - random.randint(0, 4), 0
    if kind == 1:
        return 62, 62 + random.randint(0, 4), 0
    return random.randint(-20, 20), random.randint(-20, 20), random.randint(0, 2)


def layout(m, k, n):
    # strides of A (m x k) and B (k x n): as stored or transposed
    sa = (k, 1) if random.getrandbits(1) else (1, m)
    sb = (n, 1) if random.getrandbits(1) else (1, k)
    return sa, sb


def same(F1, F2):
    # bit for bit, but a NaN equals any NaN: which NaN an invalid operation (inf - inf,
    # 0 * inf) gives is libgcc's choice, and an armv6m module on a Cortex-M3 links
    # libgcc's armv6m soft float (0x7fc00000) while the M3's firmware has its Thumb-2
    # routines (0xffc00000 at times); counted as nan_bits
    # (a slice at a time: two whole bytes() copies do not fit beside F once the module grew)
    global nan_bits
    for i in range(0, len(F1), 64):
        if bytes(F1[i:i + 64]) != bytes(F2[i:i + 64]):
            break
    else:
        return True
    for i in range(len(F1)):
        x, y = F1[i], F2[i]
        if not (x == y or (x != x and y != y)) or (x == 0.0 and bytes(F1[i:i + 1])
                                                      != bytes(F2[i:i + 1])):
            return False
    nan_bits += 1
    return True


nan_bits = 0


def place(sizes):
    # (the Conv and pooling scripts', which get these helpers prepended)
    # offsets of the tensors (sizes in the order given) in a random order, gaps of 0..3
    order = list(range(len(sizes)))
    for i in range(len(order) - 1, 0, -1):
        j = random.randint(0, i)
        order[i], order[j] = order[j], order[i]
    offsets = [0] * len(sizes)
    at = random.randint(0, 3)
    for i in order:
        offsets[i] = at
        at += sizes[i] + random.randint(0, 3)
    return offsets, at


def check(kernel, F, args):
    F1 = array("f", F)
    F2 = array("f", F)
    e1 = e2 = None
    try:
        pure[kernel](F1, None, args)
    except IndexError as e:
        e1 = type(e)
    try:
        getattr(native, kernel)(F2, None, args)
    except IndexError as e:
        e2 = type(e)
    return not same(F1, F2) or e1 is not e2


def gemm_case():
    m, n = random.randint(1, 6), random.randint(1, 6)
    k = random.choice((1, 2, 3, 5, 8, 16, 33, 64, 100, 128, 129, 200))
    (sa_m, sa_k), (sb_k, sb_n) = layout(m, k, n)
    a, b = 0, m * k + random.randint(0, 3)
    c = b + k * n + random.randint(0, 3)
    sc = random.choice(((n, 1), (0, 1), (1, 0), (0, 0), None, "y"))
    y = c + m * n + random.randint(0, 3)
    size = y + m * n + random.randint(0, 3)
    sc_m = sc_n = 0
    if sc is None:
        c = -1
    elif sc == "y":      # C is Y itself
        c, sc_m, sc_n = y, n, 1
    else:
        sc_m, sc_n = sc
    if random.randint(0, 60) == 0:
        size = y + m * n - 1      # Y past F's end: both raise IndexError
    s_a, s_b, mode = scales()
    F = arena(size, [(0, m * k, s_a, mode), (b, k * n, s_b, mode)])
    return check("gemm", F, (y, a, b, c, m, k, n, sa_m, sa_k, sb_k, sb_n, sc_m, sc_n,
                             scalar(), scalar()))


def accumulate_case():
    m, n = random.randint(1, 8), random.randint(1, 8)
    k = random.choice((1, 2, 4, 8, 9, 16, 40, 64))
    (sa_m, sa_k), (sb_k, sb_n) = layout(m, k, n)
    b = m * k
    y = b + k * n + random.randint(0, 2)
    reset = y + m * n
    s_a, s_b, mode = scales()
    F = arena(reset + 1, [(0, m * k, s_a, mode), (b, k * n, s_b, mode),
                          (y, m * n, s_a + s_b, 0)])
    F[reset] = random.choice((0.0, 1.0))
    return check("gemm_accumulate", F, (y, 0, b, reset, m, k, n, sa_m, sa_k, sb_k, sb_n,
                                        scalar()))


def batched_case():
    d = [random.randint(1, 2) for _ in range(3)]
    m, k, n = random.randint(1, 4), random.choice((1, 3, 8, 17)), random.randint(1, 4)
    (sa_m, sa_k), (sb_k, sb_n) = layout(m, k, n)
    count = d[0] * d[1] * d[2]
    # each batch dimension of A and B strided or broadcast (stride 0)
    sa = [0, 0, 0]
    sb = [0, 0, 0]
    step_a, step_b = m * k, k * n
    for i in (2, 1, 0):
        if random.getrandbits(1):
            sa[i] = step_a
            step_a *= d[i]
        if random.getrandbits(1):
            sb[i] = step_b
            step_b *= d[i]
    b = step_a
    y = b + step_b
    s_a, s_b, mode = scales()
    F = arena(y + count * m * n, [(0, step_a, s_a, mode), (b, step_b, s_b, mode)])
    return check("batched_gemm", F, (y, 0, b, d[0], d[1], d[2], sa[0], sa[1], sa[2], sb[0],
                                     sb[1], sb[2], m, k, n, sa_m, sa_k, sb_k, sb_n, scalar()))


different = 0
for case in range(CASES):  # noqa: F821 (prepended by the test)
    different += (gemm_case, accumulate_case, batched_case)[case % 3]()
print("nan_bits", nan_bits)
print("cases", CASES, "different", different)  # noqa: F821
