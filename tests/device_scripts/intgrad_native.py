# tests/test_board_natmod.py's integer backward check: the native module's kernels/intgrad.py
# kernels (device/native/intgrad_native.c) on the board, the pure-Python ones in CPython's
# run of this script (PURE = True; tests/micropython_random.py as `random`: the same
# cases), CASES random cases each (KERNELS: which), their CRC-32s of the int and byte
# arenas compared (weights, biases, generator state). Geometries: batch 1-2, groups 1-3, 1-4 input
# and output channels per group, planes up to 8 x 8, taps 1-4 a side, strides 1-3,
# dilations 1-2, any padding the forward allows; the pointwise and 3x3 depthwise forms; wide
# input gradients (>= 128 terms: the pure kernel's). Values: gradient mantissas up to 2**16,
# a few beyond (the pure kernel's fallback), of few bits (exact halves when they are shifted
# or requantized), exponents -40..40 (steps saturating when the shift falls below 1),
# multipliers of few bits and shifts 1-90, crafted multipliers (the fallback), unused
# generator (-1) or states 0, 16-bit and beyond, biases at their clamp. Prints
# "case NAME I CRC" per case and "NAME cases N fallback F different D" per kernel (F:
# crafted cases, which the module hands to the pure kernel; D: those that differ from the
# board's pure kernel, which CPython leaves to the board).
import gc
import random
from array import array
from binascii import crc32

# BIG_CASES: int_clamp_bias_grad's cases with more than one chunk of MAX_BIAS_SUM per
# plane (8,192-8,390 positions), in an int arena allocated first and once (33 KB: the M3's
# heap holds one such block beside the kernels, not two, nor the other cases' beside it).
# Each case is made from a seed of its own (drawn in turn), its arrays dropped before the
# next.
try:
    BIG_CASES
except NameError:
    BIG_CASES = False
BIG = array("i", bytearray(4 * 8400)) if BIG_CASES else None
from microtrain.kernels import intgrad, intwide

random.seed(24)
intgrad.intwide = intwide       # (the checker of a wide layer loads it)
try:
    CASES
except NameError:
    CASES = 200
try:
    KERNELS
except NameError:
    KERNELS = ("int_clamp_bias_grad",) if BIG_CASES else (
        "int_pool_grad", "int_clamp_mask", "int_clamp_bias_grad", "int_conv_grad_input",
        "int_conv_update")


def mantissa(top):
    kind = random.randint(0, 5)
    if kind == 0:       # few bits: exact halves when shifted
        return random.choice((-1, 1)) * (random.randint(0, 15) << random.randint(0, 12))
    if kind == 1:
        return random.choice((0, top, -top, 1 << 16, -(1 << 16)))
    return random.randint(-top, top)


def grads(count, crafted, extra=0):
    # a gradient tensor [e, count mantissas] and `extra` zeros after it, an array built in
    # place (BIG[0] for the large cases)
    top = random.choice((1, 255, 1 << 12, 1 << 16, 1 << 16))
    if crafted:
        top = random.choice((1 << 22, 1 << 29, (1 << 30) - 1))
    # (an array from a range is one allocation of its final size; from bytes(...) the
    # bytes were a second copy, which no longer fitted the M3's heap beside the module)
    G = array("i", range(1 + count + extra)) if BIG is None else BIG
    for i in range(len(G)):
        G[i] = 0
    G[0] = random.choice((0, random.randint(-40, 40), random.randint(-8, 8)))
    for i in range(1, 1 + count):
        G[i] = mantissa(top)
    return G


def rate():
    kind = random.randint(0, 5)
    if kind == 0:
        return random.choice((0, 1, 3, 1 << 23, 3 << 22, 1 << 24)), random.randint(1, 90)
    if kind == 1:       # few bits: exact halves
        return random.randint(1, 7) << random.randint(0, 20), random.randint(1, 62)
    return random.randint(1, 1 << 24), random.randint(9, 70)


def state():
    return random.choice((0, random.randint(1, 0xFFFF),
                          random.choice((1, -1)) * (random.getrandbits(16) << 14)))


