# Device side of bench/board_float_native.py: the native float kernels (Gemm, Conv, MaxPool)
# (kernels/float_native.mpy, device/native/float) against the pure-Python ones (bytecode over
# array('f')) on the emulated Cortex-M3 under qemu -icount shift=0, on the same arguments.
# Prints per shape "KERNEL SHAPE|MACS or PARAMETERS|PURE TICKS|NATIVE TICKS|SAME" (one tick
# per 40 instructions; each kernel once to warm up, then once counted; SAME: whether the two
# wrote the same bytes), then the heap the module's import takes ("import BYTES").
import gc
import sys
from microtrain.kernels import float_native as native
import machine   # noqa: E402
import random   # noqa: E402
from array import array   # noqa: E402
from microtrain.kernels import conv, dense, pool   # noqa: E402

random.seed(5)


def counter():
    return machine.mem32[0x40028018]


def count(fn):
    fn()
    gc.collect()
    t0 = counter()
    fn()
    return (counter() - t0) & 0xFFFFFFFF


def fill(F, n, data):
    # bench/board_kernels.py's values ("bench": 1/13 of them zeros), or random normal ones
    # of either sign ("random"), half of the first operand's zero ("relu": as after a ReLU)
    for i in range(n):
        if data == "bench":
            F[i] = ((i * 7) % 13 - 6) * 0.1
        else:
            F[i] = random.uniform(-2.0, 2.0)


def same(F, F2):
    # byte for byte, a slice at a time: two bytes() copies of a 17 KB arena at once did not
    # fit beside it on the armv6m run
    for i in range(0, len(F), 256):
        if bytes(F[i:i + 256]) != bytes(F2[i:i + 256]):
            return False
    return True


def compare(name, shape, work, kernel, F, args, pure_kernel):
    F2 = array("f", F)
    t_pure = count(lambda: pure_kernel(F2, None, args))
    t_native = count(lambda: kernel(F, None, args))
    print("%s %s|%d|%d|%d|%s" % (name, shape, work, t_pure, t_native, same(F, F2)))


def gemm(m, k, n, trans_b, data, relu=False, accumulate=False):
    gc.collect()
    size = m * k + k * n + m * n + 1
    F = array("f", bytes(4 * size))
    fill(F, size, data)
    if relu:
        for i in range(m * k):
            if F[i] < 0.0:
                F[i] = 0.0
    sb_k, sb_n = (1, k) if trans_b else (n, 1)
    y = m * k + k * n
    shape = "%dx%dx%d %s%s %s" % (m, k, n, "W[n,k]" if trans_b else "W[k,n]",
                                  " relu" if relu else "", data)
    if accumulate:
        F[size - 1] = 0.0   # no reset: Y += A B
        args = (y, 0, m * k, size - 1, m, k, n, k, 1, sb_k, sb_n, 1.0)
        compare("gemm_accumulate", shape, m * k * n, native.gemm_accumulate, F, args,
                dense._pure["gemm_accumulate"])
    else:
        args = (y, 0, m * k, -1, m, k, n, k, 1, sb_k, sb_n, 0, 0, 1.0, 0.0)
        compare("gemm", shape, m * k * n, native.gemm, F, args, dense._pure["gemm"])


gemm(8, 64, 32, False, "bench")                  # bench/board_kernels.py's call
gemm(8, 64, 32, True, "random")                  # the digits MLP's first layer forward
gemm(8, 64, 32, True, "random", relu=True)
gemm(8, 32, 10, True, "random", relu=True)       # its second layer
gemm(8, 10, 32, False, "random")                 # dX of the second layer
gemm(32, 8, 64, False, "random", accumulate=True)   # dW of the first (X^T dY, as stored)
gemm(1, 128, 32, True, "random")


def conv_shape(kernel, geometry):
    # one of the float Conv kernels on the geometry (conv.py's 16 ints, no padding: each
    # MAC a tap inside the image), random data; Y, X, W (and a reset float) in turn
    gc.collect()
    n, groups, cin_g, cout_g, in_h, in_w, out_h, out_w, k_h, k_w = geometry[:10]
    x_size, y_size = n * groups * cin_g * in_h * in_w, n * groups * cout_g * out_h * out_w
    w_size = groups * cout_g * cin_g * k_h * k_w
    size = x_size + y_size + w_size + 1
    F = array("f", bytes(4 * size))
    fill(F, size, "random")
    y, x, w = 0, y_size, y_size + x_size
    F[size - 1] = 1.0       # conv_grad_weight's reset: dW = the sums
    args = {"conv": (y, x, w, -1), "conv_grad_input": (x, y, w),
            "conv_grad_weight": (w, y, x, size - 1)}[kernel] + geometry
    shape = "%dx%d>%d %dx%d k%dx%d" % (n, cin_g * groups, cout_g * groups, in_h, in_w, k_h,
                                       k_w)
    compare(kernel, shape, n * groups * cout_g * cin_g * out_h * out_w * k_h * k_w,
            getattr(native, kernel), F, args, conv._pure[kernel])


# LeNet's Convs at batch 4 (the board_cost step's): 1 -> 4 channels on 14x14, 4 -> 8 on 6x6
for kernel in ("conv", "conv_grad_input", "conv_grad_weight"):
    if kernel != "conv_grad_input":     # (the first Conv's input gradient is not needed)
        conv_shape(kernel, (4, 1, 1, 4, 14, 14, 12, 12, 3, 3, 1, 1, 1, 1, 0, 0))
    conv_shape(kernel, (4, 1, 4, 8, 6, 6, 4, 4, 3, 3, 1, 1, 1, 1, 0, 0))


def pool_shape(kernel, planes, size, out):
    # max_pool / max_pool_grad with 2x2 windows, stride 2 (LeNet's), random data; the work
    # is the windows' elements
    gc.collect()
    x_size, y_size = planes * size * size, planes * out * out
    F = array("f", bytes(4 * (2 * x_size + y_size)))
    fill(F, len(F), "random")
    g = (planes, size, size, out, out, 2, 2, 2, 2, 0, 0, 1, 1)
    args = (0, x_size) + g if kernel == "max_pool" else (0, x_size, x_size + y_size) + g
    compare(kernel, "%d planes %dx%d k2x2 s2" % (planes, size, size), y_size * 4,
            getattr(native, kernel), F, args, pool._pure[kernel])


# LeNet's max pooling at batch 4: 16 planes of 12x12, 32 of 4x4
for kernel in ("max_pool", "max_pool_grad"):
    pool_shape(kernel, 16, 12, 6)
    pool_shape(kernel, 32, 4, 2)

# The heap the module's import takes: a second copy imported alone, as a top-level module
# from its directory (the package's copy was imported with the package: module.py and
# feed.py look up their helpers in it), after the shapes, whose arrays are garbage now.
gc.collect()
sys.path.insert(0, "/rom/microtrain/kernels")
free = gc.mem_free()
import float_native   # noqa: E402,F401  (kept alive: measured while it is)
gc.collect()
print("import", free - gc.mem_free(), float_native.gemm is not native.gemm)
