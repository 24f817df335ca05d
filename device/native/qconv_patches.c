// qlinear_conv's im2col path (qconv_native.c calls it; a file of its own for its size): see
// qlinear_native.h and device/native/README.md.
#include "qlinear_native.h"

// A Conv with several output channels per group (not pointwise; the KWS DS-CNN's first
// Conv: 1 -> 64 channels, 10x4 taps, stride 2; a general KxK Conv with K = cin_g * taps <= 96):
// the input patches of nb pixels gathered once (im2col, on the stack) as groups of eight
// pixels interleaved (patch[(g * K + t) * 8 + lane], t = ci * taps + ky * k_w + kx), then per
// output channel mt_t8 over each group (each weight loaded once for eight pixels; the
// weights' sum with them), requantized as a block. A byte is stored as u = x + c (c 128 for
// int8 inputs: b ^ 0x80, 0 for uint8), padding as x_zp + c, so that
//   sum over inside taps of (x - x_zp) * w = sum over all K of u * w - (x_zp + c) * sum w
// exactly (the padding's terms cancel): the same sums as the pure kernel's, so the same
// bytes. The gather (~5 instructions a byte inside the image, ~8 at its edges) is shared by
// the group's output channels. With one input channel, a group whose eight pixels all read
// padding for some rows of taps (the top and bottom output rows) sums only its rows
// [ky0, ky1) (a contiguous range of t there): its lanes then get (x_zp + c) * (sum w - the
// range's sum w) back, the base subtracting the whole sum (the KWS first Conv: 6 % of its
// terms). (no-tree-loop-distribute-patterns: gcc would turn the padding's fill loops into
// memset calls, which a dynamic native module cannot link)
#define PATCH_GROUPS (CHUNK / 8)
#define PATCH_K 96              // K = cin_g * taps at most (8 pixels of 96 bytes)
// One pixel's K patch bytes (8 apart, four a turn: K rounded up to four, the few bytes past
// K land in the next group's place, filled after them, or in the patch's slack) when all its
// taps lie inside the image: off[t] the tap's byte from the pixel's first (ci * in_plane +
// ky * d_h * in_w + kx * d_w). Functions of their own, one per input kind, so that gcc keeps
// their four pointers in registers (inlined in conv_patches it spilled them: ~24
// instructions a byte; here ~4).
#define GATHER(name, flip) \
    __attribute__((noinline)) static void name(uint8_t *pp, const uint8_t *px, \
                                               const int32_t *off, const int32_t *end) { \
        for (; off < end; off += 4, pp += 32) { \
            pp[0] = (uint8_t)(px[off[0]] ^ flip); \
            pp[8] = (uint8_t)(px[off[1]] ^ flip); \
            pp[16] = (uint8_t)(px[off[2]] ^ flip); \
            pp[24] = (uint8_t)(px[off[3]] ^ flip); \
        } \
    }
GATHER(gather_u8, 0)
GATHER(gather_s8, 0x80)
// A pixel at the image's edge: the taps inside, a rectangle of rows x n per input channel
// (pp and off at its first, g = [n, rows, channels, k_w, the taps from one channel's last
// row to the next's first]), and the padding around it
#define GATHER_RECT(name, flip) \
    __attribute__((noinline)) static void name(uint8_t *pp, const uint8_t *px, \
                                               const int32_t *off, const int32_t *g) { \
        const mp_int_t n = g[0], rows = g[1], k_w = g[3], skip = g[4]; \
        for (mp_int_t ch = g[2]; ch > 0; ch--, pp += 8 * skip, off += skip) { \
            for (mp_int_t r = rows; r > 0; r--, pp += 8 * k_w, off += k_w) { \
                for (mp_int_t i = 0; i < n; i++) { \
                    pp[8 * i] = (uint8_t)(px[off[i]] ^ flip); \
                } \
            } \
        } \
    }
