# Convolution (ONNX Conv, 1-D and 2-D) and its gradients, side by side; ConvTranspose, which
# is a convolution's input gradient.
#
# Every kernel gets the geometry of a 2-D convolution (a 1-D one has in_h = out_h = k_h = 1):
#   n_images, groups, cin_g, cout_g   images, groups, input / output channels per group
#   in_h, in_w, out_h, out_w          spatial sizes of X and Y
#   k_h, k_w, s_h, s_w, d_h, d_w      kernel size, strides, dilations
#   pad_t, pad_l                      leading pads (the trailing ones only decide out_h, out_w)
# Layouts are ONNX's: X[n, g*cin_g + c, iy, ix], Y[n, g*cout_g + m, oy, ox],
# W[g*cout_g + m, c, ky, kx], with iy = oy*s_h - pad_t + ky*d_h, ix = ox*s_w - pad_l + kx*d_w.
#
# The taps (ky, kx) are the outer loops. For one tap, the outputs that read inside the image
# form a rectangle: rows [oy_lo, oy_lo + rows), columns [ox_lo, ox_lo + count). It is worked
# out once per tap, so padding costs nothing in the loops below it, and the innermost loop is
# one multiply-accumulate per trip along a row of that rectangle. When the rectangle's rows
# lie back to back in both X and Y (full rows, stride 1), they are walked as one long row.


try:
    from micropython import const
except ImportError:
    def const(x):
        return x

# What _taps does with each tap's rectangles:
_FORWARD = const(0)      # Y += w * X
_GRAD_INPUT = const(1)   # X += w * Y, Y holding dY
_GRAD_WEIGHT = const(2)  # w += sum(Y * X), w holding dW, Y holding dY


def _fill(F, start, n, value):
    for i in range(start, start + n):
        F[i] = value


