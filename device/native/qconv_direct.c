// qlinear_conv's direct path (ARM builds; qconv_native.c calls it before the im2col path):
// a stride-1 Conv reads its inputs where they lie, in a padded copy of the input rows a
// chunk of output rows needs, with no gather. See device/native/README.md.
//
// Why: the im2col path (qconv_patches.c) gathers each pixel's K bytes (~6 instructions a
// byte, ~19 at the image's edge) before its eight-lane loop; with 8 output channels that
// gather is 1.4 of the 3x3 8 -> 8 Conv's 6.2 instructions per multiply-accumulate on
// armv6m. Here the lanes are eight outputs whose inputs lie at fixed distances in the
// band: eight consecutive outputs of a row (mt_d8x1: out_w a multiple of eight) or a block
// of four columns by two rows (mt_d4x2: out_w a multiple of four, out_h even, the band's
// rows 16 bytes apart so that the lower row's lanes are immediate offsets). Each term of
// the loop is one (offset, weight) pair of a table: the lanes read band[base + offset +
// lane's distance]. The band holds u = x + c (c 128 for int8 inputs: b ^ 0x80, 0 for uint8)
// and padding as x_zp + c, so that
//   sum over inside taps of (x - x_zp) * w = sum over all K of u * w - (x_zp + c) * sum w
// exactly, as in conv_patches: the same sums as the pure kernel's, so the same bytes.
#include "qlinear_native.h"

#ifdef MT_THUMB_KERNELS
#define BAND_BYTES 768          // the chunk's padded input rows (every input channel)
#define TABLE_K 72              // K = cin_g * taps at most (the table is 8 bytes a term)
#define CHUNK_OUTPUTS 48        // a chunk's outputs, summed before they are requantized
#define PITCH_4X2 16            // mt_d4x2's band rows: its lanes 4-7 read 16 bytes further

// The eight-lane loops (qconv_direct_thumb.S): acc for `groups` groups along a band row,
// p = [the table's end, groups, the byte distance from acc to lanes 4-7's sums]
void mt_d8x1(const uint8_t *x, const int32_t *table, const int32_t *p, int32_t *acc);
void mt_d4x2(const uint8_t *x, const int32_t *table, const int32_t *p, int32_t *acc);

// One band row: q bytes, pad outside the columns [lo, hi), the input row's bytes (flipped)
// inside. (no-tree-loop-distribute-patterns: gcc would call memset, which a dynamic native
// module cannot link)
__attribute__((noinline, optimize("no-tree-loop-distribute-patterns")))
static void band_row(uint8_t *d, const uint8_t *s, mp_int_t q, mp_int_t lo, mp_int_t hi,
                     uint8_t pad, uint32_t flip) {
    mp_int_t i = 0;
    for (; i < lo; i++) {
        d[i] = pad;
    }
    for (; i < hi; i++) {
        d[i] = (uint8_t)(s[i - lo] ^ flip);
    }
    for (; i < q; i++) {
        d[i] = pad;
    }
}

