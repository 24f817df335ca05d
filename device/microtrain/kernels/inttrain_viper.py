# @micropython.viper fast paths of kernels/inttrain.py (imported by it only under
# MicroPython with the viper emitter). The same integers as the pure-Python kernels: exact
# accumulators, qlinear_viper's requantization (12-bit limbs, or one product on 64-bit
# ports), the same clamps; nothing is allocated, so they run under micropython.heap_lock().
# Signed int32 values (biases, zero points, gradients, logits) are read through the array
# object (a ptr32 load is unsigned on 64-bit ports) and written through ptr32.
import micropython
from micropython import const
from microtrain.kernels.qlinear_viper import _requant, _requant64

_LIMIT = const(16777216)        # 2**24: the limbs' exact range
_LOGIT_LIMIT = const(1048576)   # kernels/inttrain.py LOGIT_LIMIT
_BIAS_LIMIT = const(8388608)    # kernels/inttrain.py BIAS_LIMIT

_WIDE = 0      # set by inttrain.py: 1 on ports with 64-bit machine words
_slow = None   # set by inttrain.py: the exact pure-Python requantization


@micropython.viper
def _rq(acc: int, m0: int, shift: int) -> int:
    if acc > 0 - _LIMIT and acc < _LIMIT:
        if int(_WIDE):
            return int(_requant64(acc, m0, shift))
        return int(_requant(acc, m0, shift))
    return int(_slow(acc, m0, shift))


@micropython.viper
def _dot(b8: ptr8, px: int, pw: int, k: int, zp: int, flip: int) -> int:
    # sum over k of (x ^ flip - zp) * w, zp including the flip
    acc = 0
    for _ in range(k):
        acc += ((int(b8[px]) ^ flip) - zp) * ((int(b8[pw]) ^ 0x80) - 0x80)
        px += 1
        pw += 1
    return acc


@micropython.viper
def int_gemm_logits(F, I, args) -> int:
    r = ptr32(I)
    z = int(args[1])
    x = int(args[2])
    w = int(args[3])
    bias = int(args[4])
    req = int(args[5])
    m = int(args[6])
    k = int(args[7])
    n = int(args[8])
    flip = 0
    if int(args[9]):
        flip = 0x80
    x_zp = int(I[req])
    for i in range(m):
        xi = x + i * k
        for j in range(n):
            acc = int(I[bias + j]) + int(_dot(args[0], xi, w + j * k, k, x_zp + flip, flip))
            v = int(_rq(acc, r[req + 1 + 2 * j], r[req + 2 + 2 * j]))
            if v > _LOGIT_LIMIT:
                v = _LOGIT_LIMIT
            elif v < 0 - _LOGIT_LIMIT:
                v = 0 - _LOGIT_LIMIT
            r[z] = v
            z += 1
    return 0


@micropython.viper
def _column(b8: ptr8, I, px: int, pg: int, m: int, k: int, n: int, zp: int, flip: int) -> int:
    # sum over the batch of g[i, j] * (x[i, t] ^ flip - zp)
    acc = 0
    for _ in range(m):
        acc += int(I[pg]) * ((int(b8[px]) ^ flip) - zp)
        px += k
        pg += n
    return acc


@micropython.viper
def int_gemm_update(F, I, args) -> int:
    q = ptr8(args[0])
    r = ptr32(I)
    w = int(args[1])
    bias = int(args[2])
    x = int(args[3])
    g = int(args[4])
    rates = int(args[5])
    random = int(args[6])
    m = int(args[7])
    k = int(args[8])
    n = int(args[9])
    flip = 0
    if int(args[10]):
        flip = 0x80
    zp = int(I[rates]) + flip
    s = 0
    moved = 0
    if random >= 0:
        s = r[random] & 0xFFFF
        if s == 0:
            s = 0xACE1
    for j in range(n):
        at = rates + 1 + 4 * j
        m0 = r[at]
        shift = r[at + 1]
        fine = 0
        if random >= 0 and shift > 8:
            fine = 1
        pw = w + j * k
        for t in range(k):
            acc = int(_column(args[0], I, x + t, g + j, m, k, n, zp, flip))
            if fine:
                # kernels/inttrain.py _dither: xorshift16
                moved = 1
                s ^= (s << 7) & 0xFFFF
                s ^= s >> 9
                s ^= (s << 8) & 0xFFFF
                step = (int(_rq(acc, m0, shift - 8)) + (s & 0xFF)) >> 8
            else:
                step = int(_rq(acc, m0, shift))
            v = ((int(q[pw + t]) ^ 0x80) - 0x80) - step
            if v > 127:
                v = 127
            elif v < -127:
                v = -127
            q[pw + t] = v & 0xFF
        acc = 0
        pg = g + j
        for _ in range(m):
            acc += int(I[pg])
            pg += n
        if random >= 0 and r[at + 3] > 8:
            moved = 1
            s ^= (s << 7) & 0xFFFF
            s ^= s >> 9
            s ^= (s << 8) & 0xFFFF
            step = (int(_rq(acc, r[at + 2], r[at + 3] - 8)) + (s & 0xFF)) >> 8
        else:
            step = int(_rq(acc, r[at + 2], r[at + 3]))
        v = int(I[bias + j]) - step
        if v > _BIAS_LIMIT:
            v = _BIAS_LIMIT
        elif v < 0 - _BIAS_LIMIT:
            v = 0 - _BIAS_LIMIT
        r[bias + j] = v
    if moved:
        r[random] = s
    return 0
