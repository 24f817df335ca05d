# Integer backward through frozen int8 convolutions (issue 11's sparse update in integers):
# the gradient flows from the classifier's input (kernels/inttrain.py int_gemm_grad_input,
# D) back through the GlobalAveragePool and every convolution's fused ReLU / clamp, so that
# the bias of every convolution and the weights of the last block (its depthwise and
# pointwise convs) train with QAS SGD fused into the backward steps. Every step integer
# only (runs under micropython.heap_lock()); floats only at load and in set_learning_rate.
#
#   int_pool_grad          G = D broadcast over the P positions (GlobalAveragePool's
#                          backward; real unit u_D / P), normalized to MANT_BITS
#   int_clamp_mask         (forward, after the convolution) 1 bit per output: the quantized
#                          output y strictly inside its clamp bounds lo < y < hi (the
#                          straight-through gradient of ReLU / Clip / the int8 range)
#   int_clamp_bias_grad    G *= mask, the bias' SGD step from sum_p G (fused, no
#                          gradient buffer), then G[c] *= s_w[c] / max(s_w) (the per-channel
#                          weight scale folded in as an integer multiplier, for the input
#                          gradient and the weight update)
#   int_conv_grad_input    G_x = the transposed (grouped) convolution of G with the int8
#                          weights (pointwise, depthwise, any stride / padding / dilation),
#                          renormalized to MANT_BITS; real unit max(s_w) * u_G
#   int_conv_update        the SGD step of a convolution's int8 weights from G and its input
#                          X (QAS: W_q[c] -= lr * dL/dW[c] / s_w[c]), per-channel multipliers
#
# Gradient tensors (int32, int arena): [e, then m * C * P mantissas], |mantissa| <
# 2**MANT_BITS, real value = mantissa * u * 2**e, u the tensor's unit fixed at load (each
# checker records the unit of the tensor its step writes in blob.int_units, from the units
# of what it reads and the scales) and e the exponent the step that wrote it chose (block
# floating point: the gradients' range shrinks or grows layer by layer, a fixed unit would
# lose it within a few layers; one int per tensor, integer only).
# The unit shrinks by max(s_w) per layer (1.1e-32 after MobileNetV1's 28 convolutions,
# below float32's range soon after), so it is kept as a float32 u' and an integer E, u =
# u' / 2**E (blob.int_unit_exps; E = 0 until u' would fall below UNIT_FLOOR = 2**-60, then
# u' is multiplied by 2**64, exactly, and E grows by 64): the rates are computed from u'
# and E is added to their shifts (which are not capped at 62: _step subtracts e first).
# A net of any depth thus trains; shallow ones (E = 0) see the same integers as before.
#
# Steps: real step = acc * m0 / 2**shift * 2**e, rounded half to even or stochastically
# (random >= 0: 8 bits of fraction and the xorshift16 generator) by kernels/intsgd.py's
# update_step, as kernels/inttrain.py's steps are; acc reduced to below 2**24 first (the
# requantization limbs' exact range on 32-bit ports: a double rounding, below 2**-14 of a
# quantum for the steps here). Weights clamped to [-127, 127], biases to +-BIAS_LIMIT.
#
# 32-bit ports: small ints end at 2**30, and every sum stays below it. Mantissas are
# normalized to |m| <= 2**MANT_BITS = 2**16 (16 bits: the relative rounding of one layer,
# 2**-17, through MobileNetV1's 28 layers stays below 10**-3 of a layer's largest step,
# where 13 bits gave 3.4e-3). A weight's gradient over any batch x positions is summed in
# chunks of MAX_SUM = 63 products (each below 2**24: a mantissa times x - x_zp), each chunk
# folded into a running sum kept below 2**24 with its own power of two (_fold_sum); a bias'
# likewise, in chunks of MAX_BIAS_SUM = 8191 positions (below 2**29). An input gradient
# element sums cout_g * taps products of a mantissa and a weight (|w| <= 128): below
# FULL_TERMS = 128 terms they are scattered into G_x (every sum below 2**30); from 128 on
# each element is gathered and summed exactly in two limbs (kernels/intwide.py: up to
# MAX_TERMS = 4096 terms, the limit checked, the sum below 2**35), then rounded to the
# tensor's 16-bit mantissas; every kernel only adds and multiplies such ints.
import math
from microtrain.kernels.fixedpoint import f32, quantization, requant, requant_pair, round_shift
from microtrain.kernels.intsgd import (derive_rates, descend_bias, descend_weight,
                                      generator_check, layer_scales, update_step)
