# Integer losses of the last Gemm besides kernels/inttrain.py's softmax cross-entropy
# (issue 22): the mean squared error (autoencoders, anomaly detection) and binary
# cross-entropy with logits. Every step integer-only (runs under micropython.heap_lock());
# floats only at load and in the loss value Module reports after the step.
#
# Both read the output z of int_gemm_logits (the real output times 2**LOGIT_BITS, int32)
# and write a gradient g [m, n] that int_gemm_update (and its momentum form) takes as it
# takes the cross-entropy's: the update's multipliers divide by the count recorded here at
# load (c.blob.int_units[g]: dL/dy[i, j] = g[i, j] / (2**14 * count)), where the
# cross-entropy's count is the batch m. Both losses are means over all m * n elements, as
# torch's F.mse_loss and BCEWithLogitsLoss (reduction "mean").
#
#   int_mse         the target T: int8 / uint8 with its own scale and zero point (the
#                   output's, or the model's input for an autoencoder), brought to z's fixed
#                   point t = requant(T - t_zp, s_t * 2**LOGIT_BITS) (derived: [t_zp, m0,
#                   shift]); d = (z - t) in 2**-8 units (rounded: the gradient's range and
#                   the loss ints below are sized for them), g = clamp(d, +-GRAD_LIMIT) (|y - t| beyond 64 counts as 64 in
#                   the gradient), so dL/dy = 2 d / (2**8 m n) = g / (2**14 * m n / 2**7):
#                   count m n / 128. Loss ints per sample: sum_j d**2 in units of 2**-16,
#                   as hi * 2**18 + lo (|d| clamped to 2**18 = 1024 real units there), so
#                   no int reaches 2**30 for n <= MAX_OUTPUTS
#   int_bce_logits  the target T: int32 probabilities in Q14 (0 .. 2**14, clamped there);
#                   e = exp(-|z| / 2**12) in Q14 from the cross-entropy's exp table,
#                   sigmoid(|z|) = 2**28 / (2**14 + e) rounded, p = sigmoid(z), g = p - t
#                   (Q14): count m n. The loss softplus(z) - z t = max(z, 0) - z t +
#                   log(1 + e): per sample (hi, lo) of sum_j (max(z, 0) - z t) in units of
#                   2**-22 (|z| in 2**-8 units, clamped to 2**15 = 128 real units there) as hi * 2**22 + lo,
#                   and prod_j (1 + e) as P * 2**k (P in Q14, in [1, 2)): loss ints
#                   (hi, lo, k, P)
import math
from microtrain.kernels.fixedpoint import (exp_q14, exp_table_check, f32, pairs_of,
                                          quantization, requant, round_shift)
from microtrain.kernels.intsgd import derive_once
from microtrain.kernels.inttrain import LOGIT_BITS, ONE

_TO_8 = LOGIT_BITS - 8       # z's fractional bits beyond the 8 of the losses' ints

GRAD_LIMIT = 1 << 14     # |g| of int_mse: the update's sums stay below m * 2**22 (m <= 127)
MAX_OUTPUTS = 2048       # outputs per sample (the loss ints' hi stays below 2**30)
_LOSS_D = 1 << 18        # |d| clamp in int_mse's loss
_LOSS_Z = 1 << 15        # |z| clamp in int_bce_logits' loss


def int_mse(F, I, args):
    Q, z, g, loss, target, req, m, n, t_signed = args
    t_zp = I[req]
    m0 = I[req + 1]
    shift = I[req + 2]
    flip = 128 if t_signed else 0
    for i in range(m):
        hi = 0
        lo = 0
        for _ in range(n):
            d = round_shift(I[z] - requant(((Q[target] ^ flip) - flip) - t_zp, m0, shift),
                            _TO_8)
            I[g] = GRAD_LIMIT if d > GRAD_LIMIT else -GRAD_LIMIT if d < -GRAD_LIMIT else d
            a = -d if d < 0 else d
            a = _LOSS_D if a > _LOSS_D else a
            top = a >> 9           # a**2 = top**2 * 2**18 + top * low * 2**10 + low**2
            low = a & 511
            hi += top * top
            lo += ((top * low) << 10) + low * low
            hi += lo >> 18
            lo &= 262143
            z += 1
            g += 1
            target += 1
        I[loss + 2 * i] = hi
        I[loss + 2 * i + 1] = lo


