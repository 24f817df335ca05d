# Integer training of an int8 classifier (and the 1x1 conv before its pooling; issue 11):
# every step integer only, so a whole train step runs under micropython.heap_lock() (floats
# are heap objects on the Unix port; on boards they are not needed either). Floats appear
# only at load and when the learning rate changes (set_learning_rate), never inside a step.
#
#   int_gemm_logits      z = requant(bias + sum_k (x - x_zp) * W[j, k]) per output j: int32
#                        logits in fixed point, LOGIT_BITS fractional bits (no clamp to int8:
#                        the loss needs them finer than the int8 output)
#   int_softmax_ce       from the logits and the label: the softmax cross-entropy gradient
#                        p - onehot in Q14 (PROB_BITS) and the loss as ints (max - z_label,
#                        sum of exp in Q14): loss = (max - z_label) / 2**12 + log(sum / 2**14),
#                        turned into a float by Module after the step
#   int_gemm_update      the SGD update of int8 W and int32 bias fused into the backward
#                        step (no gradient buffer), with quantization-aware scaling (QAS):
#                        W_q[j, k] -= round(lr * dL/dW[j, k] / s_w[j]), the float gradient
#                        dL/dW = s_x * sum_i g[i, j] * (x[i, k] - x_zp) / (2**14 * m), so
#                        one integer multiplier per channel: real_w[j] = lr * s_x /
#                        (s_w[j] * 2**14 * m); bias (units s_x * s_w[j]) likewise with
#                        real_b[j] = lr / (s_x * s_w[j] * 2**14 * m). Rounding: stochastic
#                        when the step has a generator state (default: steps below half a
#                        quantum would be lost: digits head 90.3 % vs 84.7 % round-to-
#                        nearest), else round half to even of acc * m0 / 2**shift
#                        (intsgd.update_step, exact); W clamped to [-127, 127] (the
#                        int8 weight range, zero point 0, scales fixed), bias to +-BIAS_LIMIT.
#   int_gemm_update_momentum   the same with SGD momentum (int16 velocities)
#   int_gemm_grad_input, int_conv1x1_update   the 1x1 convolution (and its ReLU) before a
#                        GlobalAveragePool feeding the classifier, trained from the
#                        classifier input's gradient
#
# Layouts: W is [n, k] (one row per output channel, per-channel scale s_w[j]); x [m, k]
# bytes (int8 or uint8, zero point x_zp); labels [m] int32; logits and gradients [m, n].
# The requantization tensors are derived at load from the tensors' scales (and the
# learning rate: Optimizer.set_learning_rate rewrites the update multipliers):
#   logits req  [x_zp, then (m0, shift) per channel: s_x * s_w[j] * 2**LOGIT_BITS]
#   update rates [x_zp, then (m0_w, shift_w, m0_b, shift_b) per channel]
# The logits carry LOGIT_BITS = 12 fractional bits: with 8, their rounding (2**-9 of a logit)
# moved p - onehot by up to 4.6e-3 of a layer's largest step against torch's cross-entropy;
# with 12, 1.1e-4. The exp table (kernels/fixedpoint.py exp_q14: three levels, Q14) is a
# constant the host computes; the checker validates it.
#
# 32-bit boards: small ints end at 2**30. Products stay below 2**28 (table entries and
# probabilities are Q14); requantization uses kernels/fixedpoint.py's 12-bit limbs, exact
# for |acc| < 2**29 (ACC_LIMIT): a logit's accumulator is below k * 255 * 127 + 2**23 <
# 2**28 for up to MAX_K = 4096 inputs (a Flatten head's), a weight's gradient sum below
# m * 2**22: batches of up to 127 (checked), no big int on 32-bit ports.
import math
from microtrain.kernels.fixedpoint import (exp_q14, exp_table_check, f32, pairs_of,
                                          quantization, requant, round_shift, weight_scales)
from microtrain.kernels.intsgd import (BIAS_LIMIT, FINE_M0, FINE_SHIFT, clamp, derive_once,
                                      derive_rates, descend_bias, generator_check,
                                      layer_scales, positive, update_step, update_weight)
