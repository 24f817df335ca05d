// qlinear_conv of the module qlinear_native.c starts (see there and qlinear_native.h).
#include "qlinear_native.h"

// qlinear_conv(F, I, args): kernels/qlinear.py's qlinear_conv, the same bytes. Per image and
// output channel, an int32 plane of accumulators (the step's scratch tensor in I, which the
// checker sizes out_h * out_w) starts at the bias; every (input channel, tap) with a nonzero
// weight adds (x - x_zp) * w over the rectangle of outputs whose tap lies inside the image
// (kernels/conv.py's clipping: padding reads nothing), as x * w - x_zp * w; then the plane
// is requantized. Integers are exact in any order, so the order differs from the pure
// kernel's and the bytes do not. Pointwise and 3x3 depthwise Convs take paths of their own,
// Convs with four or more output channels per group the im2col path (qconv_patches.c) or,
// on ARM, the direct one (qconv_direct.c); on ARM the hot loops are hand-written Thumb
// (qlinear_thumb.S, qconv_direct_thumb.S; armv7m: some thumb2.S's).
// (conv_t, the call's geometry: qlinear_native.h)

// the outputs o in [lo, hi) along one axis whose input o * s + off lies in [0, size)
static void tap_range(mp_int_t off, mp_int_t s, mp_int_t size, mp_int_t out, mp_int_t *lo,
                      mp_int_t *hi) {
    *lo = off < 0 ? (-off + s - 1) / s : 0;
    *hi = off > size - 1 ? 0 : (size - 1 - off) / s + 1;
    if (*hi > out) {
        *hi = out;
    }
}

// The rectangle one (tap, input channel) adds to the accumulator plane: rows x cols
// outputs, out_w the plane's row, in_step the input's row step (s_h * in_w), sx the input's
// stride along x
typedef struct {
    mp_int_t rows, cols, out_w, in_step, sx;
} rect_t;

// acc += (x - x_zp) * w over a rectangle, as x * w - x_zp * w (zw); flip 0x80: int8 inputs.
// Functions of their own, one per input kind and for unit strides along x (flip and sx
// constants there), so that gcc keeps the row loop's pointers, weight and zw in registers:
// with them as variables it reloaded three of them from the stack per multiply-accumulate.
static inline __attribute__((always_inline)) void conv_rect(int32_t *pa, const uint8_t *px,
                                                            const rect_t *r, int32_t wv,
                                                            int32_t zw, uint32_t flip,
                                                            mp_int_t sx) {
    const mp_int_t cols = r->cols, out_w = r->out_w, in_step = r->in_step;
    for (mp_int_t row = r->rows; row > 0; row--) {
        int32_t *a = pa, *end = pa + cols;
        const uint8_t *x = px;
        while (a != end) {
            *a++ += (int32_t)(*x ^ flip) * wv - zw;
            x += sx;
        }
        pa += out_w;
        px += in_step;
    }
}

#ifdef MT_THUMB_KERNELS
void mt_conv_rect_u8(int32_t *pa, const uint8_t *px, const int32_t *p);
void mt_conv_rect_s8(int32_t *pa, const uint8_t *px, const int32_t *p);
#endif

#define CONV_RECT(name, flip, sx) \
    __attribute__((noinline)) static void name(int32_t *pa, const uint8_t *px, const rect_t *r, \
                                               int32_t wv, int32_t zw) { \
        conv_rect(pa, px, r, wv, zw, flip, sx); \
    }
#ifndef MT_THUMB_KERNELS
CONV_RECT(conv_rect_u8_unit, 0, 1)
CONV_RECT(conv_rect_s8_unit, 0x80, 1)
#endif
CONV_RECT(conv_rect_u8, 0, r->sx)
CONV_RECT(conv_rect_s8, 0x80, r->sx)

#define AXIS_MAX 12             // kernel sizes whose tap ranges qlinear_conv caches

