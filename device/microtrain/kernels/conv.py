# Convolution (ONNX Conv, 1-D, 2-D and 3-D) and its gradients, side by side; ConvTranspose,
# which is a convolution's input gradient.
#
# Every 1-D and 2-D kernel gets the geometry of a 2-D convolution (a 1-D one has
# in_h = out_h = k_h = 1):
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
#
# The 3-D kernels (CONV_3D...) get six more ints, in_d, out_d, k_d, s_d, d_d, pad_f, in front
# of their 2-D counterparts' (depth first in each group), and walk the depth taps and output
# depths around the same 2-D walk: for depth tap kz, output plane od reads input plane
# iz = od*s_d - pad_f + kz*d_d with the weights W[m, c, kz], the planes now a depth apart
# within each channel.


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


def _fill_bias(F, y, b, n_images, channels, plane):
    # Each of Y's planes (n_images x channels of `plane` elements) = its channel's bias
    # (b < 0: zeros); the taps then add to it.
    for n in range(n_images):
        for m in range(channels):
            _fill(F, y + (n * channels + m) * plane, plane, F[b + m] if b >= 0 else 0.0)


def _sizes_check(c, a, b, w, extra):
    # Tensor arguments 0, 1 and 2 hold a, b and w elements; argument 3, when the kernel has
    # one (extra is not None) and it is present, extra.
    c.holds(0, a)
    c.holds(1, b)
    c.holds(2, w)
    if extra is not None and c.present(3):
        c.holds(3, extra)