intwide = None  # kernels/intwide.py, imported by the checker of a wide layer

LOGIT_BITS = 12
PROB_BITS = 14
ONE = 16384          # 1.0 in Q14
LOGIT_LIMIT = 1 << 24    # |z| clamp: +-4096 in real units, far beyond any useful logit
VELOCITY_LIMIT = 32767   # |int16 velocity| of int_gemm_update_momentum, in 1/256 quanta
MAX_K = 4096             # inputs per output: |logit accumulator| < 2**28
GRAD_BITS = 4            # int_gemm_grad_input: extra bits of D for up to 16 classes
# A class slot not in use (a classifier packed with room for more classes: continual.py):
# its bias is UNUSED_BIAS, below every bias training reaches (+-BIAS_LIMIT), its weights
# zero. Its logit is then UNUSED_LOGIT, below every clamped logit; the softmax gives it
# probability 0 (unless it is the label: labels are checked before a step) and the update
# leaves its row as it is.
UNUSED_BIAS = -BIAS_LIMIT - 1
UNUSED_LOGIT = -LOGIT_LIMIT - 1


# -- forward: int32 logits -------------------------------------------------------------
def int_gemm_logits(F, I, args):
    Q, z, x, w, bias, req, m, k, n, x_signed = args
    x_zp = I[req]
    flip = 128 if x_signed else 0
    for i in range(m):
        xi = x + i * k
        for j in range(n):
            acc = I[bias + j]
            if acc == UNUSED_BIAS:
                I[z] = UNUSED_LOGIT
                z += 1
                continue
            pw = w + j * k
            for t in range(k):
                acc += (((Q[xi + t] ^ flip) - flip) - x_zp) * (((Q[pw + t] ^ 128) - 128))
            I[z] = clamp(requant(acc, I[req + 1 + 2 * j], I[req + 2 + 2 * j]), LOGIT_LIMIT)
            z += 1


def int_gemm_logits_check(args, c):
    m, k, n, x_signed = c.ints
    c.positive(m, k, n)
    c.within(k, 1, MAX_K, "inputs per output")
    c.holds(0, m * n)
    c.holds(1, m * k)
    c.holds(2, n * k)
    c.holds(3, n)
    c.holds(4, 1 + 2 * n)
    c.within(x_signed, 0, 1, "signed flag")
    sx, zx, _ = quantization(c, 1)
    sw = weight_scales(c, 2, n)
    reals = [f32(f32(sx[0] * sw[j]) * (1 << LOGIT_BITS)) for j in range(n)]
    for real in reals:
        positive(c, real, "logit multiplier")
    derive_once(c, 4, [zx[0]] + pairs_of(reals))


# -- loss: integer softmax cross-entropy -----------------------------------------------
def int_softmax_ce(F, I, args):
    # loss[2i] = max - z[label], loss[2i + 1] = sum_j e_j (Q14, >= 2**14);
    # grad[i, j] = round(e_j * 2**14 / sum) - (2**14 if j == label), e_j = exp(-(max - z_j)
    # / 2**12) in Q14 (fixedpoint.exp_q14); e_j = 0 for a class slot not in use
    # (UNUSED_LOGIT) other than the label.
    z, g, loss, label, table, m, n = args
    for i in range(m):
        zi = z + i * n
        gi = g + i * n
        y = I[label + i]
        top = I[zi]
        for j in range(1, n):
            if I[zi + j] > top:
                top = I[zi + j]
        total = 0
        for j in range(n):
            e = exp_q14(I, table, top - I[zi + j]) if (
                I[zi + j] != UNUSED_LOGIT or j == y) else 0
            I[gi + j] = e
            total += e
        half = total >> 1
        for j in range(n):
            I[gi + j] = ((I[gi + j] << 14) + half) // total
        I[gi + y] -= ONE
        I[loss + 2 * i] = top - I[zi + y]
        I[loss + 2 * i + 1] = total


