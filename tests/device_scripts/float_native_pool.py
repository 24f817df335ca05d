# The native max_pool and max_pool_grad (device/native/float/float_pool.c) against the
# pure-Python kernels of kernels/pool.py on the same board. The test prepends CASES and
# float_native.py's helpers (everything before its gemm_case: random float32 data, ties,
# zeros of either sign, in one case of five subnormals, infinities and NaNs; check()
# compares the pure and the native kernel's F byte for byte, a NaN equal to any NaN). Random
# 1-D and 2-D windows: planes, odd sizes, kernels, strides, dilations, pads (every window
# holding an input element, as pool.py's checker requires); values from a few distinct ones
# in one case of three (equal maxima: the first one wins). CASES cases in turn: max_pool,
# max_pool_grad. Prints "pool_fast B", "nan_bits N", then "cases N different D refused R"
# (R: calls reaching past F's end, raised alike).
import gc
import random
from array import array
from microtrain.kernels import pool
from microtrain.kernels import float_native as native

pure = pool._pure
print("pool_fast", pool.max_pool is native.max_pool and pool.FAST
      and pool.max_pool_grad is native.max_pool_grad)


# same(): float_native.py's, prepended with its helpers


def holds(o, s, pad, d, k, size):
    # pool.py's _windows_check for one window
    start = o * s - pad
    first = 0 if start >= 0 else (d - 1 - start) // d
    stop = (size - start + d - 1) // d
    return (stop if stop < k else k) > first


def axis():
    # (size, k, s, pad, d, out) with every window holding an element
    while True:
        n, k = random.randint(1, 9), random.randint(1, 4)
        s, d = random.choice((1, 2, 2, 3)), random.choice((1, 1, 2))
        pad = random.randint(0, k - 1) if random.randint(0, 9) else random.randint(-1, 4)
        out = (n + 2 * pad - d * (k - 1) - 1) // s + 1 + random.randint(0, 1)
        if out >= 1 and all(holds(o, s, pad, d, k, n) for o in range(out)):
            return n, k, s, pad, d, out


refused = 0


def pool_case(grad):
    global refused
    one_d = random.randint(0, 3) == 0
    H, kH, sH, pT, dH, OH = (1, 1, 1, 0, 1, 1) if one_d else axis()
    W, kW, sW, pL, dW, OW = axis()
    planes = random.randint(1, 6)
    g = (planes, H, W, OH, OW, kH, kW, sH, sW, pT, pL, dH, dW)
    x_size, y_size = planes * H * W, planes * OH * OW
    scale, _, mode = scales()  # noqa: F821 (the helpers')
    if grad:
        (dx, dy, x), size = place((x_size, y_size, x_size))
        F = arena(size, [(x, x_size, scale, mode), (dy, y_size, scale, 0)])  # noqa: F821
        args, name, last = (dx, dy, x) + g, "max_pool_grad", dx + x_size
    else:
        (y, x), size = place((y_size, x_size))
        F = arena(size, [(x, x_size, scale, mode)])  # noqa: F821
        args, name, last = (y, x) + g, "max_pool", y + y_size
    if random.randint(0, 2) == 0:     # few distinct values: equal maxima
        values = [F[x + random.randrange(x_size)] for _ in range(3)]
        for i in range(x, x + x_size):
            F[i] = values[random.randrange(3)]
    if random.randint(0, 40) == 0:      # the output past F's end: both raise IndexError
        F = array("f", F[:last - 1])
        refused += 1
    return check(name, F, args)  # noqa: F821 (the helpers')


different = 0
for case in range(CASES):  # noqa: F821 (prepended by the test)
    gc.collect()
    different += pool_case(case % 2)
print("nan_bits", nan_bits)  # noqa: F821
print("cases", CASES, "different", different, "refused", refused)  # noqa: F821