GATHER_RECT(gather_rect_u8, 0)
GATHER_RECT(gather_rect_s8, 0x80)
__attribute__((noinline, optimize("no-tree-loop-distribute-patterns")))
static void fill8(uint8_t *pp, mp_int_t n, uint8_t b) {
    // four bytes a turn (stores at immediate offsets): n rounded up to four, the bytes past
    // n land where the gather's do (the next group's place, filled after, or the slack)
    for (uint8_t *pe = pp + 8 * n; pp < pe; pp += 32) {
        pp[0] = b;
        pp[8] = b;
        pp[16] = b;
        pp[24] = b;
    }
}
__attribute__((noinline, optimize("no-tree-loop-distribute-patterns")))
void conv_patches(const conv_t *c, uint8_t *q, const int32_t *r,
                                                   const uint8_t *wbuf, uint32_t flip,
                                                   mp_int_t first) {
    const mp_int_t taps = c->k_h * c->k_w, K = c->cin_g * taps;
    const mp_int_t in_plane = c->in_h * c->in_w, out_plane = c->out_h * c->out_w;
    mp_int_t nb = (PATCH_BYTES / K) & ~(mp_int_t)7;
    if (nb > CHUNK) {
        nb = CHUNK;
    }
    uint8_t patch[PATCH_BYTES + 32];            // + the gather's bytes past the last K
    int32_t acc[CHUNK + 1];                     // mt_t8's last call writes acc[n8]: sum w
    int32_t off[PATCH_K + 3];                   // each tap's byte from a pixel's first
    // per group: its first and last pixel's output row, then its rows of taps [ky0, ky1)
    mp_int_t g_oy[2 * PATCH_GROUPS], g_t[2 * PATCH_GROUPS];
    // the geometry in locals: the byte stores below may alias anything behind a pointer
    const mp_int_t cin_g = c->cin_g, in_h = c->in_h, in_w = c->in_w, out_w = c->out_w;
    const mp_int_t k_h = c->k_h, k_w = c->k_w, s_h = c->s_h, s_w = c->s_w, d_h = c->d_h,
                   d_w = c->d_w, pad_t = c->pad_t, pad_l = c->pad_l;
    const mp_int_t x_span = (k_w - 1) * d_w, y_span = (k_h - 1) * d_h;    // the taps' reach
    for (mp_int_t ci = 0, t = 0; ci < cin_g; ci++) {
        for (mp_int_t ky = 0; ky < k_h; ky++) {
            for (mp_int_t kx = 0; kx < k_w; kx++) {
                off[t++] = ci * in_plane + ky * d_h * in_w + kx * d_w;
            }
        }
    }
    off[K] = off[K + 1] = off[K + 2] = 0;       // the last turn's bytes past K: the first tap's
    const int32_t zp = r[c->req], cu = flip ? 128 : 0;
    const uint8_t zpb = (uint8_t)(zp + cu);
    for (mp_int_t ig = 0; ig < c->n_images * c->groups; ig++) {
        const uint8_t *x_group = q + c->x + ig * c->cin_g * in_plane;
        const mp_int_t mo0 = (ig % c->groups) * c->cout_g;
        uint8_t *out_group = q + c->y + ig * c->cout_g * out_plane;
        for (mp_int_t p0 = first; p0 < out_plane; p0 += nb) {
            const mp_int_t n = out_plane - p0 < nb ? out_plane - p0 : nb, n8 = (n + 7) & ~7;
            mp_int_t oy = p0 / out_w, ox = p0 - oy * out_w;
            for (mp_int_t i = 0; i < n8; i++) {
                uint8_t *pp = patch + (i >> 3) * 8 * K + (i & 7);
                if (i >= n) {                   // the last group's unused lanes
                    fill8(pp, K, zpb);
                    continue;
                }
                if ((i & 7) == 0) {
                    g_oy[2 * (i >> 3)] = oy;
                }
                g_oy[2 * (i >> 3) + 1] = oy;
                const mp_int_t iy0 = oy * s_h - pad_t, ix0 = ox * s_w - pad_l;
                if (ix0 >= 0 && ix0 + x_span < in_w && iy0 >= 0 && iy0 + y_span < in_h) {
                    (flip ? gather_s8 : gather_u8)(pp, x_group + iy0 * in_w + ix0, off, off + K);
                } else {
                    // at the image's edge: padding everywhere, then the taps inside
                    fill8(pp, K, zpb);
                    mp_int_t ky0 = 0, ky1 = k_h, kx0 = 0, kx1 = k_w;
                    while (ky0 < k_h && iy0 + ky0 * d_h < 0) {
                        ky0++;
                    }
                    while (ky1 > ky0 && iy0 + (ky1 - 1) * d_h >= in_h) {
                        ky1--;
                    }
                    while (kx0 < k_w && ix0 + kx0 * d_w < 0) {
                        kx0++;
                    }
                    while (kx1 > kx0 && ix0 + (kx1 - 1) * d_w >= in_w) {
                        kx1--;
                    }
                    if (kx1 > kx0 && ky1 > ky0) {
                        const mp_int_t t0 = ky0 * k_w + kx0;
                        const int32_t g[5] = {kx1 - kx0, ky1 - ky0, cin_g, k_w,
                                              (k_h - (ky1 - ky0)) * k_w};
                        (flip ? gather_rect_s8 : gather_rect_u8)(
                            pp + 8 * t0, x_group + iy0 * in_w + ix0, off + t0, g);
                    }
                }
                if (++ox == out_w) {
                    ox = 0;
                    oy++;
                }
            }
            // each group's rows of taps: those that some pixel of it reads inside the image
            // (one input channel: t = ky * k_w + kx, a row range is a range of t)
            bool partial = false;
            for (mp_int_t j = 0; j < n8; j += 8) {
                mp_int_t ky0 = 0, ky1 = k_h;
                if (cin_g == 1) {
                    const mp_int_t top = g_oy[j >> 2 | 1] * s_h - pad_t,
                                   bottom = g_oy[j >> 2] * s_h - pad_t;
                    while (ky0 < k_h && top + ky0 * d_h < 0) {
                        ky0++;
                    }
                    while (ky1 > ky0 && bottom + (ky1 - 1) * d_h >= in_h) {
                        ky1--;
                    }
                }
                g_t[j >> 2] = ky0 * k_w;
                g_t[j >> 2 | 1] = cin_g == 1 ? ky1 * k_w : K;
                partial |= ky0 > 0 || ky1 < k_h;
            }
            for (mp_int_t mo = mo0; mo < mo0 + c->cout_g; mo++) {
                const uint8_t *w_m = wbuf + c->w + mo * K;
                // the whole groups first: any of them gives sum w (acc[j + 8], until the
                // next call overwrites it)
                int32_t sum_w = 0;
                bool have_sum = false;
                for (mp_int_t j = 0; j < n8; j += 8) {
                    if (g_t[j >> 2] == 0 && g_t[j >> 2 | 1] == K) {
                        mt_t8(patch + j * K, w_m, (const int32_t[2]){K, 1}, acc + j);
                        sum_w = acc[j + 8];
                        have_sum = true;
                    }
                }
                for (mp_int_t t = 0; partial && !have_sum && t < K; t++) {
                    sum_w += (int8_t)w_m[t];
                }
                for (mp_int_t j = 0; partial && j < n8; j += 8) {
                    const mp_int_t t0 = g_t[j >> 2], t1 = g_t[j >> 2 | 1];
                    if (t0 == 0 && t1 == K) {
                        continue;
                    }
                    int32_t back;               // the group's lanes get zpc * (the rest's sum w)
                    if (t1 > t0) {
                        const int32_t next = acc[j + 8];    // a whole group's lane 0
                        mt_t8(patch + (j * K + 8 * t0), w_m + t0, (const int32_t[2]){t1 - t0, 1},
                              acc + j);
                        back = sum_w - acc[j + 8];
                        acc[j + 8] = next;
                    } else {
                        for (mp_int_t lane = 0; lane < 8; lane++) {
                            acc[j + lane] = 0;
                        }
                        back = sum_w;
                    }
                    back *= zp + cu;
                    for (mp_int_t lane = 0; lane < 8; lane++) {
                        acc[j + lane] += back;
                    }
                }
                rq_t rq;
                const uint32_t base = conv_channel_rq(&rq, c, r, mo, (zp + cu) * sum_w);
                rq_run(&rq, acc, base, n, out_group + (mo - mo0) * out_plane + p0);
            }
        }
    }
}
