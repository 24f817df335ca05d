# Fixed-point arithmetic of the integer kernel families, written once: kernels/qlinear.py
# (int8 inference), inttrain.py (integer training of the classifier and the 1x1 conv before
# it) and intgrad.py (the integer backward through int8 convolutions) import it; the two
# training families' SGD steps are kernels/intsgd.py, on top of it.
#
# At load (the checkers; floats allowed): a real multiplier, computed in float32 as a board
# computes it (f32), becomes an exact integer pair m0 / 2**shift (requant_pair, pairs_of);
# the quantization parameters of a step's tensors are looked up (quantization).
#
# In steps (integers only, nothing allocated on any port, so they run under
# micropython.heap_lock()): requant(acc, m0, shift) = round_half_even(acc * m0 / 2**shift),
# exactly, saturated at +-2**29 on every port (far beyond any clamp bound; a step rounded
# stochastically, >> 8 after, moves a bias by 2**21 at most: the same on a board and on
# CPython), and round_shift(v, e) = round_half_even(v / 2**e). 32-bit boards: small ints
# end at 2**30, so requant splits the product into 12-bit limbs there (requant_narrow, as
# the viper fast paths do) and no kernel allocates a big int unless an accumulator reaches
# ACC_LIMIT = 2**29 (a bias beyond 2**30 is itself a big int when read). Its viper forms
# are in kernels/fixedpoint_viper.py, integer for integer the same.
import math
import sys
from array import array

from microtrain.blob import INT8

_F32 = array("f", [0.0])
ACC_LIMIT = 1 << 29     # |accumulator| of requant's exact limbs on 32-bit ports
_INF = float("inf")


def f32(v):
    # v rounded to float32 (a no-op on boards, whose floats are float32)
    _F32[0] = v
    return _F32[0]


def requant_pair(real, capped=True):
    # (m0, shift) with real == m0 / 2**shift, m0 < 2**24, 1 <= shift <= 62, of a float32
    # multiplier; (0, 1) for 0, a negative, NaN or one below 2**-38 (always the zero point);
    # (2**24, 1) for one beyond 2**23 (always saturates). Mirrors ops/qlinear.py.
    # capped=False: no upper bound on the shift (kernels/intgrad.py's rates, whose steps
    # subtract the gradient's exponent from it before they round, and clamp it then).
    if not 0.0 < real < 3.4e38:
        return 0, 1
    mantissa, exponent = math.frexp(real)
    shift = 24 - exponent
    if shift < 1:
        return 16777216, 1
    if capped and shift > 62:
        return 0, 1
    return int(mantissa * 16777216.0), shift


def pairs_of(reals, capped=True):
    # [m0, shift, m0, shift, ...]: requant_pair of each float32 multiplier
    values = []
    for real in reals:
        values += requant_pair(real, capped)
    return values


# -- at load: the quantization parameters of a step's tensors ---------------------------
def quantization(c, k):
    # (scales, zero points, axis) of the step's tensor argument k, from the blob; a crafted
    # blob's are refused here, at load: every scale a positive finite float32, every zero
    # point in the range of the tensor's type
    q = c.blob.quant.get(c.tensors[k])
    if q is None:
        c.fail("tensor argument %d has no quantization scale to derive the multipliers from"
               % k)
    for s in q[0]:
        scale_check(c, k, s)
    for z in q[1]:
        zero_point_check(c, k, z)
    return q


def scale_check(c, k, s):
    # s: the quantization scale of tensor argument k (its Tensor.scale, or what a constant
    # the kernel reads holds)
    if not 0.0 < s < _INF:     # NaN fails too
        c.fail("scale of tensor '%s' is %r; a quantization scale must be a positive finite "
               "number" % (c.blob.names[c.tensors[k]], s))


def zero_point_check(c, k, z):
    # z: a zero point of byte tensor argument k, within the range of its type
    low, high, kind = (-128, 127, "an int8") if c.blob.dtypes[c.tensors[k]] == INT8 else \
        (0, 255, "a uint8")
    if not low <= z <= high:
        c.fail("zero point of tensor '%s' is %r; %s tensor's zero point must lie in [%d, %d]"
               % (c.blob.names[c.tensors[k]], z, kind, low, high))