intwide = None  # kernels/intwide.py, imported by the checker of a wide layer

MANT_BITS = 16
_TOP = 1 << MANT_BITS
_LIMB = 1 << 24
_HALF_SMALL = 1 << 29
MAX_SUM = (1 << (22 - MANT_BITS)) - 1         # 63: products of mantissas and bytes per sum
MAX_BIAS_SUM = (1 << (29 - MANT_BITS)) - 1    # 8191: mantissas per sum (a bias')
FULL_TERMS = 1 << (23 - MANT_BITS)            # 128: an input gradient's terms gathered from
MAX_TERMS = 4096                              # an input gradient's terms (checked)
UNIT_FLOOR = 2.0 ** -60  # a gradient unit below it is renormalized (x 2**UNIT_STEP)
UNIT_STEP = 64


def _normalize(I, g, count):
    # the shift e making every |I[g + 1 + i]| <= 2**MANT_BITS with as many bits as fit
    # (negative: shifted up, exact), applied (rounded half to even: a value just below
    # 2**(MANT_BITS + e) may round up to 2**MANT_BITS) and returned
    top = 0
    for i in range(g + 1, g + 1 + count):
        v = I[i]
        v = -v if v < 0 else v
        top = v if v > top else top
    e = 0
    if top:
        while top >= _TOP:
            top >>= 1
            e += 1
        while top < (_TOP >> 1):
            top <<= 1
            e -= 1
    if e > 0:
        for i in range(g + 1, g + 1 + count):
            I[i] = round_shift(I[i], e)
    elif e < 0:
        for i in range(g + 1, g + 1 + count):
            I[i] = I[i] << -e
    return e


def _step(I, acc, m0, shift, e, random):
    # update_step of acc * 2**e: round(acc * m0 / 2**shift * 2**e), half to even or
    # stochastic with random >= 0. The rates' shifts are not limited to 62 (_scaled_pair:
    # the units fixed at load shrink layer by layer while the exponents grow, a step's rate
    # can be 2**-200), so the exponent is subtracted and the shift clamped here.
    if acc == 0 or m0 == 0:     # (a zero rate: learning rate 0, whatever the exponent)
        return 0
    shift -= e
    while acc >= _LIMB or acc <= -_LIMB:
        acc = round_shift(acc, 1)
        shift -= 1
    if shift < 1:
        return 1 << 29 if acc > 0 else -(1 << 29)    # beyond every clamp
    if shift > 62:
        shift = 62
    return update_step(I, acc, m0, shift, random)


# -- GlobalAveragePool's backward ------------------------------------------------------
def int_pool_grad(F, I, args):
    g, d, m, channels, plane = args
    at = g + 1
    for i in range(m * channels):
        v = I[d + i]
        for _ in range(plane):
            I[at] = v
            at += 1
    I[g] = _normalize(I, g, m * channels * plane)


def int_pool_grad_check(args, c):
    m, channels, plane = c.ints
    c.positive(m, channels, plane)
    c.holds(0, 1 + m * channels * plane)
    c.holds(1, m * channels)
    unit, exp = _unit(c, 1)
    _record_unit(c, 0, f32(unit / plane), exp)


# -- a convolution's clamp: mask, bias step, weight scale folded -----------------------
def int_clamp_mask(F, I, args):
    # bit i of the mask (byte i >> 3, bit i & 7) = lo < y[i] < hi: what the backward needs of
    # a convolution's output (1 bit instead of its byte, so the planner can reuse the output's
    # plane for the next layer's once the mask is taken)
    Q, mask, y, req, count, y_signed = args
    fy = 128 if y_signed else 0
    lo = I[req + 2]
    hi = I[req + 3]
    i = 0
    for at in range(mask, mask + ((count + 7) >> 3)):
        bits = 0
        for b in range(8):
            if i < count:
                v = (Q[y + i] ^ fy) - fy
                if lo < v < hi:
                    bits |= 1 << b
            i += 1
        Q[at] = bits