def geometry(wide=False):
    # (m, groups, cin_g, cout_g, in_h, in_w, out_h, out_w, k_h, k_w, s_h, s_w, d_h, d_w,
    # pad_t, pad_l); wide: >= 128 terms per input gradient element (small planes)
    kind = random.randint(0, 4)
    m = random.randint(1, 2)
    side = 8
    if wide:
        m, side = 1, 4
        groups, cin_g, s, d = 1, 1, (1, 1), (1, 1)
        if kind < 2:
            cout_g, k, pad = 128, (1, 1), (0, 0, 0, 0)
        else:
            cout_g, k, pad = 16, (3, 3), (1, 1, 1, 1)
    elif kind == 0:       # pointwise
        groups, cin_g, cout_g = 1, random.randint(1, 12), random.randint(1, 12)
        k, s, d, pad = (1, 1), (1, 1), (1, 1), (0, 0, 0, 0)
    elif kind == 1:     # 3x3 depthwise, padding 1
        groups, cin_g, cout_g = random.randint(1, 6), 1, 1
        k, s, d, pad = (3, 3), (1, 1), (1, 1), (1, 1, 1, 1)
    else:
        groups, cin_g, cout_g = (random.randint(1, 3), random.randint(1, 4),
                                 random.randint(1, 4))
        k = (random.randint(1, 4), random.randint(1, 4))
        s = (random.randint(1, 3), random.randint(1, 3))
        d = (random.randint(1, 2), random.randint(1, 2))
        pad = tuple(random.randint(0, (k[i % 2] - 1) * d[i % 2]) for i in range(4))
    while True:
        in_h, in_w = random.randint(1, side), random.randint(1, side)
        out_h = (in_h + pad[0] + pad[2] - (k[0] - 1) * d[0] - 1) // s[0] + 1
        out_w = (in_w + pad[1] + pad[3] - (k[1] - 1) * d[1] - 1) // s[1] + 1
        if out_h >= 1 and out_w >= 1:
            break
    return (m, groups, cin_g, cout_g, in_h, in_w, out_h, out_w, k[0], k[1], s[0], s[1],
            d[0], d[1], pad[0], pad[1])


def case_pool():
    m, channels, plane = random.randint(1, 2), random.randint(1, 12), random.randint(1, 40)
    I = array("i", bytearray(4 * (m * channels * (plane + 1) + 1)))
    top = random.choice((1, 300, 1 << 20, (1 << 30) - 1))
    for i in range(m * channels):
        I[i] = mantissa(top)
    if random.randint(0, 9) == 0:
        I[0] = random.choice((-(1 << 31), (1 << 31) - 1))
    return bytearray(1), I, (m * channels, 0, m, channels, plane), False


def case_mask():
    count, signed = random.randint(1, 80), random.randint(0, 1)
    Q = bytearray(random.getrandbits(8) for _ in range(2 * count))
    lo, hi = sorted((random.randint(-128, 255), random.randint(-128, 255)))
    I = array("i", [0, 0, lo, hi])
    return Q, I, (Q, count, 0, 0, count, signed), False


def case_bias():
    m, channels, plane = random.randint(1, 3), random.randint(1, 6), random.randint(1, 60)
    large = BIG is not None or random.randint(0, 2) == 0
    if BIG is not None:       # more than one chunk of MAX_BIAS_SUM
        m, channels, plane = 1, 1, random.randint(8192, 8390)
    elif large:     # sums beyond 2**24: the fold's roundings (exact halves among them)
        m, channels, plane = (random.randint(1, 3), random.randint(1, 2),
                              random.randint(200, 700))
    crafted = random.randint(0, 30) == 0
    count = m * channels * plane
    G = grads(count, crafted, channels * 5 + 1)
    if large:
        sign = random.choice((1, -1))
        for i in range(1, 1 + count):
            G[i] = sign * random.choice((1 << 16, (1 << 16) - 1, 1 << 15,
                                         random.randint(0, 1 << 16)))
    mask = bytearray(random.getrandbits(8) for _ in range((count + 7) >> 3))
    if large or random.randint(0, 3) == 0:
        mask = bytearray(b"\xff" * len(mask))
    bias = [random.choice((random.randint(-(1 << 23), 1 << 23), 1 << 23, -(1 << 23),
                           random.randint(-300, 300))) for _ in range(channels)]
    rates = []
    for c in range(channels):
        m0, shift = rate()
        if large:
            # a step of 1 or 1/2 of the folded sum's units (acc * 2**t, t its halvings:
            # each one rounded half to even), the bias at the clamp on the sum's side:
            # the step's low bits reach the bias unclamped
            total = 0
            for i in range(m):
                start = 1 + (i * channels + c) * plane
                for p in range(start, start + plane):
                    total += G[p]
            t = 0
            while total >= 1 << 24 or total <= -(1 << 24):
                total //= 2
                t += 1
            m0, shift = 1 << 23, 23 + G[0] + t + random.randint(0, 1)
            bias[c] = sign << 23
        fold = random.choice((random.randint(1, 1 << 24), random.randint(1, 7) << 20,
                              1 << 23))
        rates += [m0, shift, fold, random.choice((23, 24, random.randint(20, 70)))]
        if random.randint(0, 60) == 0:
            rates[-2] = random.choice((-1, (1 << 24) + 1))
            crafted = True
    b0 = 1 + count
    I = G
    for i, v in enumerate(bias + rates + [state()]):
        I[b0 + i] = v
    gen = b0 + 5 * channels if random.randint(0, 3) else -1
    args = (mask, 0, 0, b0, b0 + channels, gen, 0, m, channels, plane, mask)
    return mask, I, args, crafted