def weight_scales(c, w, channels, broadcast=False):
    # The scales of the step's int8 weight (tensor argument w), one per output channel;
    # broadcast: one scale (per tensor) may stand for every channel
    sw = quantization(c, w)[0]
    if broadcast and len(sw) == 1:
        sw = tuple(sw) * channels
    if len(sw) != channels:
        c.fail("%d weight scales for %d output channels" % (len(sw), channels))
    return sw


# -- at load: requantization tensors (int8 layers' checkers) -------------------------------
def derive_requant(c, k, zps, reals):
    # A derived requantization tensor (argument k): its given header (zero points of tensor
    # arguments zps, clamp bounds) and the (m0, shift) of each real multiplier, which
    # Blob.derive puts into the int arena.
    values = requant_head(c, k, zps)
    if values is None:
        return
    for v in pairs_of(reals):
        values.append(v)
    c.blob.derive(c.tensors[k], bytes(values))


def requant_head(c, k, zps):
    # The given header of derived req tensor k: the zero points of tensor arguments zps (in
    # that order), then the output's clamp bounds. None: the same step of another program
    # (train and eval share their frozen layers) derived it already.
    tid = c.tensors[k]
    done = c.blob.int_derived
    if tid in done and tid not in c.blob.derived:
        if done[tid] != len(zps) + 2:
            c.fail("requantization tensor is shared by steps of other kinds")
        return None
    head = c.blob.derived.pop(tid, ())
    if len(head) != len(zps) + 2:
        c.fail("requantization tensor has %d given values, expected %d"
               % (len(head), len(zps) + 2))
    header_check(c, head, zps)
    done[tid] = len(head)
    return array("i", head)


def header_check(c, values, zps):
    # each zero point in the range of its tensor's type, the bounds each a byte's value
    for i in range(len(zps)):
        zero_point_check(c, zps[i], values[i])
    for i in range(len(zps), len(zps) + 2):
        c.within(values[i], -128, 255, "clamp bound")


def given_requant(c, k, zps):
    # A req tensor stored whole (not derived): the kernels trust its values, so they are
    # checked here as requant_pair would have made them (the viper and pure kernels agree
    # only for m0 in [0, 2**24] and shift in [1, 62]). Only a constant: any other tensor's
    # values could change after this check.
    c.role(k, "constant")
    data = c.blob.constant_data(c.tensors[k])
    if data is not None:
        values = array("i", data)
        header_check(c, values, zps)
        for i in range(len(zps) + 2, len(values) - 1, 2):
            c.within(values[i], 0, 16777216, "requantization multiplier")
            c.within(values[i + 1], 1, 62, "requantization shift")


# -- in steps: requantization --------------------------------------------------------------
def requant_wide(acc, m0, shift):
    # round_half_even(acc * m0 / 2**shift): exact with Python integers (64-bit small ints
    # hold the product of a 24-bit accumulator and a 24-bit multiplier)
    if shift < 1:       # the host writes 1..62; a crafted blob must not make this raise
        shift = 1
    p = acc * m0
    q = p >> shift
    r = p - (q << shift)
    half = 1 << (shift - 1)
    if r > half or (r == half and q & 1):
        q += 1
    return q


def requant_narrow(acc, m0, shift):
    # The same integer with 12-bit limbs, every intermediate below 2**30 (32-bit boards),
    # for |acc| < ACC_LIMIT = 2**29 and 0 <= m0 <= 2**24 (else the exact formula): acc as
    # a2 * 2**24 + a1 * 2**12 + a0 (a2 < 2**5), the product as high * 2**24 + low, high <
    # 33 * 2**24. A result of 2**29 or more comes back as 2**29 (far beyond any clamp), as
    # requant_saturated's.
    if not (-ACC_LIMIT < acc < ACC_LIMIT and 0 <= m0 <= 16777216):
        return requant_saturated(acc, m0, shift)
    if shift < 1:
        shift = 1
    negative = acc < 0
    a = -acc if negative else acc
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
            rem, half, tail = low, 0x800000, 0
        else:
            rem, half, tail = high & ((1 << s2) - 1), 1 << (s2 - 1), low
        if rem > half or (rem == half and (tail > 0 or q & 1)):
            q += 1
    else:
        s1 = 24 - shift
        if high >= (1 << (29 - s1)):
            q = 1 << 29                            # far beyond any clamp bound
        else:
            q = (high << s1) + (low >> shift)
            rem = low & ((1 << shift) - 1)
            half = 1 << (shift - 1)
            if rem > half or (rem == half and q & 1):
                q += 1
    return -q if negative else q


