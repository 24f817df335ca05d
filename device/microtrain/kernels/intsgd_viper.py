# @micropython.viper forms of kernels/intsgd.py's step helpers, shared by the viper fast
# paths of the integer training families (inttrain_viper, intgrad_viper): the same
# integers, nothing allocated. Imported by intsgd.py at module level (for tools/runtime.py's
# minimal runtimes); requant is kernels/fixedpoint_viper.py's. Signed int32 values are read
# through the array object (a ptr32 load is unsigned on 64-bit ports). A call between viper
# functions is dear (kernels/fixedpoint_viper.py): these are called once per weight or bias
# at most.
import micropython
from micropython import const
from microtrain.kernels.fixedpoint_viper import requant

_BIAS_LIMIT = const(8388608)    # intsgd.BIAS_LIMIT


@micropython.viper
def dither(I, at: int) -> int:
    # intsgd.dither: the next xorshift16 value of the state I[at] (0: unseeded)
    r = ptr32(I)
    s = r[at] & 0xFFFF
    if s == 0:
        s = 0xACE1
    s ^= (s << 7) & 0xFFFF
    s ^= s >> 9
    s ^= (s << 8) & 0xFFFF
    r[at] = s
    return s


@micropython.viper
def update_step(I, acc: int, m0: int, shift: int, random: int) -> int:
    # intsgd.update_step: the step acc * m0 / 2**shift in quanta, stochastic (random >= 0,
    # 8 bits of fraction) or rounded half to even
    if random >= 0 and shift > 8:
        return (int(requant(acc, m0, shift - 8)) + (int(dither(I, random)) & 0xFF)) >> 8
    return int(requant(acc, m0, shift))


@micropython.viper
def update_weight(q, I, at: int, acc: int, m0: int, shift: int, random: int) -> int:
    # intsgd.update_weight: the int8 weight Q[at] -= update_step(I, acc, m0, shift,
    # random), clamped to +-127 (intsgd.descend_weight). Called once per weight, so
    # update_step, dither and the clamp are written out here: one call instead of four
    # (calling dither instead cost +1.1 % of a whole int8 train step, bench/int8_callgrind.py
    # "train block" on the Unix port: 125,648,102 -> 127,006,801 instructions).
    if random >= 0 and shift > 8:
        r = ptr32(I)
        s = r[random] & 0xFFFF
        if s == 0:
            s = 0xACE1
        s ^= (s << 7) & 0xFFFF
        s ^= s >> 9
        s ^= (s << 8) & 0xFFFF
        r[random] = s
        step = (int(requant(acc, m0, shift - 8)) + (s & 0xFF)) >> 8
    else:
        step = int(requant(acc, m0, shift))
    b = ptr8(q)
    v = ((int(b[at]) ^ 0x80) - 0x80) - step
    if v > 127:
        v = 127
    elif v < -127:
        v = -127
    b[at] = v & 0xFF
    return 0


@micropython.viper
def descend_bias(I, at: int, step: int) -> int:
    # intsgd.descend_bias: the int32 bias I[at] -= step, clamped to +-BIAS_LIMIT
    v = int(I[at]) - step
    if v > _BIAS_LIMIT:
        v = _BIAS_LIMIT
    elif v < 0 - _BIAS_LIMIT:
        v = 0 - _BIAS_LIMIT
    r = ptr32(I)
    r[at] = v
    return 0