bool conv_direct(const conv_t *c, uint8_t *q, const int32_t *r, const uint8_t *wbuf,
                 uint32_t flip) {
    const mp_int_t taps = c->k_h * c->k_w, K = c->cin_g * taps, cin_g = c->cin_g;
    const mp_int_t in_h = c->in_h, in_w = c->in_w, out_h = c->out_h, out_w = c->out_w;
    if (c->s_h != 1 || c->s_w != 1 || c->d_h != 1 || c->d_w != 1 || K > TABLE_K) {
        return false;
    }
    const mp_int_t span = out_w + c->k_w - 1;   // the columns a row of outputs reads
    const bool by8 = out_w % 8 == 0;
    if (!by8 && (out_w % 4 != 0 || out_h % 2 != 0 || span > PITCH_4X2)) {
        return false;
    }
    const mp_int_t pitch = by8 ? span : PITCH_4X2, rows_step = by8 ? 1 : 2;
    // the most output rows a chunk takes: its band (those rows and k_h - 1 more, every
    // input channel) and its sums on the stack
    mp_int_t rows = 0;
    while (rows < out_h && (rows + rows_step + c->k_h - 1) * pitch * cin_g <= BAND_BYTES &&
           (rows + rows_step) * out_w <= CHUNK_OUTPUTS) {
        rows += rows_step;
    }
    if (rows == 0) {
        return false;
    }
    const mp_int_t band_rows = rows + c->k_h - 1, plane = band_rows * pitch;
    uint8_t band[BAND_BYTES];
    int32_t acc[CHUNK_OUTPUTS];
    // (offset, weight) per term, four terms a turn: K rounded up with (0, 0) pairs
    int32_t table[2 * TABLE_K];
    const mp_int_t K4 = (K + 3) & ~(mp_int_t)3;
    for (mp_int_t ci = 0, t = 0; ci < cin_g; ci++) {
        for (mp_int_t ky = 0; ky < c->k_h; ky++) {
            for (mp_int_t kx = 0; kx < c->k_w; kx++, t++) {
                table[2 * t] = ci * plane + ky * pitch + kx;
            }
        }
    }
    for (mp_int_t t = K; t < K4; t++) {
        table[2 * t] = table[2 * t + 1] = 0;
    }
    const int32_t p[3] = {(int32_t)(table + 2 * K4), out_w / (by8 ? 8 : 4),
                          by8 ? 16 : 4 * out_w};
    const int32_t zp = r[c->req], zpc = zp + (flip ? 128 : 0);
    const mp_int_t in_plane = in_h * in_w, out_plane = out_h * out_w;
    // the band's columns that hold the input row (the rest is padding)
    const mp_int_t lo = c->pad_l, hi = c->pad_l + in_w < pitch ? c->pad_l + in_w : pitch;
    for (mp_int_t ig = 0; ig < c->n_images * c->groups; ig++) {
        const uint8_t *x_group = q + c->x + ig * cin_g * in_plane;
        const mp_int_t mo0 = (ig % c->groups) * c->cout_g;
        uint8_t *out_group = q + c->y + ig * c->cout_g * out_plane;
        for (mp_int_t oy0 = 0; oy0 < out_h; oy0 += rows) {
            const mp_int_t n_rows = out_h - oy0 < rows ? out_h - oy0 : rows;
            for (mp_int_t ci = 0; ci < cin_g; ci++) {
                for (mp_int_t j = 0; j < band_rows; j++) {
                    const mp_int_t iy = oy0 - c->pad_t + j;
                    const bool inside = iy >= 0 && iy < in_h;
                    band_row(band + ci * plane + j * pitch,
                             x_group + ci * in_plane + (inside ? iy * in_w : 0), pitch,
                             inside ? lo : pitch, inside ? hi : pitch, (uint8_t)zpc, flip);
                }
            }
            for (mp_int_t mo = mo0; mo < mo0 + c->cout_g; mo++) {
                const int8_t *w_m = (const int8_t *)(wbuf + c->w + mo * K);
                int32_t sum_w = 0;
                for (mp_int_t t = 0; t < K; t++) {
                    table[2 * t + 1] = w_m[t];
                    sum_w += w_m[t];
                }
                for (mp_int_t rr = 0; rr < n_rows; rr += rows_step) {
                    (by8 ? mt_d8x1 : mt_d4x2)(band + rr * pitch, table, p, acc + rr * out_w);
                }
                const uint32_t base = (uint32_t)(c->bias >= 0 ? r[c->bias + mo] : 0)
                                      - (uint32_t)(zpc * sum_w);
                rq_t rq;
                rq_init(&rq, r + c->req, r[c->req + 4 + 2 * mo], r[c->req + 5 + 2 * mo]);
                rq_run(&rq, acc, base, n_rows * out_w,
                       out_group + (mo - mo0) * out_plane + oy0 * out_w);
            }
        }
    }
    return true;
}
#endif
