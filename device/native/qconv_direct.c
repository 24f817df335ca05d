// qlinear_conv's direct path (ARM builds; qconv_native.c calls it before the im2col path):
// a Conv reads its inputs where they lie, in a padded copy of the input rows (or columns)
// its outputs need, with no gather. See device/native/README.md.
//
// Why: the im2col path (qconv_patches.c) gathers each pixel's K bytes (~6 instructions a
// byte, ~19 at the image's edge) before its eight-lane loop; with 8 output channels that
// gather is 1.4 of the 3x3 8 -> 8 Conv's 6.2 instructions per multiply-accumulate on
// armv6m. Here the lanes are eight outputs whose inputs lie at fixed distances in a band:
//   rows (stride 1): eight consecutive outputs of a row (mt_d8x1; out_w a multiple of 8)
//     or a block of four columns by two rows (mt_d4x2: out_w a multiple of four, out_h
//     even, the band's rows 16 bytes apart so that the lower row's lanes are immediate
//     offsets), the band a chunk of output rows' padded input rows;
//   columns (stride 1 or 2 along y, any along x): eight consecutive outputs of a column
//     (mt_d8: lanes one byte apart, mt_d8s2: two), the band the whole padded input
//     transposed, an input column a band row; the last out_h mod 8 rows are the im2col
//     path's. An edge column leaves out the terms of the kx that read only padding there
//     (its sums start from what they add).
// Each term of the loop is one (offset, weight) pair of a table: the lanes read band[base +
// offset + lane's distance]. The band holds u = x + c (c 128 for int8 inputs: b ^ 0x80, 0
// for uint8) and padding as x_zp + c, so that
//   sum over inside taps of (x - x_zp) * w = sum over all K of u * w - (x_zp + c) * sum w
// exactly, as in conv_patches: the same sums as the pure kernel's, so the same bytes.
#include "qlinear_native.h"

#ifdef MT_THUMB_KERNELS
#define BAND_BYTES 768          // the padded input on the stack (every input channel)
#define TABLE_K 72              // K = cin_g * taps at most (the table is 8 bytes a term)
#define CHUNK_OUTPUTS 48        // a chunk of rows' outputs, summed before they are requantized
#define PITCH_4X2 16            // mt_d4x2's band rows: its lanes 4-7 read 16 bytes further
// the columns form keeps two bytes per output column (at most BAND_BYTES / 8 of them) in
// the rows form's sums
_Static_assert(2 * (BAND_BYTES / 8) <= 4 * CHUNK_OUTPUTS, "the columns' spans fit acc");

// The eight-lane loops (qconv_direct_thumb.S): sums for `groups` groups of eight outputs,
// p = [the table's end, groups, stride, x step, acc step, the sums' start] (see there)
void mt_d8x1(const uint8_t *x, const int32_t *table, const int32_t *p, int32_t *acc);
void mt_d8(const uint8_t *x, const int32_t *table, const int32_t *p, int32_t *acc);
void mt_d8s2(const uint8_t *x, const int32_t *table, const int32_t *p, int32_t *acc);
void mt_d4x2(const uint8_t *x, const int32_t *table, const int32_t *p, int32_t *acc);

// A band row: q bytes, padding outside the columns [lo, hi), the input row's bytes
// (flipped) inside. (no-tree-loop-distribute-patterns: gcc would call memset, which a
// dynamic native module cannot link)
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

// A band column (the transposed input's line): n bytes, padding outside [lo, hi), inside the
// input column's bytes from s, in_w apart (flipped)
__attribute__((noinline, optimize("no-tree-loop-distribute-patterns")))
static void band_column(uint8_t *d, const uint8_t *s, mp_int_t n, mp_int_t lo, mp_int_t hi,
                        const int32_t *pad_flip_step) {
    const uint32_t pad = (uint32_t)pad_flip_step[0], flip = (uint32_t)pad_flip_step[1];
    const mp_int_t step = pad_flip_step[2];
    uint8_t *const inside = d + lo, *const after = d + hi, *const end = d + n;
    while (d < inside) {
        *d++ = (uint8_t)pad;
    }
    for (; d < after; s += step) {
        *d++ = (uint8_t)(*s ^ flip);
    }
    while (d < end) {
        *d++ = (uint8_t)pad;
    }
}

