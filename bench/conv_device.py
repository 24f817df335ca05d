# Device side of bench/conv_kernels.py: the rate of the conv kernels (kernels/conv.py: forward,
# input gradient, weight gradient) on a few representative Conv and ConvTranspose layers and,
# in the same process, the interpreter's plain multiply-accumulate loop.
# Runs unchanged on MicroPython and CPython (only array, gc, sys, time, via mac_loop.py).
#   micropython bench/conv_device.py ROUNDS     (MICROPYPATH=device)
#   python      bench/conv_device.py ROUNDS     (PYTHONPATH=device)
# Prints one "RESULT key=value ..." line per layer and kernel for the host script.
import gc
import sys
from array import array

from mac_loop import now_us, plain_loop_rate, since_us
from microtrain.kernels.conv import conv, conv_grad_input, conv_grad_weight, conv_transpose

IMPL = sys.implementation.name

# name: (images, groups, cin_g, cout_g, in_h, in_w, k_h, k_w, stride, pad), pad on every side
LAYERS = (
    ("conv2d_3x3_8to16_24x24", (1, 1, 8, 16, 24, 24, 3, 3, 1, 1)),
    ("depthwise_3x3_16ch_24x24", (1, 16, 1, 1, 24, 24, 3, 3, 1, 1)),
    ("pointwise_1x1_16to16_24x24", (1, 1, 16, 16, 24, 24, 1, 1, 1, 0)),
    ("conv2d_3x3_s2_8to16_24x24", (1, 1, 8, 16, 24, 24, 3, 3, 2, 1)),
    ("conv1d_k5_8to16_128", (1, 1, 8, 16, 1, 128, 1, 5, 1, 2)),
)

# ConvTranspose layers of decoders: name: (images, groups, cin_g, cout_g, in_h, in_w, k_h, k_w,
# stride, pad, output_padding), X (images, groups * cin_g, in_h, in_w) -> Y (images, groups *
# cout_g, ...). Their kernels run the geometry of the convolution that reads Y and writes X:
# forward conv_transpose, input gradient conv (dX = Conv(dY, W)), weight gradient
# conv_grad_weight with X as "dY" and dY as "X" (what ops/conv.py lowers them to).
TRANSPOSED = (
    ("convT2d_4x4_s2_16to8_6x6", (1, 1, 16, 8, 6, 6, 4, 4, 2, 1, 0)),
    ("convT2d_3x3_s2_op1_8to4_12x12", (1, 1, 8, 4, 12, 12, 3, 3, 2, 1, 1)),
    ("convT2d_2x2_s2_8to8_12x12", (1, 1, 8, 8, 12, 12, 2, 2, 2, 0, 0)),
    ("convT2d_3x3_s1_8to8_12x12", (1, 1, 8, 8, 12, 12, 3, 3, 1, 1, 0)),
    ("depthwise_convT_4x4_s2_16ch_12x12", (1, 16, 1, 1, 12, 12, 4, 4, 2, 1, 0)),
    ("convT1d_k4_s2_16to8_32", (1, 1, 16, 8, 1, 32, 1, 4, 2, 1, 0)),
)


def taps_inside(size, out, kernel, stride, pad):
    # (output, tap) pairs along one dimension that read inside the input, counted one by one
    # (independently of the kernels' rectangle arithmetic); padding reads are no MACs.
    count = 0
    for o in range(out):
        for k in range(kernel):
            if 0 <= o * stride - pad + k < size:
                count += 1
    return count


def time_us(kernel, F, args):
    t0 = now_us()
    kernel(F, None, args)
    return since_us(t0)


def arena(sizes):
    # One arena holding the given tensors back to back, deterministic values in [0, 1):
    # returns it and each tensor's offset.
    offsets = []
    end = 0
    for n in sizes:
        offsets.append(end)
        end += n
    gc.collect()
    F = array("f", bytes(4 * end))
    for i in range(end):
        F[i] = ((i * 7919) % 1009) / 1009.0
    return F, offsets


