# Device side of bench/conv_kernels.py: the rate of the conv kernels (kernels/conv.py: forward,
# input gradient, weight gradient) on a few representative layers and, in the same process,
# the interpreter's plain multiply-accumulate loop.
# Runs unchanged on MicroPython and CPython (only array, gc, sys, time, via mac_loop.py).
#   micropython bench/conv_device.py ROUNDS     (MICROPYPATH=device)
#   python      bench/conv_device.py ROUNDS     (PYTHONPATH=device)
# Prints one "RESULT key=value ..." line per layer and kernel for the host script.
import gc
import sys
from array import array

from mac_loop import now_us, plain_loop_rate, since_us
from microtrain.kernels.conv import conv, conv_grad_input, conv_grad_weight

IMPL = sys.implementation.name

# name: (images, groups, cin_g, cout_g, in_h, in_w, k_h, k_w, stride, pad), pad on every side
LAYERS = (
    ("conv2d_3x3_8to16_24x24", (1, 1, 8, 16, 24, 24, 3, 3, 1, 1)),
    ("depthwise_3x3_16ch_24x24", (1, 16, 1, 1, 24, 24, 3, 3, 1, 1)),
    ("pointwise_1x1_16to16_24x24", (1, 1, 16, 16, 24, 24, 1, 1, 1, 0)),
    ("conv2d_3x3_s2_8to16_24x24", (1, 1, 8, 16, 24, 24, 3, 3, 2, 1)),
    ("conv1d_k5_8to16_128", (1, 1, 8, 16, 1, 128, 1, 5, 1, 2)),
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
    # One arena: X, W, B, Y, dY, dX, dW, deterministic values in [0, 1).
    x, w = 0, x_size
    b = w + w_size
    y = b + groups * cout_g
    dy = y + y_size
    dx = dy + y_size
    dw = dx + x_size
    gc.collect()
    F = array("f", bytes(4 * (dw + w_size)))
    for i in range(len(F)):
        F[i] = ((i * 7919) % 1009) / 1009.0
    macs = (n * groups * cout_g * cin_g * taps_inside(in_h, out_h, k_h, s_h, pad_t)
            * taps_inside(in_w, out_w, k_w, stride, pad))
    best = {"forward": 1e30, "grad_input": 1e30, "grad_weight": 1e30}
    loop = 0.0
    # Interleaved rounds, best of each: the kernels and the plain loop see the same machine.
    for _ in range(rounds):
        best["forward"] = min(best["forward"], time_us(conv, F, (y, x, w, b) + geometry))
        best["grad_input"] = min(best["grad_input"],
                                 time_us(conv_grad_input, F, (dx, dy, w) + geometry))
        best["grad_weight"] = min(best["grad_weight"],
                                  time_us(conv_grad_weight, F, (dw, dy, x, -1) + geometry))
        loop = max(loop, plain_loop_rate())
    for kernel in ("forward", "grad_input", "grad_weight"):
        rate = macs / (best[kernel] / 1e6)
        print("RESULT impl=%s layer=%s kernel=%s macs=%d us=%.0f rate=%.0f loop=%.0f"
              % (IMPL, name, kernel, macs, best[kernel], rate, loop))
    F = None
