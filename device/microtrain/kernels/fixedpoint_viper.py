# @micropython.viper forms of kernels/fixedpoint.py's requantization, shared by the viper
# fast paths of the integer families (qlinear_viper; inttrain_viper and intgrad_viper, also
# through intsgd_viper), with the two output helpers of the int8 kernels (requant_store,
# requant_plane). Imported by fixedpoint.py at module level, so that a model's minimal
# runtime (tools/runtime.py follows module-level imports) carries it with any family that
# uses it; a build without the viper emitter (or CPython) fails that import and the families
# keep their pure-Python kernels.
#
# Same integers as fixedpoint.py's helpers, in 32-bit machine words (boards) as in 64-bit
# ones (the Unix port), nothing allocated (micropython.heap_lock()). Signed int32 values are
# read through the array object, or as (v ^ 2**31) - 2**31 of a ptr32 load (which is
# unsigned on 64-bit ports); helpers get the array objects, not pointers (a pointer passed
# between viper functions becomes an int object, a big int above 2**30 on 32-bit ports).
#
# A call between viper functions is dear: about 400 instructions for three int arguments on
# the 64-bit Unix port (callgrind), 750 on the 32-bit one, and more with every argument
# (each is boxed by the caller and converted back by the callee). So a helper here is
# called once per output, weight or gradient element at most, and what a kernel does per
# multiply-accumulate stays inline in it.
import micropython
from micropython import const

_LIMIT = const(16777216)        # 2**24: |acc| and m0 below it keep every limb product < 2**25
_ACC_LIMIT = const(536870912)   # 2**29: fixedpoint.ACC_LIMIT, requant's exact limbs' |acc|

WIDE = 0                # set by fixedpoint.py: 1 where the machine word (and a small int)
                        # has 64 bits, so that acc * m0 fits one word
requant_exact = None    # set by fixedpoint.py: its requant_saturated, for an accumulator or
                        # a multiplier beyond 2**24 (the exact value, saturated at +-2**29)


@micropython.viper
def requant(acc: int, m0: int, shift: int) -> int:
    # fixedpoint.requant: round_half_even(acc * m0 / 2**shift), shift clamped to >= 1,
    # saturated at +-2**29. One product on 64-bit ports (|acc * m0| < 2**53); else 12-bit
    # limbs (requant_narrow's: |acc| < 2**29).
    if shift < 1:
        shift = 1
    if acc <= 0 - _ACC_LIMIT or acc >= _ACC_LIMIT or m0 < 0 or m0 > _LIMIT:
        return int(requant_exact(acc, m0, shift))
    if int(WIDE):
        if shift > 62:
            return 0       # |acc * m0| < 2**53 < 2**(shift - 1); a shift of 64 would wrap
        p = acc * m0
        q = p >> shift
        rem = p - (q << shift)
        half = 1 << (shift - 1)
        if rem > half:
            q += 1
        elif rem == half and (q & 1):
            q += 1
        if q > _ACC_LIMIT:          # 2**29: the limbs' saturation, on every port
            return _ACC_LIMIT
        if q < 0 - _ACC_LIMIT:
            return 0 - _ACC_LIMIT
        return q
    negative = 0
    a = acc
    if acc < 0:
        negative = 1
        a = 0 - acc
    a2 = a >> 24
    a1 = (a >> 12) & 0xFFF
    a0 = a & 0xFFF
    m1 = m0 >> 12
    ml = m0 & 0xFFF
    mid = a1 * ml + a0 * m1
    t = a0 * ml + ((mid & 0xFFF) << 12)
    low = t & 0xFFFFFF
    high = a1 * m1 + (mid >> 12) + (t >> 24) + a2 * m0    # product = high * 2**24 + low
    if shift >= 24:
        s2 = shift - 24
        if s2 > 29:
            return 0                               # product < 2**53 <= 2**(shift - 1)
        q = high >> s2
        if s2 == 0:
            rem = low
            half = 0x800000
            tail = 0
        else:
            rem = high & ((1 << s2) - 1)
            half = 1 << (s2 - 1)
            tail = low                             # the remainder's low 24 bits
        if rem > half:
            q += 1
        elif rem == half:
            if tail > 0:
                q += 1
            elif q & 1:
                q += 1
    else:
        s1 = 24 - shift
        if high >= (1 << (29 - s1)):
            q = 1 << 29                            # far beyond any clamp bound
        else:
            q = (high << s1) + (low >> shift)
            rem = low & ((1 << shift) - 1)
            half = 1 << (shift - 1)
            if rem > half:
                q += 1
            elif rem == half and (q & 1):
                q += 1
    if negative:
        return 0 - q
    return q