// The range [lo, hi) of a band line's n positions (input index = position - pad) that lie
// inside an input of `size` (empty: hi = lo = n)
static void inside_range(mp_int_t pad, mp_int_t size, mp_int_t n, mp_int_t *lo,
                         mp_int_t *hi) {
    *lo = pad < n ? pad : n;
    *hi = pad + size < n ? pad + size : n;
    if (*hi < *lo) {
        *hi = *lo;
    }
}

// What both forms share: the call's geometry and constants, the table of (offset, weight)
// pairs (each output channel's weights written beside the offsets), the padding's byte
typedef struct {
    const conv_t *c;
    const int32_t *r;
    const uint8_t *wbuf;
    int32_t *table;
    mp_int_t K, K4, zpc;        // K4: K rounded up to four (the table's length)
    bool by_kx;                 // the table kx-major (the columns form)
} direct_t;

__attribute__((noinline)) static int32_t channel_weights(const direct_t *d, mp_int_t mo) {
    // (a function of its own and the byte in a local: inlined, gcc kept the sum on the
    // stack, and it loads a byte again after a store it may alias)
    const mp_int_t K = d->K, step = d->by_kx ? d->c->k_w : 1;
    const int8_t *w_m = (const int8_t *)(d->wbuf + d->c->w + mo * K);
    int32_t *entry = d->table + 1, sum_w = 0;
    for (mp_int_t o = 0; o < step; o++) {   // kx-major: each kx's (ci, ky) rows, k_w apart
        for (const int8_t *w = w_m + o, *end = w + K; w < end; w += step, entry += 2) {
            const int32_t v = *w;
            *entry = v;
            sum_w += v;
        }
    }
    return sum_w;
}

// Output channel mo's n sums in acc (less (x_zp + c) * sum w, plus its bias) requantized
static inline __attribute__((always_inline)) void requantize(const direct_t *d, mp_int_t mo,
                                                             int32_t sum_w, const int32_t *acc,
                                                             mp_int_t n, uint8_t *out) {
    rq_t rq;
    const uint32_t base = conv_channel_rq(&rq, d->c, d->r, mo, d->zpc * sum_w);
    rq_run(&rq, acc, base, n, out);
}

// The table's offsets: tap (ci, ky, kx) at ci * plane + ky * d_h * y_step + kx * d_w * x_step,
// in the weights' order or kx-major (d->by_kx: a range of kx is a range of the table, for
// the columns form to leave out the kx a column reads only padding at), then (0, 0) pairs
// up to a multiple of four (four terms a turn)
__attribute__((optimize("no-tree-loop-distribute-patterns")))     // (the zeros: no memset)
static void table_offsets(const direct_t *d, mp_int_t plane, mp_int_t y_step,
                          mp_int_t x_step) {
    const conv_t *c = d->c;
    const mp_int_t k_h = c->k_h, k_w = c->k_w, cin_g = c->cin_g;
    for (mp_int_t ci = 0; ci < cin_g; ci++) {
        for (mp_int_t ky = 0; ky < k_h; ky++) {
            for (mp_int_t kx = 0; kx < k_w; kx++) {
                const mp_int_t at = d->by_kx ? (kx * cin_g + ci) * k_h + ky
                                             : (ci * k_h + ky) * k_w + kx;
                d->table[2 * at] = ci * plane + ky * c->d_h * y_step + kx * c->d_w * x_step;
            }
        }
    }
    for (int32_t *entry = d->table + 2 * d->K, *end = d->table + 2 * d->K4; entry < end;
         entry++) {
        *entry = 0;
    }
}

// The sum of n terms' weights from entry
static int32_t left_out(const int32_t *entry, mp_int_t n) {
    int32_t sum_w = 0;
    for (const int32_t *end = entry + 2 * n; entry < end; entry += 2) {
        sum_w += entry[1];
    }
    return sum_w;
}

// The image-and-group ig's input and output planes, and its first output channel
static inline mp_int_t group_at(const conv_t *c, uint8_t *q, mp_int_t ig, const uint8_t **x,
                                uint8_t **out) {
    *x = q + c->x + ig * c->cin_g * c->in_h * c->in_w;
    *out = q + c->y + ig * c->cout_g * c->out_h * c->out_w;
    return (ig % c->groups) * c->cout_g;
}

