// kernels/inttrain.py's int_gemm_update (the SGD step of an integer-trained Gemm's int8
// weights and int32 biases) as machine code, in the module of qlinear_native.c. Bytecode-
// heavy in its viper form (a call per weight: the KWS DS-CNN's "int8 last" classifier update
// took 1.85 M instructions there, a tenth of the step); here a loop. Below it the family's
// other training kernels: int_gemm_update_momentum, int_gemm_grad_input and
// int_conv1x1_update (the last 1x1 convolution before the pool; 32.8 M instructions of the
// KWS "int8 last block" step in viper, 5.7 M here on armv6m).
//
// The same integers as the pure-Python kernel on a 32-bit board, per output channel j with
// a bias in use and per input t:
//   acc = sum over the batch i of g[i, j] * (x[i, t] - x_zp)
//   W[j, t] = clamp(W[j, t] - update_step(acc, m0_w, shift_w), +-127)
// and the bias from sum_i g[i, j] with (m0_b, shift_b), clamped to +-2**23. update_step is
// intsgd.py's: with a generator (random >= 0) and shift > 8, (requant(acc, m0, shift - 8) +
// (dither & 255)) >> 8 (xorshift16, its state I[random]); else requant(acc, m0, shift).
// requant is fixedpoint.requant_narrow, the 32-bit ports' (exact; a result at or beyond
// 2**29 comes back as 2**29 when the shift is below 24): exact here on one 64-bit product,
// for |acc| < 2**29 and 0 <= m0 <= 2**24. A call with a possible accumulator or a
// multiplier outside that goes to the pure-Python kernel (_pure).
#include "qlinear_native.h"

#define BIAS_LIMIT (8388608)            // intsgd.BIAS_LIMIT
#define UNUSED_BIAS (-BIAS_LIMIT - 1)   // inttrain.UNUSED_BIAS: a class not in use
#define ACC_LIMIT (536870912)           // fixedpoint.ACC_LIMIT, 2**29

// fixedpoint.requant_narrow for |acc| < 2**29 and 0 <= m0 <= 2**24 (intgrad_native.c too)
int32_t requant29(int32_t acc, int32_t m0, int32_t shift) {
    if (shift < 1) {
        shift = 1;
    }
    if (shift > 62) {
        return 0;                       // |acc * m0| < 2**53 <= 2**(shift - 1)
    }
    int64_t p = (int64_t)acc * m0;
    uint64_t a = p < 0 ? 0 - (uint64_t)p : (uint64_t)p;
    if (shift < 24 && (a >> 24) >= ((uint64_t)1 << (shift + 5))) {
        return p < 0 ? -ACC_LIMIT : ACC_LIMIT;      // requant_narrow's saturation
    }
    uint64_t q = a >> shift, rem = a & (((uint64_t)1 << shift) - 1);
    uint64_t half = (uint64_t)1 << (shift - 1);
    if (rem > half || (rem == half && (q & 1))) {   // half to even: odd-symmetric
        q += 1;
    }
    return p < 0 ? -(int32_t)q : (int32_t)q;
}

// intsgd.dither: the next xorshift16 value of the state I[at] (0: unseeded), in int32
// arithmetic as Python's on any int32 state
static int32_t dither(int32_t *I, mp_int_t at) {
    int32_t s = I[at];
    if (s == 0) {
        s = 0xACE1;
    }
    s ^= (int32_t)(((uint32_t)s << 7) & 0xFFFF);
    s ^= s >> 9;
    s ^= (int32_t)(((uint32_t)s << 8) & 0xFFFF);
    I[at] = s;
    return s;
}

// intsgd.update_step (intgrad_native.c's steps too)
int32_t update_step(int32_t *I, int32_t acc, int32_t m0, int32_t shift,
                           mp_int_t random) {
    if (random >= 0 && shift > 8) {
        return (requant29(acc, m0, shift - 8) + (dither(I, random) & 255)) >> 8;
    }
    return requant29(acc, m0, shift);
}