@micropython.viper
def requant_store(q, y: int, acc: int, m0: int, shift: int, y_zp: int, lo: int,
                  hi: int) -> int:
    # Q[y] = clamp(requant(acc) + y_zp, lo, hi): one quantized output byte
    v = int(requant(acc, m0, shift)) + y_zp
    if v < lo:
        v = lo
    elif v > hi:
        v = hi
    b = ptr8(q)
    b[y] = v & 0xFF
    return 0


@micropython.viper
def requant_plane(pa: ptr32, pq: ptr8, count: int, acc: int, y: int, m0: int, shift: int,
                  y_zp: int, lo: int, hi: int) -> int:
    # Q[y + p] = clamp(requant(I[acc + p] - 2**30) + y_zp, lo, hi) for p < count: a plane of
    # accumulators offset by 2**30 (qlinear_viper's convolution), pa the int32 arena I, pq
    # the byte arena Q (the first three locals live in machine registers: the moving
    # pointers and the count). requant is inlined, once per plane rather than called per
    # element (a call per element would cost the 32-bit ports several times the
    # multiply-accumulates of a pointwise output): on 64-bit ports one product per element
    # for 0 <= m0 <= 2**24 (then |p| < 2**56, no accumulator needs the exact helper), and
    # round half to even is floor((p + half - 1 + odd) / 2**shift), odd the parity of
    # floor(p / 2**shift): the same integer without a branch; elsewhere the limbs, the exact
    # helper beyond them.
    if shift < 1:
        shift = 1
    if shift > 62 and m0 >= 0 and m0 <= _LIMIT:
        m0 = 0             # (a crafted shift) |acc * m0| < 2**56 <= 2**(shift - 1): 0
        shift = 62
    pa = ptr32(uint(pa) + 4 * acc)
    pq = ptr8(uint(pq) + y)
    offset = 16384
    offset <<= 16          # 2**30, built at run time: as a constant (const() or a folded
                           # 1 << 30) it is a big-int object on 32-bit ports, whose small
                           # ints end below 2**30, and viper code would not compile there
    if int(WIDE) and m0 >= 0 and m0 <= _LIMIT:
        half1 = (1 << (shift - 1)) - 1
        while count > 0:
            p = (pa[0] - offset) * m0
            z = ((p + half1 + ((p >> shift) & 1)) >> shift) + y_zp
            if z < lo:
                z = lo
            elif z > hi:
                z = hi
            pq[0] = z
            pa = ptr32(uint(pa) + 4)
            pq = ptr8(uint(pq) + 1)
            count -= 1
        return 0
    m1 = m0 >> 12
    ml = m0 & 0xFFF
    for p in range(count):
        v = pa[p] - offset
        if v > 0 - _LIMIT and v < _LIMIT and m0 >= 0 and m0 <= _LIMIT:
            negative = 0
            if v < 0:
                negative = 1
                v = 0 - v
            a1 = v >> 12
            a0 = v & 0xFFF
            mid = a1 * ml + a0 * m1
            t = a0 * ml + ((mid & 0xFFF) << 12)
            low = t & 0xFFFFFF
            high = a1 * m1 + (mid >> 12) + (t >> 24)
            if shift >= 24:
                s2 = shift - 24
                if s2 > 25:
                    z = 0
                else:
                    z = high >> s2
                    if s2 == 0:
                        rem = low
                        half = 0x800000
                        tail = 0
                    else:
                        rem = high & ((1 << s2) - 1)
                        half = 1 << (s2 - 1)
                        tail = low
                    if rem > half:
                        z += 1
                    elif rem == half:
                        if tail > 0:
                            z += 1
                        elif z & 1:
                            z += 1
            else:
                s1 = 24 - shift
                if high >= (1 << (29 - s1)):
                    z = 1 << 29
                else:
                    z = (high << s1) + (low >> shift)
                    rem = low & ((1 << shift) - 1)
                    half = 1 << (shift - 1)
                    if rem > half:
                        z += 1
                    elif rem == half and (z & 1):
                        z += 1
            if negative:
                z = 0 - z
        else:
            z = int(requant_exact(v, m0, shift))
        z += y_zp
        if z < lo:
            z = lo
        elif z > hi:
            z = hi
        pq[p] = z & 0xFF
    return 0


@micropython.viper
def round_shift(v: int, e: int) -> int:
    # fixedpoint.round_shift: round half to even of v / 2**e (e >= 0)
    if e == 0:
        return v
    q = v >> e
    rem = v - (q << e)
    half = 1 << (e - 1)
    if rem > half:
        q += 1
    elif rem == half and (q & 1):
        q += 1
    return q
