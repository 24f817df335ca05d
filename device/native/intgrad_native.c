// kernels/intgrad.py (the integer backward through frozen int8 convolutions and the sparse
// update of their weights and biases) as machine code, in the module of qlinear_native.c:
// int_pool_grad, int_clamp_mask, int_clamp_bias_grad, int_conv_grad_input (below
// FULL_TERMS terms per element: the scatter) and int_conv_update. Their viper forms spent
// ~640 M instructions of the KWS DS-CNN's "int8 sparse" step on the emulated Cortex-M3, a
// viper call per element or per weight; here loops.
//
// The same integers as the pure-Python kernels on a 32-bit board (intgrad.py's comments
// give the arithmetic): the same normalization and half-to-even roundings, the same chunks
// of MAX_SUM positions folded by _fold_sum (its roundings depend on where a chunk ends, so
// the chunks end where the pure kernel's do), the steps by inttrain_native.c's update_step
// (requant_narrow's saturation, the generator drawn in the same order). Sums whose order
// the pure kernel fixes only by its loops are exact integers here as there (checked bounds
// below), so their order is free: the loops run per weight along rows, not per output.
// Arguments outside the domain where the int32 sums are exact (a gradient mantissa beyond
// what its layer can hold, a multiplier beyond 2**24, a wide input gradient's terms) go to
// the pure-Python kernel (_pure), which the module's other kernels do too.
#include "qlinear_native.h"

#define MANT_TOP (65536)            // intgrad._TOP, 2**MANT_BITS
#define LIMB (16777216)             // intgrad._LIMB, 2**24
#define HALF_SMALL (536870912)      // intgrad._HALF_SMALL, 2**29
#define MAX_SUM (63)                // intgrad.MAX_SUM
#define MAX_BIAS_SUM (8191)         // intgrad.MAX_BIAS_SUM
#define FULL_TERMS (128)            // intgrad.FULL_TERMS
#define BIAS_LIMIT (8388608)        // intsgd.BIAS_LIMIT

// fixedpoint.round_shift: round half to even of v / 2**e (0 <= e < 63; inttrain_native.c too)
int64_t rshift64(int64_t v, int e) {
    if (e <= 0) {
        return v;
    }
    int64_t q = v >> e;                                    // floor (arithmetic shift)
    uint64_t r = (uint64_t)v & (((uint64_t)1 << e) - 1);   // v - q * 2**e
    uint64_t half = (uint64_t)1 << (e - 1);
    if (r > half || (r == half && (q & 1))) {
        q += 1;
    }
    return q;
}

// the same for an int32 (1 <= e <= 31): the normalization's per-element rounding
static int32_t rshift32(int32_t v, int e) {
    int32_t q = v >> e;
    uint32_t r = (uint32_t)v & ((1u << e) - 1), half = 1u << (e - 1);
    if (r > half || (r == half && (q & 1))) {
        q += 1;
    }
    return q;
}

// intgrad._normalize: the exponent making every |I[g + 1 + i]| <= 2**MANT_BITS, applied
static int32_t normalize(int32_t *I, mp_int_t g, mp_int_t count) {
    int32_t *p = I + g + 1;
    uint32_t top = 0;
    for (mp_int_t i = 0; i < count; i++) {
        uint32_t v = p[i] < 0 ? 0u - (uint32_t)p[i] : (uint32_t)p[i];
        top = v > top ? v : top;
    }
    int e = 0;
    if (top) {
        while (top >= MANT_TOP) {
            top >>= 1;
            e += 1;
        }
        while (top < (MANT_TOP >> 1)) {
            top <<= 1;
            e -= 1;
        }
    }
    if (e > 0) {
        for (mp_int_t i = 0; i < count; i++) {
            p[i] = rshift32(p[i], e);
        }
    } else if (e < 0) {
        for (mp_int_t i = 0; i < count; i++) {
            p[i] = (int32_t)((uint32_t)p[i] << -e);      // |p| < 2**15: exact
        }
    }
    return e;
}