def int_softmax_ce_check(args, c):
    m, n = c.ints
    c.positive(m, n)
    c.within(n, 2, 1024, "classes")    # total < 1025 * 2**14 < 2**30
    c.holds(0, m * n)
    c.holds(1, m * n)
    c.holds(2, 2 * m)
    c.holds(3, m)
    c.role(3, "label")
    if c.blob.loss != "int_softmax_cross_entropy":     # Module reads the loss by this name
        c.fail("the blob's loss is %r, not int_softmax_cross_entropy" % c.blob.loss)
    c.blob.num_classes = c.blob.num_classes or n
    if c.blob.num_classes != n:
        c.fail("%d classes, the blob's labels have %d" % (n, c.blob.num_classes))
    exp_table_check(c, 4)


def loss_value(I, at, m):
    """The mean cross-entropy (a float, outside the step) from int_softmax_ce's loss ints.
    A sum of exponentials below 1.0, which int_softmax_ce never leaves (the largest logit's
    term is 1.0), means a later step of the program overwrote the loss (a blob whose plan
    puts another tensor over it): a TrainingError, not a math domain error."""
    total = 0.0
    for i in range(m):
        s = I[at + 2 * i + 1]
        if s < ONE:
            from microtrain.errors import TrainingError
            raise TrainingError("the integer loss of sample %d is not a softmax's (its sum of "
                                "exponentials is %d, below 1.0 = %d): a step after the loss "
                                "overwrote it; the blob's tensors overlap" % (i, s, ONE))
        total += I[at + 2 * i] / (1 << LOGIT_BITS) + math.log(s / 16384.0)
    return total / m


# -- backward + update, fused ----------------------------------------------------------
def _column(Q, I, px, pg, m, k, n, x_zp, flip):
    # sum over the batch of g[i, j] * (x[i, t] - x_zp), px and pg at x[0, t] and g[0, j]:
    # a weight's gradient
    acc = 0
    for _ in range(m):
        acc += I[pg] * (((Q[px] ^ flip) - flip) - x_zp)
        px += k
        pg += n
    return acc


def _column_sum(I, g, m, n):
    # sum over the batch of g[i, j] (g at column j, rows n apart): the bias' gradient
    acc = 0
    for _ in range(m):
        acc += I[g]
        g += n
    return acc


def int_gemm_update(F, I, args):
    # each weight's (and bias') step rounded by intsgd.update_step: stochastically with a
    # generator state (random >= 0), else half to even
    Q, w, bias, x, g, rates, random, m, k, n, x_signed = args
    x_zp = I[rates]
    flip = 128 if x_signed else 0
    for j in range(n):
        if I[bias + j] == UNUSED_BIAS:
            continue
        r = rates + 1 + 4 * j
        m0 = I[r]
        shift = I[r + 1]
        pw = w + j * k
        for t in range(k):
            update_weight(Q, I, pw + t, _column(Q, I, x + t, g + j, m, k, n, x_zp, flip), m0,
                          shift, random)
        descend_bias(I, bias + j,
                     update_step(I, _column_sum(I, g + j, m, n), I[r + 2], I[r + 3], random))


def int_gemm_update_momentum(F, I, args):
    # SGD with momentum (torch's rule, dampening 0: v = mu v + g, w -= lr v) in quanta: the
    # velocity V of each weight is the step in 1/256 quanta, V = round(mu V) + step, and
    # W -= V / 256 rounded (update_step at the multiplier FINE_M0 / 2**FINE_SHIFT = 1 / 256:
    # stochastically with random >= 0, else half to even). V is an int16 (2 bytes, little
    # endian, in the byte arena: a velocity beyond 128 quanta would move an int8 weight
    # across its whole range, so it is clamped there); the bias' velocity an int32, in 1/256
    # of its quanta too. mu in Q14; mu V rounded half up (|V * mu| < 2**29; the bias' in
    # two parts).
    Q, w, bias, x, g, rates, random, vw, vb, m, k, n, x_signed, mu = args
    x_zp = I[rates]
    flip = 128 if x_signed else 0
    for j in range(n):
        if I[bias + j] == UNUSED_BIAS:
            continue
        r = rates + 1 + 4 * j
        m0 = I[r]
        shift = I[r + 1] - 8 if I[r + 1] > 8 else 1
        pw = w + j * k
        pv = vw + 2 * j * k
        for t in range(k):
            acc = _column(Q, I, x + t, g + j, m, k, n, x_zp, flip)
            v = Q[pv] | (((Q[pv + 1] ^ 128) - 128) << 8)
            v = clamp(((v * mu + 8192) >> 14) + requant(acc, m0, shift), VELOCITY_LIMIT)
            Q[pv] = v & 255
            Q[pv + 1] = (v >> 8) & 255
            pv += 2
            update_weight(Q, I, pw + t, v, FINE_M0, FINE_SHIFT, random)
        acc = _column_sum(I, g + j, m, n)
        shift = I[r + 3] - 8 if I[r + 3] > 8 else 1
        v = I[vb + j]          # mu V rounded half up, in two parts (|V| < 2**23)
        hi = v >> 14
        v = hi * mu + (((v - (hi << 14)) * mu + 8192) >> 14) + requant(acc, I[r + 2], shift)
        v = clamp(v, BIAS_LIMIT)
        I[vb + j] = v
        descend_bias(I, bias + j, update_step(I, v, FINE_M0, FINE_SHIFT, random))