// A pointwise Conv (1x1, stride 1, no padding): output channel mo's plane is
// sum over ci of (x[ci, p] - x_zp) * w[ci], computed as sum x * w + (bias - x_zp * sum w),
// four pixels at once (each weight loaded once for four inputs; on ARM qlinear_thumb.S's
// loop), each sum requantized as it is done: no accumulator plane.
#ifdef MT_THUMB_KERNELS
void mt_pw4_u8(const uint8_t *px, const uint8_t *pw, const int32_t *p, int32_t *acc);
void mt_pw4_s8(const uint8_t *px, const uint8_t *pw, const int32_t *p, int32_t *acc);
void mt_pw8_u8(const uint8_t *px, const uint8_t *pw, const int32_t *p, int32_t *acc);
void mt_pw8_s8(const uint8_t *px, const uint8_t *pw, const int32_t *p, int32_t *acc);
#else
static void pw4(const uint8_t *px, const uint8_t *pw, mp_int_t cin, mp_int_t step,
                uint32_t flip, int32_t *acc) {
    int32_t a0 = 0, a1 = 0, a2 = 0, a3 = 0;
    for (const uint8_t *pe = pw + cin; pw != pe; pw++) {
        int32_t wv = (int8_t)*pw;
        a0 += (int32_t)(px[0] ^ flip) * wv;
        a1 += (int32_t)(px[1] ^ flip) * wv;
        a2 += (int32_t)(px[2] ^ flip) * wv;
        a3 += (int32_t)(px[3] ^ flip) * wv;
        px += step;
    }
    acc[0] = a0;
    acc[1] = a1;
    acc[2] = a2;
    acc[3] = a3;
}
#endif

__attribute__((noinline)) static void conv_pointwise(const uint8_t *x, const uint8_t *w,
                                                     mp_int_t cin, mp_int_t plane, int32_t bias,
                                                     uint32_t flip, int32_t zpf,
                                                     const rq_t *rq, uint8_t *out) {
    int32_t sum_w = 0;
    for (mp_int_t ci = 0; ci < cin; ci++) {
        sum_w += (int8_t)w[ci];
    }
#ifdef MT_THUMB_KERNELS
    // the loop reads sign-extended int8 inputs: x_zp itself
    const uint32_t base = (uint32_t)bias - (uint32_t)((zpf - (int32_t)flip) * sum_w);
    const int32_t p[2] = {cin, plane};
#else
    // (b ^ flip) - zpf: the input's value for either kind
    const uint32_t base = (uint32_t)bias - (uint32_t)(zpf * sum_w);
#endif
    mp_int_t px = 0;
    int32_t acc[CHUNK];
    while (px + 4 <= plane) {
        mp_int_t n = 0;
        for (; n < CHUNK && px + 4 <= plane; n += 4, px += 4) {
#ifdef MT_THUMB_KERNELS
            if (px + 8 <= plane) {
                (flip ? mt_pw8_s8 : mt_pw8_u8)(x + px, w, p, acc + n);
                n += 4;
                px += 4;
                continue;
            }
            (flip ? mt_pw4_s8 : mt_pw4_u8)(x + px, w, p, acc + n);
#else
            pw4(x + px, w, cin, plane, flip, acc + n);
#endif
        }
        rq_run(rq, acc, base, n, out + px - n);
    }
    for (; px < plane; px++) {
        int32_t a = bias;
        const uint8_t *pin = x + px;
        for (mp_int_t ci = 0; ci < cin; ci++) {
            a += ((int32_t)(*pin ^ flip) - zpf) * (int8_t)w[ci];
            pin += plane;
        }
        rq_run(rq, &a, 0, 1, out + px);
    }
}