def int_clamp_mask_check(args, c):
    count, y_signed = c.ints
    c.positive(count)
    c.holds(0, (count + 7) >> 3)
    c.holds(1, count)
    c.holds(2, 4)
    c.within(y_signed, 0, 1, "signed flag")


def int_clamp_bias_grad(F, I, args):
    # (the mask tensor carries the scale of the conv's input: the bias quanta s_x * s_w[c];
    # the weight w only gives its scales, to the checker: its buffer W is not read here)
    Q, g, mask, bias, rates, random, w, m, channels, plane, W = args
    e = I[g]
    for c in range(channels):
        r = rates + 4 * c
        total = 0       # the sum of the chunks' sums so far (_fold_sum: packed)
        for i in range(m):
            start = (i * channels + c) * plane
            stop = start + plane
            while start < stop:     # (a range with a step would allocate)
                end = start + MAX_BIAS_SUM if start + MAX_BIAS_SUM < stop else stop
                total = _fold_sum(total, _masked_sum(Q, I, g, mask, start, end))
                start = end
        descend_bias(I, bias + c, _step(I, total >> 5, I[r], I[r + 1], e + (total & 31),
                                        random))
        m0 = I[r + 2]
        shift = I[r + 3] if I[r + 3] < 62 else 62      # a scale ratio below 2**-38: 0
        for i in range(m):
            pg = g + 1 + (i * channels + c) * plane
            for p in range(pg, pg + plane):
                I[p] = requant(I[p], m0, shift)


def _masked_sum(Q, I, g, mask, start, end):
    # G[p] zeroed where the clamp mask's bit p is 0, for p in [start, end); the sum of the
    # rest (at most MAX_BIAS_SUM mantissas: below 2**29)
    acc = 0
    pg = g + 1 + start
    for p in range(start, end):
        if (Q[mask + (p >> 3)] >> (p & 7)) & 1:
            acc += I[pg]
        else:
            I[pg] = 0
        pg += 1
    return acc


def bias_reals(unit, sx, sw, m, lr):
    """[(real_b, fold)] per channel of int_clamp_bias_grad: the bias step per unit of G
    (lr * u / (m * s_x * s_w[c]), bias quanta s_x * s_w[c]) and s_w[c] / max(s_w)."""
    top = max(sw)
    u = f32(f32(lr * unit) / m)
    return [(f32(u / f32(sx * s)), f32(s / top)) for s in sw]


def _bias_rates(params, lr):
    # int_clamp_bias_grad's rates at learning rate lr (intsgd.derive_rates): per channel
    # the (m0, shift) of the bias step (E added to its shift: the unit is unit / 2**E),
    # then of the fold
    unit, sx, sw, m, exp = params
    values = []
    for step, fold in bias_reals(unit, sx, sw, m, lr):
        values += _scaled_pair(step, exp)
        values += requant_pair(fold, False)
    return values


def _scaled_pair(real, exp):
    # requant_pair(real / 2**exp, capped=False), the power of two applied to the shift (the
    # quotient itself may be below float32's range): (m0, shift), real / 2**exp == m0 /
    # 2**shift; (0, 1) for 0; (2**24, 1) for a quotient beyond 2**23 (always saturates)
    if not 0.0 < real < 3.4e38:
        return 0, 1
    mantissa, exponent = math.frexp(real)
    shift = 24 - exponent + exp
    if shift < 1:
        return 16777216, 1
    return int(mantissa * 16777216.0), shift


