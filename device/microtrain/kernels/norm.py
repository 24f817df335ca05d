# BatchNormalization and Dropout, forward and backward side by side.
#
# BatchNormalization works on X of shape (N, C, inner): the host passes n, c and inner (the
# product of the spatial dimensions, 1 for (N, C)). The elements of channel ch sit at
# x + i*c*inner + ch*inner + j for i < n, j < inner.
#
# Dropout draws its mask from a seeded integer generator: two Lehmer generators with prime
# moduli below 2**30, stepped with Schrage's method so that no intermediate reaches 2**30
# (a small int on 32-bit MicroPython: nothing is allocated), combined by subtraction as in
# L'Ecuyer's combined generators (period about 2**59). Integer arithmetic only, so every
# port (single or double precision floats) draws the same sequence.
import math
from microtrain.kernels.activation import mask_check, masked_copy
try:
    from micropython import const
except ImportError:
    def const(x):
        return x

_M1 = const(1073741789)   # 2**30 - 35, prime; 31999 is a primitive root
_A1 = const(31999)
_Q1 = const(33555)        # _M1 // _A1
_R1 = const(15344)        # _M1 % _A1 (< _Q1, as Schrage's method needs)
_M2 = const(1073741783)   # 2**30 - 41, prime; 32000 is a primitive root
_A2 = const(32000)
_Q2 = const(33554)
_R2 = const(13783)
_SPAN = const(1073741788)  # _M1 - 1: draws z lie in [1, _SPAN]
_TOP_BIT = const(536870912)   # 2**29: a mask word holds 30 bits, so it stays a small int
_WARM_UP = const(4)
_A1_WARM = const(255296538)  # _A1 ** _WARM_UP % _M1
_A2_WARM = const(310616529)  # _A2 ** _WARM_UP % _M2


# -- BatchNormalization -----------------------------------------------------------------

def _channels_check(c, n, channels, inner, eps, tensors, per_channel):
    # Tensor arguments `tensors` hold n*channels*inner elements, `per_channel` hold channels
    # (both skip absent ones); eps > 0 keeps sqrt(var + eps) > 0.
    c.positive(n, channels, inner)
    for k in tensors:
        if c.present(k):
            c.holds(k, n * channels * inner)
    for k in per_channel:
        if c.present(k):
            c.holds(k, channels)
    if eps is not None:
        c.within(eps, 1e-30, 3e38, "epsilon")


def _inverse_std(var, eps):
    # 1 / sqrt(var + eps), NaN for a negative variance (running statistics come from a
    # checkpoint or a mutated blob and may be anything) instead of a math domain error.
    v = var + eps
    return 1.0 / math.sqrt(v) if v > 0.0 else math.nan

def _channel_sum(F, p, n, plane, inner):
    total = 0.0
    for _ in range(n):
        for j in range(p, p + inner):
            total += F[j]
        p += plane
    return total


def _channel_squares(F, p, n, plane, inner, mean):
    # sum((x - mean)^2): the two-pass variance, which stays accurate when |mean| >> std.
    total = 0.0
    for _ in range(n):
        for j in range(p, p + inner):
            d = F[j] - mean
            total += d * d
        p += plane
    return total


def _normalize_channel(F, py, px, n, plane, inner, mean, a, b):
    # y = (x - mean) * a + b
    for _ in range(n):
        for j in range(inner):
            F[py + j] = (F[px + j] - mean) * a + b
        px += plane
        py += plane


def batch_norm_training(F, I, args):
    # Normalizes with the batch statistics (biased variance) and updates the running
    # statistics in place the way PyTorch does: running = momentum*running +
    # (1-momentum)*batch, with the *unbiased* batch variance for running_var (ONNX's
    # reference and onnxruntime use the biased one). rmean/rvar = -1: nothing to update.
    y, x, scale, bias, rmean, rvar, n, c, inner, eps, momentum = args
    plane = c * inner
    count = n * inner
    unbiased = count / (count - 1)
    keep = 1.0 - momentum
    for ch in range(c):
        px = x + ch * inner
        mean = _channel_sum(F, px, n, plane, inner) / count
        var = _channel_squares(F, px, n, plane, inner, mean) / count
        a = F[scale + ch] / math.sqrt(var + eps)
        _normalize_channel(F, y + ch * inner, px, n, plane, inner, mean, a, F[bias + ch])
        if rmean >= 0:
            F[rmean + ch] = momentum * F[rmean + ch] + keep * mean
        if rvar >= 0:
            F[rvar + ch] = momentum * F[rvar + ch] + keep * var * unbiased


