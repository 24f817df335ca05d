// kernels/inttrain.py's int_gemm_update (the SGD step of an integer-trained Gemm's int8
// weights and int32 biases) as machine code, in the module of qlinear_native.c. Bytecode-
// heavy in its viper form (a call per weight: the KWS DS-CNN's "int8 last" classifier update
// took 1.85 M instructions there, a tenth of the step); here a loop.
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
