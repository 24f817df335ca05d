# Pooling over (planes, H, W) tensors, forward and backward side by side. The host turns
# 1-D pooling into H = 1, resolves auto_pad into pads and drops ceil_mode windows that
# would start in the padding, so a kernel only walks windows:
#   window (oh, ow) covers rows oh * sH - pT + kh * dH, columns ow * sW - pL + kw * dW;
#   rows and columns outside [0, H) x [0, W) are padding.
# Window bounds are worked out once per output row and per output element (a few integer
# operations), never per input element.
#
# MaxPool's backward recomputes each window's argmax from X instead of keeping int32
# indices from the forward pass: in the usual Conv -> Relu -> MaxPool, ReluGrad keeps X
# alive until MaxPoolGrad anyway, so recomputing costs no memory, while indices would hold
# 4 bytes per output element from the forward to the backward pass.


def _window_rows(x, planes, plane, OH, sH, pT):
    # (first element of the plane, first row of the window, padding included) per plane and
    # output row: the walk both kinds of window share (bounds are worked out per row, then
    # per window, by the caller)
    for p in range(planes):
        for oh in range(OH):
            yield x + p * plane, oh * sH - pT


def _max_windows(F, out, x, dx, planes, H, W, OH, OW, kH, kW, sH, sW, pT, pL, dH, dW):
    # Forward (dx < 0): out[o] = max of window o. Backward: dx[argmax of window o] += out[o]
    # (out is then dY). The argmax is the first maximum in row-major window order, and a
    # NaN wins, as in torch, so both passes route through the same element.
    o = out
    for base, h0 in _window_rows(x, planes, H * W, OH, sH, pT):
        kh0 = 0 if h0 >= 0 else (dH - 1 - h0) // dH      # first row inside the input
        kh1 = (H - h0 + dH - 1) // dH                      # one past the last
        if kh1 > kH:
            kh1 = kH
        first_row = base + (h0 + kh0 * dH) * W
        last_row = base + (h0 + kh1 * dH) * W
        row_step = dH * W
        for ow in range(OW):
            w0 = ow * sW - pL
            kw0 = 0 if w0 >= 0 else (dW - 1 - w0) // dW
            kw1 = (W - w0 + dW - 1) // dW
            if kw1 > kW:
                kw1 = kW
            start = w0 + kw0 * dW
            stop = w0 + kw1 * dW
            arg = first_row + start
            best = F[arg]
            for row in range(first_row, last_row, row_step):
                for i in range(row + start, row + stop, dW):
                    v = F[i]
                    if v > best or v != v:
                        best = v
                        arg = i
            if dx < 0:
                F[o] = best
            else:
                F[dx + arg - x] += F[o]
            o += 1


def _windows_check(c, planes, H, W, OH, OW, kH, kW, sH, sW, pT, pL, dH, dW):
    # Every window must hold an input element: the kernels start from the window's first one.
    # Worked out as the kernels do, per output row and column (not per element).
    c.positive(planes, H, W, OH, OW, kH, kW, sH, sW, dH, dW)
    for size, outs, k, s, pad, d in ((H, OH, kH, sH, pT, dH), (W, OW, kW, sW, pL, dW)):
        for o in range(outs):
            start = o * s - pad
            first = 0 if start >= 0 else (d - 1 - start) // d
            stop = (size - start + d - 1) // d
            if (stop if stop < k else k) <= first:
                c.fail("pooling window %d lies entirely in the padding" % o)


def _zero(F, start, n):
    for i in range(start, start + n):
        F[i] = 0.0


def _planes_check(c, sides):
    # Tensor argument k holds `planes` planes of the output (sides[k] is "y") or of the
    # input ("x").
    planes, H, W, OH, OW = c.ints[:5]
    for k in range(len(sides)):
        c.holds(k, planes * (OH * OW if sides[k] == "y" else H * W))


def max_pool(F, I, args):
    y, x, planes, H, W, OH, OW, kH, kW, sH, sW, pT, pL, dH, dW = args
    _max_windows(F, y, x, -1, planes, H, W, OH, OW, kH, kW, sH, sW, pT, pL, dH, dW)


def max_pool_check(args, c):
    _planes_check(c, "yx")
    _windows_check(c, *c.ints)


