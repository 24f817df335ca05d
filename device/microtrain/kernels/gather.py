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


def _rows(F, I, args, grad):
    # Forward (y, data): y[o, p, :] = data[o, indices[p], :]. grad (dx, dy): dx zeroed,
    # then dx[o, indices[p], :] += dy[o, p, :] (repeated indices add up). y and dy are
    # (outer, count, inner), data and dx (outer, size, inner). One branch per row.
    first, second, indices, outer, size, inner, count = args
    picked, table = (second, first) if grad else (first, second)
    if grad:
        for i in range(table, table + outer * size * inner):
            F[i] = 0.0
    for p in range(count):
        v = _row_of(I, indices, p, size)
        for o in range(outer):
            at = table + (o * size + v) * inner
            row = picked + (o * count + p) * inner
            if grad:
                for j in range(inner):
                    F[at + j] += F[row + j]
            else:
                for j in range(inner):
                    F[row + j] = F[at + j]


def _rows_check(c, grad):
    # the indices hold `count` ints; y (or dy) the (outer, count, inner) rows, data (or dx)
    # the (outer, size, inner) table
    outer, size, inner, count = c.ints
    c.positive(outer, size, inner, count)
    c.holds(2, count)
    picked = outer * count * inner
    table = outer * size * inner
    c.holds(0, table if grad else picked)
    c.holds(1, picked if grad else table)


def gather_rows(F, I, args):
    _rows(F, I, args, False)


def gather_rows_check(args, c):
    _rows_check(c, False)


def gather_rows_grad(F, I, args):
    _rows(F, I, args, True)


def gather_rows_grad_check(args, c):
    _rows_check(c, True)