// intgrad._fold_sum: the running sum packed as acc * 32 + t with a chunk's sum added
static int64_t fold_sum(int64_t total, int64_t part) {
    int64_t acc = total >> 5;
    int t = (int)(total & 31);
    part = rshift64(part, t);
    while (part >= HALF_SMALL || part <= -HALF_SMALL) {
        part = rshift64(part, 1);
        acc = rshift64(acc, 1);
        t += 1;
    }
    acc += part;
    while (acc >= LIMB || acc <= -LIMB) {
        acc = rshift64(acc, 1);
        t += 1;
    }
    return acc * 32 + t;
}

// intgrad._step: update_step of acc * 2**e (m0 within [0, 2**24]: the callers check)
static int32_t gstep(int32_t *I, int64_t acc, int32_t m0, int64_t shift, int64_t e,
                     mp_int_t random) {
    if (acc == 0 || m0 == 0) {
        return 0;
    }
    shift -= e;
    while (acc >= LIMB || acc <= -LIMB) {
        acc = rshift64(acc, 1);
        shift -= 1;
    }
    if (shift < 1) {
        return acc > 0 ? HALF_SMALL : -HALF_SMALL;
    }
    return update_step(I, (int32_t)acc, m0, shift > 62 ? 62 : (int32_t)shift, random);
}

// the largest |I[at + i]| of count ints (as an unsigned: -2**31 is 2**31)
static uint32_t largest(const int32_t *I, mp_int_t at, mp_int_t count) {
    uint32_t top = 0;
    for (mp_int_t i = 0; i < count; i++) {
        int32_t v = I[at + i];
        uint32_t a = v < 0 ? 0u - (uint32_t)v : (uint32_t)v;
        top = a > top ? a : top;
    }
    return top;
}

// every multiplier of count channels' rates (at rates + first, step apart) within [0, 2**24]
static bool rates_inside(const int32_t *I, mp_int_t at, mp_int_t count, mp_int_t step) {
    for (mp_int_t c = 0; c < count; c++, at += step) {
        if (I[at] < 0 || I[at] > M0_LIMIT) {
            return false;
        }
    }
    return true;
}

// (F, I, args): args' `count` ints from index `from` into f, args itself into *args; I's
// words (inttrain_native.c's kernels too)
int32_t *int_fields(const mp_obj_t *in, size_t from, size_t count, size_t total,
                           mp_int_t *f, mp_obj_t **args) {
    size_t len;
    mp_obj_t *a;
    mp_obj_get_array(in[2], &len, &a);
    if (len != total) {
        mp_raise_ValueError(MP_ERROR_TEXT("wrong number of kernel arguments"));
    }
    mp_buffer_info_t bi;
    mp_get_buffer_raise(in[1], &bi, MP_BUFFER_WRITE);
    for (size_t i = 0; i < count; i++) {
        f[i] = mp_obj_get_int(a[from + i]);
    }
    *args = a;
    return bi.buf;
}

uint8_t *bytes_of(mp_obj_t obj, int flags) {
    mp_buffer_info_t b;
    mp_get_buffer_raise(obj, &b, flags);
    return b.buf;
}

// -- GlobalAveragePool's backward ---------------------------------------------------------
// int_pool_grad(F, I, (g, d, m, channels, plane))
static mp_obj_t int_pool_grad(size_t n_args, const mp_obj_t *in) {
    mp_int_t f[5];
    mp_obj_t *a;
    int32_t *I = int_fields(in, 0, 5, 5, f, &a);
    const mp_int_t g = f[0], d = f[1], count = f[2] * f[3], plane = f[4];
    int32_t *at = I + g + 1;
    for (mp_int_t i = 0; i < count; i++) {
        int32_t v = I[d + i];
        for (mp_int_t p = 0; p < plane; p++) {
            *at++ = v;
        }
    }
    I[g] = normalize(I, g, count * plane);
    return mp_const_none;
}
MP_DEFINE_CONST_FUN_OBJ_VAR_BETWEEN(int_pool_grad_obj, 3, 3, int_pool_grad);

