// Native forms of kernels/conv.py's 2-D float Conv kernels (conv, conv_grad_input,
// conv_grad_weight; a 1-D Conv is a 2-D one with in_h = out_h = k_h = 1), in the
// float_native module (float_native.c). conv.py's _taps walked as it walks: the taps
// (ky, kx) outer, each tap's rectangle of outputs that read inside the image clipped once,
// then output channel, input channel, image and row, one multiply-accumulate per trip. Every
// element of F is read and written in the pure kernel's sequence, each product and sum
// rounded to float32 (f32.h; no fused multiply-add), so the bytes are the pure kernel's on
// the same board, whatever the tensors' overlap.
#include "float_native.h"

// the setup for size (machine code is heap on the board), the row loops for speed
#pragma GCC optimize ("Os")

#define FORWARD 0       // Y += w * X
#define GRAD_INPUT 1    // X += w * Y, Y holding dY
#define GRAD_WEIGHT 2   // w += sum(Y * X), w holding dW, Y holding dY

// The 2-D geometry (conv.py's 16 ints, in its order)
typedef struct {
    mp_int_t n_images, groups, cin_g, cout_g, in_h, in_w, out_h, out_w, k_h, k_w, s_h, s_w,
        d_h, d_w, pad_t, pad_l;
} conv_t;

// (float_native.h: mt_udiv, mt_inside, mt_product)
uint32_t mt_udiv(uint32_t n, uint32_t d) {
    uint32_t q = 0, r = 0;
    for (int i = 31; i >= 0; i--) {
        r = (r << 1) | ((n >> i) & 1);
        if (r >= d) {
            r -= d;
            q |= 1u << i;
        }
    }
    return q;
}

// The outputs o in [*lo, lo + returned count) along one axis whose input o * s + off lies
// in [0, size): conv.py's oy_lo and rows (ox_lo and count), with Python's floor division
static mp_int_t clip(mp_int_t off, mp_int_t s, mp_int_t size, mp_int_t out, mp_int_t *lo) {
    *lo = off >= 0 ? 0 : (mp_int_t)mt_udiv((uint32_t)(s - 1 - off), (uint32_t)s);
    mp_int_t t = size - 1 - off;
    if (t < 0) {
        return 0;       // floor(t / s) + 1 <= 0: nothing inside
    }
    mp_int_t hi = (mp_int_t)mt_udiv((uint32_t)t, (uint32_t)s) + 1;
    return (hi < out ? hi : out) - *lo;
}

// One (tap, output channel m, input channel c) over all images: conv.py's rows of the
// tap's rectangle (lines of count outputs, Y's rows out_w apart, X's x_row), py and px
// their first elements in the first image; returns s, the weight gradient's sum
typedef struct {
    mp_int_t lines, count, s_w, out_w, x_row, n_images, y_image, x_image;
} rect_t;

__attribute__((noinline, optimize("O2")))
static uint32_t tap_rows(uint32_t *F, int mode, mp_int_t py0, mp_int_t px0, uint32_t wv,
                         const rect_t *r) {
    uint32_t s = 0;
    mp_int_t s_w = r->s_w;
    for (mp_int_t n = 0; n < r->n_images; n++) {
        uint32_t *py = F + py0 + n * r->y_image, *px = F + px0 + n * r->x_image;
        for (mp_int_t line = 0; line < r->lines; line++) {
            uint32_t *a = py, *end = py + r->count, *b = px;
            if (mode == FORWARD) {
                for (; a < end; a++, b += s_w) {
                    *a = f32_muladd(*a, wv, *b);
                }
            } else if (mode == GRAD_INPUT) {
                for (; a < end; a++, b += s_w) {
                    *b = f32_muladd(*b, wv, *a);
                }
            } else {
                for (; a < end; a++, b += s_w) {
                    s = f32_muladd(s, *a, *b);
                }
            }
            py += r->out_w;
            px += r->x_row;
        }
    }
    return s;
}

