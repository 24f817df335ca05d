# The native float Conv kernels (device/native/float/float_conv.c) against the pure-Python
# kernels of kernels/conv.py on the same board, whose floats are single precision. The test
# prepends CASES and float_native.py's helpers (everything before its gemm_case: random
# float32 data of several magnitudes, ties, zeros, in one case of five subnormals,
# infinities and NaNs; check() runs `pure` and the native kernel on copies of F and compares
# them byte for byte, a NaN equal to any NaN). Random 1-D and 2-D geometries: images,
# groups, channels, odd sizes, strides, dilations, pads (leading pads beyond the kernel,
# negative ones), output sizes past the image's; Y, X and W in any order in F. CASES cases
# in turn: conv (with and without a bias), conv_grad_input, conv_grad_weight (its lazy reset
# set or not). Prints "conv_fast B", "nan_bits N", then "cases N different D refused R"
# (R: calls reaching past F's end, raised alike).
import gc
import random
from array import array
from microtrain.kernels import conv
from microtrain.kernels import float_native as native

pure = conv._pure
print("conv_fast", conv.conv is native.conv and conv.FAST
      and conv.conv_grad_input is native.conv_grad_input
      and conv.conv_grad_weight is native.conv_grad_weight)


# same(): float_native.py's, prepended with its helpers


def axis():
    # (in, k, s, d, pad_lead, out) along one axis: sizes 1..8, kernels 1..4, strides and
    # dilations 1..3, pads 0..3 (one in ten -2..5); out as ONNX gives it with a random
    # trailing pad, or one in eight a little past it
    while True:
        n, k = random.randint(1, 8), random.randint(1, 4)
        s, d = random.choice((1, 1, 2, 3)), random.choice((1, 1, 1, 2, 3))
        lead = random.randint(-2, 5) if random.randint(0, 9) == 0 else random.randint(0, 3)
        out = (n + lead + random.randint(0, 3) - d * (k - 1) - 1) // s + 1
        if random.randint(0, 7) == 0:
            out += random.randint(1, 2)
        if out >= 1:
            return n, k, s, d, lead, out


def geometry():
    one_d = random.randint(0, 3) == 0
    in_h, k_h, s_h, d_h, pad_t, out_h = (1, 1, 1, 1, 0, 1) if one_d else axis()
    in_w, k_w, s_w, d_w, pad_l, out_w = axis()
    # (small enough that F and check()'s two copies fit the heap)
    n_images, groups = random.randint(1, 2), random.choice((1, 1, 2, 3))
    cin_g, cout_g = random.randint(1, 3), random.randint(1, 3)
    return (n_images, groups, cin_g, cout_g, in_h, in_w, out_h, out_w, k_h, k_w, s_h, s_w,
            d_h, d_w, pad_t, pad_l)


refused = 0


def conv_case(kind):
    global refused
    g = geometry()
    n_images, groups, cin_g, cout_g, in_h, in_w, out_h, out_w, k_h, k_w = g[:10]
    x_size = n_images * groups * cin_g * in_h * in_w
    y_size = n_images * groups * cout_g * out_h * out_w
    w_size = groups * cout_g * cin_g * k_h * k_w
    s_x, s_w, mode = scales()  # noqa: F821 (the helpers')
    s_y = s_x + s_w
    if kind == 0:       # conv: y, x, w, b
        bias = random.getrandbits(1)
        (y, x, w, b), size = place((y_size, x_size, w_size, groups * cout_g if bias else 0))
        F = arena(size, [(x, x_size, s_x, mode), (w, w_size, s_w, mode),  # noqa: F821
                         (b, groups * cout_g * bias, s_y, 0)])
        args, name, last = (y, x, w, b if bias else -1) + g, "conv", y + y_size
    elif kind == 1:     # conv_grad_input: dx, dy, w
        (dx, dy, w), size = place((x_size, y_size, w_size))
        F = arena(size, [(dy, y_size, s_y, mode), (w, w_size, s_w, mode)])  # noqa: F821
        args, name, last = (dx, dy, w) + g, "conv_grad_input", dx + x_size
    else:               # conv_grad_weight: dw, dy, x, reset
        (dw, dy, x, reset), size = place((w_size, y_size, x_size, 1))
        F = arena(size, [(dy, y_size, s_y, mode), (x, x_size, s_x, mode),  # noqa: F821
                         (dw, w_size, s_x + s_y, 0)])
        r = random.randint(0, 2)
        F[reset] = (0.0, 1.0)[r] if r < 2 else F[reset]
        if random.randint(0, 5) == 0:
            reset = -1
        args, name, last = (dw, dy, x, reset) + g, "conv_grad_weight", dw + w_size
    if random.randint(0, 40) == 0:      # the output past F's end: both raise IndexError
        F = array("f", F[:last - 1])
        refused += 1
    return check(name, F, args)  # noqa: F821 (the helpers')


different = 0
for case in range(CASES):  # noqa: F821 (prepended by the test)
    gc.collect()
    different += conv_case(case % 3)
print("nan_bits", nan_bits)  # noqa: F821
print("cases", CASES, "different", different, "refused", refused)  # noqa: F821