// -- a convolution's clamp ------------------------------------------------------------------
// int_clamp_mask(F, I, (Q, mask, y, req, count, y_signed))
static mp_obj_t int_clamp_mask(size_t n_args, const mp_obj_t *in) {
    mp_int_t f[5];
    mp_obj_t *a;
    int32_t *I = int_fields(in, 1, 5, 6, f, &a);
    uint8_t *Q = bytes_of(a[0], MP_BUFFER_WRITE);
    const mp_int_t count = f[3];
    const uint32_t fy = f[4] ? 0x80 : 0;
    // lo < (b ^ fy) - fy < hi  <=>  lo + fy < (b ^ fy) < hi + fy
    const int32_t lo = I[f[2] + 2] + (int32_t)fy, hi = I[f[2] + 3] + (int32_t)fy;
    const uint8_t *y = Q + f[1];
    uint8_t *mask = Q + f[0];
    for (mp_int_t i = 0; i < count; i += 8) {
        uint32_t bits = 0;
        mp_int_t n = count - i < 8 ? count - i : 8;
        for (mp_int_t b = 0; b < n; b++) {
            int32_t v = y[i + b] ^ fy;
            bits |= (uint32_t)(v > lo && v < hi) << b;
        }
        *mask++ = (uint8_t)bits;
    }
    return mp_const_none;
}
MP_DEFINE_CONST_FUN_OBJ_VAR_BETWEEN(int_clamp_mask_obj, 3, 3, int_clamp_mask);

// int_clamp_bias_grad(F, I, (Q, g, mask, bias, rates, random, w, m, channels, plane, W))
static mp_obj_t int_clamp_bias_grad(size_t n_args, const mp_obj_t *in) {
    mp_int_t f[9];
    mp_obj_t *a;
    int32_t *I = int_fields(in, 1, 9, 11, f, &a);
    const uint8_t *Q = bytes_of(a[0], MP_BUFFER_WRITE);
    const mp_int_t g = f[0], mask = f[1], bias = f[2], rates = f[3], random = f[4],
                   m = f[6], channels = f[7], plane = f[8];
    // the domain: the fold's requant_narrow exact (|G| < 2**29), every multiplier in range
    if (largest(I, g + 1, m * channels * plane) >= HALF_SMALL
        || !rates_inside(I, rates, channels, 4) || !rates_inside(I, rates + 2, channels, 4)) {
        return pure_kernel(MP_QSTR_int_clamp_bias_grad, in);
    }
    const int64_t e = I[g];
    for (mp_int_t c = 0; c < channels; c++) {
        const int32_t *r = I + rates + 4 * c;
        int64_t total = 0;
        for (mp_int_t i = 0; i < m; i++) {
            mp_int_t start = (i * channels + c) * plane, stop = start + plane;
            while (start < stop) {
                mp_int_t end = start + MAX_BIAS_SUM < stop ? start + MAX_BIAS_SUM : stop;
                int64_t part = 0;        // _masked_sum
                int32_t *pg = I + g + 1;
                for (mp_int_t p = start; p < end; p++) {
                    if ((Q[mask + (p >> 3)] >> (p & 7)) & 1) {
                        part += pg[p];
                    } else {
                        pg[p] = 0;
                    }
                }
                total = fold_sum(total, part);
                start = end;
            }
        }
        int64_t v = (int64_t)I[bias + c] - gstep(I, total >> 5, r[0], r[1],
                                                  e + (total & 31), random);
        I[bias + c] = (int32_t)(v > BIAS_LIMIT ? BIAS_LIMIT : v < -BIAS_LIMIT ? -BIAS_LIMIT : v);
        const int32_t m0 = r[2], shift = r[3] < 62 ? r[3] : 62;
        for (mp_int_t i = 0; i < m; i++) {
            int32_t *pg = I + g + 1 + (i * channels + c) * plane;
            for (mp_int_t p = 0; p < plane; p++) {
                pg[p] = requant29(pg[p], m0, shift);
            }
        }
    }
    return mp_const_none;
}
MP_DEFINE_CONST_FUN_OBJ_VAR_BETWEEN(int_clamp_bias_grad_obj, 3, 3, int_clamp_bias_grad);