// conv.py's _taps for one mode, its arguments checked (conv_args)
static void taps(uint32_t *F, int mode, mp_int_t y, mp_int_t x, mp_int_t w, const conv_t *g) {
    mp_int_t x_chan = g->in_h * g->in_w, y_chan = g->out_h * g->out_w;
    mp_int_t taps = g->k_h * g->k_w;
    rect_t r = {0, 0, g->s_w, g->out_w, g->s_h * g->in_w, g->n_images,
                g->groups * g->cout_g * y_chan, g->groups * g->cin_g * x_chan};
    for (mp_int_t ky = 0; ky < g->k_h; ky++) {
        mp_int_t off_y = ky * g->d_h - g->pad_t, oy_lo;
        mp_int_t rows = clip(off_y, g->s_h, g->in_h, g->out_h, &oy_lo);
        for (mp_int_t kx = 0; kx < g->k_w; kx++) {
            mp_int_t off_x = kx * g->d_w - g->pad_l, ox_lo;
            mp_int_t count = clip(off_x, g->s_w, g->in_w, g->out_w, &ox_lo);
            if (rows <= 0 || count <= 0) {
                continue;       // this tap only ever reads padding
            }
            r.lines = rows;
            r.count = count;
            if (count == g->out_w && r.x_row == count * g->s_w) {
                r.count = count * rows;     // full rows back to back in X and Y: one row
                r.lines = 1;
            }
            mp_int_t y_tap = y + oy_lo * g->out_w + ox_lo;
            mp_int_t x_tap = x + (oy_lo * g->s_h + off_y) * g->in_w + ox_lo * g->s_w + off_x;
            mp_int_t w_tap = w + ky * g->k_w + kx;
            // the output channels m in order, group by group (no division for m's group)
            mp_int_t m = 0;
            for (mp_int_t group = 0; group < g->groups; group++) {
                mp_int_t x_group = x_tap + group * g->cin_g * x_chan;
                for (mp_int_t mo = 0; mo < g->cout_g; mo++, m++) {
                    for (mp_int_t c = 0; c < g->cin_g; c++) {
                        mp_int_t at_w = w_tap + (m * g->cin_g + c) * taps;
                        // read before the rows, as conv.py does (unused by GRAD_WEIGHT)
                        uint32_t s = tap_rows(F, mode, y_tap + m * y_chan,
                                              x_group + c * x_chan, F[at_w], &r);
                        if (mode == GRAD_WEIGHT) {
                            F[at_w] = f32_add(F[at_w], s);  // summed in a local, stored once
                        }
                    }
                }
            }
        }
    }
}

bool mt_inside(mp_int_t off, int64_t n, mp_int_t len) {
    return off >= 0 && off + n <= len;
}

int64_t mt_product(const mp_int_t *f, mp_int_t len) {
    int64_t p = 1;
    for (int i = 0; i < 5 && p <= len; i++) {
        p *= f[i];
    }
    return p <= len ? p : (int64_t)len + 1;
}

// A call's arguments: `lead` offsets then the geometry, and F. False (the pure kernel
// takes the call) unless every size, stride and dilation is in [1, 2**15], every pad and
// (k - 1) * d in [-2**15, 2**15] and X, Y and W lie in F (x, y, w: indices into v of their
// offsets): then no index below overflows a word and every element _taps touches is in F.
static bool conv_args(const mp_obj_t *in, size_t lead, mp_int_t *v, conv_t *g, uint32_t **F,
                      mp_int_t *len, int x, int y, int w) {
    if (!float_args(in, lead + 16, 0, v, NULL, F, len)) {
        return false;
    }
    mp_int_t *q = v + lead;
    for (int i = 0; i < 16; i++) {
        if (i < 14 ? q[i] < 1 || q[i] > 32768 : q[i] < -32768 || q[i] > 32768) {
            return false;
        }
    }
    *g = (conv_t){q[0], q[1], q[2], q[3], q[4], q[5], q[6], q[7], q[8], q[9], q[10], q[11],
                  q[12], q[13], q[14], q[15]};
    if ((int64_t)(g->k_h - 1) * g->d_h > 32768 || (int64_t)(g->k_w - 1) * g->d_w > 32768) {
        return false;
    }
    const mp_int_t xs[5] = {g->n_images, g->groups, g->cin_g, g->in_h, g->in_w};
    const mp_int_t ys[5] = {g->n_images, g->groups, g->cout_g, g->out_h, g->out_w};
    const mp_int_t ws[5] = {g->groups, g->cout_g, g->cin_g, g->k_h, g->k_w};
    return mt_inside(v[x], mt_product(xs, *len), *len)
           && mt_inside(v[y], mt_product(ys, *len), *len)
           && mt_inside(v[w], mt_product(ws, *len), *len);
}