def int_clamp_bias_grad_check(args, c):
    m, channels, plane = c.ints
    c.positive(m, channels, plane)
    c.holds(0, 1 + m * channels * plane)
    c.holds(1, (m * channels * plane + 7) >> 3)
    c.holds(2, channels)
    c.role(2, "param")
    c.holds(3, 4 * channels)
    generator_check(c, 4)
    unit, exp = _unit(c, 0)
    sx, _, sw = layer_scales(c, 1, 5, channels, True)
    for s in sw:    # bias_reals divides by each bias quantum: none may underflow to 0
        if not f32(sx * s) > 0.0:
            c.fail("the bias quantum (input scale %r x weight scale %r) underflows float32"
                   % (sx, s))
    derive_rates(c, 3, _bias_rates, (unit, sx, sw, m, exp))
    # G now holds G * s_w[c] / max(s_w): what the input gradient and the weight update read


# -- a convolution's input gradient --------------------------------------------------------
def int_conv_grad_input(F, I, args):
    # G_x[cin, iy, ix] = sum over the outputs (mo, oy, ox) and taps reaching it of
    # W[mo, c, ky, kx] * G[mo, oy, ox] (G already scaled by s_w[mo] / max(s_w)): scattered
    # below FULL_TERMS terms per element (every sum below 2**30), gathered and summed
    # exactly from FULL_TERMS on (kernels/intwide.py)
    (Q, gx, g, w, m, groups, cin_g, cout_g, in_h, in_w, out_h, out_w, k_h, k_w, s_h, s_w,
     d_h, d_w, pad_t, pad_l, W) = args      # W: the weight's buffer (in place or Q)
    count = m * groups * cin_g * in_h * in_w
    if cout_g * k_h * k_w >= FULL_TERMS:
        intwide.gather_wide(I, args)
        I[gx] = I[g] + intwide.common_exponent(I, gx, count) + _normalize(I, gx, count)
        return
    in_plane = in_h * in_w
    out_plane = out_h * out_w
    taps = k_h * k_w
    channels = groups * cout_g
    for i in range(gx + 1, gx + 1 + count):
        I[i] = 0
    for n in range(m):
        xg = gx + 1 + n * groups * cin_g * in_plane
        for mo in range(channels):
            x_group = xg + (mo // cout_g) * cin_g * in_plane
            pg = g + 1 + (n * channels + mo) * out_plane
            w_m = w + mo * cin_g * taps
            for oy in range(out_h):
                for ox in range(out_w):
                    v = I[pg]
                    pg += 1
                    if v == 0:
                        continue
                    for c in range(cin_g):
                        x_c = x_group + c * in_plane
                        w_c = w_m + c * taps
                        for ky in range(k_h):
                            iy = oy * s_h - pad_t + ky * d_h
                            if iy < 0 or iy >= in_h:
                                continue
                            for kx in range(k_w):
                                ix = ox * s_w - pad_l + kx * d_w
                                if ix < 0 or ix >= in_w:
                                    continue
                                I[x_c + iy * in_w + ix] += v * ((W[w_c + ky * k_w + kx] ^ 128)
                                                                - 128)
    I[gx] = I[g] + _normalize(I, gx, count)


def _unit(c, k):
    # (u', E): the real unit u' / 2**E of gradient tensor argument k, which an earlier step
    # recorded
    tid = c.tensors[k]
    unit = c.blob.int_units.get(tid)
    if unit is None:
        c.fail("no step before this one gives its gradient tensor's unit")
    return unit, c.blob.int_unit_exps.get(tid, 0)


def _record_unit(c, k, unit, exp):
    # the unit unit / 2**exp of the gradient tensor argument k the step writes, unit
    # renormalized above UNIT_FLOOR (exact: a power of two times a normal float32)
    if not unit >= 1.2e-38:    # a normal float32 (NaN fails too)
        c.fail("the gradient's unit underflows float32 (%r): a weight or activation scale "
               "is out of range" % unit)
    while unit < UNIT_FLOOR:
        unit = f32(unit * 18446744073709551616.0)     # 2**UNIT_STEP
        exp += UNIT_STEP
    tid = c.tensors[k]
    c.blob.int_units[tid] = unit
    if exp:
        c.blob.int_unit_exps[tid] = exp


def _geometry_check(c):
    # The convolution both checkers' ints start with (contract/ops.py INT_CONV_GRAD_INPUT,
    # INT_CONV_UPDATE), checked; its sizes returned
    (m, groups, cin_g, cout_g, in_h, in_w, out_h, out_w, k_h, k_w, s_h, s_w, d_h, d_w, pad_t,
     pad_l) = c.ints[:16]
    c.positive(m, groups, cin_g, cout_g, in_h, in_w, out_h, out_w, k_h, k_w, s_h, s_w, d_h,
               d_w)
    c.within(pad_t, 0, k_h * d_h, "padding")
    c.within(pad_l, 0, k_w * d_w, "padding")
    # every output position's taps inside the padded image (the forward's geometry)
    c.within((out_h - 1) * s_h + (k_h - 1) * d_h - pad_t, 0, in_h + k_h * d_h, "geometry")
    c.within((out_w - 1) * s_w + (k_w - 1) * d_w - pad_l, 0, in_w + k_w * d_w, "geometry")
    return m, groups, cin_g, cout_g, in_h, in_w, out_h, out_w, k_h, k_w


def int_conv_grad_input_check(args, c):
    m, groups, cin_g, cout_g, in_h, in_w, out_h, out_w, k_h, k_w = _geometry_check(c)
    # each input element sums cout_g * taps terms (kernels/intwide.py: its exact sum below
    # 2**35, its high limb below 2**22)
    c.within(cout_g * k_h * k_w, 1, MAX_TERMS, "terms per input gradient")
    if cout_g * k_h * k_w >= FULL_TERMS:     # kernels/intwide.py's, fast as this family's
        from microtrain.kernels import fastpath
        fastpath.load_helper(globals(), "intwide", "int_conv_grad_input")
    c.holds(0, 1 + m * groups * cin_g * in_h * in_w)
    c.holds(1, 1 + m * groups * cout_g * out_h * out_w)
    c.holds(2, groups * cout_g * cin_g * k_h * k_w)
    unit, exp = _unit(c, 1)
    sw = quantization(c, 2)[0]
    _record_unit(c, 0, f32(max(sw) * unit), exp)


# -- a convolution's weight update ---------------------------------------------------------
def _fold_sum(total, part):
    # The running sum of a weight's gradient, packed as acc * 32 + t (|acc| < 2**24, real sum
    # acc * 2**t: one small int, no tuple, nothing allocated), with a chunk's sum part (|part|
    # < 2**30, in units of 1) added: part rounded to the total's units, both halved while
    # |part| >= 2**29 (so that acc + part < 2**30), then the sum halved while >= 2**24 (each
    # halving round_shift(., 1), half to even: exactly _step's halving for a single chunk).
    # t < 32 while the real sum is below 2**55 (2**34 positions of a weight's terms).
    acc = total >> 5
    t = total & 31
    part = round_shift(part, t)
    while part >= _HALF_SMALL or part <= -_HALF_SMALL:
        part = round_shift(part, 1)
        acc = round_shift(acc, 1)
        t += 1
    acc += part
    while acc >= _LIMB or acc <= -_LIMB:
        acc = round_shift(acc, 1)
        t += 1
    return acc * 32 + t


def _weight_sum(Q, I, args, mo, c, ky, kx, zp, fx):
    # sum over the batch and the outputs of G[mo, oy, ox] * (X[c, iy, ix] - x_zp) for one
    # weight, the taps inside the image (padding contributes 0), folded (_fold_sum, packed)
    # every MAX_SUM positions of the rows inside the image (no partial sum reaches 2**30)
    (_, _, x, g, _, _, m, groups, cin_g, cout_g, in_h, in_w, out_h, out_w, _, _,
     s_h, s_w, d_h, d_w, pad_t, pad_l, _) = args
    in_plane = in_h * in_w
    out_plane = out_h * out_w
    channels = groups * cout_g
    first = (mo // cout_g) * cin_g
    chunk = MAX_SUM
    total = 0
    part = 0
    done = 0
    for n in range(m):
        pg = g + 1 + (n * channels + mo) * out_plane
        px = x + (n * groups * cin_g + first + c) * in_plane
        for oy in range(out_h):
            iy = oy * s_h - pad_t + ky * d_h
            if iy < 0 or iy >= in_h:
                pg += out_w
                continue
            row = px + iy * in_w
            for ox in range(out_w):
                v = I[pg]
                pg += 1
                if v != 0:
                    ix = ox * s_w - pad_l + kx * d_w
                    if 0 <= ix < in_w:
                        part += v * (((Q[row + ix] ^ fx) - fx) - zp)
                done += 1
                if done == chunk:
                    total = _fold_sum(total, part)
                    part = 0
                    done = 0
    return _fold_sum(total, part)


def int_conv_update(F, I, args):
    # W[mo, c, ky, kx] -= step(sum over the batch and outputs of G[mo, oy, ox] *
    # (X[c, iy, ix] - x_zp)) (_weight_sum: any batch x positions)
    (Q, w, _, g, rates, random, _, groups, cin_g, cout_g, _, _, _, _, k_h, k_w, _, _, _, _, _,
     _, x_signed) = args
    fx = 128 if x_signed else 0
    x_zp = I[rates]
    e = I[g]
    for mo in range(groups * cout_g):
        m0 = I[rates + 1 + 2 * mo]
        shift = I[rates + 2 + 2 * mo]
        for c in range(cin_g):
            for ky in range(k_h):
                for kx in range(k_w):
                    total = _weight_sum(Q, I, args, mo, c, ky, kx, x_zp, fx)
                    descend_weight(Q, w + ((mo * cin_g + c) * k_h + ky) * k_w + kx,
                                   _step(I, total >> 5, m0, shift, e + (total & 31), random))


def weight_reals(unit, sx, sw, m, lr):
    """[real_w] per channel of int_conv_update: the weight step (quanta s_w[c]) per unit of
    the folded G times (x - x_zp): lr * u * s_x * max(s_w) / (m * s_w[c]**2)."""
    top = max(sw)
    u = f32(f32(f32(lr * unit) / m) * f32(sx * top))
    return [f32(f32(u / s) / s) for s in sw]


def _weight_rates(params, lr):
    # int_conv_update's rates at learning rate lr (intsgd.derive_rates): x_zp, then the
    # (m0, shift) of the weight step per channel (E added to the shifts: the unit is
    # unit / 2**E)
    unit, sx, sw, m, x_zp, exp = params
    values = [x_zp]
    for real in weight_reals(unit, sx, sw, m, lr):
        values += _scaled_pair(real, exp)
    return values


def int_conv_update_check(args, c):
    m, groups, cin_g, cout_g, in_h, in_w, out_h, out_w, k_h, k_w = _geometry_check(c)
    x_signed = c.ints[-1]      # after the geometry
    channels = groups * cout_g
    c.holds(0, channels * cin_g * k_h * k_w)
    c.role(0, "param")
    c.holds(1, m * groups * cin_g * in_h * in_w)
    c.holds(2, 1 + m * channels * out_h * out_w)
    c.holds(3, 1 + 2 * channels)
    generator_check(c, 4)
    c.within(x_signed, 0, 1, "signed flag")
    unit, exp = _unit(c, 2)
    sx, x_zp, sw = layer_scales(c, 1, 0, channels, True)
    derive_rates(c, 3, _weight_rates, (unit, sx, sw, m, x_zp, exp))


# The viper fast paths (kernels/intgrad_viper.py, MicroPython with the viper emitter): the
# same integers, no allocation. use_fast(False) switches back to the pure-Python kernels
# (tests compare the two).
_FAST_NAMES = ("int_pool_grad", "int_clamp_mask", "int_clamp_bias_grad",
               "int_conv_grad_input", "int_conv_update")


def use_fast(on=True):
    # (a wide layer's kernels/intwide.py, when loaded, switches with this family)
    from microtrain.kernels import fastpath
    # the native module's where kernels/qlinear_native.mpy is (device/native/intgrad_native.c)
    return fastpath.use_fast(globals(), _FAST_NAMES, on, "intgrad_viper", "qlinear_native",
                             helper="intwide")


FAST = use_fast()