def _taps(F, mode, y, x, w, geometry, x_chan=0, y_chan=0, taps=0):
    # For every tap and every (output channel m, input channel c) of a group, over all
    # images: one of the three updates above. Each element of Y, X or W is updated in the
    # order (tap, c) or (tap, m) whatever the mode, so the results do not depend on it.
    # geometry: the 2-D one (the 16 ints above). x_chan, y_chan: elements from one
    # channel's plane to the next's (a depth of planes in 3-D; 0: a plane's size); taps:
    # W's elements per (m, c) (0: k_h * k_w).
    (n_images, groups, cin_g, cout_g, in_h, in_w, out_h, out_w, k_h, k_w, s_h, s_w, d_h, d_w,
     pad_t, pad_l) = geometry
    if not taps:
        x_chan = in_h * in_w
        y_chan = out_h * out_w
        taps = k_h * k_w
    x_image = groups * cin_g * x_chan
    y_image = groups * cout_g * y_chan
    x_row = s_h * in_w
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
                y_m = y_tap + m * y_chan
                x_group = x_tap + (m // cout_g) * cin_g * x_chan
                for c in range(cin_g):
                    at_w = w_tap + (m * cin_g + c) * taps
                    wv = F[at_w]  # unused by _GRAD_WEIGHT
                    s = 0.0
                    for n in range(n_images):
                        py = y_m + n * y_image
                        px = x_group + n * x_image + c * x_chan
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
    y, x, w, b = args[:4]
    n_images, groups, cin_g, cout_g, in_h, in_w, out_h, out_w = args[4:12]
    _fill_bias(F, y, b, n_images, groups * cout_g, out_h * out_w)
    _taps(F, _FORWARD, y, x, w, args[4:])


def conv_check(args, c):
    x_size, y_size, w_size = _geometry_check(c, c.ints)
    _sizes_check(c, y_size, x_size, w_size, c.ints[1] * c.ints[3])  # bias: groups * cout_g


def conv_grad_input(F, I, args):
    # dX[n, c, iy, ix] = sum over the taps and output channels that read X[n, c, iy, ix] of
    # dY[n, m, oy, ox] * W[m, c, ky, kx]: the forward's walk with the accumulation reversed.
    dx, dy, w = args[:3]
    n_images, groups, cin_g, cout_g, in_h, in_w = args[3:9]
    _fill(F, dx, n_images * groups * cin_g * in_h * in_w, 0.0)
    _taps(F, _GRAD_INPUT, dy, dx, w, args[3:])


def conv_grad_input_check(args, c):
    x_size, y_size, w_size = _geometry_check(c, c.ints)
    _sizes_check(c, x_size, y_size, w_size, None)


def conv_grad_weight(F, I, args):
    # dW[m, c, ky, kx] = sum over images and the tap's rectangle of dY[n, m, oy, ox] * X[n, c,
    # iy, ix]: a dot product per weight. A tap that only reads padding adds nothing.
    # reset >= 0: dW is a gradient accumulation buffer and the sum is added to it unless
    # F[reset] (lazy_reset_grad) is set, which saves a weight-sized temporary.
    dw, dy, x, reset = args[:4]
    if reset < 0 or F[reset] != 0.0:
        n_images, groups, cin_g, cout_g, in_h, in_w, out_h, out_w, k_h, k_w = args[4:14]
        _fill(F, dw, groups * cout_g * cin_g * k_h * k_w, 0.0)
    _taps(F, _GRAD_WEIGHT, dy, x, dw, args[4:])


def conv_grad_weight_check(args, c):
    x_size, y_size, w_size = _geometry_check(c, c.ints)
    _sizes_check(c, w_size, y_size, x_size, 1)  # reset: one float


def conv_transpose(F, I, args):
    # Y = ConvTranspose(X, W) + B (B < 0: no bias) is the input gradient of the convolution
    # that reads Y's shape and writes X's, so the geometry is that convolution's: in_h, in_w
    # and cin_g are Y's sizes and channels per group, out_h, out_w and cout_g X's, and
    # W (C_X, C_Y / group, k_h, k_w) is its weight as it stands. Output cells no tap reaches
    # (output_padding) keep the bias.
    y, x, w, b = args[:4]
    n_images, groups, cin_g, cout_g, in_h, in_w = args[4:10]
    _fill_bias(F, y, b, n_images, groups * cin_g, in_h * in_w)
    _taps(F, _GRAD_INPUT, x, y, w, args[4:])


def conv_transpose_check(args, c):
    y_size, x_size, w_size = _geometry_check(c, c.ints)  # the mirrored conv's X, Y, W
    _sizes_check(c, y_size, x_size, w_size, c.ints[1] * c.ints[2])  # groups * cin_g: Y's


# The native forms of the 2-D kernels (device/native/float/float_conv.c: machine code for the
# board's architecture, in kernels/float_native.mpy where the runtime carries it) replace
# these when it imports: the same bits, no allocation. use_fast(False): the pure-Python
# kernels. A minimal runtime keeps this switch only when it carries the module
# (tools/runtime.py).
_FAST_NAMES = ("conv", "conv_grad_input", "conv_grad_weight")


def use_fast(on=True):
    from microtrain.kernels import fastpath
    return fastpath.use_fast(globals(), _FAST_NAMES, on, None, "float_native")


FAST = use_fast()

# -- 3-D: the depth taps and output depths around the 2-D walk ---------------------------

def _taps_3d(F, mode, y, x, w, args):
    (n_images, groups, cin_g, cout_g, in_d, in_h, in_w, out_d, out_h, out_w, k_d, k_h, k_w,
     s_d, s_h, s_w, d_d, d_h, d_w, pad_f, pad_t, pad_l) = args
    in_plane = in_h * in_w
    out_plane = out_h * out_w
    taps_2d = k_h * k_w
    x_chan = in_d * in_plane
    y_chan = out_d * out_plane
    taps = k_d * taps_2d
    geometry_2d = (n_images, groups, cin_g, cout_g, in_h, in_w, out_h, out_w, k_h, k_w, s_h,
                   s_w, d_h, d_w, pad_t, pad_l)
    for kz in range(k_d):
        off_z = kz * d_d - pad_f
        od_lo = 0 if off_z >= 0 else (s_d - 1 - off_z) // s_d
        od_hi = min(out_d, (in_d - 1 - off_z) // s_d + 1)  # output depths reading inside
        for od in range(od_lo, od_hi):
            _taps(F, mode, y + od * out_plane, x + (od * s_d + off_z) * in_plane,
                  w + kz * taps_2d, geometry_2d, x_chan, y_chan, taps)


def _geometry_3d_check(c, geometry):
    # The element counts of X, Y and W; as in 2-D, any pads are safe (a depth tap reads
    # only the output depths whose input plane lies inside).
    (n_images, groups, cin_g, cout_g, in_d, in_h, in_w, out_d, out_h, out_w, k_d, k_h, k_w,
     s_d, s_h, s_w, d_d, d_h, d_w, pad_f, pad_t, pad_l) = geometry
    c.positive(n_images, groups, cin_g, cout_g, in_d, in_h, in_w, out_d, out_h, out_w, k_d,
               k_h, k_w, s_d, s_h, s_w, d_d, d_h, d_w)
    return (n_images * groups * cin_g * in_d * in_h * in_w,
            n_images * groups * cout_g * out_d * out_h * out_w,
            groups * cout_g * cin_g * k_d * k_h * k_w)


def conv3d(F, I, args):
    # Y = Conv(X, W) + B over (N, C, D, H, W) (B < 0: no bias).
    y, x, w, b = args[0:4]
    geometry = args[4:26]
    n_images, groups, cout_g = geometry[0], geometry[1], geometry[3]
    _fill_bias(F, y, b, n_images, groups * cout_g, geometry[7] * geometry[8] * geometry[9])
    _taps_3d(F, _FORWARD, y, x, w, geometry)


def conv3d_check(args, c):
    x_size, y_size, w_size = _geometry_3d_check(c, c.ints)
    _sizes_check(c, y_size, x_size, w_size, c.ints[1] * c.ints[3])  # bias: groups * cout_g


def conv3d_grad_input(F, I, args):
    # dX of the 3-D convolution: its walk with the accumulation reversed.
    dx, dy, w = args[0:3]
    geometry = args[3:25]
    _fill(F, dx, geometry[0] * geometry[1] * geometry[2] * geometry[4] * geometry[5]
          * geometry[6], 0.0)
    _taps_3d(F, _GRAD_INPUT, dy, dx, w, geometry)


def conv3d_grad_input_check(args, c):
    x_size, y_size, w_size = _geometry_3d_check(c, c.ints)
    _sizes_check(c, x_size, y_size, w_size, None)


def conv3d_grad_weight(F, I, args):
    # dW of the 3-D convolution; reset as in conv_grad_weight (an accumulation buffer).
    dw, dy, x, reset = args[0:4]
    geometry = args[4:26]
    if reset < 0 or F[reset] != 0.0:
        _fill(F, dw, geometry[1] * geometry[3] * geometry[2] * geometry[10] * geometry[11]
              * geometry[12], 0.0)
    _taps_3d(F, _GRAD_WEIGHT, dy, x, dw, geometry)


def conv3d_grad_weight_check(args, c):
    x_size, y_size, w_size = _geometry_3d_check(c, c.ints)
    _sizes_check(c, w_size, y_size, x_size, 1)  # reset: one float