def measure(name, kind, kernels, F, macs, rounds):
    # Interleaved rounds, best of each: the kernels and the plain loop see the same machine.
    best = [1e30] * len(kernels)
    loop = 0.0
    for _ in range(rounds):
        for i in range(len(kernels)):
            best[i] = min(best[i], time_us(kernels[i][1], F, kernels[i][2]))
        loop = max(loop, plain_loop_rate())
    for i in range(len(kernels)):
        rate = macs / (best[i] / 1e6)
        print("RESULT impl=%s kind=%s layer=%s kernel=%s macs=%d us=%.0f rate=%.0f loop=%.0f"
              % (IMPL, kind, name, kernels[i][0], macs, best[i], rate, loop))


rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 3
for name, (n, groups, cin_g, cout_g, in_h, in_w, k_h, k_w, stride, pad) in LAYERS:
    one_d = in_h == 1  # a 1-D layer: height 1, no vertical padding or stride
    pad_t = 0 if one_d else pad
    s_h = 1 if one_d else stride
    out_h = (in_h + 2 * pad_t - k_h) // s_h + 1
    out_w = (in_w + 2 * pad - k_w) // stride + 1
    geometry = (n, groups, cin_g, cout_g, in_h, in_w, out_h, out_w, k_h, k_w, s_h, stride,
                1, 1, pad_t, pad)
    x_size = n * groups * cin_g * in_h * in_w
    y_size = n * groups * cout_g * out_h * out_w
    w_size = groups * cout_g * cin_g * k_h * k_w
    # X, W, B, Y, dY, dX, dW
    F, (x, w, b, y, dy, dx, dw) = arena((x_size, w_size, groups * cout_g, y_size, y_size,
                                         x_size, w_size))
    macs = (n * groups * cout_g * cin_g * taps_inside(in_h, out_h, k_h, s_h, pad_t)
            * taps_inside(in_w, out_w, k_w, stride, pad))
    measure(name, "conv", (("forward", conv, (y, x, w, b) + geometry),
                           ("grad_input", conv_grad_input, (dx, dy, w) + geometry),
                           ("grad_weight", conv_grad_weight, (dw, dy, x, -1) + geometry)),
            F, macs, rounds)
    F = None

for name, (n, groups, cin_g, cout_g, in_h, in_w, k_h, k_w, stride, pad, extra) in TRANSPOSED:
    one_d = in_h == 1
    pad_t = 0 if one_d else pad
    s_h = 1 if one_d else stride
    out_h = 1 if one_d else s_h * (in_h - 1) + extra + k_h - 2 * pad_t
    out_w = stride * (in_w - 1) + extra + k_w - 2 * pad
    # The mirrored convolution reads Y (out_h x out_w, cout_g channels per group) and
    # writes X (in_h x in_w, cin_g per group).
    geometry = (n, groups, cout_g, cin_g, out_h, out_w, in_h, in_w, k_h, k_w, s_h, stride,
                1, 1, pad_t, pad)
    x_size = n * groups * cin_g * in_h * in_w
    y_size = n * groups * cout_g * out_h * out_w
    w_size = groups * cin_g * cout_g * k_h * k_w
    F, (x, w, b, y, dy, dx, dw) = arena((x_size, w_size, groups * cout_g, y_size, y_size,
                                         x_size, w_size))
    macs = (n * groups * cout_g * cin_g * taps_inside(out_h, in_h, k_h, s_h, pad_t)
            * taps_inside(out_w, in_w, k_w, stride, pad))
    measure(name, "transpose", (("forward", conv_transpose, (y, x, w, b) + geometry),
                                ("grad_input", conv, (dx, dy, w, -1) + geometry),
                                ("grad_weight", conv_grad_weight, (dw, x, dy, -1) + geometry)),
            F, macs, rounds)
    F = None