def _taps(F, mode, y, x, w, n_images, groups, cin_g, cout_g, in_h, in_w, out_h, out_w,
          k_h, k_w, s_h, s_w, d_h, d_w, pad_t, pad_l):
    # For every tap and every (output channel m, input channel c) of a group, over all
    # images: one of the three updates above. Each element of Y, X or W is updated in the
    # order (tap, c) or (tap, m) whatever the mode, so the results do not depend on it.
    in_plane = in_h * in_w
    out_plane = out_h * out_w
    x_image = groups * cin_g * in_plane
    y_image = groups * cout_g * out_plane
    x_row = s_h * in_w
    taps = k_h * k_w
    for ky in range(k_h):
        off_y = ky * d_h - pad_t
        oy_lo = 0 if off_y >= 0 else (s_h - 1 - off_y) // s_h
        rows = min(out_h, (in_h - 1 - off_y) // s_h + 1) - oy_lo
        for kx in range(k_w):
            off_x = kx * d_w - pad_l
            ox_lo = 0 if off_x >= 0 else (s_w - 1 - off_x) // s_w
            count = min(out_w, (in_w - 1 - off_x) // s_w + 1) - ox_lo
            if rows <= 0 or count <= 0:
                continue  # this tap only ever reads padding
            lines = rows
            if count == out_w and x_row == count * s_w:
                count *= rows
                lines = 1
            y_tap = y + oy_lo * out_w + ox_lo
            x_tap = x + (oy_lo * s_h + off_y) * in_w + ox_lo * s_w + off_x
            w_tap = w + ky * k_w + kx
            for m in range(groups * cout_g):
                y_m = y_tap + m * out_plane
                x_group = x_tap + (m // cout_g) * cin_g * in_plane
                for c in range(cin_g):
                    at_w = w_tap + (m * cin_g + c) * taps
                    wv = F[at_w]  # unused by _GRAD_WEIGHT
                    s = 0.0
                    for n in range(n_images):
                        py = y_m + n * y_image
                        px = x_group + n * x_image + c * in_plane
                        for _ in range(lines):
                            b = px
                            if mode == _FORWARD:
                                for a in range(py, py + count):
                                    F[a] += wv * F[b]
                                    b += s_w
                            elif mode == _GRAD_INPUT:
                                for a in range(py, py + count):
                                    F[b] += wv * F[a]
                                    b += s_w
                            else:
                                for a in range(py, py + count):
                                    s += F[a] * F[b]
                                    b += s_w
                            py += out_w
                            px += x_row
                    if mode == _GRAD_WEIGHT:
                        F[at_w] += s  # summed in a local, stored once


def _geometry_check(c, geometry):
    # The element counts of X, Y and W. Any pads are safe (_taps clips every tap's
    # rectangle to the image); the sizes, strides and dilations must be positive.
    (n_images, groups, cin_g, cout_g, in_h, in_w, out_h, out_w, k_h, k_w, s_h, s_w, d_h,
     d_w, pad_t, pad_l) = geometry
    c.positive(n_images, groups, cin_g, cout_g, in_h, in_w, out_h, out_w, k_h, k_w, s_h, s_w,
               d_h, d_w)
    return (n_images * groups * cin_g * in_h * in_w, n_images * groups * cout_g * out_h * out_w,
            groups * cout_g * cin_g * k_h * k_w)


def conv(F, I, args):
    # Y = Conv(X, W) + B (B < 0: no bias).
    (y, x, w, b, n_images, groups, cin_g, cout_g, in_h, in_w, out_h, out_w,
     k_h, k_w, s_h, s_w, d_h, d_w, pad_t, pad_l) = args
    out_plane = out_h * out_w
    channels = groups * cout_g
    for n in range(n_images):
        for m in range(channels):
            _fill(F, y + (n * channels + m) * out_plane, out_plane, F[b + m] if b >= 0 else 0.0)
    _taps(F, _FORWARD, y, x, w, n_images, groups, cin_g, cout_g, in_h, in_w, out_h, out_w,
          k_h, k_w, s_h, s_w, d_h, d_w, pad_t, pad_l)


def conv_check(args, c):
    x_size, y_size, w_size = _geometry_check(c, args[4:20])
    c.holds(0, y_size)
    c.holds(1, x_size)
    c.holds(2, w_size)
    if c.present(3):
        c.holds(3, args[5] * args[7])  # groups * cout_g


def conv_grad_input(F, I, args):
    # dX[n, c, iy, ix] = sum over the taps and output channels that read X[n, c, iy, ix] of
    # dY[n, m, oy, ox] * W[m, c, ky, kx]: the forward's walk with the accumulation reversed.
    (dx, dy, w, n_images, groups, cin_g, cout_g, in_h, in_w, out_h, out_w,
     k_h, k_w, s_h, s_w, d_h, d_w, pad_t, pad_l) = args
    _fill(F, dx, n_images * groups * cin_g * in_h * in_w, 0.0)
    _taps(F, _GRAD_INPUT, dy, dx, w, n_images, groups, cin_g, cout_g, in_h, in_w, out_h, out_w,
          k_h, k_w, s_h, s_w, d_h, d_w, pad_t, pad_l)


def conv_grad_input_check(args, c):
    x_size, y_size, w_size = _geometry_check(c, args[3:19])
    c.holds(0, x_size)
    c.holds(1, y_size)
    c.holds(2, w_size)


def conv_grad_weight(F, I, args):
    # dW[m, c, ky, kx] = sum over images and the tap's rectangle of dY[n, m, oy, ox] * X[n, c,
    # iy, ix]: a dot product per weight. A tap that only reads padding adds nothing.
    # reset >= 0: dW is a gradient accumulation buffer and the sum is added to it unless
    # F[reset] (lazy_reset_grad) is set, which saves a weight-sized temporary.
    (dw, dy, x, reset, n_images, groups, cin_g, cout_g, in_h, in_w, out_h, out_w,
     k_h, k_w, s_h, s_w, d_h, d_w, pad_t, pad_l) = args
    if reset < 0 or F[reset] != 0.0:
        _fill(F, dw, groups * cout_g * cin_g * k_h * k_w, 0.0)
    _taps(F, _GRAD_WEIGHT, dy, x, dw, n_images, groups, cin_g, cout_g, in_h, in_w, out_h,
          out_w, k_h, k_w, s_h, s_w, d_h, d_w, pad_t, pad_l)


def conv_grad_weight_check(args, c):
    x_size, y_size, w_size = _geometry_check(c, args[4:20])
    c.holds(0, w_size)
    c.holds(1, y_size)
    c.holds(2, x_size)
    if c.present(3):
        c.holds(3, 1)


def conv_transpose(F, I, args):
    # Y = ConvTranspose(X, W) + B (B < 0: no bias) is the input gradient of the convolution
    # that reads Y's shape and writes X's, so the geometry is that convolution's: in_h, in_w
    # and cin_g are Y's sizes and channels per group, out_h, out_w and cout_g X's, and
    # W (C_X, C_Y / group, k_h, k_w) is its weight as it stands. Output cells no tap reaches
    # (output_padding) keep the bias.
    (y, x, w, b, n_images, groups, cin_g, cout_g, in_h, in_w, out_h, out_w,
     k_h, k_w, s_h, s_w, d_h, d_w, pad_t, pad_l) = args
    plane = in_h * in_w
    channels = groups * cin_g
    for n in range(n_images):
        for c in range(channels):
            _fill(F, y + (n * channels + c) * plane, plane, F[b + c] if b >= 0 else 0.0)
    _taps(F, _GRAD_INPUT, x, y, w, n_images, groups, cin_g, cout_g, in_h, in_w, out_h, out_w,
          k_h, k_w, s_h, s_w, d_h, d_w, pad_t, pad_l)


def conv_transpose_check(args, c):
    y_size, x_size, w_size = _geometry_check(c, args[4:20])  # the mirrored conv's X, Y, W
    c.holds(0, y_size)
    c.holds(1, x_size)
    c.holds(2, w_size)
    if c.present(3):
        c.holds(3, args[5] * args[6])  # groups * cin_g: Y's channels