// int_gemm_update(F, I, args), args (Q, w, bias, x, g, rates, random, m, k, n, x_signed)
static mp_obj_t int_gemm_update(size_t n_args, const mp_obj_t *in) {
    size_t len;
    mp_obj_t *a;
    mp_obj_get_array(in[2], &len, &a);
    if (len != 11) {
        mp_raise_ValueError(MP_ERROR_TEXT("int_gemm_update: 11 arguments expected"));
    }
    mp_buffer_info_t bq, bi;
    mp_get_buffer_raise(a[0], &bq, MP_BUFFER_WRITE);
    mp_get_buffer_raise(in[1], &bi, MP_BUFFER_WRITE);
    mp_int_t f[10];
    for (int i = 0; i < 10; i++) {
        f[i] = mp_obj_get_int(a[i + 1]);
    }
    const mp_int_t w = f[0], bias = f[1], x = f[2], g = f[3], rates = f[4], random = f[5],
                   m = f[6], k = f[7], n = f[8];
    uint8_t *Q = bq.buf;
    int32_t *I = bi.buf;
    const uint32_t flip = f[9] ? 0x80 : 0;
    const int32_t zpf = I[rates] + (int32_t)flip;    // (b ^ flip) - zpf: the input less x_zp
    // the domain (see the top): every accumulator below 2**29, every multiplier in range
    int64_t top = 0;
    for (mp_int_t i = 0; i < m * n; i++) {
        int64_t v = I[g + i];
        top = v < 0 ? (-v > top ? -v : top) : (v > top ? v : top);
    }
    int64_t dx = zpf < 0 ? 255 - (int64_t)zpf : (zpf > 255 - zpf ? zpf : 255 - zpf);
    bool inside = top * m * (dx > 1 ? dx : 1) < ACC_LIMIT;
    for (mp_int_t j = 0; inside && j < n; j++) {
        const int32_t *r = I + rates + 1 + 4 * j;
        inside = r[0] >= 0 && r[0] <= M0_LIMIT && r[2] >= 0 && r[2] <= M0_LIMIT;
    }
    if (!inside) {
        return pure_kernel(MP_QSTR_int_gemm_update, in);
    }
    for (mp_int_t j = 0; j < n; j++) {
        if (I[bias + j] == UNUSED_BIAS) {
            continue;
        }
        const int32_t m0 = I[rates + 1 + 4 * j], shift = I[rates + 2 + 4 * j];
        uint8_t *pw = Q + w + j * k;
        for (mp_int_t t = 0; t < k; t++) {
            int32_t acc = 0;
            const uint8_t *px = Q + x + t;
            const int32_t *pg = I + g + j;
            for (mp_int_t i = 0; i < m; i++, px += k, pg += n) {
                acc += *pg * ((int32_t)(*px ^ flip) - zpf);
            }
            int32_t v = (int8_t)pw[t] - update_step(I, acc, m0, shift, random);
            pw[t] = (uint8_t)(v > 127 ? 127 : v < -127 ? -127 : v);
        }
        int32_t acc = 0;
        for (mp_int_t i = 0; i < m; i++) {
            acc += I[g + i * n + j];
        }
        int64_t v = (int64_t)I[bias + j] - update_step(I, acc, I[rates + 3 + 4 * j],
                                                       I[rates + 4 + 4 * j], random);
        I[bias + j] = (int32_t)(v > BIAS_LIMIT ? BIAS_LIMIT
                                : v < -BIAS_LIMIT ? -BIAS_LIMIT : v);
    }
    return mp_const_none;
}
MP_DEFINE_CONST_FUN_OBJ_VAR_BETWEEN(int_gemm_update_obj, 3, 3, int_gemm_update);

// -- int_gemm_update_momentum, int_gemm_grad_input, int_conv1x1_update ----------------------
#define GRAD_BITS (4)                   // inttrain.GRAD_BITS
#define VELOCITY_LIMIT (32767)          // inttrain.VELOCITY_LIMIT
#define MU_LIMIT (16384)                // the momentum in Q14, below 1.0 (the checker's)
#define MASK_BYTES (512)                // int_conv1x1_update's clamp mask on the stack

// max |(b ^ flip) - zpf| over the bytes b: an input less its zero point (at least 1)
static int64_t input_span(int64_t zpf) {
    int64_t dx = zpf < 0 ? 255 - zpf : (zpf > 255 - zpf ? zpf : 255 - zpf);
    return dx > 1 ? dx : 1;
}

// every multiplier of count channels' rates (at I[at], step words apart) within [0, 2**24]
static bool multipliers_inside(const int32_t *I, mp_int_t at, mp_int_t count, mp_int_t step) {
    for (mp_int_t c = 0; c < count; c++, at += step) {
        if (I[at] < 0 || I[at] > M0_LIMIT) {
            return false;
        }
    }
    return true;
}

// the largest |I[at + i * step]| of count ints (as an unsigned: -2**31 is 2**31)
static uint32_t top_of(const int32_t *I, mp_int_t at, mp_int_t count, mp_int_t step) {
    uint32_t top = 0;
    for (mp_int_t i = 0; i < count; i++, at += step) {
        uint32_t v = I[at] < 0 ? 0u - (uint32_t)I[at] : (uint32_t)I[at];
        top = v > top ? v : top;
    }
    return top;
}