def int_gemm_update_momentum_check(args, c):
    m, k, n, x_signed, mu = c.ints
    int_gemm_update_check(args, c)      # the same first six tensors and four ints
    c.holds(6, 2 * n * k)
    c.role(6, "optimizer_state")
    c.holds(7, n)
    c.role(7, "optimizer_state")
    c.within(mu, 0, ONE - 1, "momentum (Q14)")


def update_reals(sx, sw, m, lr):
    """[(real_w, real_b) per channel] of int_gemm_update, float32 as a board computes them:
    real_w = lr * s_x / s_w / 2**14 / m, real_b = lr / (s_x * s_w) / 2**14 / m."""
    out = []
    unit = f32(ONE * m)
    for s in sw:
        out.append((f32(f32(f32(lr * sx) / s) / unit),
                    f32(f32(lr / f32(sx * s)) / unit)))
    return out


def rate_values(x_zp, reals):
    """An update step's rates tensor: [x_zp, then (m0_w, shift_w, m0_b, shift_b) per
    channel] of its (real_w, real_b) pairs."""
    return [x_zp] + pairs_of(r for pair in reals for r in pair)


def _update_rates(params, lr):
    # int_gemm_update's rates at learning rate lr (intsgd.derive_rates)
    x_zp, sx, sw, m = params
    return rate_values(x_zp, update_reals(sx, sw, m, lr))


def int_gemm_update_check(args, c):
    m, k, n, x_signed = c.ints[:4]     # (int_gemm_update_momentum's: and mu)
    c.positive(m, k, n)
    c.within(m, 1, 127, "batch")        # sums of m * 2**14 * 255 below 2**29
    c.within(k, 1, MAX_K, "inputs per output")
    c.holds(0, n * k)
    c.role(0, "param")
    c.holds(1, n)
    c.role(1, "param")
    c.holds(2, m * k)
    c.holds(3, m * n)
    c.holds(4, 1 + 4 * n)
    generator_check(c, 5)
    c.within(x_signed, 0, 1, "signed flag")
    sx, x_zp, sw = layer_scales(c, 2, 0, n)
    # the count the gradient's mean divides by: the batch (softmax cross-entropy), or what
    # an intloss step writing it recorded (dL/dy = g / (2**14 * count))
    derive_rates(c, 4, _update_rates, (x_zp, sx, sw, c.blob.int_units.get(c.tensors[3], m)))


def set_learning_rate(b, I, lr):
    """Rewrite every update step's multipliers for learning rate lr (floats: outside any
    step, as the Optimizer calls it): each record of b.int_rates (intsgd.derive_rates,
    this family's steps and kernels/intgrad.py's) names the function computing its rates."""
    for tid, rates_of, params in b.int_rates:
        at = b.offsets[tid]
        values = rates_of(params, lr)
        for i in range(len(values)):
            I[at + i] = values[i]