def batch_norm_training_check(args, c):
    n, channels, inner = c.ints
    eps, momentum = c.floats
    _channels_check(c, n, channels, inner, eps, (0, 1), (2, 3, 4, 5))
    if n * inner < 2:  # the unbiased variance divides by count - 1
        c.fail("batch statistics need at least 2 values per channel, got %d" % (n * inner))
    c.within(momentum, 0.0, 1.0, "momentum")
    c.nonnegative(5)   # the running variance a checkpoint brings
    c.kept(4)
    c.kept(5)


def batch_norm_inference(F, I, args):
    # Normalizes with the running statistics: y = (x - mean) * scale/sqrt(var + eps) + bias.
    y, x, scale, bias, mean, var, n, c, inner, eps = args
    plane = c * inner
    for ch in range(c):
        a = F[scale + ch] * _inverse_std(F[var + ch], eps)
        _normalize_channel(F, y + ch * inner, x + ch * inner, n, plane, inner, F[mean + ch], a,
                           F[bias + ch])


def batch_norm_inference_check(args, c):
    n, channels, inner = c.ints
    _channels_check(c, n, channels, inner, c.floats[0], (0, 1), (2, 3, 4, 5))
    c.nonnegative(5)


def channel_affine(F, I, args):
    # y = x * a[ch] + b[ch] (b = -1: no offset). A BatchNormalization whose scale, bias and
    # statistics are all frozen, folded on the host; with b = -1 also its gradient dx = dy * a.
    y, x, a, b, n, c, inner = args
    plane = c * inner
    for ch in range(c):
        # (x - 0.0) * a + b: subtracting 0.0 changes no float, so this is x * a + b exactly.
        _normalize_channel(F, y + ch * inner, x + ch * inner, n, plane, inner, 0.0, F[a + ch],
                           F[b + ch] if b >= 0 else 0.0)


def channel_affine_check(args, c):
    n, channels, inner = c.ints
    _channels_check(c, n, channels, inner, None, (0, 1), (2, 3))


def batch_norm_grad(F, I, args):
    # dscale = sum(dy * xhat), dbias = sum(dy), xhat = (x - mean) / sqrt(var + eps).
    # Training mode (mean = var = -1): mean and var are the batch statistics, recomputed from
    # x exactly as the forward kernel computed them (no saved tensors to keep alive), and
    # dx = scale/sqrt(var+eps) * (dy - sum(dy)/count - xhat * sum(dy*xhat)/count).
    # Inference mode: the running statistics are constants, dx = dy * scale/sqrt(var+eps).
    # Absent outputs (-1) are not needed by any trainable parameter.
    dx, dscale, dbias, dy, x, scale, mean, var, n, c, inner, eps = args
    plane = c * inner
    count = n * inner
    for ch in range(c):
        px = x + ch * inner
        pdy = dy + ch * inner
        if mean < 0:
            mu = _channel_sum(F, px, n, plane, inner) / count
            sigma2 = _channel_squares(F, px, n, plane, inner, mu) / count
        else:
            mu = F[mean + ch]
            sigma2 = F[var + ch]
        inv_std = _inverse_std(sigma2, eps)
        sum_dy = 0.0
        sum_dy_centered = 0.0
        p, q = px, pdy
        for _ in range(n):
            for j in range(inner):
                g = F[q + j]
                sum_dy += g
                sum_dy_centered += g * (F[p + j] - mu)
            p += plane
            q += plane
        if dbias >= 0:
            F[dbias + ch] = sum_dy
        if dscale >= 0:
            F[dscale + ch] = sum_dy_centered * inv_std
        if dx < 0:
            continue
        k = F[scale + ch] * inv_std
        q, r = pdy, dx + ch * inner
        if mean >= 0:
            for _ in range(n):
                for j in range(inner):
                    F[r + j] = k * F[q + j]
                q += plane
                r += plane
            continue
        shift = sum_dy / count
        slope = sum_dy_centered * inv_std * inv_std / count
        p = px
        for _ in range(n):
            for j in range(inner):
                F[r + j] = k * (F[q + j] - shift - (F[p + j] - mu) * slope)
            p += plane
            q += plane
            r += plane