def int_mse_check(args, c):
    m, n, t_signed = c.ints
    c.positive(m, n)
    c.within(n, 1, MAX_OUTPUTS, "outputs")
    c.within(t_signed, 0, 1, "signed flag")
    c.holds(0, m * n)
    c.holds(1, m * n)
    c.holds(2, 2 * m)
    c.holds(3, m * n)
    c.holds(4, 3)
    c.apart(1, 4)        # g and the loss written while the target's multiplier is read
    c.apart(2, 4)
    scales, zps, _ = quantization(c, 3)
    if len(scales) != 1:
        c.fail("the target needs one scale (per tensor)")
    # [t_zp, m0, shift]: the target into z's fixed point, derived once
    derive_once(c, 4, [zps[0]] + pairs_of([f32(scales[0] * (1 << LOGIT_BITS))]))
    _record(c, m, n, f32(m * n / 128.0), "int_mean_squared_error")


def _record(c, m, n, count, loss):
    # the gradient's count for the update (int_gemm_update_check) and the loss tensor's
    # elements per sample (loss_value); Module turns the loss ints into a float by the
    # blob's loss name (intparams.integer_loss), which must be this step's
    if c.blob.loss != loss:
        c.fail("the blob's loss is %r; this step computes %r" % (c.blob.loss, loss))
    c.blob.int_units[c.tensors[1]] = count
    c.blob.int_units[c.tensors[2]] = n


def int_bce_logits(F, I, args):
    z, g, loss, target, table, m, n = args
    for i in range(m):
        hi = 0
        lo = 0
        k = 0
        p = ONE
        for _ in range(n):
            v = I[z]
            t = I[target]
            t = 0 if t < 0 else ONE if t > ONE else t
            a = -v if v < 0 else v
            e = exp_q14(I, table, a)
            s = ((ONE << 14) + ((ONE + e) >> 1)) // (ONE + e)     # sigmoid(|z|), Q14
            I[g] = (s if v >= 0 else ONE - s) - t
            a = round_shift(a, _TO_8)
            a = _LOSS_Z if a > _LOSS_Z else a
            lo += a * (ONE - t) if v >= 0 else a * t      # max(z, 0) - z t, >= 0
            hi += lo >> 22
            lo &= 4194303
            p = (p * (ONE + e) + 8192) >> 14
            if p >= 2 * ONE:
                p >>= 1
                k += 1
            z += 1
            g += 1
            target += 1
        at = loss + 4 * i
        I[at] = hi
        I[at + 1] = lo
        I[at + 2] = k
        I[at + 3] = p


def int_bce_logits_check(args, c):
    m, n = c.ints
    c.positive(m, n)
    c.within(n, 1, MAX_OUTPUTS, "outputs")
    c.holds(0, m * n)
    c.holds(1, m * n)
    c.holds(2, 4 * m)
    c.holds(3, m * n)
    exp_table_check(c, 4)
    _record(c, m, n, f32(m * n), "int_bce_with_logits")


# -- the loss as a float (Module, after the step) --------------------------------------
def mse_value(I, at, m, n):
    """The mean squared error (a float) from int_mse's loss ints."""
    total = 0.0
    for i in range(m):
        total += (I[at + 2 * i] * 262144.0 + I[at + 2 * i + 1]) / 65536.0
    return total / (m * n)


def bce_value(I, at, m, n):
    """The mean binary cross-entropy with logits (a float) from int_bce_logits' loss ints."""
    total = 0.0
    for i in range(m):
        hi, lo, k, p = I[at + 4 * i], I[at + 4 * i + 1], I[at + 4 * i + 2], I[at + 4 * i + 3]
        if not ONE <= p < 2 * ONE:
            from microtrain.errors import TrainingError
            raise TrainingError("the integer loss of sample %d is not int_bce_logits' (its "
                                "product %d is outside [1, 2) in Q14): a step after the loss "
                                "overwrote it; the blob's tensors overlap" % (i, p))
        total += (hi * 4194304.0 + lo) / 4194304.0 + k * math.log(2.0) + math.log(p / 16384.0)
    return total / (m * n)


# the blob's loss name -> (loss value function, ints per sample in the loss tensor)
LOSSES = {"int_mean_squared_error": (mse_value, 2), "int_bce_with_logits": (bce_value, 4)}