// update_step(I, v, FINE_M0, FINE_SHIFT, random) written out: v / 256 in whole quanta,
// dithered ((v + u) >> 8: requant(v, 2, 1) is v) or rounded half to even
static int32_t fine_step(int32_t *I, int32_t v, mp_int_t random) {
    if (random >= 0) {
        return (v + (dither(I, random) & 255)) >> 8;
    }
    int32_t q = v >> 8;
    uint32_t r = (uint32_t)v & 255;
    return q + (r > 128 || (r == 128 && (q & 1)));
}

static uint8_t descend_weight(uint8_t w, int32_t step) {
    int32_t v = (int8_t)w - step;       // |step| <= 2**29
    return (uint8_t)(v > 127 ? 127 : v < -127 ? -127 : v);
}

static void descend_bias(int32_t *b, int32_t step) {
    int64_t v = (int64_t)*b - step;
    *b = (int32_t)(v > BIAS_LIMIT ? BIAS_LIMIT : v < -BIAS_LIMIT ? -BIAS_LIMIT : v);
}

// int_gemm_update_momentum(F, I, (Q, w, bias, x, g, rates, random, vw, vb, m, k, n,
// x_signed, mu)): int_gemm_update's sums, the int16 velocities V = round(mu V) + step in
// 1/256 quanta (clamped to +-VELOCITY_LIMIT, the bias' int32 ones to +-BIAS_LIMIT), the
// weights and biases moved by V / 256 (fine_step). Domain: int_gemm_update's, mu in Q14
// below 1.0 (|V * mu| < 2**29)
static mp_obj_t int_gemm_update_momentum(size_t n_args, const mp_obj_t *in) {
    mp_int_t f[13];
    mp_obj_t *a;
    int32_t *I = int_fields(in, 1, 13, 14, f, &a);
    uint8_t *Q = bytes_of(a[0], MP_BUFFER_WRITE);
    const mp_int_t w = f[0], bias = f[1], x = f[2], g = f[3], rates = f[4], random = f[5],
                   vw = f[6], vb = f[7], m = f[8], k = f[9], n = f[10], mu = f[12];
    const uint32_t flip = f[11] ? 0x80 : 0;
    const int64_t zpf = (int64_t)I[rates] + flip;
    if ((int64_t)top_of(I, g, m * n, 1) * m * input_span(zpf) >= ACC_LIMIT
        || !multipliers_inside(I, rates + 1, n, 4) || !multipliers_inside(I, rates + 3, n, 4)
        || mu < 0 || mu >= MU_LIMIT) {
        return pure_kernel(MP_QSTR_int_gemm_update_momentum, in);
    }
    const int32_t zp = (int32_t)zpf, mu32 = (int32_t)mu;     // |zp| < 2**29: the check
    for (mp_int_t j = 0; j < n; j++) {
        if (I[bias + j] == UNUSED_BIAS) {
            continue;
        }
        const int32_t *r = I + rates + 1 + 4 * j;
        const int32_t m0 = r[0], shift = r[1] > 8 ? r[1] - 8 : 1;
        uint8_t *pw = Q + w + j * k, *pv = Q + vw + 2 * j * k;
        for (mp_int_t t = 0; t < k; t++, pv += 2) {
            int32_t acc = 0;
            const uint8_t *px = Q + x + t;
            const int32_t *pg = I + g + j;
            for (mp_int_t i = 0; i < m; i++, px += k, pg += n) {
                acc += *pg * ((int32_t)(*px ^ flip) - zp);
            }
            int32_t v = (int16_t)(pv[0] | (pv[1] << 8));
            v = ((v * mu32 + 8192) >> 14) + requant29(acc, m0, shift);
            v = v > VELOCITY_LIMIT ? VELOCITY_LIMIT : v < -VELOCITY_LIMIT ? -VELOCITY_LIMIT : v;
            pv[0] = (uint8_t)v;
            pv[1] = (uint8_t)(v >> 8);
            pw[t] = descend_weight(pw[t], fine_step(I, v, random));
        }
        int32_t acc = 0;
        for (mp_int_t i = 0; i < m; i++) {
            acc += I[g + i * n + j];
        }
        const int32_t v0 = I[vb + j], hi = v0 >> 14;        // mu V in two parts
        int64_t v = (int64_t)hi * mu32 + (((v0 - hi * 16384) * mu32 + 8192) >> 14)
                    + requant29(acc, r[2], r[3] > 8 ? r[3] - 8 : 1);
        I[vb + j] = (int32_t)(v > BIAS_LIMIT ? BIAS_LIMIT : v < -BIAS_LIMIT ? -BIAS_LIMIT : v);
        descend_bias(I + bias + j, fine_step(I, I[vb + j], random));
    }
    return mp_const_none;
}
MP_DEFINE_CONST_FUN_OBJ_VAR_BETWEEN(int_gemm_update_momentum_obj, 3, 3, int_gemm_update_momentum);

