# SGD in integers, written once for the two integer training families (kernels/inttrain.py,
# intgrad.py): a step's integer update of int8 weights and int32 biases, in quanta of their
# fixed scales (QAS: quantization-aware scaling), on top of kernels/fixedpoint.py's
# requantization.
#
# At load (the checkers): the scales of a trained layer (layer_scales), the optional state
# of the stochastic rounding's generator (generator_check), derived constants computed once
# (derive_once), and a step's rates at the blob's learning rate, recorded with the function
# computing them (derive_rates), so that kernels/inttrain.py's set_learning_rate rewrites
# every family's rates without importing the family.
#
# In steps (integers only, nothing allocated on any port):
#   dither(I, at)              the xorshift16 generator of stochastic rounding
#   update_step(...)           a step acc * m0 / 2**shift in quanta, rounded stochastically
#                              or half to even
#   descend_weight / descend_bias    W -= step, b -= step, clamped
#   update_weight(...)         descend_weight by update_step
# Their viper forms are in kernels/intsgd_viper.py, integer for integer the same.
from array import array
from microtrain.kernels.fixedpoint import quantization, requant, weight_scales

BIAS_LIMIT = 1 << 23    # |trained int32 bias| clamp: keeps |acc| < 2**28 for k <= 4096 inputs
WEIGHT_LIMIT = 127      # |trained int8 weight| clamp (zero point 0, the scales fixed)
# update_step's (m0, shift) for a step already counted in 1/256 quanta (a momentum
# velocity): 1 / 2**8 written as 2 / 2**9, exact, so that the step keeps the 8 bits of
# fraction stochastic rounding draws against (update_step dithers only when shift > 8)
FINE_M0 = 2
FINE_SHIFT = 9


# -- at load: a trained layer's scales, its derived rates ------------------------------
def positive(c, v, what):
    if not 0.0 < v < 3.4e38:
        c.fail("%s %r is not positive and finite" % (what, v))


def layer_scales(c, x, w, channels, broadcast=False):
    """(s_x, x_zp, (s_w per output channel)) of a layer's input (tensor argument x) and its
    int8 weight (w) (quantization checks them); broadcast: one weight scale (per
    tensor) stands for every channel, else there must be one per channel."""
    sx, zx, _ = quantization(c, x)
    sw = weight_scales(c, w, channels, broadcast)     # positive and finite: quantization
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


# -- in steps ------------------------------------------------------------------------------


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


# The viper forms (kernels/intsgd_viper.py), which the training families' viper modules
# import: imported here, at module level, so that a model's minimal runtime
# (tools/runtime.py) carries them with this module (kernels/fixedpoint.py does the same).
try:
    from microtrain.kernels import intsgd_viper  # noqa: F401
except (ImportError, SyntaxError):
    pass