// Rows: stride 1 both ways, unit dilation; false when the outputs do not tile
static bool direct_rows(const direct_t *d, uint8_t *q, uint8_t *band, int32_t *acc,
                        uint32_t flip) {
    const conv_t *c = d->c;
    const mp_int_t cin_g = c->cin_g, in_h = c->in_h, in_w = c->in_w, out_h = c->out_h,
                   out_w = c->out_w;
    if (c->s_h != 1 || c->s_w != 1 || c->d_h != 1 || c->d_w != 1) {
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
    table_offsets(d, plane, pitch, 1);
    const int32_t p[6] = {(int32_t)(d->table + 2 * d->K4), out_w / (by8 ? 8 : 4),
                          by8 ? 16 : 4 * out_w, by8 ? 8 : 4, by8 ? 32 : 16, 0};
    const mp_int_t in_plane = in_h * in_w, out_plane = out_h * out_w;
    mp_int_t lo, hi;
    inside_range(c->pad_l, in_w, pitch, &lo, &hi);
    for (mp_int_t ig = 0; ig < c->n_images * c->groups; ig++) {
        const uint8_t *x_group;
        uint8_t *out_group;
        const mp_int_t mo0 = group_at(c, q, ig, &x_group, &out_group);
        for (mp_int_t oy0 = 0; oy0 < out_h; oy0 += rows) {
            const mp_int_t n_rows = out_h - oy0 < rows ? out_h - oy0 : rows;
            for (mp_int_t ci = 0; ci < cin_g; ci++) {
                for (mp_int_t j = 0; j < band_rows; j++) {
                    const mp_int_t iy = oy0 - c->pad_t + j;
                    const bool inside = iy >= 0 && iy < in_h;
                    band_row(band + ci * plane + j * pitch,
                             x_group + ci * in_plane + (inside ? iy * in_w : 0), pitch,
                             inside ? lo : pitch, inside ? hi : pitch, (uint8_t)d->zpc, flip);
                }
            }
            for (mp_int_t mo = mo0; mo < mo0 + c->cout_g; mo++) {
                const int32_t sum_w = channel_weights(d, mo);
                for (mp_int_t rr = 0; rr < n_rows; rr += rows_step) {
                    (by8 ? mt_d8x1 : mt_d4x2)(band + rr * pitch, d->table, p, acc + rr * out_w);
                }
                requantize(d, mo, sum_w, acc, n_rows * out_w,
                           out_group + (mo - mo0) * out_plane + oy0 * out_w);
            }
        }
    }
    return true;
}

// Columns: stride 1 or 2 along y; the groups of eight rows (the rest for the im2col path);
// every input channel's padded, transposed input in the band. span: 192 bytes (the rows
// form's sums, unused here) for each output column's range of terms. Returns the outputs
// done per plane (0: not taken).
__attribute__((optimize("no-tree-loop-distribute-patterns")))     // (the zeros: no memset)
static mp_int_t direct_columns(const direct_t *d, uint8_t *q, uint8_t *band, int32_t *plane,
                               uint8_t *span, uint32_t flip) {
    const conv_t *c = d->c;
    const mp_int_t cin_g = c->cin_g, in_h = c->in_h, in_w = c->in_w, out_w = c->out_w;
    const mp_int_t rows = c->out_h & ~(mp_int_t)7;
    if (rows == 0 || (c->s_h != 1 && c->s_h != 2)) {
        return 0;
    }
    // the band's lines: one per input column read (width), each the rows read (height)
    const mp_int_t width = (out_w - 1) * c->s_w + (c->k_w - 1) * c->d_w + 1;
    const mp_int_t height = (rows - 1) * c->s_h + (c->k_h - 1) * c->d_h + 1;
    const mp_int_t size = width * height;
    if (size * cin_g > BAND_BYTES) {
        return 0;
    }
    table_offsets(d, size, 1, height);
    int32_t p[6] = {0, rows / 8, 4 * out_w, 8 * c->s_h, 32 * out_w, 0};
    const mp_int_t block = cin_g * c->k_h;      // the table's terms per kx
    // each output column's terms: those of the kx whose input column lies inside the
    // image, widened to whole turns of four; the padding terms left out add (x_zp + c) * w
    // each, which the sums start from (the KWS DS-CNN's first Conv: 8 of 40 terms left out
    // at its two edge columns), computed once a call, not per output channel. out_w <= 96
    // here (the band's lines are 8 bytes or more): two bytes each fit the span.
    for (mp_int_t ox = 0; ox < out_w; ox++) {
        mp_int_t kx0 = 0, kx1 = c->k_w;
        while (kx0 < kx1 && ox * c->s_w + kx0 * c->d_w < c->pad_l) {
            kx0++;
        }
        while (kx1 > kx0 && ox * c->s_w + (kx1 - 1) * c->d_w - c->pad_l >= in_w) {
            kx1--;
        }
        mp_int_t first = (kx0 * block) & ~(mp_int_t)3, end = (kx1 * block + 3) & ~(mp_int_t)3;
        if (end <= first) {         // a column of padding only: every term
            first = 0;
            end = d->K4;
        }
        span[2 * ox] = (uint8_t)first;
        span[2 * ox + 1] = (uint8_t)end;
    }
    const mp_int_t in_plane = in_h * in_w, out_plane = c->out_h * out_w;
    const int32_t pad_flip_step[3] = {d->zpc, (int32_t)flip, in_w};
    mp_int_t lo, hi;
    inside_range(c->pad_t, in_h, height, &lo, &hi);
    for (mp_int_t ig = 0; ig < c->n_images * c->groups; ig++) {
        const uint8_t *x_group;
        uint8_t *out_group;
        const mp_int_t mo0 = group_at(c, q, ig, &x_group, &out_group);
        for (mp_int_t ci = 0; ci < cin_g; ci++) {
            for (mp_int_t j = 0; j < width; j++) {
                const mp_int_t ix = j - c->pad_l;
                const bool inside = ix >= 0 && ix < in_w;
                band_column(band + ci * size + j * height,
                            x_group + ci * in_plane + (inside ? (lo - c->pad_t) * in_w + ix : 0),
                            height, inside ? lo : height, inside ? hi : height, pad_flip_step);
            }
        }
        for (mp_int_t mo = mo0; mo < mo0 + c->cout_g; mo++) {
            const int32_t sum_w = channel_weights(d, mo);
            for (mp_int_t ox = 0; ox < out_w; ox++) {
                const mp_int_t first = span[2 * ox], end = span[2 * ox + 1];
                p[0] = (int32_t)(d->table + 2 * end);
                p[5] = d->zpc * (left_out(d->table, first) + left_out(d->table + 2 * end,
                                                                       d->K4 - end));
                (c->s_h == 2 ? mt_d8s2 : mt_d8)(band + ox * c->s_w * height,
                                                 d->table + 2 * first, p, plane + ox);
            }
            requantize(d, mo, sum_w, plane, rows * out_w, out_group + (mo - mo0) * out_plane);
        }
    }
    // the scratch plane back to zeros: the pure kernel does not write it, so a run from a
    // fresh arena keeps it at zeros there (whole runs compare their arenas bit for bit with
    // CPython's: tests/test_board_kws_native.py)
    for (int32_t *a = plane, *end = plane + rows * out_w; a < end; a++) {
        *a = 0;
    }
    return rows * out_w;
}

mp_int_t conv_direct(const conv_t *c, uint8_t *q, int32_t *r, const uint8_t *wbuf,
                     uint32_t flip) {
    uint8_t band[BAND_BYTES];
    int32_t table[2 * TABLE_K], acc[CHUNK_OUTPUTS];
    const mp_int_t K = c->cin_g * c->k_h * c->k_w;
    direct_t d = {c, r, wbuf, table, K, (K + 3) & ~(mp_int_t)3, r[c->req] + (flip ? 128 : 0),
                  false};
    if (d.K > TABLE_K) {
        return 0;
    }
    if (direct_rows(&d, q, band, acc, flip)) {
        return c->out_h * c->out_w;
    }
    // the step's scratch plane (out_h x out_w int32, the checker's size) holds the sums
    d.by_kx = true;
    return direct_columns(&d, q, band, r + c->scratch, (uint8_t *)acc, flip);
}
#endif