# -- the layer before the classifier: a 1x1 convolution (its ReLU) -> GlobalAveragePool ----
def int_gemm_grad_input(F, I, args):
    # D[i, c] = sum_j round(g[i, j] * 2**x * s_w[j] / s_wmax) * W[j, c]: the gradient of the
    # classifier's input (real: D * s_wmax / 2**(14 + x)), before the classifier's update;
    # x extra bits, chosen at load so that |D| < n * 2**14 * 128 * 2**x <= 2**30 (below).
    # Beyond 31 outputs (x < GRAD_BITS) each term takes `wide` more bits and their exact sum
    # is rounded once to D's unit (kernels/intwide.py: one rounding instead of n).
    Q, d, g, w, factors, m, k, n = args
    wide = 0
    while n << GRAD_BITS > 511 << wide:
        wide += 1
    if wide:
        intwide.gemm_grad_input_wide(I, args, wide)
        return
    for i in range(m):
        gi = g + i * n
        for c in range(k):
            acc = 0
            pw = w + c
            for j in range(n):
                h = requant(I[gi + j], I[factors + 2 * j], I[factors + 2 * j + 1])
                acc += h * ((Q[pw] ^ 128) - 128)
                pw += k
            I[d + i * k + c] = acc


def int_gemm_grad_input_check(args, c):
    m, k, n = c.ints
    c.positive(m, k, n)
    c.within(n, 1, 2048, "outputs")     # (kernels/intloss.py MAX_OUTPUTS)
    c.holds(0, m * k)
    c.holds(1, m * n)
    c.holds(2, n * k)
    c.holds(3, 2 * n)
    c.apart(0, 1, 3)     # D written while g and the factors are read (|D| < 2**30 needs them)
    sw = weight_scales(c, 2, n)
    top = max(sw)
    count = c.blob.int_units.get(c.tensors[1])     # of kernels/intloss.py's mean; CE's: m
    extra = 1 << GRAD_BITS if n <= 16 or count else 1     # (CE: as its blobs always trained)
    while n * extra > 511:      # extra bits while n * 2**x <= 511; beyond, fewer than none
        extra /= 2
    if n << GRAD_BITS > 511:    # kernels/intwide.py's, fast as this family's
        from microtrain.kernels import fastpath
        fastpath.load_helper(globals(), "intwide", "int_gemm_grad_input")
    derive_once(c, 3, pairs_of(f32(f32(v / top) * extra) for v in sw))
    unit = f32(top / (ONE * extra))     # D's real unit per sample (later steps divide by m)
    c.blob.int_units[c.tensors[0]] = unit if count is None else f32(f32(unit * m) / count)


def _mantissa(I, d, c, m, k, limit):
    # e, the shift making every |D[i, c]| of the batch < limit (D taken as d * 2**e with as
    # many significant bits as keep the products below 2**24: exact 12-bit limbs)
    top = 0
    for i in range(m):
        v = I[d + i * k + c]
        v = -v if v < 0 else v
        top = v if v > top else top
    e = 0
    while top >= limit:
        top >>= 1
        e += 1
    return e


