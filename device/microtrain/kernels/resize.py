# Resize (ONNX Resize / Upsample: nearest and linear, 1-D and 2-D) and its gradient, side by
# side. X is viewed as (planes, in_h, in_w), Y as (planes, out_h, out_w); a 1-D resize has
# in_h = out_h = 1.
#
# The host works out, once, where every output row and column reads (coordinate mode,
# rounding, clamping: ops/resize.py) and ships the answer as tables in the step's ints
# and floats, after the geometry (planes, in_h, in_w, out_h, out_w):
#   nearest: row[out_h], col[out_w]                     source row / column of each output
#   linear:  top[out_h], bottom[out_h], left[out_w], right[out_w]   the two source rows and
#            columns; floats w_top[out_h], w_bottom[out_h], w_left[out_w], w_right[out_w]
#            their weights: Y = w_top * (w_left * X[top, left] + w_right * X[top, right])
#                             + w_bottom * (w_left * X[bottom, left] + ...)
# So the kernels do no float arithmetic on coordinates (which would round differently on
# float32 ports), and the checkers can see at load that every table entry is inside X.
# The gradients scatter dY back through the same tables and weights.

_HEAD = 7  # args before the tables: y, x, planes, in_h, in_w, out_h, out_w


def _sides(F, args, grad):
    # (the (planes, out_h, out_w) side, walked in order; the side the tables index): Y and
    # X, or for a gradient dY and dX (arguments 1 and 0), dX zeroed first for the scatter.
    if not grad:
        return args[0], args[1]
    dx = args[0]
    planes, in_h, in_w = args[2:5]
    for i in range(dx, dx + planes * in_h * in_w):
        F[i] = 0.0
    return args[1], dx


def _nearest(F, args, grad):
    # Forward: Y[p, oy, ox] = X[p, row[oy], col[ox]]. grad: args are dX, dY and
    # dX[p, row[oy], col[ox]] += dY[p, oy, ox], dX zeroed first. One branch per row.
    o, table = _sides(F, args, grad)
    planes, in_h, in_w, out_h, out_w = args[2:_HEAD]
    cols = _HEAD + out_h
    for p in range(planes):
        base = table + p * in_h * in_w
        for oy in range(out_h):
            row = base + args[_HEAD + oy] * in_w
            if grad:
                for c in range(cols, cols + out_w):
                    F[row + args[c]] += F[o]
                    o += 1
            else:
                for c in range(cols, cols + out_w):
                    F[o] = F[row + args[c]]
                    o += 1


def _linear(F, args, grad):
    # Forward: Y = w_top * (w_left * X[top, left] + w_right * X[top, right]) + w_bottom *
    # (...): the two source rows and columns of each output and their weights. grad: args
    # are dX, dY, dX zeroed first, then each dY[p, oy, ox] goes to the four (or two) X cells
    # it was read from, times the same weights. One branch per row.
    o, table = _sides(F, args, grad)
    planes, in_h, in_w, out_h, out_w = args[2:_HEAD]
    bottom = _HEAD + out_h
    left = bottom + out_h
    right = left + out_w
    w_top = right + out_w
    w_bottom = w_top + out_h
    w_left = w_bottom + out_h
    for p in range(planes):
        base = table + p * in_h * in_w
        for oy in range(out_h):
            r0 = base + args[_HEAD + oy] * in_w
            r1 = base + args[bottom + oy] * in_w
            a = args[w_top + oy]
            b = args[w_bottom + oy]
            wl = w_left
            # The right column and its weight sit out_w entries after the left ones.
            if grad:
                for c in range(left, right):
                    u = args[wl]
                    v = args[wl + out_w]
                    i = args[c]
                    j = args[c + out_w]
                    g = F[o] * a
                    F[r0 + i] += g * u
                    F[r0 + j] += g * v
                    if b != 0.0:
                        g = F[o] * b
                        F[r1 + i] += g * u
                        F[r1 + j] += g * v
                    wl += 1
                    o += 1
            elif b == 0.0:  # one source row: 1-D, or an output row on an input row
                for c in range(left, right):
                    F[o] = a * (args[wl] * F[r0 + args[c]]
                                + args[wl + out_w] * F[r0 + args[c + out_w]])
                    wl += 1
                    o += 1
            else:
                for c in range(left, right):
                    u = args[wl]
                    v = args[wl + out_w]
                    i = args[c]
                    j = args[c + out_w]
                    F[o] = a * (u * F[r0 + i] + v * F[r0 + j]) + b * (u * F[r1 + i]
                                                                       + v * F[r1 + j])
                    wl += 1
                    o += 1


def resize_nearest(F, I, args):
    _nearest(F, args, False)


def resize_nearest_grad(F, I, args):
    _nearest(F, args, True)


def resize_linear(F, I, args):
    _linear(F, args, False)


def resize_linear_grad(F, I, args):
    _linear(F, args, True)


def _tables_check(args, c, taps, y_arg, x_arg):
    # The geometry, the exact int and float counts (the tables), every table entry inside
    # X's rows and columns, and the two tensors' sizes.
    if c.counts[0] < 5:
        c.fail("a resize step needs 5 ints of geometry, got %d" % c.counts[0])
    ints = c.ints
    planes, in_h, in_w, out_h, out_w = ints[:5]
    c.positive(planes, in_h, in_w, out_h, out_w)
    c.equal(c.counts, (5 + taps * (out_h + out_w), (taps * (out_h + out_w)) if taps > 1 else 0),
            "(int count, float count)")
    at = 5          # the tables follow the geometry among the ints
    for t in range(taps):
        for k in range(at, at + out_h):
            c.within(ints[k], 0, in_h - 1, "source row")
        at += out_h
    for t in range(taps):
        for k in range(at, at + out_w):
            c.within(ints[k], 0, in_w - 1, "source column")
        at += out_w
    c.holds(y_arg, planes * out_h * out_w)
    c.holds(x_arg, planes * in_h * in_w)


def resize_nearest_check(args, c):
    _tables_check(args, c, 1, 0, 1)


def resize_nearest_grad_check(args, c):
    _tables_check(args, c, 1, 1, 0)


def resize_linear_check(args, c):
    _tables_check(args, c, 2, 0, 1)


def resize_linear_grad_check(args, c):
    _tables_check(args, c, 2, 1, 0)