def requant_saturated(acc, m0, shift):
    # requant_wide saturated at +-2**29, as requant_narrow's limbs saturate it: requant on
    # 64-bit ports, and the exact helper of requant_narrow and the viper fast paths (an
    # accumulator or multiplier beyond their machine-word formulas), a small int on 32-bit
    # ports too (a bigger one would be cut to a machine word by the viper code)
    q = requant_wide(acc, m0, shift)
    if q > 536870912:
        return 536870912
    if q < -536870912:
        return -536870912
    return q


# 64-bit small ints (CPython, the Unix port): the direct product; else limbs
requant = requant_saturated if sys.maxsize > 1 << 40 else requant_narrow


def round_shift(v, e):
    # round half to even of v / 2**e (e >= 0): requant_wide's rounding with m0 = 1
    if e == 0:
        return v
    return requant_wide(v, 1, e)


# The viper forms (kernels/fixedpoint_viper.py), which the families' viper modules import.
# Imported here, at module level, so that a model's minimal runtime (tools/runtime.py
# follows module-level imports, try blocks included) carries it with this module, and given
# the word width and the exact helper; CPython and a MicroPython without the viper emitter
# fail the import, and the families keep their pure-Python kernels (kernels/fastpath.py).
try:
    from microtrain.kernels import fixedpoint_viper as _viper
    _viper.WIDE = 0 if requant is requant_narrow else 1
    _viper.requant_exact = requant_saturated
except (ImportError, SyntaxError):
    pass


# -- the integer losses' exponentials (kernels/inttrain.py softmax, intloss.py sigmoid) ----
# exp(-d / 2**12) in Q14 for a logit difference d >= 0 in 2**-12 units, from a three-level
# table the host computes (so that every port uses the same integers: a board's float32
# math.exp could round an entry differently): exp(-a) for a = d >> 12 < EXP_HI (exp(-12)
# * 2**14 < 0.5: beyond, 0), exp(-b / 64) for b = (d >> 6) & 63, exp(-c / 4096) for c =
# d & 63; two products of Q14 numbers, each below 2**28, rounded.
EXP_ONE = 1 << 14
EXP_HI = 12
EXP_MID = 64
EXP_LO = 64
EXP_SIZE = EXP_HI + EXP_MID + EXP_LO


def exp_q14(I, table, d):
    a = d >> 12
    if a >= EXP_HI:
        return 0
    # each product rounded (half up), not floored: a softmax sums a dozen of these, and
    # floors bias the sum low (by 8.7 of 2**14 in a 12-class DS-CNN's p - onehot)
    return (((((I[table + a] * I[table + EXP_HI + ((d >> 6) & 63)]) + 8192) >> 14)
             * I[table + EXP_HI + EXP_MID + (d & 63)]) + 8192) >> 14


def exp_table_check(c, k):
    # the exp table (tensor argument k): each of its three levels starts at 1.0 and never
    # increases, entries in [0, 1.0]; checked on its constant bytes (the arena is filled
    # after the checks)
    c.holds(k, EXP_SIZE)
    c.role(k, "constant")
    raw = c.blob.constant_data(c.tensors[k])
    if raw is None:
        c.fail("the exp table is not a constant with data")
    values = array("i", raw)
    for start, count in ((0, EXP_HI), (EXP_HI, EXP_MID), (EXP_HI + EXP_MID, EXP_LO)):
        prev = EXP_ONE
        if values[start] != EXP_ONE:
            c.fail("exp table does not start at 1.0")
        for v in values[start:start + count]:
            if not 0 <= v <= prev:
                c.fail("exp table entry %r is outside [0, %d] or increases" % (v, prev))
            prev = v
