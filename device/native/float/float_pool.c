// Native forms of kernels/pool.py's max_pool and max_pool_grad, in the float_native module
// (float_native.c): pool.py's _max_windows walked as it walks (planes, output rows, output
// columns; each window's rows and columns inside the input clipped once), the same
// comparisons (v > best or v is a NaN: the first maximum in row-major order, a NaN wins),
// the same copies and sums (the gradient added with f32.h's addition), each element of F
// read and written in the pure kernel's sequence.
#include "float_native.h"

#pragma GCC optimize ("Os")

// The window's input rows (or columns) kept for output o along one axis: [*k0, k1) of the
// kernel's taps, pool.py's kh0 and kh1 (Python's floor division); false when none is inside
static bool window(mp_int_t o, mp_int_t s, mp_int_t pad, mp_int_t d, mp_int_t k,
                   mp_int_t size, mp_int_t *start, mp_int_t *k0, mp_int_t *k1) {
    mp_int_t h0 = o * s - pad;
    *start = h0;
    *k0 = h0 >= 0 ? 0 : (mp_int_t)mt_udiv((uint32_t)(d - 1 - h0), (uint32_t)d);
    mp_int_t t = size - h0 + d - 1;
    *k1 = t < 0 ? -1 : (mp_int_t)mt_udiv((uint32_t)t, (uint32_t)d);
    if (*k1 > k) {
        *k1 = k;
    }
    return *k1 > *k0;
}

// Float order on bits for the comparison v > best (neither a NaN): -0 and +0 equal
static inline int32_t order(uint32_t u) {
    int32_t m = (int32_t)(u & ~F32_SIGN);
    return u & F32_SIGN ? -m : m;
}

static inline bool is_nan(uint32_t u) {
    return (u & ~F32_SIGN) > 0x7f800000u;
}

// pool.py's _max_windows: v[0] out (Y, or dY), v[1] x, dx (< 0: the forward pass), then
// planes, H, W, OH, OW, kH, kW, sH, sW, pT, pL, dH, dW in g
static void max_windows(uint32_t *F, mp_int_t out, mp_int_t x, mp_int_t dx, const mp_int_t *g) {
    mp_int_t planes = g[0], H = g[1], W = g[2], OH = g[3], OW = g[4], kH = g[5], kW = g[6];
    mp_int_t sH = g[7], sW = g[8], pT = g[9], pL = g[10], dH = g[11], dW = g[12];
    mp_int_t o = out;
    for (mp_int_t p = 0; p < planes; p++) {
        mp_int_t base = x + p * H * W;
        for (mp_int_t oh = 0; oh < OH; oh++) {
            mp_int_t h0, kh0, kh1;
            window(oh, sH, pT, dH, kH, H, &h0, &kh0, &kh1);
            mp_int_t first_row = base + (h0 + kh0 * dH) * W;
            mp_int_t last_row = base + (h0 + kh1 * dH) * W, row_step = dH * W;
            for (mp_int_t ow = 0; ow < OW; ow++) {
                mp_int_t w0, kw0, kw1;
                window(ow, sW, pL, dW, kW, W, &w0, &kw0, &kw1);
                mp_int_t start = w0 + kw0 * dW, stop = w0 + kw1 * dW;
                mp_int_t arg = first_row + start;
                uint32_t best = F[arg];
                for (mp_int_t row = first_row; row < last_row; row += row_step) {
                    for (mp_int_t i = row + start; i < row + stop; i += dW) {
                        uint32_t v = F[i];
                        if (is_nan(v) || (!is_nan(best) && order(v) > order(best))) {
                            best = v;
                            arg = i;
                        }
                    }
                }
                if (dx < 0) {
                    F[o] = best;
                } else {
                    F[dx + arg - x] = f32_add(F[dx + arg - x], F[o]);
                }
                o++;
            }
        }
    }
}

// The call's arguments: `lead` offsets, then the 13 ints of the windows. False (the pure
// kernel takes the call) unless sizes, strides and dilations are in [1, 2**15], pads in
// [-2**15, 2**15], every window holds an input element (pool.py's checker's rule), and the
// planes of X (and dX: `with_dx`) and of the output lie in F
static bool pool_args(const mp_obj_t *in, size_t lead, mp_int_t *v, uint32_t **F,
                      mp_int_t *len) {
    if (!float_args(in, lead + 13, 0, v, NULL, F, len)) {
        return false;
    }
    const mp_int_t *g = v + lead;
    for (int i = 0; i < 13; i++) {
        bool pad = i == 9 || i == 10;
        if (pad ? g[i] < -32768 || g[i] > 32768 : g[i] < 1 || g[i] > 32768) {
            return false;
        }
    }
    mp_int_t start, k0, k1;
    for (mp_int_t o = 0; o < g[3]; o++) {
        if (!window(o, g[7], g[9], g[11], g[5], g[1], &start, &k0, &k1)) {
            return false;
        }
    }
    for (mp_int_t o = 0; o < g[4]; o++) {
        if (!window(o, g[8], g[10], g[12], g[6], g[2], &start, &k0, &k1)) {
            return false;
        }
    }
    const mp_int_t xs[5] = {g[0], g[1], g[2], 1, 1}, ys[5] = {g[0], g[3], g[4], 1, 1};
    int64_t x_size = mt_product(xs, *len), y_size = mt_product(ys, *len);
    // max_pool: y, x; max_pool_grad: dx, dy, x
    return lead == 2 ? mt_inside(v[0], y_size, *len) && mt_inside(v[1], x_size, *len)
           : mt_inside(v[0], x_size, *len) && mt_inside(v[1], y_size, *len)
           && mt_inside(v[2], x_size, *len);
}

// max_pool(F, I, args): y, x, then the windows; Y = each window's maximum
static mp_obj_t max_pool(size_t n_args, const mp_obj_t *in) {
    mp_int_t v[15], len;
    uint32_t *F;
    if (!pool_args(in, 2, v, &F, &len)) {
        return pure_kernel(MP_QSTR_max_pool, in);
    }
    max_windows(F, v[0], v[1], -1, v + 2);
    return mp_const_none;
}
MP_DEFINE_CONST_FUN_OBJ_VAR_BETWEEN(max_pool_obj, 3, 3, max_pool);

// max_pool_grad(F, I, args): dx, dy, x, then the windows; dX = 0, then each window's dY
// added at its argmax (recomputed from X)
static mp_obj_t max_pool_grad(size_t n_args, const mp_obj_t *in) {
    mp_int_t v[16], len;
    uint32_t *F;
    if (!pool_args(in, 3, v, &F, &len)) {
        return pure_kernel(MP_QSTR_max_pool_grad, in);
    }
    mp_int_t n = v[3] * v[4] * v[5];
    for (mp_int_t i = v[0]; i < v[0] + n; i++) {
        F[i] = 0;
    }
    max_windows(F, v[1], v[2], v[0], v + 3);
    return mp_const_none;
}
MP_DEFINE_CONST_FUN_OBJ_VAR_BETWEEN(max_pool_grad_obj, 3, 3, max_pool_grad);
