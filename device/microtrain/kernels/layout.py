# Layout ops: Transpose, Slice, Concat, Split, Pad and their gradients only move elements,
# so they all are one strided copy: the host views both sides as (d0, d1, d2, d3) and gives
# each side a start and four strides (negative for a reversed Slice, 0 for Pad's edge mode).
# Concat writes one piece per step into a window of Y, Split reads one window of X per step,
# Slice's gradient and Pad are a fill followed by a copy into a window.


def _strided(row):
    # The kernel of a strided move, given its row: every (d0, d1, d2) index of both sides
    # walked, row(F, py, sy, px, sx, n) does one row of d3 elements.
    def kernel(F, I, args):
        y, x, y0, x0, d0, d1, d2, d3, sy0, sy1, sy2, sy3, sx0, sx1, sx2, sx3 = args
        y += y0
        x += x0
        for i0 in range(d0):
            for i1 in range(d1):
                py = y + i0 * sy0 + i1 * sy1
                px = x + i0 * sx0 + i1 * sx1
                for _ in range(d2):
                    row(F, py, sy3, px, sx3, d3)
                    py += sy2
                    px += sx2
    return kernel


def _strided_check(args, c):
    y, x = c.offsets
    y0, x0, d0, d1, d2, d3, sy0, sy1, sy2, sy3, sx0, sx1, sx2, sx3 = c.ints
    counts = (d0, d1, d2, d3)
    c.span(0, y + y0, counts, (sy0, sy1, sy2, sy3))
    c.span(1, x + x0, counts, (sx0, sx1, sx2, sx3))
    # Either side may stand still along a dimension (Pad's edge, a summed gradient), not both.
    c.moving(counts, (abs(sy0) + abs(sx0), abs(sy1) + abs(sx1), abs(sy2) + abs(sx2),
                      abs(sy3) + abs(sx3)))


@_strided
def strided_copy(F, py, sy, px, sx, n):
    # Y[window] = X[window]
    for _ in range(n):
        F[py] = F[px]
        py += sy
        px += sx


strided_copy_check = _strided_check


@_strided
def strided_add(F, py, sy, px, sx, n):
    # Y[window] += X[window]: gradients where several outputs read one input element
    # (Pad's edge and reflect modes), summed in a fixed order.
    for _ in range(n):
        F[py] += F[px]
        py += sy
        px += sx


strided_add_check = _strided_check


def fill(F, I, args):
    # Y = value: Pad's border, the zeros a Slice gradient is scattered into.
    y, n, value = args
    for i in range(y, y + n):
        F[i] = value


def fill_check(args, c):
    n, = c.ints
    c.holds(0, n)
