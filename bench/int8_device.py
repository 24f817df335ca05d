# Run on the device itself, no host driver (bench/README.md): the float kernels
# (kernels/dense.gemm, kernels/conv.conv, bytecode) against the int8 kernels
# (kernels/qlinear: the viper fast paths under MicroPython, pure Python elsewhere) on the
# same shapes in the same run, and whether the int8 ones allocate (micropython.heap_lock).
# Prints one line per shape:
#   name macs float_us int8_us ratio locked
import sys
from array import array
from mac_loop import now_us, since_us
from microtrain.kernels import conv, dense, qlinear

try:
    import micropython
    lock, unlock = micropython.heap_lock, micropython.heap_unlock
except ImportError:
    lock = unlock = None


def best_of(fn, rounds):
    best = None
    for _ in range(rounds):
        t0 = now_us()
        fn()
        t = since_us(t0)
        best = t if best is None or t < best else best
    return best


def gemm_case(m, k, n, rounds):
    F = array("f", [((i * 7) % 13 - 6) * 0.1 for i in range(m * k + k * n + m * n)])
    fargs = (m * k + k * n, 0, m * k, -1, m, k, n, k, 1, n, 1, 0, 0, 1.0, 0.0)
    Q = bytearray((i * 37) & 255 for i in range(m * k + k * n + m * n))
    I = array("i", [128, 0, 0, 255] + [12000000, 36] * n)
    qargs = (Q, m * k + k * n, 0, m * k, -1, 0, m, k, n, k, 1, n, 1, 0, 0, Q)
    return (lambda: dense.gemm(F, None, fargs)), (lambda: qlinear.qlinear_gemm(None, I, qargs)), \
        m * k * n, qargs, I


def conv_case(n_img, cin, cout, groups, h, w, kh, rounds):
    pad = kh // 2
    oh, ow = h, w
    nx, nw, ny = n_img * cin * h * w, cout * (cin // groups) * kh * kh, n_img * cout * oh * ow
    geometry = (n_img, groups, cin // groups, cout // groups, h, w, oh, ow, kh, kh, 1, 1, 1, 1,
                pad, pad)
    F = array("f", [((i * 7) % 13 - 6) * 0.1 for i in range(nx + nw + ny)])
    fargs = (nx + nw, 0, nx, -1) + geometry
    Q = bytearray((i * 37) & 255 for i in range(nx + nw + ny))
    I = array("i", [128, 0, 0, 255] + [12000000, 36] * cout + [0] * (oh * ow))
    qargs = (Q, nx + nw, 0, nx, -1, 0, 4 + 2 * cout) + geometry + (0, 0, Q)
    macs = ny * (cin // groups) * kh * kh
    return (lambda: conv.conv(F, None, fargs)), (lambda: qlinear.qlinear_conv(None, I, qargs)), \
        macs, qargs, I


def main(argv):
    rounds = int(argv[1]) if len(argv) > 1 else 3
    cases = [("gemm 8x64x32 (digits MLP layer 1)",) + gemm_case(8, 64, 32, rounds),
             ("gemm 1x256x64",) + gemm_case(1, 256, 64, rounds),
             ("conv pointwise 1x1, 64->64, 25x5 (DS-CNN)",) + conv_case(1, 64, 64, 1, 25, 5, 1,
                                                                      rounds),
             ("conv depthwise 3x3, 64 ch, 25x5 (DS-CNN)",) + conv_case(1, 64, 64, 64, 25, 5, 3,
                                                                     rounds),
             ("conv 3x3, 8->8, 12x12 (LeNet-like)",) + conv_case(1, 8, 8, 1, 12, 12, 3, rounds)]
    print("fast", qlinear.FAST)
    for name, float_fn, int8_fn, macs, qargs, I in cases:
        float_fn()
        int8_fn()
        t_float = best_of(float_fn, rounds)
        t_int8 = best_of(int8_fn, rounds)
        locked = "-"
        if lock is not None:
            lock()
            try:
                int8_fn()
                locked = "yes"
            except MemoryError:
                locked = "NO"
            unlock()
        print("%s|%d|%d|%d|%.1f|%s" % (name, macs, t_float, t_int8, t_float / max(t_int8, 1),
                                       locked))


main(sys.argv)