// A depthwise-like Conv with 3x3 taps (one input and one output channel per group, the KWS
// DS-CNN's and MobileNet's depthwise layers), unit dilation along x: per channel, a band of
// output rows at a time, the input rows they read copied once with their padding (on the
// stack, as bytes u = x + c: c 0 for uint8 inputs, 128 for int8 ones (b ^ 0x80), padding
// x_zp + c), then each output the nine products straight from three row pointers, no
// bounds checks, requantized in chunks. Exact, as conv_patches:
//   sum over inside taps of (x - x_zp) * w = sum over the 9 of u * w - (x_zp + c) * sum w.
// The rectangles' path took ~19.5 instructions per MAC here (a 25x5 plane: rows of 4-5).
// copy_rows: `count` rows of n >= 1 bytes b ^ flip, src_pitch and dst_pitch bytes apart
// (Thumb: qlinear_thumb.S's mt_copy_rows, 5 instructions a byte; gcc's loop took 8,
// reloading flip from the stack)
#ifdef MT_THUMB_KERNELS
void mt_copy_rows(uint8_t *dst, const uint8_t *src, const int32_t *geo);
#endif
static void copy_rows(uint8_t *dst, const uint8_t *src, mp_int_t n, mp_int_t count,
                      mp_int_t src_pitch, mp_int_t dst_pitch, uint32_t flip) {
#ifdef MT_THUMB_KERNELS
    const int32_t geo[5] = {n, count, src_pitch, dst_pitch, (int32_t)flip};
    mt_copy_rows(dst, src, geo);
#else
    for (; count > 0; count--, src += src_pitch, dst += dst_pitch) {
        for (mp_int_t i = 0; i < n; i++) {
            dst[i] = (uint8_t)(src[i] ^ flip);
        }
    }
#endif
}

#define DW_CHUNK 128            // sums per requantization (a KWS plane's 125 at once)
#ifdef MT_THUMB_KERNELS
#define DW_RS 14                // the row loop's padded rows: its taps at offsets 0 .. 30
void mt_dw3_s1(const uint8_t *p, int32_t *acc, const int32_t *geo, const int32_t *w);
void mt_dw3_s2(const uint8_t *p, int32_t *acc, const int32_t *geo, const int32_t *w);
#endif
#ifdef MT_THUMB2
// The armv7m build's depthwise 3x3 Conv with "same" padding and stride 1 (the KWS DS-CNN's,
// MobileNet's): two output rows at a time, one SMLAL a tap for both (qlinear_thumb2.S's
// mt_dw3p8 / mt_dw3p16: 15 instructions an output, the MLA row loop's 22). P holds each
// padded row's input values s (the bytes as the Conv reads them, signed or not; the
// padding x_zp) with the next row's in bits 20 and up: P[pr][pc] = s[pr][pc] +
// (s[pr + 1][pc] << 20), each channel's inside columns written by mt_dw3p_fill (6
// instructions an entry), the padding columns and the row below the last the same for all.
// The sums are conv_dw3x3's less (x_zp + c) * sum w: requantized from bias - x_zp * sum w.
// Planes up to 14 wide whose P fits DWP_WORDS; else (false) conv_dw3x3.
#define DWP_WORDS 256
void mt_dw3p8(const uint32_t *P, int32_t *acc, const int32_t *geo, const int32_t *w);
void mt_dw3p16(const uint32_t *P, int32_t *acc, const int32_t *geo, const int32_t *w);
void mt_dw3p_fill(uint32_t *P, const uint8_t *x, const int32_t *geo);
__attribute__((noinline)) static bool dw3_pairs(const conv_t *c, uint8_t *q, const int32_t *r,
                                                const uint8_t *wbuf, uint32_t flip) {
    const mp_int_t h = c->out_h, w = c->out_w;
    if (c->s_h != 1 || c->s_w != 1 || c->d_h != 1 || c->pad_t != 1 || c->pad_l != 1 ||
        c->in_h != h || c->in_w != w || w > 14) {
        return false;
    }
    const mp_int_t rs = w <= 6 ? 8 : 16;    // P's row: the padded row's w + 2 words
    if ((h + 2) * rs > DWP_WORDS) {
        return false;
    }
    uint32_t P[DWP_WORDS];
    int32_t acc[DW_CHUNK];      // a chunk's rows (an odd count's pair ends below: kmax even)
    const int32_t zp = r[c->req];
    const uint32_t pad2 = (uint32_t)zp + ((uint32_t)zp << 20);
    for (mp_int_t pr = 0; pr < h + 2; pr++) {
        P[pr * rs] = pad2;
        P[pr * rs + w + 1] = pad2;
    }
    for (mp_int_t pc = 1; pc <= w; pc++) {
        P[(h + 1) * rs + pc] = pad2;        // (its second row, below the image, unused)
    }
    const int32_t fill[5] = {w, h, 4 * (rs - w), flip != 0, zp};
    const mp_int_t kmax = (DW_CHUNK / w) & ~1;     // rows a chunk of sums holds, in pairs
    for (mp_int_t ch = 0, mo = 0; ch < c->n_images * c->groups; ch++, mo++) {
        if (mo == c->groups) {
            mo = 0;                         // (ch % groups, counted)
        }
        const uint8_t *wt = wbuf + c->w + mo * 9;
        int32_t wv[9], sum_w = 0;
        for (mp_int_t t = 0; t < 9; t++) {
            wv[t] = (int8_t)wt[t];
            sum_w += wv[t];
        }
        rq_t rq;
        const uint32_t base = conv_channel_rq(&rq, c, r, mo, zp * sum_w);
        mt_dw3p_fill(P + 1, q + c->x + ch * h * w, fill);
        uint8_t *out = q + c->y + ch * h * w;
        for (mp_int_t oy = 0; oy < h; oy += kmax) {
            const mp_int_t k = h - oy < kmax ? h - oy : kmax;
            const int32_t geo[2] = {4 * w, (k + 1) / 2};
            (rs == 8 ? mt_dw3p8 : mt_dw3p16)(P + oy * rs, acc, geo, wv);
            rq_run(&rq, acc, base, k * w, out);
            out += k * w;
        }
    }
    return true;
}
#endif

