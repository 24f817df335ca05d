# Reductions. The host views X as (d0, d1, d2) and gives Y's stride for each dimension,
# 0 along reduced dimensions; Y = scale * sum of the X elements that land on it.

# Long sums go in blocks of BLOCK elements: on a single-precision build (every MCU port)
# each addition rounds to float32, and a running sum of n terms can drift by n rounding
# errors; summing blocks first bounds that by BLOCK + n / BLOCK (50,000 terms: relative
# error 9e-7 -> 3e-7; tests/test_float32.py).
BLOCK = 64


def reduce_sum(F, I, args):
    y, x, d0, d1, d2, sy0, sy1, sy2, ny, scale = args
    for i in range(ny):
        F[y + i] = 0.0
    for i0 in range(d0):
        for i1 in range(d1):
            py = y + i0 * sy0 + i1 * sy1
            if sy2 == 0:
                # Sum the row in a local (a float32 one on boards), store once.
                s = 0.0
                left = d2
                while left > 0:
                    k = BLOCK if left > BLOCK else left
                    block = 0.0
                    for _ in range(k):
                        block += F[x]
                        x += 1
                    s += block
                    left -= k
                F[py] += s
            else:
                for _ in range(d2):
                    F[py] += F[x]
                    x += 1
                    py += sy2
    if scale != 1.0:
        for i in range(ny):
            F[y + i] *= scale


def reduce_sum_check(args, c):
    y, x = c.offsets
    d0, d1, d2, sy0, sy1, sy2, ny = c.ints
    c.positive(d0, d1, d2)
    c.holds(0, ny)
    c.holds(1, d0 * d1 * d2)
    c.span(0, y, (d0, d1, d2), (sy0, sy1, sy2))


# The native form of reduce_sum (a Gemm's bias gradient; device/native/float: machine code
# for the board's architecture, kernels/float_native.mpy where the runtime carries it)
# replaces it when it imports: the same bits, no allocation. use_fast(False): the pure-Python
# kernel. A minimal runtime keeps this switch only when it carries the module
# (tools/runtime.py).
_FAST_NAMES = ('reduce_sum',)


def use_fast(on=True):
    from microtrain.kernels import fastpath
    return fastpath.use_fast(globals(), _FAST_NAMES, on, None, "float_native")


FAST = use_fast()