def conv_case(update):
    geo = geometry(not update and random.randint(0, 15) == 0)
    (m, groups, cin_g, cout_g, in_h, in_w, out_h, out_w, k_h, k_w) = geo[:10]
    channels = groups * cout_g
    crafted = random.randint(0, 30) == 0
    count = m * channels * out_h * out_w
    weights = channels * cin_g * k_h * k_w
    xs = m * groups * cin_g * in_h * in_w
    W = bytearray(random.getrandbits(8) for _ in range(weights))
    if random.randint(0, 4) == 0:
        for i in range(len(W)):
            W[i] = random.choice((0, 1, 127, 128, 129, 255))
    if not update:
        I = grads(count, crafted, 1 + xs)
        Q = bytearray(4)
        return Q, I, (Q, 1 + count, 0, 0) + geo + (W,), crafted
    signed = random.randint(0, 1)
    x_zp = random.randint(-128, 127) if signed else random.randint(0, 255)
    rates = [x_zp]
    for _ in range(channels):
        rates += rate()
        if random.randint(0, 80) == 0:
            rates[-2] = random.choice((-1, (1 << 24) + 1))
            crafted = True
    I = grads(count, crafted, len(rates) + 1)
    for i in range(len(rates)):
        I[1 + count + i] = rates[i]
    I[len(I) - 1] = state()
    gen = len(I) - 1 if random.randint(0, 3) else -1
    Q = W + bytearray(random.getrandbits(8) for _ in range(xs))
    if random.randint(0, 3) == 0:
        for i in range(weights, len(Q)):
            Q[i] = random.choice((0, 255, 127, 128))
    return Q, I, (Q, 0, weights, 0, 1 + count, gen) + geo + (signed,), crafted


MAKE = {"int_pool_grad": case_pool, "int_clamp_mask": case_mask,
        "int_clamp_bias_grad": case_bias,
        "int_conv_grad_input": lambda: conv_case(False),
        "int_conv_update": lambda: conv_case(True)}
gc.collect()
if not PURE:
    print("free", gc.mem_free())
for name in KERNELS:
    kernel = kernel_of(intgrad, name)  # noqa: F821 (native_oracle.py's)
    cases = fallback = crafted_different = 0
    while cases < CASES:
        seed = random.getrandbits(30)
        gc.collect()
        random.seed(seed)
        Q, I, args, crafted = MAKE[name]()
        if PURE and crafted:
            # crafted values may overflow the int32 arena, where a board's array wraps and
            # CPython's raises: the board compares these with its own pure kernel (below)
            result = "crafted"
        else:
            kernel(None, I, args)
            result = "%d/%d" % (crc32(I, crc32(Q)), len(I))
        if crafted and not PURE:      # the module hands them to the pure kernel: the same
            Q = I = args = None
            gc.collect()
            random.seed(seed)
            Q, I, args, crafted = MAKE[name]()
            intgrad._pure[name](None, I, args)
            crafted_different += result != "%d/%d" % (crc32(I, crc32(Q)), len(I))
        cases += 1
        fallback += crafted
        print("case", name, cases, result, "seed %d" % seed if PURE else "")
        Q = I = args = None
    print(name, "cases", cases, "fallback", fallback, "different", crafted_different)
