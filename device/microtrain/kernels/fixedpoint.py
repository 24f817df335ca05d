# Fixed-point arithmetic of the integer kernel families, written once: kernels/qlinear.py
# (int8 inference), inttrain.py (integer training of the classifier and the 1x1 conv before
# it) and intgrad.py (the integer backward through int8 convolutions) import it.
#
# At load (the checkers; floats allowed): a real multiplier, computed in float32 as a board
# computes it (f32), becomes an exact integer pair m0 / 2**shift (requant_pair); the
# quantization parameters of a step's tensors are looked up and checked; derived int32
# constants (multipliers, learning-rate rates) are computed once and recorded.
#
# In steps (integers only, nothing allocated on any port, so they run under
# micropython.heap_lock()):
#   requant(acc, m0, shift)    round_half_even(acc * m0 / 2**shift), exactly
#   round_shift(v, e)          round_half_even(v / 2**e)
#   dither(I, at)              the xorshift16 generator of stochastic rounding
#   update_step(...)           an SGD step in quanta, rounded stochastically or half to even
#   descend_weight / descend_bias    W -= step, b -= step, clamped
#   update_weight(...)         descend_weight by update_step
#
# 32-bit boards: small ints end at 2**30. requant splits the product into 12-bit limbs there
# (requant_narrow, as the viper fast paths do), so no kernel allocates a big int unless an
# accumulator or a bias reaches 2**24 (a bias beyond 2**30 is itself a big int when read).
# The viper forms of the step helpers are in kernels/fixedpoint_viper.py, integer for
# integer the same.
import math
import sys
from array import array

BIAS_LIMIT = 1 << 23    # |trained int32 bias| clamp: keeps |acc| < 2**24 for k <= 256 inputs
WEIGHT_LIMIT = 127      # |trained int8 weight| clamp (zero point 0, the scales fixed)
# update_step's (m0, shift) for a step already counted in 1/256 quanta (a momentum
# velocity): 1 / 2**8 written as 2 / 2**9, exact, so that the step keeps the 8 bits of
# fraction stochastic rounding draws against (update_step dithers only when shift > 8)
FINE_M0 = 2
FINE_SHIFT = 9

_F32 = array("f", [0.0])


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


# -- at load: the quantization parameters of a step's tensors ---------------------------
def quantization(c, k):
    # (scales, zero points, axis) of the step's tensor argument k, from the blob
    q = c.blob.quant.get(c.tensors[k])
    if q is None:
        c.fail("tensor argument %d has no quantization scale to derive the multipliers from"
               % k)
    return q


def positive(c, v, what):
    if not 0.0 < v < 3.4e38:
        c.fail("%s %r is not positive and finite" % (what, v))


def layer_scales(c, x, w, channels, broadcast=False):
    """(s_x, x_zp, (s_w per output channel)) of a layer's input (tensor argument x) and its
    int8 weight (w), every scale positive and finite; broadcast: one weight scale (per
    tensor) stands for every channel, else there must be one per channel."""
    sx, zx, _ = quantization(c, x)
    sw = quantization(c, w)[0]
    if broadcast and len(sw) == 1:
        sw = tuple(sw) * channels
    if len(sw) != channels:
        c.fail("%d weight scales for %d output channels" % (len(sw), channels))
    positive(c, sx[0], "input scale")
    for s in sw:
        positive(c, s, "weight scale")
    return sx[0], zx[0], tuple(sw)


def generator_check(c, k):
    # the optional tensor argument k: the state of stochastic rounding's generator (dither)
    if c.present(k):
        c.holds(k, 1)
        c.role(k, "optimizer_state")


def derive_once(c, k, values):
    # Tensor argument k is a derived constant with no given values: its contents, computed
    # (once: the eval program's step reads what the train program's derived). True when
    # this call derived it.
    tid = c.tensors[k]
    done = c.blob.int_derived
    if tid in done:
        if done[tid] != len(values):
            c.fail("derived tensor argument %d is shared by steps of other sizes" % k)
        return False
    if tid not in c.blob.derived:
        c.fail("tensor argument %d must be a derived constant" % k)
    if c.blob.derived.pop(tid):
        c.fail("derived tensor argument %d has given values" % k)
    done[tid] = len(values)
    c.blob.derive(tid, bytes(array("i", values)))
    return True


def derive_rates(c, k, rates_of, params):
    # Tensor argument k holds a training step's rates, rates_of(params, lr) (ints): derived
    # at the blob's learning rate and recorded, so that set_learning_rate (kernels/inttrain.py)
    # rewrites it for another one without knowing which family made it.
    lr = c.blob.optimizer.get("learning_rate", 0.0)
    if derive_once(c, k, rates_of(params, lr)):
        c.blob.int_rates.append((c.tensors[k], rates_of, params))