// int_gemm_grad_input(F, I, (Q, d, g, w, factors, m, k, n)): D[i, c] = sum_j h[i, j] *
// W[j, c], h = requant(g, factors): each h once per sample (the pure kernel's per term:
// the same integer), D's rows summed along W's rows, in wrapping 32-bit words as the
// arena's int32 stores keep the exact sum. Beyond 31 outputs (intwide.py's exact sums),
// |g| >= 2**29 or a multiplier outside [0, 2**24]: the pure kernel
static mp_obj_t int_gemm_grad_input(size_t n_args, const mp_obj_t *in) {
    mp_int_t f[7];
    mp_obj_t *a;
    int32_t *I = int_fields(in, 1, 7, 8, f, &a);
    const uint8_t *Q = bytes_of(a[0], MP_BUFFER_READ);
    const mp_int_t d = f[0], g = f[1], w = f[2], factors = f[3], m = f[4], k = f[5], n = f[6];
    if (n < 1 || (n << GRAD_BITS) > 511 || top_of(I, g, m * n, 1) >= ACC_LIMIT
        || !multipliers_inside(I, factors, n, 2)) {
        return pure_kernel(MP_QSTR_int_gemm_grad_input, in);
    }
    for (mp_int_t i = 0; i < m; i++) {
        uint32_t *D = (uint32_t *)(I + d + i * k);
        for (mp_int_t j = 0; j < n; j++) {
            const uint32_t h = (uint32_t)requant29(I[g + i * n + j], I[factors + 2 * j],
                                                   I[factors + 2 * j + 1]);
            const int8_t *pw = (const int8_t *)(Q + w + j * k);
            if (j == 0) {
                for (mp_int_t c = 0; c < k; c++) {
                    D[c] = h * (uint32_t)(int32_t)pw[c];
                }
            } else if (h != 0) {
                for (mp_int_t c = 0; c < k; c++) {
                    D[c] += h * (uint32_t)(int32_t)pw[c];
                }
            }
        }
    }
    return mp_const_none;
}
MP_DEFINE_CONST_FUN_OBJ_VAR_BETWEEN(int_gemm_grad_input_obj, 3, 3, int_gemm_grad_input);

// inttrain._mantissa: e, the shift making every |D[i, c]| of the batch < limit
static int mantissa(const int32_t *I, mp_int_t at, mp_int_t m, mp_int_t stride, int64_t limit) {
    int64_t top = top_of(I, at, m, stride);
    int e = 0;
    while (top >= limit) {
        top >>= 1;
        e += 1;
    }
    return e;
}

// a shift of update_step, clamped to 1 .. 63 (every shift beyond 62 gives requant29's 0, as
// requant_narrow's)
static int32_t shift_of(int64_t s) {
    return s < 1 ? 1 : s > 63 ? 63 : (int32_t)s;
}