def batch_norm_grad_check(args, c):
    n, channels, inner = c.ints
    _channels_check(c, n, channels, inner, c.floats[0], (0, 3, 4), (1, 2, 5, 6, 7))
    for k in (3, 4, 5):
        c.holds(k, 1)  # dy, x and scale are always read
    if c.present(6) != c.present(7):
        c.fail("running mean and variance must both be given or both be absent")


# -- Dropout ----------------------------------------------------------------------------

def seed_state(I, at, seed, stream):
    # Generator state I[at], I[at + 1] for `seed` and dropout node number `stream`. Distinct
    # (seed, stream) pairs start distinct streams; the state moves _WARM_UP draws on, away
    # from small first values: one multiplication by A**_WARM_UP mod M per generator (two
    # long-int products on 32-bit ports when a Dropout node is seeded; the draws themselves
    # allocate nothing).
    I[at] = (1 + seed % _SPAN) * _A1_WARM % _M1
    I[at + 1] = (1 + stream % (_M2 - 1)) * _A2_WARM % _M2


def get_state(I, at):
    # The generator state I[at], I[at + 1] as one int a * 2**30 + b in [0, 2**60), an int64
    # (0: not drawn from or seeded yet), for checkpoints (Module: property microtrain.rng.<k>).
    # Only at save time: on 32-bit ports the result is a long int.
    return I[at] * 1073741824 + I[at + 1]


def set_state(I, at, value):
    # Inverse of get_state; False, and nothing changed, when `value` is no state of this
    # generator (0 < a < _M1 and 0 < b < _M2, or both 0).
    if not isinstance(value, int) or value < 0:
        return False
    a = value // 1073741824
    b = value % 1073741824
    if a >= _M1 or b >= _M2 or (a == 0) != (b == 0):
        return False
    I[at] = a
    I[at + 1] = b
    return True


def dropout(F, I, args):
    # y = x * scale where kept, 0 where dropped; an element is dropped when the draw
    # z in [1, _SPAN] is <= threshold (the host sets threshold = ratio * _SPAN).
    # The mask goes to the int arena, 30 elements per word as ReLU's (kernels/activation.py):
    # the backward needs one bit per element, not a float.
    # state[0] == 0 means not seeded yet (the arena starts zeroed): seed from the node's own
    # seed, unless Module.set_seed got there first.
    y, x, mask, state, n, threshold, seed, stream, scale = args
    if I[state] == 0:
        seed_state(I, state, seed, stream)
    a = I[state]
    b = I[state + 1]
    word = mask
    bits = 0
    bit = 1
    for i in range(n):
        a = _A1 * (a % _Q1) - _R1 * (a // _Q1)
        if a < 0:
            a += _M1
        b = _A2 * (b % _Q2) - _R2 * (b // _Q2)
        if b < 0:
            b += _M2
        z = a - b
        if z < 1:
            z += _SPAN
        if z > threshold:
            F[y + i] = F[x + i] * scale
            bits |= bit
        else:
            F[y + i] = 0.0
        if bit == _TOP_BIT:
            I[word] = bits
            word += 1
            bits = 0
            bit = 1
        else:
            bit <<= 1
    if bit != 1:
        I[word] = bits
    I[state] = a
    I[state + 1] = b


def dropout_check(args, c):
    n, threshold, seed, stream = c.ints
    mask_check(c, n)
    c.holds(3, 2)
    c.role(3, "activation", "optimizer_state", "control")
    c.kept(3)          # the generator: a refused step draws again what it drew


def dropout_grad(F, I, args):
    # dx = dy * scale where the forward kept the element, else 0.
    dx, dy, mask, n, scale = args
    masked_copy(F, I, dx, dy, mask, n, scale)


def dropout_grad_check(args, c):
    n, = c.ints
    mask_check(c, n)


def kept_problem(b, F):
    # Why the state a training forward pass updated in place (b.kept: running statistics,
    # an observer's range, which may be infinite but not NaN) cannot be kept, or None: a
    # float of it is not finite (Module refuses the train call and puts the state back)
    for t in b.kept:
        if b.dtypes[t] == 0:      # FLOAT (blob.py)
            off = b.offsets[t]
            infinite_ok = b.names[t].endswith(".observer_range")
            for i in range(off, off + b.sizes[t]):
                v = F[i]
                if v != v or not (infinite_ok or v - v == 0.0):
                    return ("running statistic '%s' became %r (an activation beyond float32 "
                            "range: check the parameters and inputs)" % (b.names[t], v))
    return None