// -- a convolution's geometry -----------------------------------------------------------------
// The outputs o in [*o0, *o1) whose tap lands inside the input: 0 <= o * s + off < size
static void tap_range(mp_int_t outs, mp_int_t size, mp_int_t s, mp_int_t off, mp_int_t *o0,
                      mp_int_t *o1) {
    // ceil(a / s) for any a, s >= 1
    mp_int_t a = -off, b = size - off;
    mp_int_t lo = s == 1 ? a : a <= 0 ? -((-a) / s) : (a + s - 1) / s;
    mp_int_t hi = s == 1 ? b : b <= 0 ? -((-b) / s) : (b + s - 1) / s;
    *o0 = lo < 0 ? 0 : lo > outs ? outs : lo;
    *o1 = hi > outs ? outs : hi < *o0 ? *o0 : hi;
}

// The geometry both kernels' ints hold, from m on (contract/ops.py INT_CONV_GRAD_INPUT)
typedef struct {
    mp_int_t m, groups, cin_g, cout_g, in_h, in_w, out_h, out_w, k_h, k_w, s_h, s_w, d_h,
             d_w, pad_t, pad_l;
} geo_t;

// -- a convolution's input gradient -------------------------------------------------------------
// (no-tree-loop-distribute-patterns: gcc would make the loop a memset call, which a dynamic
// native module cannot link)
__attribute__((optimize("no-tree-loop-distribute-patterns")))
static void zero(int32_t *x, mp_int_t n) {
    for (mp_int_t i = 0; i < n; i++) {
        x[i] = 0;
    }
}

// x[i * sx] += w * g[i], n terms
static void axpy(int32_t *x, mp_int_t sx, const int32_t *g, mp_int_t n, int32_t w) {
    mp_int_t i = 0;
    if (sx == 1) {
        for (; i + 4 <= n; i += 4) {
            x[i] += w * g[i];
            x[i + 1] += w * g[i + 1];
            x[i + 2] += w * g[i + 2];
            x[i + 3] += w * g[i + 3];
        }
    }
    for (; i < n; i++) {
        x[i * sx] += w * g[i];
    }
}

// int_conv_grad_input(F, I, (Q, gx, g, w, m, groups, cin_g, cout_g, in_h, in_w, out_h,
// out_w, k_h, k_w, s_h, s_w, d_h, d_w, pad_t, pad_l, W)). Each element of G_x the exact sum
// of its terms (the scatter's, in another order): below FULL_TERMS terms of |G| * 128 each
static mp_obj_t int_conv_grad_input(size_t n_args, const mp_obj_t *in) {
    mp_int_t f[19];
    mp_obj_t *a;
    int32_t *I = int_fields(in, 1, 19, 21, f, &a);
    const uint8_t *W = bytes_of(a[20], MP_BUFFER_READ);     // the weight's buffer (in place, or Q)
    const mp_int_t gx = f[0], g = f[1], w = f[2];
    const geo_t q = *(const geo_t *)(f + 3);
    const mp_int_t taps = q.k_h * q.k_w, terms = q.cout_g * taps, channels = q.groups * q.cout_g;
    const mp_int_t in_plane = q.in_h * q.in_w, out_plane = q.out_h * q.out_w;
    const mp_int_t count = q.m * q.groups * q.cin_g * in_plane;
    if (terms >= FULL_TERMS || I[g] <= -(1 << 30) || I[g] >= (1 << 30)
        || (int64_t)largest(I, g + 1, q.m * channels * out_plane) * 128 * terms
           >= ((int64_t)1 << 31)) {
        return pure_kernel(MP_QSTR_int_conv_grad_input, in);
    }
    int32_t *X = I + gx + 1;
    zero(X, count);
    for (mp_int_t ky = 0; ky < q.k_h; ky++) {
        mp_int_t oy0, oy1, offy = ky * q.d_h - q.pad_t;
        tap_range(q.out_h, q.in_h, q.s_h, offy, &oy0, &oy1);
        for (mp_int_t kx = 0; kx < q.k_w; kx++) {
            mp_int_t ox0, ox1, offx = kx * q.d_w - q.pad_l;
            tap_range(q.out_w, q.in_w, q.s_w, offx, &ox0, &ox1);
            if (oy0 >= oy1 || ox0 >= ox1) {
                continue;
            }
            // whole rows on both sides, one after the other: one run over them
            bool flat = q.s_h == 1 && q.s_w == 1 && ox0 == 0 && ox1 == q.out_w
                        && q.in_w == q.out_w;
            for (mp_int_t n = 0; n < q.m; n++) {
                mp_int_t mo = 0;
                for (mp_int_t grp = 0; grp < q.groups; grp++) {
                    int32_t *xg = X + (n * q.groups + grp) * q.cin_g * in_plane;
                    for (mp_int_t j = 0; j < q.cout_g; j++, mo++) {
                        const int32_t *gp = I + g + 1 + (n * channels + mo) * out_plane;
                        const uint8_t *wm = W + w + mo * q.cin_g * taps + ky * q.k_w + kx;
                        for (mp_int_t c = 0; c < q.cin_g; c++) {
                            int32_t wv = (int8_t)wm[c * taps];
                            if (wv == 0) {
                                continue;
                            }
                            int32_t *xc = xg + c * in_plane;
                            if (flat) {
                                axpy(xc + (oy0 + offy) * q.in_w, 1, gp + oy0 * q.out_w,
                                     (oy1 - oy0) * q.out_w, wv);
                                continue;
                            }
                            for (mp_int_t oy = oy0; oy < oy1; oy++) {
                                axpy(xc + (oy * q.s_h + offy) * q.in_w + ox0 * q.s_w + offx,
                                     q.s_w, gp + oy * q.out_w + ox0, ox1 - ox0, wv);
                            }
                        }
                    }
                }
            }
        }
    }
    int32_t top = I[g];
    I[gx] = top + normalize(I, gx, count);
    return mp_const_none;
}
MP_DEFINE_CONST_FUN_OBJ_VAR_BETWEEN(int_conv_grad_input_obj, 3, 3, int_conv_grad_input);

