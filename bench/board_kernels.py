# Device side of bench/board_cost.py: instructions per multiply-accumulate of each kernel
# family on the emulated Cortex-M3 under qemu -icount shift=0. Each kernel runs once to warm
# up, then once counted by the FPGAIO counter (one tick per 40 instructions); prints
# "kernel FAMILY|SHAPE|MACS|TICKS", then the optimizer updates' "update OPTIMIZER|SHAPE|
# PARAMETERS|TICKS". The calls are the kernels' own (kernels/dense, conv: bytecode
# over array('f'); kernels/qlinear: its viper fast paths where MicroPython has them, as the
# board's runtime picks them; kernels/optim), on the shapes of the models the bench steps.
import gc
import machine
from array import array
from microtrain.kernels import conv, dense, optim, qlinear


def counter():
    return machine.mem32[0x40028018]


def count(fn):
    fn()
    gc.collect()
    t0 = counter()
    fn()
    return (counter() - t0) & 0xFFFFFFFF


def floats(n):
    # filled in place: a list of n boxed floats would not fit the 140 KiB heap
    F = array("f", bytes(4 * n))
    for i in range(n):
        F[i] = ((i * 7) % 13 - 6) * 0.1
    return F


def requant(channels, extra=0):
    # header (zero points and clamp) then a multiplier and shift per output channel
    return array("i", [128, 0, 0, 255] + [12000000, 36] * channels + [0] * extra)


def gemm(m, k, n):
    F = floats(m * k + k * n + m * n)
    f = (m * k + k * n, 0, m * k, -1, m, k, n, k, 1, n, 1, 0, 0, 1.0, 0.0)
    Q = bytearray((i * 37) & 255 for i in range(m * k + k * n + m * n))
    q = (Q, m * k + k * n, 0, m * k, -1, 0, m, k, n, k, 1, n, 1, 0, 0, Q)
    I = requant(n)
    return (lambda: dense.gemm(F, None, f)), (lambda: qlinear.qlinear_gemm(None, I, q)), m * k * n


def conv2d(cin, cout, groups, h, w, k, with_float):
    # stride 1, "same" padding: every tap inside counted (padding reads are no MACs)
    pad = k // 2
    geometry = (1, groups, cin // groups, cout // groups, h, w, h, w, k, k, 1, 1, 1, 1, pad, pad)
    nx, nw = cin * h * w, cout * (cin // groups) * k * k
    ny = cout * h * w
    macs = 0
    for oy in range(h):
        for ox in range(w):
            inside = sum(1 for dy in range(k) for dx in range(k)
                         if 0 <= oy + dy - pad < h and 0 <= ox + dx - pad < w)
            macs += inside
    macs *= cout * (cin // groups)
    float_fn = None
    if with_float:
        F = floats(nx + nw + ny)
        float_fn = lambda: conv.conv(F, None, (nx + nw, 0, nx, -1) + geometry)  # noqa: E731
    Q = bytearray((i * 37) & 255 for i in range(nx + nw + ny))
    I = requant(cout, h * w)
    q = (Q, nx + nw, 0, nx, -1, 0, 4 + 2 * cout) + geometry + (0, 0, Q)
    return float_fn, (lambda: qlinear.qlinear_conv(None, I, q)), macs


print("fast", qlinear.FAST)
float_gemm, int8_gemm, macs = gemm(8, 64, 32)
print("kernel float dense|gemm 8x64x32|%d|%d" % (macs, count(float_gemm)))
print("kernel int8 dense|gemm 8x64x32|%d|%d" % (macs, count(int8_gemm)))
del float_gemm, int8_gemm
gc.collect()
float_conv, int8_conv, macs = conv2d(8, 8, 1, 12, 12, 3, True)
print("kernel float conv|conv 3x3 8->8 12x12|%d|%d" % (macs, count(float_conv)))
print("kernel int8 conv|conv 3x3 8->8 12x12|%d|%d" % (macs, count(int8_conv)))
del float_conv, int8_conv
gc.collect()
_, int8_conv, macs = conv2d(64, 64, 1, 25, 5, 1, False)
print("kernel int8 conv|conv 1x1 64->64 25x5|%d|%d" % (macs, count(int8_conv)))
del int8_conv
gc.collect()
_, int8_conv, macs = conv2d(64, 64, 64, 25, 5, 3, False)
print("kernel int8 depthwise|depthwise 3x3 64 25x5|%d|%d" % (macs, count(int8_conv)))
del int8_conv
gc.collect()
n = 1024   # p, g, m, v, then lr and AdamW's step size (LeNet has 1,034 parameters)
F = floats(4 * n + 2)
F[4 * n] = F[4 * n + 1] = 0.01
print("update SGD|sgd %d|%d|%d" % (n, n, count(lambda: optim.sgd(F, None, (0, n, 4 * n, n)))))
print("update AdamW|adamw %d|%d|%d" % (n, n, count(lambda: optim.adamw(
    F, None, (0, n, 2 * n, 3 * n, 4 * n, 4 * n + 1, n, 0.9, 0.999, 1e-6, 0.0)))))