__attribute__((noinline, optimize("no-tree-loop-distribute-patterns")))
static void conv_dw3x3(const conv_t *c, uint8_t *q, const int32_t *r, const uint8_t *wbuf,
                       uint32_t flip) {
    const mp_int_t in_h = c->in_h, in_w = c->in_w, out_h = c->out_h, out_w = c->out_w;
    const mp_int_t s_h = c->s_h, s_w = c->s_w, d_h = c->d_h, pad_t = c->pad_t,
                   pad_l = c->pad_l;
    const mp_int_t in_plane = in_h * in_w, out_plane = out_h * out_w;
    const mp_int_t wp = (out_w - 1) * s_w + 3;         // a padded row
#ifdef MT_THUMB_KERNELS
    // qlinear_thumb.S's row loop: rows DW_RS bytes apart, unit dilation along y
    const bool fast = wp <= DW_RS && d_h == 1 && s_w <= 2;
    const mp_int_t rs = fast ? DW_RS : wp;
#else
    const mp_int_t rs = wp;
#endif
    // output rows per band: (band - 1) * s_h + 2 * d_h + 1 padded rows fit the buffer
    const mp_int_t band = (PATCH_BYTES / rs - 2 * d_h - 1) / s_h + 1;
    uint8_t rows[PATCH_BYTES];
    int32_t acc[DW_CHUNK];
    const int32_t zp = r[c->req], cu = flip ? 128 : 0;
    const uint8_t zpb = (uint8_t)(zp + cu);
    // one band (all the padded rows fit): the padding lies at the same bytes for every
    // channel, filled once here; each channel copies its rows' inside only
    const bool once = band >= out_h;
    for (mp_int_t i = 0; once && i < ((out_h - 1) * s_h + 2 * d_h + 1) * rs; i++) {
        rows[i] = zpb;
    }
#ifdef MT_THUMB_KERNELS
    const mp_int_t kmax = fast ? DW_CHUNK / out_w : 0;     // rows of sums the chunk holds
#endif
    for (mp_int_t ch = 0; ch < c->n_images * c->groups; ch++) {
        const uint8_t *x = q + c->x + ch * in_plane;
        const mp_int_t mo = ch % c->groups;
        const uint8_t *w = wbuf + c->w + mo * 9;
        const int32_t w0 = (int8_t)w[0], w1 = (int8_t)w[1], w2 = (int8_t)w[2],
                      w3 = (int8_t)w[3], w4 = (int8_t)w[4], w5 = (int8_t)w[5],
                      w6 = (int8_t)w[6], w7 = (int8_t)w[7], w8 = (int8_t)w[8];
        const int32_t sum_w = w0 + w1 + w2 + w3 + w4 + w5 + w6 + w7 + w8;
#ifdef MT_THUMB_KERNELS
        const int32_t wv[9] = {w0, w1, w2, w3, w4, w5, w6, w7, w8};
#endif
        rq_t rq;
        const uint32_t base = conv_channel_rq(&rq, c, r, mo, (zp + cu) * sum_w);
        uint8_t *out = q + c->y + ch * out_plane;
        mp_int_t n = 0;                                 // sums in acc
#ifdef MT_THUMB_KERNELS
        mp_int_t kr = 0;                                // their rows (the row loop's)
#endif
        for (mp_int_t oy0 = 0; oy0 < out_h; oy0 += band) {
            const mp_int_t oy1 = oy0 + band < out_h ? oy0 + band : out_h;
            const mp_int_t prows = (oy1 - oy0 - 1) * s_h + 2 * d_h + 1;
            if (once) {
                // the one band: the plane's rows inside the image into their padded places,
                // in one call (a call per row cost ~115 instructions a row of five bytes)
                const mp_int_t m = wp - pad_l < in_w ? wp - pad_l : in_w;
                const mp_int_t inside = prows - pad_t < in_h ? prows - pad_t : in_h;
                if (m > 0) {
                    copy_rows(rows + pad_t * rs + pad_l, x, m, inside, in_w, rs, flip);
                }
            }
            for (mp_int_t pr = 0, iy = oy0 * s_h - pad_t; !once && pr < prows; pr++, iy++) {
                uint8_t *pp = rows + pr * rs;
                uint8_t *pe = pp + wp;
                if (iy < 0 || iy >= in_h) {
                    while (pp != pe) {
                        *pp++ = zpb;
                    }
                    continue;
                }
                const uint8_t *row = x + iy * in_w;
                mp_int_t ix = -pad_l;
                for (; ix < 0 && pp != pe; ix++) {
                    *pp++ = zpb;
                }
                mp_int_t m = in_w - ix < pe - pp ? in_w - ix : pe - pp;
                copy_rows(pp, row + ix, m, 1, 0, 0, flip);
                pp += m;
                while (pp != pe) {
                    *pp++ = zpb;
                }
            }
#ifdef MT_THUMB_KERNELS
            // as many rows per call as the chunk holds (out_w <= 12 < DW_CHUNK here; rows
            // counted in kr: no division, a libgcc call on armv6m)
            for (mp_int_t oy = oy0; fast && oy < oy1;) {
                mp_int_t k = kmax - kr;
                if (k == 0) {
                    kr = 0;
                    rq_run(&rq, acc, base, n, out);
                    out += n;
                    n = 0;
                    continue;
                }
                if (k > oy1 - oy) {
                    k = oy1 - oy;
                }
                const int32_t geo[3] = {out_w, k, s_h * rs - out_w * s_w};
                (s_w == 1 ? mt_dw3_s1 : mt_dw3_s2)(rows + (oy - oy0) * s_h * rs, acc + n, geo,
                                                   wv);
                n += k * out_w;
                kr += k;
                oy += k;
            }
            if (fast) {
                continue;
            }
#endif
            for (mp_int_t oy = oy0; oy < oy1; oy++) {
                const uint8_t *p0 = rows + (oy - oy0) * s_h * rs, *p1 = p0 + d_h * rs,
                              *p2 = p1 + d_h * rs;
                for (mp_int_t ox = 0; ox < out_w; ox++) {
                    acc[n++] = p0[0] * w0 + p0[1] * w1 + p0[2] * w2 + p1[0] * w3 + p1[1] * w4
                               + p1[2] * w5 + p2[0] * w6 + p2[1] * w7 + p2[2] * w8;
                    p0 += s_w;
                    p1 += s_w;
                    p2 += s_w;
                    if (n == DW_CHUNK) {
                        rq_run(&rq, acc, base, n, out);
                        out += n;
                        n = 0;
                    }
                }
            }
        }
        rq_run(&rq, acc, base, n, out);
    }
}