// -- a convolution's weight update ------------------------------------------------------------
// One weight's running sum (_weight_sum): its folded total, the open chunk's sum (exact in
// wrapping 32-bit arithmetic: the chunk's true sum is below 2**31) and its positions so far
typedef struct {
    int64_t total;
    uint32_t part;
    mp_int_t done;
} wsum_t;

// sum of g[i] * ((x[i * sx] ^ flip) - zpf), i < n, as sum g * (x ^ flip) - zpf * sum g
static uint32_t dot(const int32_t *g, const uint8_t *x, mp_int_t sx, mp_int_t n,
                    uint32_t flip, int32_t zpf) {
    uint32_t sgx = 0, sg = 0;
    mp_int_t i = 0;
    if (sx == 1) {
        for (; i + 4 <= n; i += 4) {
            sg += (uint32_t)(g[i] + g[i + 1] + g[i + 2] + g[i + 3]);
            sgx += (uint32_t)g[i] * (x[i] ^ flip) + (uint32_t)g[i + 1] * (x[i + 1] ^ flip)
                   + (uint32_t)g[i + 2] * (x[i + 2] ^ flip)
                   + (uint32_t)g[i + 3] * (x[i + 3] ^ flip);
        }
    }
    for (; i < n; i++) {
        sg += (uint32_t)g[i];
        sgx += (uint32_t)g[i] * (x[i * sx] ^ flip);
    }
    return sgx - (uint32_t)zpf * sg;
}

// n positions of the weight's sum (each counted towards the chunks of MAX_SUM, as the pure
// kernel counts every output of a row inside the image), those in [a0, a1) summed: g at
// position 0, x its input byte's offset in Q (ix steps sx)
static void run(wsum_t *s, const int32_t *g, const uint8_t *Q, mp_int_t x, mp_int_t sx,
                mp_int_t n, mp_int_t a0, mp_int_t a1, uint32_t flip, int32_t zpf) {
    for (mp_int_t i = 0; i < n;) {
        mp_int_t seg = MAX_SUM - s->done < n - i ? MAX_SUM - s->done : n - i;
        mp_int_t lo = i > a0 ? i : a0, hi = i + seg < a1 ? i + seg : a1;
        if (lo < hi) {
            s->part += dot(g + lo, Q + (x + lo * sx), sx, hi - lo, flip, zpf);
        }
        i += seg;
        s->done += seg;
        if (s->done == MAX_SUM) {
            s->total = fold_sum(s->total, (int32_t)s->part);
            s->part = 0;
            s->done = 0;
        }
    }
}