def pairs_of(reals, capped=True):
    # [m0, shift, m0, shift, ...]: requant_pair of each float32 multiplier
    values = []
    for real in reals:
        values += requant_pair(real, capped)
    return values


# -- in steps: rounding ------------------------------------------------------------------
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
    # for |acc| < 2**24 and 0 <= m0 <= 2**24 (else the exact formula).
    if not (-16777216 < acc < 16777216 and 0 <= m0 <= 16777216):
        return requant_wide(acc, m0, shift)
    if shift < 1:
        shift = 1
    negative = acc < 0
    a = -acc if negative else acc
    a1 = a >> 12
    a0 = a & 0xFFF
    m1 = m0 >> 12
    ml = m0 & 0xFFF
    mid = a1 * ml + a0 * m1
    t = a0 * ml + ((mid & 0xFFF) << 12)
    low = t & 0xFFFFFF
    high = a1 * m1 + (mid >> 12) + (t >> 24)      # product = high * 2**24 + low
    if shift >= 24:
        s2 = shift - 24
        if s2 > 25:
            return 0                               # product < 2**49 <= 2**(shift - 1)
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


# 64-bit small ints (CPython, the Unix port): the direct product; else limbs
requant = requant_wide if sys.maxsize > 1 << 40 else requant_narrow


def requant_saturated(acc, m0, shift):
    # The viper fast paths' exact helper (an accumulator or multiplier beyond their
    # machine-word formulas): requant_wide saturated at +-2**29, far beyond any clamp bound,
    # so that the result is a small int on 32-bit ports too (a bigger one would be cut to a
    # machine word by the viper code; every caller clamps it far below 2**29)
    q = requant_wide(acc, m0, shift)
    if q > 536870912:
        return 536870912
    if q < -536870912:
        return -536870912
    return q


def round_shift(v, e):
    # round half to even of v / 2**e (e >= 0): requant_wide's rounding with m0 = 1
    if e == 0:
        return v
    return requant_wide(v, 1, e)


# -- in steps: SGD updates in quanta ------------------------------------------------------
def dither(I, at):
    # the next value of the xorshift16 generator whose state is I[at] (0: not seeded yet),
    # 16 bits, so that no intermediate reaches 2**30 on any port
    s = I[at] or 0xACE1
    s ^= (s << 7) & 0xFFFF
    s ^= s >> 9
    s ^= (s << 8) & 0xFFFF
    I[at] = s
    return s


def update_step(I, acc, m0, shift, random):
    # The step acc * m0 / 2**shift in whole quanta. Stochastic (random >= 0: the index of the
    # generator's state) when the step has 8 bits of fraction to round: the step in 1/256
    # quanta, rounded half to even, plus a uniform 0..255 from the generator, >> 8, so that
    # steps below half a quantum still move the weights on average; else half to even.
    if random >= 0 and shift > 8:
        return (requant(acc, m0, shift - 8) + (dither(I, random) & 255)) >> 8
    return requant(acc, m0, shift)


def clamp(v, limit):
    # v clamped to [-limit, limit]
    if v > limit:
        return limit
    if v < -limit:
        return -limit
    return v


def descend_weight(Q, at, step):
    # the int8 weight Q[at] (a two's complement byte) -= step, clamped to +-WEIGHT_LIMIT
    Q[at] = clamp(((Q[at] ^ 128) - 128) - step, WEIGHT_LIMIT) & 255


def update_weight(Q, I, at, acc, m0, shift, random):
    # the SGD step of one int8 weight: descend_weight by update_step (in one call in the
    # viper form, which is called per weight)
    descend_weight(Q, at, update_step(I, acc, m0, shift, random))


def descend_bias(I, at, step):
    # the int32 bias I[at] -= step, clamped to +-BIAS_LIMIT
    I[at] = clamp(I[at] - step, BIAS_LIMIT)


# The viper forms of the step helpers (kernels/fixedpoint_viper.py), which the families'
# viper modules import. Imported here, at module level, so that a model's minimal runtime
# (tools/runtime.py follows module-level imports, try blocks included) carries it with this
# module; CPython and a MicroPython without the viper emitter fail the import, and the
# families keep their pure-Python kernels (kernels/fastpath.py).
try:
    from microtrain.kernels import fixedpoint_viper as _viper
    _viper.WIDE = 1 if requant is requant_wide else 0
    _viper.requant_exact = requant_saturated
except (ImportError, SyntaxError):
    pass
