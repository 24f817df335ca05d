# Gather with indices computed on the device (an int input: token ids, categories): data
# viewed as (outer, size, inner), `count` indices; negative ones count from the end, as in
# ONNX. Index values come from the caller, so they are checked here, once per index (an
# embedding lookup and the scatter of its gradient into the table).
from microtrain.errors import InputError


def _row_of(I, indices, p, size):
    v = I[indices + p]
    if v < 0:
        v += size
    if not 0 <= v < size:
        raise InputError("index %d at position %d of a Gather is outside [-%d, %d)"
                         % (I[indices + p], p, size, size))
    return v


def gather_rows(F, I, args):
    # y[o, p, :] = data[o, indices[p], :]
    y, data, indices, outer, size, inner, count = args
    for p in range(count):
        v = _row_of(I, indices, p, size)
        for o in range(outer):
            src = data + (o * size + v) * inner
            dst = y + (o * count + p) * inner
            for j in range(inner):
                F[dst + j] = F[src + j]


def _gather_check(args, c):
    outer, size, inner, count = c.ints
    c.positive(outer, size, inner, count)
    c.holds(2, count)


def gather_rows_check(args, c):
    _gather_check(args, c)
    outer, size, inner, count = c.ints
    c.holds(0, outer * count * inner)
    c.holds(1, outer * size * inner)


def gather_rows_grad(F, I, args):
    # dx = zeros, then dx[o, indices[p], :] += dy[o, p, :] (repeated indices add up)
    dx, dy, indices, outer, size, inner, count = args
    for i in range(dx, dx + outer * size * inner):
        F[i] = 0.0
    for p in range(count):
        v = _row_of(I, indices, p, size)
        for o in range(outer):
            dst = dx + (o * size + v) * inner
            src = dy + (o * count + p) * inner
            for j in range(inner):
                F[dst + j] += F[src + j]


def gather_rows_grad_check(args, c):
    _gather_check(args, c)
    outer, size, inner, count = c.ints
    c.holds(0, outer * size * inner)
    c.holds(1, outer * count * inner)