static mp_obj_t qlinear_conv(size_t n_args, const mp_obj_t *in) {
    mp_buffer_info_t b[3];
    conv_t c;
    unpack_args(in, 26, MP_ERROR_TEXT("qlinear_conv: 26 arguments expected"), true, b,
                &c.y);                                      // y .. x_signed; scratch in I
    uint8_t *q = b[0].buf;
    int32_t *r = b[1].buf;
    const uint8_t *wbuf = b[2].buf;
    const mp_int_t channels = c.groups * c.cout_g, taps = c.k_h * c.k_w;
    const mp_int_t in_plane = c.in_h * c.in_w, out_plane = c.out_h * c.out_w;
    // the domain of the int32 planes and of out_byte (see the top): else the pure kernel
    bool inside = c.cin_g * taps <= 21000 && r[c.req] >= -128 && r[c.req] <= 255 &&
                  r[c.req + 1] >= -128 && r[c.req + 1] <= 255;
    for (mp_int_t mo = 0; inside && mo < channels; mo++) {
        int32_t m0 = r[c.req + 4 + 2 * mo];
        int32_t b = c.bias >= 0 ? r[c.bias + mo] : 0;
        inside = m0 >= 0 && m0 <= M0_LIMIT && b > -(1 << 30) && b < (1 << 30);
    }
    if (!inside) {
        return pure_kernel(MP_QSTR_qlinear_conv, in);
    }
    const uint32_t flip = c.x_signed ? 0x80 : 0;
    const int32_t zpf = r[c.req] + (int32_t)flip;
    int32_t *plane = r + c.scratch;
    uint8_t *out = q + c.y;
    const bool pointwise = taps == 1 && c.s_h == 1 && c.s_w == 1 && c.pad_t == 0 &&
                           c.pad_l == 0 && c.out_h == c.in_h && c.out_w == c.in_w;
    const int32_t x_zp = r[c.req];
    if (!pointwise && c.cout_g >= 4 && c.cin_g * taps <= PATCH_BYTES / 8 &&
        (flip ? x_zp <= 127 : x_zp >= 0)) {     // x_zp - off a signed byte (conv_patches)
        mp_int_t done = 0;
#ifdef MT_THUMB_KERNELS
        done = conv_direct(&c, q, r, wbuf, flip);
#endif
        if (done < out_plane) {
            conv_patches(&c, q, r, wbuf, flip, done);
        }
        return mp_const_none;
    }
    if (c.cin_g == 1 && c.cout_g == 1 && c.k_h == 3 && c.k_w == 3 && c.d_w == 1 &&
        (c.out_w - 1) * c.s_w + 3 <= PATCH_BYTES / (2 * c.d_h + 1) &&
        (flip ? x_zp <= 127 : x_zp >= 0)) {     // x_zp + c a byte (conv_dw3x3)
#ifdef MT_THUMB2
        if (dw3_pairs(&c, q, r, wbuf, flip)) {  // (beside conv_dw3x3's frame, not on it)
            return mp_const_none;
        }
#endif
        conv_dw3x3(&c, q, r, wbuf, flip);
        return mp_const_none;
    }
    // each tap row's and column's range of outputs (tap_range's two divisions), once per call
    mp_int_t yr[2 * AXIS_MAX], xr[2 * AXIS_MAX];
    const bool cached = !pointwise && c.k_h <= AXIS_MAX && c.k_w <= AXIS_MAX;
    for (mp_int_t ky = 0; cached && ky < c.k_h; ky++) {
        tap_range(ky * c.d_h - c.pad_t, c.s_h, c.in_h, c.out_h, &yr[2 * ky], &yr[2 * ky + 1]);
    }
    for (mp_int_t kx = 0; cached && kx < c.k_w; kx++) {
        tap_range(kx * c.d_w - c.pad_l, c.s_w, c.in_w, c.out_w, &xr[2 * kx], &xr[2 * kx + 1]);
    }
    for (mp_int_t img = 0; img < c.n_images; img++) {
        const uint8_t *x_image = q + c.x + img * c.groups * c.cin_g * in_plane;
        for (mp_int_t mo = 0; mo < channels; mo++) {
            const uint8_t *x_g = x_image + (mo / c.cout_g) * c.cin_g * in_plane;
            const uint8_t *w_g = wbuf + c.w + mo * c.cin_g * taps;
            int32_t bias = c.bias >= 0 ? r[c.bias + mo] : 0;
            rq_t rq;
            rq_init(&rq, r + c.req, r[c.req + 4 + 2 * mo], r[c.req + 5 + 2 * mo]);
            if (pointwise) {
                conv_pointwise(x_g, w_g, c.cin_g, in_plane, bias, flip, zpf, &rq, out);
                out += out_plane;
                continue;
            }
            int32_t start = c.bias >= 0 ? r[c.bias + mo] : 0;
            for (mp_int_t p = 0; p < out_plane; p++) {
                plane[p] = start;
            }
            const uint8_t *x_group = x_image + (mo / c.cout_g) * c.cin_g * in_plane;
            const uint8_t *w_m = wbuf + c.w + mo * c.cin_g * taps;
            for (mp_int_t tap = 0, ky = 0, kx = 0; tap < taps; tap++, kx++) {
                if (kx == c.k_w) {
                    kx = 0;
                    ky++;
                }
                mp_int_t off_y = ky * c.d_h - c.pad_t, off_x = kx * c.d_w - c.pad_l;
                mp_int_t oy0, oy1, ox0, ox1;
                if (cached) {           // the axes' ranges, divided out once per call
                    oy0 = yr[2 * ky];
                    oy1 = yr[2 * ky + 1];
                    ox0 = xr[2 * kx];
                    ox1 = xr[2 * kx + 1];
                } else {
                    tap_range(off_y, c.s_h, c.in_h, c.out_h, &oy0, &oy1);
                    tap_range(off_x, c.s_w, c.in_w, c.out_w, &ox0, &ox1);
                }
                if (oy0 >= oy1 || ox0 >= ox1) {
                    continue;
                }
                rect_t rect = {oy1 - oy0, ox1 - ox0, c.out_w, c.s_h * c.in_w, c.s_w};
                if (rect.cols == c.out_w && rect.in_step == rect.cols * c.s_w) {
                    rect.cols *= rect.rows;     // whole rows back to back: one long row
                    rect.rows = 1;
                }
                for (mp_int_t ci = 0; ci < c.cin_g; ci++) {
                    int32_t wv = (int8_t)w_m[ci * taps + tap];
                    if (wv == 0) {
                        continue;
                    }
                    const uint8_t *px = x_group + ci * in_plane
                                        + (oy0 * c.s_h + off_y) * c.in_w + ox0 * c.s_w + off_x;
                    int32_t *pa = plane + oy0 * c.out_w + ox0;
                    int32_t zw = zpf * wv;
                    if (c.s_w == 1) {
#ifdef MT_THUMB_KERNELS
                        // qlinear_thumb.S's loop: int8 bytes sign-extended, so x_zp * w
                        int32_t p[6] = {rect.rows, rect.cols, 4 * (c.out_w - rect.cols),
                                        rect.in_step - rect.cols, wv, zw - (int32_t)flip * wv};
                        (flip ? mt_conv_rect_s8 : mt_conv_rect_u8)(pa, px, p);
#else
                        (flip ? conv_rect_s8_unit : conv_rect_u8_unit)(pa, px, &rect, wv, zw);
#endif
                    } else {
                        (flip ? conv_rect_s8 : conv_rect_u8)(pa, px, &rect, wv, zw);
                    }
                }
            }
            rq_run(&rq, plane, 0, out_plane, out);
            out += out_plane;
        }
    }
    return mp_const_none;
}
MP_DEFINE_CONST_FUN_OBJ_VAR_BETWEEN(qlinear_conv_obj, 3, 3, qlinear_conv);