static void fill(uint32_t *F, mp_int_t start, mp_int_t n, uint32_t value) {
    for (mp_int_t i = start; i < start + n; i++) {
        F[i] = value;
    }
}

// conv(F, I, args): y, x, w, b, then the geometry; Y = Conv(X, W) + B (b < 0: no bias)
static mp_obj_t conv(size_t n_args, const mp_obj_t *in) {
    mp_int_t v[20], len;
    uint32_t *F;
    conv_t g;
    if (!conv_args(in, 4, v, &g, &F, &len, 1, 0, 2)
        || (v[3] >= 0 && !mt_inside(v[3], (int64_t)g.groups * g.cout_g, len))) {
        return pure_kernel(MP_QSTR_conv, in);
    }
    mp_int_t channels = g.groups * g.cout_g, plane = g.out_h * g.out_w, y = v[0], b = v[3];
    for (mp_int_t n = 0; n < g.n_images; n++) {     // conv.py's _fill_bias
        for (mp_int_t m = 0; m < channels; m++) {
            fill(F, y + (n * channels + m) * plane, plane, b >= 0 ? F[b + m] : 0);
        }
    }
    taps(F, FORWARD, y, v[1], v[2], &g);
    return mp_const_none;
}
MP_DEFINE_CONST_FUN_OBJ_VAR_BETWEEN(conv_obj, 3, 3, conv);

// conv_grad_input(F, I, args): dx, dy, w, then the geometry; dX = 0, then the taps
static mp_obj_t conv_grad_input(size_t n_args, const mp_obj_t *in) {
    mp_int_t v[19], len;
    uint32_t *F;
    conv_t g;
    if (!conv_args(in, 3, v, &g, &F, &len, 0, 1, 2)) {
        return pure_kernel(MP_QSTR_conv_grad_input, in);
    }
    fill(F, v[0], g.n_images * g.groups * g.cin_g * g.in_h * g.in_w, 0);
    taps(F, GRAD_INPUT, v[1], v[0], v[2], &g);
    return mp_const_none;
}
MP_DEFINE_CONST_FUN_OBJ_VAR_BETWEEN(conv_grad_input_obj, 3, 3, conv_grad_input);

// conv_grad_weight(F, I, args): dw, dy, x, reset, then the geometry; dW = 0 unless reset
// >= 0 and F[reset] is 0.0 (a lazy reset pending: the sums are added), then the taps
static mp_obj_t conv_grad_weight(size_t n_args, const mp_obj_t *in) {
    mp_int_t v[20], len;
    uint32_t *F;
    conv_t g;
    if (!conv_args(in, 4, v, &g, &F, &len, 2, 1, 0) || v[3] >= len) {
        return pure_kernel(MP_QSTR_conv_grad_weight, in);
    }
    if (v[3] < 0 || (F[v[3]] << 1) != 0) {      // != 0.0, a NaN included
        fill(F, v[0], g.groups * g.cout_g * g.cin_g * g.k_h * g.k_w, 0);
    }
    taps(F, GRAD_WEIGHT, v[1], v[2], v[0], &g);
    return mp_const_none;
}
MP_DEFINE_CONST_FUN_OBJ_VAR_BETWEEN(conv_grad_weight_obj, 3, 3, conv_grad_weight);