// int_conv1x1_update(F, I, (Q, w, bias, x, y, d, req, rates, random, m, cin, cout, plane,
// x_signed, y_signed)): per output channel c, D's mantissas dc (round_shift by _mantissa's
// e), each weight's acc = sum_i dc * sum over the positions whose output lies inside the
// clamp (lo < y < hi) of x - x_zp, the bias' sum_i dc * their count. Domain: every such
// sum below 2**29 by its bound (|dc| <= limit, |x - x_zp| <= the span), multipliers in
// [0, 2**24]
static mp_obj_t int_conv1x1_update(size_t n_args, const mp_obj_t *in) {
    mp_int_t f[14];
    mp_obj_t *a;
    int32_t *I = int_fields(in, 1, 14, 15, f, &a);
    uint8_t *Q = bytes_of(a[0], MP_BUFFER_WRITE);
    const mp_int_t w = f[0], bias = f[1], x = f[2], y = f[3], d = f[4], req = f[5],
                   rates = f[6], random = f[7], m = f[8], cin = f[9], cout = f[10],
                   plane = f[11];
    const uint32_t fx = f[12] ? 0x80 : 0, fy = f[13] ? 0x80 : 0;
    const int64_t zpf = (int64_t)I[rates] + fx, mp = (int64_t)m * plane;
    const int32_t lo = I[req + 2], hi = I[req + 3];
    const int64_t wlimit = mp >= 1 ? 16777216 / (mp * 255) + 1 : 1;
    const int64_t blimit = mp >= 1 ? 16777216 / mp + 1 : 1;
    const int64_t span = input_span(zpf);
    if (mp < 1 || mp >= ACC_LIMIT || span > 65536 || mp * wlimit >= ACC_LIMIT
        || mp * wlimit * span >= ACC_LIMIT
        || mp * blimit >= ACC_LIMIT || !multipliers_inside(I, rates + 1, cout, 4)
        || !multipliers_inside(I, rates + 3, cout, 4)) {
        return pure_kernel(MP_QSTR_int_conv1x1_update, in);
    }
    const int32_t zp = (int32_t)zpf;
    // the clamp's mask of channel c's outputs over the batch, once per channel (not per
    // weight) where it fits: -1 inside, 0 outside, ANDed with x - x_zp
    int8_t mask[MASK_BYTES];
    const bool masked = mp <= MASK_BYTES;
    for (mp_int_t c = 0; c < cout; c++) {
        const int32_t *r = I + rates + 1 + 4 * c;
        for (mp_int_t i = 0; masked && i < m; i++) {
            const uint8_t *py = Q + y + (i * cout + c) * plane;
            for (mp_int_t p = 0; p < plane; p++) {
                const int32_t v = (int32_t)(py[p] ^ fy) - (int32_t)fy;
                mask[i * plane + p] = -(int8_t)(v > lo && v < hi);
            }
        }
        const int e = mantissa(I, d + c, m, cout, wlimit);
        const int eb = mantissa(I, d + c, m, cout, blimit);
        const int32_t wshift = shift_of((int64_t)r[1] - e), bshift = shift_of((int64_t)r[3] - eb);
        uint8_t *pw = Q + w + c * cin;
        for (mp_int_t t = 0; t < cin; t++) {
            int32_t acc = 0;
            for (mp_int_t i = 0; i < m; i++) {
                const int32_t dc = (int32_t)rshift64(I[d + i * cout + c], e);
                if (dc == 0) {
                    continue;
                }
                const uint8_t *px = Q + x + (i * cin + t) * plane;
                if (masked) {
                    const int8_t *mi = mask + i * plane;
                    int32_t part = 0;
                    mp_int_t p = 0;
                    for (; p + 4 <= plane; p += 4) {
                        part += (((int32_t)(px[p] ^ fx) - zp) & mi[p])
                                + (((int32_t)(px[p + 1] ^ fx) - zp) & mi[p + 1])
                                + (((int32_t)(px[p + 2] ^ fx) - zp) & mi[p + 2])
                                + (((int32_t)(px[p + 3] ^ fx) - zp) & mi[p + 3]);
                    }
                    for (; p < plane; p++) {
                        part += ((int32_t)(px[p] ^ fx) - zp) & mi[p];
                    }
                    acc += dc * part;
                    continue;
                }
                const uint8_t *py = Q + y + (i * cout + c) * plane;
                int32_t sum = 0, count = 0;
                for (mp_int_t p = 0; p < plane; p++) {
                    const int32_t v = (int32_t)(py[p] ^ fy) - (int32_t)fy;
                    if (v > lo && v < hi) {
                        sum += px[p] ^ fx;
                        count += 1;
                    }
                }
                acc += dc * (sum - zp * count);
            }
            pw[t] = descend_weight(pw[t], update_step(I, acc, r[0], wshift, random));
        }
        int32_t acc = 0;
        for (mp_int_t i = 0; i < m; i++) {
            const uint8_t *py = Q + y + (i * cout + c) * plane;
            int32_t count = 0;
            for (mp_int_t p = 0; p < plane; p++) {
                const int32_t v = (int32_t)(py[p] ^ fy) - (int32_t)fy;
                count += v > lo && v < hi;
            }
            acc += (int32_t)rshift64(I[d + i * cout + c], eb) * count;
        }
        descend_bias(I + bias + c, update_step(I, acc, r[2], bshift, random));
    }
    return mp_const_none;
}
MP_DEFINE_CONST_FUN_OBJ_VAR_BETWEEN(int_conv1x1_update_obj, 3, 3, int_conv1x1_update);

void inttrain_globals(void) {
    mp_store_global(MP_QSTR_int_gemm_update_momentum,
                    MP_OBJ_FROM_PTR(&int_gemm_update_momentum_obj));
    mp_store_global(MP_QSTR_int_gemm_grad_input, MP_OBJ_FROM_PTR(&int_gemm_grad_input_obj));
    mp_store_global(MP_QSTR_int_conv1x1_update, MP_OBJ_FROM_PTR(&int_conv1x1_update_obj));
}
