# Device side of bench/board_native.py: the native int8 Gemm and Conv
# (kernels/qlinear_native.mpy, device/native) against the viper ones on the emulated
# Cortex-M3 under qemu -icount shift=0, on the same arguments. Prints the heap the module's
# import took ("import BYTES"), then per shape "KERNEL SHAPE|MACS|VIPER TICKS|NATIVE
# TICKS|SAME" (one tick per 40 instructions; each kernel once to warm up, then once
# counted; SAME: whether the two wrote the same bytes).
import gc
import microtrain.kernels     # noqa: F401  (the package, before the measured import)
gc.collect()
free = gc.mem_free()
from microtrain.kernels import qlinear_native as native   # noqa: E402
gc.collect()
print("import", free - gc.mem_free())
import machine   # noqa: E402
from array import array   # noqa: E402
from microtrain.kernels import qlinear, qlinear_viper as viper   # noqa: E402


def counter():
    return machine.mem32[0x40028018]


def count(fn):
    fn()
    gc.collect()
    t0 = counter()
    fn()
    return (counter() - t0) & 0xFFFFFFFF


def gemm(m, k, n, transposed, signed):
    # bench/board_kernels.py's arguments: zero point 128 (unsigned inputs) or 5 (signed);
    # but the multiplier 12,000,000 / 2**31 (shift 31, as the KWS DS-CNN's Convs have,
    # 30-32; board_kernels.py's 2**36 takes the armv7m build's longer rounding)
    gc.collect()
    Q = bytearray((i * 37) & 255 for i in range(m * k + k * n + m * n))
    I = array("i", [5 if signed else 128, 0, 0, 255] + [12000000, 31] * n)
    sw_k, sw_n = (1, k) if transposed else (n, 1)
    args = [Q, m * k + k * n, 0, m * k, -1, 0, m, k, n, k, 1, sw_k, sw_n, signed, 0, Q]
    Q2 = bytearray(Q)
    args2 = tuple([Q2] + args[1:15] + [Q2])
    args = tuple(args)
    v = count(lambda: viper.qlinear_gemm(None, I, args))
    nt = count(lambda: native.qlinear_gemm(None, I, args2))
    shape = "%dx%dx%d %s %s" % (m, k, n, "W[n,k]" if transposed else "W[k,n]",
                                "int8" if signed else "uint8")
    print("gemm %s|%d|%d|%d|%s" % (shape, m * k * n, v, nt, bytes(Q) == bytes(Q2)))


def conv2d(cin, cout, groups, h, w, k, name, kw=None, s=1, pad=None):
    # bench/board_kernels.py's: stride 1, "same" padding, every tap inside counted; or a
    # k x kw kernel, stride s, padding pad = (top, left) (the KWS DS-CNN's first Conv)
    gc.collect()
    kw = k if kw is None else kw
    pt, pl = (k // 2, kw // 2) if pad is None else pad
    oh, ow = (h + 2 * pt - k) // s + 1, (w + 2 * pl - kw) // s + 1
    geometry = (1, groups, cin // groups, cout // groups, h, w, oh, ow, k, kw, s, s, 1, 1,
                pt, pl)
    nx, nw, ny = cin * h * w, cout * (cin // groups) * k * kw, cout * oh * ow
    macs = 0
    for oy in range(oh):
        for ox in range(ow):
            macs += sum(1 for dy in range(k) for dx in range(kw)
                        if 0 <= oy * s + dy - pt < h and 0 <= ox * s + dx - pl < w)
    macs *= cout * (cin // groups)
    Q = bytearray(nx + nw + ny)     # filled in place: a generator's growing copy ran out
    for i in range(len(Q)):
        Q[i] = (i * 37) & 255
    I = array("i", [128, 0, 0, 255] + [12000000, 31] * cout)
    I.extend(array("i", bytes(4 * oh * ow)))
    args = (Q, nx + nw, 0, nx, -1, 0, 4 + 2 * cout) + geometry + (0, 0, Q)
    v = count(lambda: viper.qlinear_conv(None, I, args))
    # one arena for both (a second copy did not fit the heap at the KWS shapes): the viper
    # kernel's outputs kept, then overwritten by the native kernel's
    y = bytes(memoryview(Q)[nx + nw:])
    Q[nx + nw:] = bytes(ny)
    nt = count(lambda: native.qlinear_conv(None, I, args))
    print("conv %s|%d|%d|%d|%s" % (name, macs, v, nt, y == bytes(memoryview(Q)[nx + nw:])))


print("fast", qlinear.FAST, qlinear.qlinear_gemm is native.qlinear_gemm)
for m, k, n in ((8, 64, 32), (1, 256, 32), (1, 64, 12)):
    for transposed in (1, 0):
        gemm(m, k, n, transposed, 0)
gemm(8, 64, 32, 1, 1)
gemm(1, 256, 32, 1, 1)
conv2d(8, 8, 1, 12, 12, 3, "3x3 8->8 12x12")
conv2d(32, 32, 1, 25, 5, 1, "1x1 32->32 25x5")
conv2d(32, 32, 32, 25, 5, 3, "depthwise 3x3 32 25x5")
# the KWS DS-CNN's three Conv kinds (examples/kws): its first Conv, a depthwise and a
# pointwise one
conv2d(1, 64, 1, 49, 10, 10, "KWS first 10x4 s2 1->64 49x10", kw=4, s=2, pad=(5, 1))
conv2d(64, 64, 64, 25, 5, 3, "KWS depthwise 3x3 64 25x5")
conv2d(64, 64, 1, 25, 5, 1, "KWS 1x1 64->64 25x5")
