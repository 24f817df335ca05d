# Reductions. The host views X as (d0, d1, d2) and gives Y's stride for each dimension,
# 0 along reduced dimensions; Y = scale * sum of the X elements that land on it.


def reduce_sum(F, I, args):
    y, x, d0, d1, d2, sy0, sy1, sy2, ny, scale = args
    for i in range(ny):
        F[y + i] = 0.0
    for i0 in range(d0):
        for i1 in range(d1):
            py = y + i0 * sy0 + i1 * sy1
            if sy2 == 0:
                # Sum the row in a double-precision local, store once.
                s = 0.0
                for _ in range(d2):
                    s += F[x]
                    x += 1
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
    y, x, d0, d1, d2, sy0, sy1, sy2, ny = args[:9]
    c.positive(d0, d1, d2)
    c.holds(0, ny)
    c.holds(1, d0 * d1 * d2)
    c.span(0, y, (d0, d1, d2), (sy0, sy1, sy2))