// int_conv_update(F, I, (Q, w, x, g, rates, random, m, groups, cin_g, cout_g, in_h, in_w,
// out_h, out_w, k_h, k_w, s_h, s_w, d_h, d_w, pad_t, pad_l, x_signed))
static mp_obj_t int_conv_update(size_t n_args, const mp_obj_t *in) {
    mp_int_t f[22];
    mp_obj_t *a;
    int32_t *I = int_fields(in, 1, 22, 23, f, &a);
    uint8_t *Q = bytes_of(a[0], MP_BUFFER_WRITE);
    const mp_int_t w = f[0], x = f[1], g = f[2], rates = f[3], random = f[4];
    const geo_t q = *(const geo_t *)(f + 5);
    const uint32_t flip = f[21] ? 0x80 : 0;
    const mp_int_t channels = q.groups * q.cout_g;
    const mp_int_t in_plane = q.in_h * q.in_w, out_plane = q.out_h * q.out_w;
    const int32_t zpf = I[rates] + (int32_t)flip;   // (b ^ flip) - zpf: the input less x_zp
    int64_t dx = zpf < 0 ? 255 - (int64_t)zpf : (zpf > 255 - zpf ? zpf : 255 - zpf);
    // the domain: a chunk's MAX_SUM products summed exactly in 32 bits; multipliers in range
    if ((int64_t)largest(I, g + 1, q.m * channels * out_plane) * (dx > 1 ? dx : 1) * MAX_SUM
        >= ((int64_t)1 << 31) || !rates_inside(I, rates + 1, channels, 2)) {
        return pure_kernel(MP_QSTR_int_conv_update, in);
    }
    const int64_t e = I[g];
    mp_int_t mo = 0;
    for (mp_int_t grp = 0; grp < q.groups; grp++) {
        for (mp_int_t j = 0; j < q.cout_g; j++, mo++) {
            const int32_t m0 = I[rates + 1 + 2 * mo], shift = I[rates + 2 + 2 * mo];
            for (mp_int_t c = 0; c < q.cin_g; c++) {
                for (mp_int_t ky = 0; ky < q.k_h; ky++) {
                    mp_int_t oy0, oy1, offy = ky * q.d_h - q.pad_t;
                    tap_range(q.out_h, q.in_h, q.s_h, offy, &oy0, &oy1);
                    for (mp_int_t kx = 0; kx < q.k_w; kx++) {
                        mp_int_t ox0, ox1, offx = kx * q.d_w - q.pad_l;
                        tap_range(q.out_w, q.in_w, q.s_w, offx, &ox0, &ox1);
                        bool flat = q.s_h == 1 && q.s_w == 1 && ox0 == 0 && ox1 == q.out_w
                                    && q.in_w == q.out_w;
                        wsum_t s = {0, 0, 0};
                        for (mp_int_t n = 0; n < q.m; n++) {
                            const int32_t *gp = I + g + 1 + (n * channels + mo) * out_plane;
                            mp_int_t px = x + ((n * q.groups + grp) * q.cin_g + c) * in_plane;
                            if (flat) {
                                mp_int_t len = (oy1 - oy0) * q.out_w;
                                run(&s, gp + oy0 * q.out_w, Q, px + (oy0 + offy) * q.in_w, 1,
                                    len, 0, len, flip, zpf);
                                continue;
                            }
                            for (mp_int_t oy = oy0; oy < oy1; oy++) {
                                run(&s, gp + oy * q.out_w, Q,
                                    px + (oy * q.s_h + offy) * q.in_w + offx, q.s_w,
                                    q.out_w, ox0, ox1, flip, zpf);
                            }
                        }
                        int64_t total = fold_sum(s.total, (int32_t)s.part);
                        uint8_t *pw = Q + w + ((mo * q.cin_g + c) * q.k_h + ky) * q.k_w + kx;
                        int32_t v = (int8_t)*pw - gstep(I, total >> 5, m0, shift,
                                                        e + (total & 31), random);
                        *pw = (uint8_t)(v > 127 ? 127 : v < -127 ? -127 : v);
                    }
                }
            }
        }
    }
    return mp_const_none;
}
MP_DEFINE_CONST_FUN_OBJ_VAR_BETWEEN(int_conv_update_obj, 3, 3, int_conv_update);