def int_conv1x1_update(F, I, args):
    # The SGD step of the 1x1 convolution y = relu(W x + b) feeding GlobalAveragePool (P
    # positions) then the classifier, from D (int_gemm_grad_input), QAS-scaled as the
    # classifier's: dL/dy[c, p] = D[c] * s_wmax / 2**14 / P where the output is inside its
    # clamp (lo < y < hi: the ReLU or the int8 range passes it), else 0; so
    #   W[c, t] -= round(r_w[c] * D[c] * sum_p mask[c, p] (x[t, p] - x_zp)),
    #   b[c]    -= round(r_b[c] * D[c] * count_p mask[c, p]),
    # D taken as d * 2**e with as many significant bits as keep the products below 2**24
    # (_mantissa), rounded half to even or stochastically as int_gemm_update (random >= 0).
    Q, w, bias, x, y, d, req, rates, random, m, cin, cout, plane, x_signed, y_signed = args
    fx = 128 if x_signed else 0
    fy = 128 if y_signed else 0
    x_zp = I[rates]
    lo = I[req + 2]
    hi = I[req + 3]
    wlimit = 16777216 // (plane * 255 * m) + 1     # |d * sum_p (x - x_zp)| < 2**24 over
    blimit = 16777216 // (plane * m) + 1           # the batch; d * count likewise
    for c in range(cout):
        r = rates + 1 + 4 * c
        e = _mantissa(I, d, c, m, cout, wlimit)
        eb = _mantissa(I, d, c, m, cout, blimit)
        wshift = I[r + 1] - e
        bshift = I[r + 3] - eb
        if wshift < 1:
            wshift = 1
        if bshift < 1:
            bshift = 1
        pw = w + c * cin
        for t in range(cin):
            acc = 0
            for i in range(m):
                dc = round_shift(I[d + i * cout + c], e)
                if dc == 0:
                    continue
                py = y + (i * cout + c) * plane
                px = x + (i * cin + t) * plane
                part = 0
                for p in range(plane):
                    v = (Q[py + p] ^ fy) - fy
                    if lo < v < hi:
                        part += ((Q[px + p] ^ fx) - fx) - x_zp
                acc += dc * part
            update_weight(Q, I, pw + t, acc, I[r], wshift, random)
        acc = 0
        for i in range(m):
            dc = round_shift(I[d + i * cout + c], eb)
            py = y + (i * cout + c) * plane
            count = 0
            for p in range(plane):
                v = (Q[py + p] ^ fy) - fy
                if lo < v < hi:
                    count += 1
            acc += dc * count
        descend_bias(I, bias + c, update_step(I, acc, I[r + 2], bshift, random))


def conv_reals(sx, sw, unit, plane, m, lr):
    """[(real_w, real_b)] per channel of int_conv1x1_update: the step per unit of D (real
    gradient D * unit / P) times sum (x - x_zp), resp. times the count:
    real_w = lr * unit * s_x / (P * m * s_w), real_b = lr * unit / (P * m * s_x * s_w)."""
    out = []
    u = f32(unit / f32(plane * m))
    for s in sw:
        out.append((f32(f32(f32(lr * u) * sx) / s), f32(f32(lr * u) / f32(sx * s))))
    return out


def _conv_rates(params, lr):
    # int_conv1x1_update's rates at learning rate lr (intsgd.derive_rates)
    x_zp, sx, sw, unit, plane, m = params
    return rate_values(x_zp, conv_reals(sx, sw, unit, plane, m, lr))


def int_conv1x1_update_check(args, c):
    m, cin, cout, plane, x_signed, y_signed = c.ints
    c.positive(m, cin, cout, plane)
    c.within(plane, 1, 4096, "positions")      # sum_p (x - x_zp) < 2**20
    c.holds(0, cout * cin)
    c.role(0, "param")
    c.holds(1, cout)
    c.role(1, "param")
    c.holds(2, m * cin * plane)
    c.holds(3, m * cout * plane)
    c.holds(4, m * cout)
    c.holds(5, 4)
    c.holds(6, 1 + 4 * cout)
    generator_check(c, 7)
    c.within(x_signed, 0, 1, "signed flag")
    c.within(y_signed, 0, 1, "signed flag")
    sx, x_zp, sw = layer_scales(c, 2, 0, cout)
    # D's real unit, recorded by the int_gemm_grad_input step that writes D (earlier)
    unit = c.blob.int_units.get(c.tensors[4])
    if unit is None:
        c.fail("no int_gemm_grad_input step before this one writes its gradient tensor")
    derive_rates(c, 6, _conv_rates, (x_zp, sx, sw, unit, plane, m))


# The viper fast paths (kernels/inttrain_viper.py, MicroPython with the viper emitter): the
# same integers, no allocation. use_fast(False) switches back to the pure-Python kernels
# (tests compare the two).
_FAST_NAMES = ("int_gemm_logits", "int_gemm_update", "int_gemm_grad_input",
               "int_conv1x1_update", "int_gemm_update_momentum")


def use_fast(on=True):
    # (a wide layer's kernels/intwide.py, when loaded, switches with this family)
    from microtrain.kernels import fastpath
    # all but the logits: the native module's where kernels/qlinear_native.mpy is
    # (device/native/inttrain_native.c)
    return fastpath.use_fast(globals(), _FAST_NAMES, on, "inttrain_viper", "qlinear_native",
                             helper="intwide")


FAST = use_fast()