def max_pool_grad(F, I, args):
    # dx = dy routed to each window's argmax, recomputed from x.
    dx, dy, x, planes, H, W, OH, OW, kH, kW, sH, sW, pT, pL, dH, dW = args
    _zero(F, dx, planes * H * W)
    _max_windows(F, dy, x, dx, planes, H, W, OH, OW, kH, kW, sH, sW, pT, pL, dH, dW)


def max_pool_grad_check(args, c):
    _planes_check(c, "xyx")
    _windows_check(c, *c.ints)


# Averages divide by the window clipped to rows [ch0, ch1) and columns [cw0, cw1): the
# input itself, or the padded input when count_include_pad (the host passes the bounds).

def _average_windows(F, out, x, backward, planes, H, W, OH, OW, kH, kW, sH, sW, pT, pL,
                     ch0, ch1, cw0, cw1):
    # Forward: out[o] = mean of window o. Backward: x[window o] += out[o] / count (x is then
    # dX, out is dY).
    o = out
    for base, h0 in _window_rows(x, planes, H * W, OH, sH, pT):
        h1 = h0 + kH
        rows = (h1 if h1 < ch1 else ch1) - (h0 if h0 > ch0 else ch0)
        first_row = base + (h0 if h0 > 0 else 0) * W
        last_row = base + (h1 if h1 < H else H) * W
        for ow in range(OW):
            w0 = ow * sW - pL
            w1 = w0 + kW
            cols = (w1 if w1 < cw1 else cw1) - (w0 if w0 > cw0 else cw0)
            start = w0 if w0 > 0 else 0
            stop = w1 if w1 < W else W
            if backward:
                share = F[o] / (rows * cols)
                for row in range(first_row, last_row, W):
                    for i in range(row + start, row + stop):
                        F[i] += share
            else:
                total = 0.0
                for row in range(first_row, last_row, W):
                    for i in range(row + start, row + stop):
                        total += F[i]
                F[o] = total / (rows * cols)
            o += 1


def _average_check(c, planes, H, W, OH, OW, kH, kW, sH, sW, pT, pL, ch0, ch1, cw0, cw1):
    # Each window's divisor (its rows and columns inside the counted bounds) must be >= 1.
    c.positive(planes, H, W, OH, OW, kH, kW, sH, sW)
    for outs, k, s, pad, low, high in ((OH, kH, sH, pT, ch0, ch1), (OW, kW, sW, pL, cw0, cw1)):
        for o in range(outs):
            start = o * s - pad
            stop = start + k
            if (stop if stop < high else high) - (start if start > low else low) < 1:
                c.fail("average pooling window %d counts no element" % o)


def average_pool(F, I, args):
    y, x, planes, H, W, OH, OW, kH, kW, sH, sW, pT, pL, ch0, ch1, cw0, cw1 = args
    _average_windows(F, y, x, False, planes, H, W, OH, OW, kH, kW, sH, sW, pT, pL,
                     ch0, ch1, cw0, cw1)


def average_pool_check(args, c):
    _planes_check(c, "yx")
    _average_check(c, *c.ints)


def average_pool_grad(F, I, args):
    # dx = each window's dy / count, spread over the window's input elements.
    dx, dy, planes, H, W, OH, OW, kH, kW, sH, sW, pT, pL, ch0, ch1, cw0, cw1 = args
    _zero(F, dx, planes * H * W)
    _average_windows(F, dy, dx, True, planes, H, W, OH, OW, kH, kW, sH, sW, pT, pL,
                     ch0, ch1, cw0, cw1)


def average_pool_grad_check(args, c):
    _planes_check(c, "xy")
    _average_check(c, *c.ints)


# The native forms of max_pool and max_pool_grad (device/native/float/float_pool.c: machine
# code for the board's architecture, in kernels/float_native.mpy where the runtime carries
# it) replace these when it imports: the same bits, no allocation. use_fast(False): the
# pure-Python kernels. A minimal runtime keeps this switch only when it carries the module
# (tools/runtime.py).
_FAST_NAMES = ("max_pool", "max_pool_grad")


def use_fast(on=True):
    from microtrain.kernels import fastpath
    return fastpath.use_fast(globals(), _FAST_NAMES, on, None, "float_native")


FAST = use_fast()
