// Native forms of kernels/qlinear.py's int8 Gemm and Conv (qlinear_gemm here; qlinear_conv in
// qconv_native.c) as a MicroPython dynamic native module (an .mpy holding machine code;
// built by scripts/build_natmod.sh with MicroPython 1.25's py/dynruntime.mk).
// kernels/fastpath.py puts them in place of the viper and pure-Python kernels when the
// module imports; the pure-Python kernels stay the reference.
//
// The same bytes as the pure-Python kernels, integers only:
//   Y[i, j] = clamp(round_half_even((sum_k (X[i, k] - x_zp) * W[k, j] + bias[j]) * m0[j]
//                                   / 2**shift[j]) + y_zp, lo, hi)
// The sum over k is exact in 32 bits while k <= 32768 (|x - x_zp| <= 383, |w| <= 128). The
// requantization (out_byte) works in 32-bit limbs for |acc| < 2**24 and on one exact 64-bit
// product beyond (m0 <= 2**24 keeps it below 2**57). Arguments outside that domain (k
// beyond 32768, a crafted multiplier, a zero point outside a byte's range) go to the
// pure-Python kernel, which the module finds in its global _pure (set by fastpath.py, as
// for the viper module).
//
// Nothing is allocated on the heap: the kernels run under micropython.heap_lock().
#include "qlinear_native.h"

// The geometry and arrays of one qlinear_gemm call (its args tuple: Q, y, x, w, bias, req,
// m, k, n, sx_m, sx_k, sw_k, sw_n, x_signed, y_signed, W)
typedef struct {
    uint8_t *q;             // the byte arena
    const int32_t *r;       // the int32 arena
    const uint8_t *wb;      // the weights' buffer (the arena, or a blob in flash)
    mp_int_t y, x, w, bias, req, m, k, n, sx_m, sx_k, sw_k, sw_n, x_signed;
} gemm_t;

// round_half_even(acc * m0 / 2**shift) + y_zp, clamped to [lo, hi]: fixedpoint.requant_wide
// (shift below 1 taken as 1) for 0 <= m0 <= 2**24 and |acc| < 2**33
static uint8_t requant_byte(int64_t acc, int32_t m0, int32_t shift, int32_t y_zp, int32_t lo,
                            int32_t hi) {
    if (shift < 1) {
        shift = 1;
    }
    int64_t q = 0;
    if (shift <= 62) {      // beyond: |acc * m0| < 2**57 <= 2**(shift - 1) rounds to 0
        int64_t p = acc * m0;
        q = p >> shift;     // arithmetic: floor, as Python's >>
        uint64_t rem = (uint64_t)p & (((uint64_t)1 << shift) - 1);
        uint64_t half = (uint64_t)1 << (shift - 1);
        if (rem > half || (rem == half && (q & 1))) {
            q += 1;
        }
    }
    q += y_zp;
    if (q < lo) {
        q = lo;
    } else if (q > hi) {
        q = hi;
    }
    return (uint8_t)q;
}

// round_half_even(a * m / 2**shift) for 0 <= a < 2**24, 0 <= m <= 2**24, 1 <= shift <= 62,
// in 32-bit words (armv6m has no 32 x 32 -> 64 multiply: gcc's int64 product and shifts are
// libgcc calls, four per output): the product in 16-bit limbs as hi * 2**32 + lo (< 2**48),
// then t = floor(p / 2**(shift - 1)), whose low bit is the half and the bits below it the
// sticky rest. Saturated at 2**25, far beyond any clamp bound.
static int32_t requant_narrow(uint32_t a, uint32_t m, uint32_t shift) {
    uint32_t al = a & 0xFFFF, ah = a >> 16, ml = m & 0xFFFF, mh = m >> 16;
    uint32_t mid = ah * ml + al * mh;           // < 2**25
    uint32_t add = mid << 16;
    uint32_t lo = al * ml + add;
    uint32_t hi = ah * mh + (mid >> 16) + (lo < add);
    uint32_t u = shift - 1, t, sticky;
    if (u == 0) {
        if (hi) {
            return 1 << 25;
        }
        t = lo;
        sticky = 0;
    } else if (u < 32) {
        if (hi >> u) {
            return 1 << 25;
        }
        t = (hi << (32 - u)) | (lo >> u);
        sticky = lo & ((1u << u) - 1);
    } else {
        uint32_t v = u - 32;                    // <= 29
        t = hi >> v;
        sticky = lo | (hi & ((1u << v) - 1));
    }
    if (t >> 26) {
        return 1 << 25;
    }
    uint32_t q = t >> 1;
    if ((t & 1) && (sticky || (q & 1))) {
        q += 1;
    }
    return (int32_t)q;
}

// One output byte from its accumulator (the sum with the bias) and its channel's (m0,
// shift), hdr the req tensor's header [x_zp, y_zp, lo, hi]: |acc| < 2**24 (nearly always)
// in 32-bit words, else on one exact 64-bit product (requant_byte)
uint8_t out_byte(const int32_t *hdr, int64_t acc, int32_t m0, int32_t shift) {
    int32_t y_zp = hdr[1], lo = hdr[2], hi = hdr[3];
    if (acc > -M0_LIMIT && acc < M0_LIMIT && shift <= 62) {
        int32_t a = (int32_t)acc;
        int32_t q = requant_narrow(a < 0 ? -a : a, m0, shift < 1 ? 1 : shift);
        q = (a < 0 ? -q : q) + y_zp;           // round half to even is odd-symmetric
        if (q < lo) {
            q = lo;
        } else if (q > hi) {
            q = hi;
        }
        return (uint8_t)q;
    }
    return requant_byte(acc, m0, shift, y_zp, lo, hi);
}

static inline __attribute__((always_inline)) uint8_t rq_byte(const rq_t *c, int32_t acc) {
    uint32_t a = acc < 0 ? 0u - (uint32_t)acc : (uint32_t)acc;
    if (a >= c->amax) {
        return out_byte(c->hdr, acc, c->m0, c->shift);
    }
    uint32_t ml = c->ml, v = c->v;
    uint32_t p0 = (a & 0xFFFF) * ml;
    uint32_t h = a * c->mh + (a >> 16) * ml + (p0 >> 16);
    uint32_t carry = ((p0 << 16) | ((h >> v) & 1)) != 0;
    uint32_t u = (h + c->half_m1 + carry) >> v;
    if (u > (1u << 20)) {
        u = 1u << 20;                           // far beyond any clamp bound
    }
    int32_t q = (acc < 0 ? -(int32_t)u : (int32_t)u) + c->y_zp;   // odd-symmetric rounding
    if (q < c->lo) {
        q = c->lo;
    } else if (q > c->hi) {
        q = c->hi;
    }
    return (uint8_t)q;
}

// n output bytes from n accumulators (plus base, in wrapping 32-bit arithmetic): the one
// copy of rq_byte's machine code (the constants copied to a local, which the byte stores
// cannot alias); on ARM qrequant_thumb.S's mt_rq_run, the same arithmetic by hand, which
// stops at each accumulator at or beyond amax (out_byte's, here)
#ifdef MT_THUMB_KERNELS
mp_int_t mt_rq_run(const int32_t *acc, uint8_t *out, mp_int_t n, const int32_t *p);
mp_int_t mt_rq_relu(const int32_t *acc, uint8_t *out, mp_int_t n, const int32_t *p);
#endif
__attribute__((noinline)) void rq_run(const rq_t *rq, const int32_t *acc, uint32_t base,
                                             mp_int_t n, uint8_t *out) {
#ifdef MT_THUMB_KERNELS
    // (the constants straight into the asm's record: no copy of rq, a run per block of a
    // Conv's outputs)
    const int32_t p[9] = {(int32_t)base, (int32_t)rq->ml, (int32_t)rq->mh, (int32_t)rq->v,
                          (int32_t)rq->half_m1, (int32_t)rq->amax, rq->y_zp, rq->lo, rq->hi};
    while (n > 0) {
        if (rq->amax) {
            // lo at or above y_zp (a fused Relu): accumulators at or below 0 give lo
            mp_int_t done = (rq->lo >= rq->y_zp ? mt_rq_relu : mt_rq_run)(acc, out, n, p);
            acc += done;
            out += done;
            n -= done;
            if (n == 0) {
                break;
            }
        }
        *out++ = out_byte(rq->hdr, (int32_t)(base + (uint32_t)*acc++), rq->m0, rq->shift);
        n--;
    }
#else
    const rq_t c = *rq;
    for (; n > 0; n--) {
        *out++ = rq_byte(&c, (int32_t)(base + (uint32_t)*acc++));
    }
#endif
}

// The output Y[i, j] from the sum over k
static inline void store(const gemm_t *g, mp_int_t i, mp_int_t j, int32_t sum) {
    const int32_t *r = g->r;
    int64_t acc = sum;
    if (g->bias >= 0) {
        acc += r[g->bias + j];
    }
    g->q[g->y + i * g->n + j] = out_byte(r + g->req, acc, r[g->req + 4 + 2 * j],
                                         r[g->req + 5 + 2 * j]);
}

// The outputs Y[i, j .. j + count - 1] from their sums: on ARM qrequant_thumb.S's
// mt_rq_cols for those inside rq_init's domain (~50 instructions an output), store's
// out_byte (~125 with the call) for the others
#ifdef MT_THUMB_KERNELS
mp_int_t mt_rq_cols(const int32_t *sum, uint8_t *out, mp_int_t n, const int32_t *p);
#endif
static void store_run(const gemm_t *g, mp_int_t i, mp_int_t j, const int32_t *sum,
                      mp_int_t count) {
#ifdef MT_THUMB_KERNELS
    static const int32_t no_bias[4];
    const int32_t *r = g->r, *hdr = r + g->req;
    while (count > 0) {
        int32_t p[5] = {(int32_t)(intptr_t)(hdr + 4 + 2 * j),
                        (int32_t)(intptr_t)(g->bias >= 0 ? r + g->bias + j : no_bias),
                        hdr[1], hdr[2], hdr[3]};
        mp_int_t done = mt_rq_cols(sum, g->q + g->y + i * g->n + j, count, p);
        if (done < count) {
            store(g, i, j + done, sum[done]);
            done++;
        }
        sum += done;
        j += done;
        count -= done;
    }
#else
    for (mp_int_t c = 0; c < count; c++) {
        store(g, i, j + c, sum[c]);
    }
#endif
}

// Four outputs of one row with unit strides along k (a transposed weight, as the packager
// lowers torch's Linear): the input byte is loaded once for four weights. On ARM the loop
// is qlinear_thumb.S's (Thumb-1 by hand: gcc spills the four sums there; armv7m: Thumb-2,
// qlinear_thumb2.S's); elsewhere the
// same loop in C. Each weight row is at a fixed distance from the moving input pointer.
#ifdef MT_THUMB_KERNELS
void mt_dot4_u8(const uint8_t *px, const uint8_t *pe, const int32_t *p, int32_t *acc);
void mt_dot4_s8(const uint8_t *px, const uint8_t *pe, const int32_t *p, int32_t *acc);
#endif

// (inlined: called, the Gemm took 6.62 instructions per MAC at 8x64x32 instead of 6.56)
static inline __attribute__((always_inline)) void dot4_unit(const uint8_t *px,
                                                            const uint8_t *w0, mp_int_t sw_n,
                                                            mp_int_t k, bool x_signed,
                                                            int32_t x_zp, int32_t *acc) {
    const uint8_t *pe = px + k;
    int32_t d[5] = {w0 - px, w0 + sw_n - px, w0 + 2 * sw_n - px, w0 + 3 * sw_n - px, x_zp};
    acc[0] = acc[1] = acc[2] = acc[3] = 0;
#ifdef MT_THUMB_KERNELS
    if (k & 1) {            // an odd k: its first term here, then pairs of terms in the loop
#else
    while (px != pe) {
#endif
        int32_t xv = (x_signed ? (int32_t)(int8_t)px[0] : (int32_t)px[0]) - x_zp;
        acc[0] += xv * (int8_t)px[d[0]];
        acc[1] += xv * (int8_t)px[d[1]];
        acc[2] += xv * (int8_t)px[d[2]];
        acc[3] += xv * (int8_t)px[d[3]];
        px++;
    }
#ifdef MT_THUMB_KERNELS
    if (px != pe) {
        if (x_signed) {
            mt_dot4_s8(px, pe, d, acc);
        } else {
            mt_dot4_u8(px, pe, d, acc);
        }
    }
#endif
}

#ifdef MT_THUMB_KERNELS
void mt_dot4_kn_u8(const uint8_t *px, const uint8_t *pe, const int32_t *p, int32_t *acc);
void mt_dot4_kn_s8(const uint8_t *px, const uint8_t *pe, const int32_t *p, int32_t *acc);

// Four outputs of one row for a weight W[k, n] (unit stride along n and along the input's
// k): qlinear_thumb.S's second loop, after an odd k's first term. k >= 1.
static void dot4_kn(const uint8_t *px, const uint8_t *pw, mp_int_t sw, mp_int_t k,
                    bool x_signed, int32_t x_zp, int32_t *acc) {
    const uint8_t *pe = px + k;
    acc[0] = acc[1] = acc[2] = acc[3] = 0;
    if (k & 1) {
        int32_t xv = (x_signed ? (int32_t)(int8_t)px[0] : (int32_t)px[0]) - x_zp;
        acc[0] = xv * (int8_t)pw[0];
        acc[1] = xv * (int8_t)pw[1];
        acc[2] = xv * (int8_t)pw[2];
        acc[3] = xv * (int8_t)pw[3];
        px++;
        pw += sw;
    }
    if (px != pe) {
        int32_t p[3] = {(int32_t)(intptr_t)pw, sw, x_zp};
        if (x_signed) {
            mt_dot4_kn_s8(px, pe, p, acc);
        } else {
            mt_dot4_kn_u8(px, pe, p, acc);
        }
    }
}
#endif

// Four outputs of one row at once (columns j .. j + 3), any strides: each input byte loaded
// once for four weights. The input's value is (b ^ flip) - zpf with flip 0x80 for int8
// inputs (then (b ^ 0x80) - 0x80 is the signed byte) and zpf = x_zp + flip.
static void dot4(const gemm_t *g, mp_int_t i, mp_int_t j, uint32_t flip, int32_t zpf) {
    const uint8_t *px = g->q + g->x + i * g->sx_m;
    const uint8_t *pw = g->wb + g->w + j * g->sw_n;
    int32_t a[4];
    mp_int_t k = g->k;
    if (g->sx_k == 1 && g->sw_k == 1) {
        dot4_unit(px, pw, g->sw_n, k, flip != 0, zpf - (int32_t)flip, a);
#ifdef MT_THUMB_KERNELS
    } else if (g->sx_k == 1 && g->sw_n == 1 && k > 0) {
        dot4_kn(px, pw, g->sw_k, k, flip != 0, zpf - (int32_t)flip, a);
#endif
    } else {
        const mp_int_t sx = g->sx_k, sw = g->sw_k, s1 = g->sw_n, s2 = s1 + s1, s3 = s2 + s1;
        a[0] = a[1] = a[2] = a[3] = 0;
        while (k-- > 0) {
            int32_t xv = (int32_t)(*px ^ flip) - zpf;
            a[0] += xv * (int8_t)pw[0];
            a[1] += xv * (int8_t)pw[s1];
            a[2] += xv * (int8_t)pw[s2];
            a[3] += xv * (int8_t)pw[s3];
            px += sx;
            pw += sw;
        }
    }
    store_run(g, i, j, a, 4);
}

// One output (the last n % 4 columns)
static void dot1(const gemm_t *g, mp_int_t i, mp_int_t j, uint32_t flip, int32_t zpf) {
    const uint8_t *px = g->q + g->x + i * g->sx_m;
    const uint8_t *pw = g->wb + g->w + j * g->sw_n;
    const mp_int_t sx = g->sx_k, sw = g->sw_k;
    int32_t a = 0;
    for (mp_int_t c = g->k; c > 0; c--) {
        a += ((int32_t)(*px ^ flip) - zpf) * (int8_t)*pw;
        px += sx;
        pw += sw;
    }
    store(g, i, j, a);
}

#ifndef MT_THUMB_KERNELS
// (qlinear_native.h; on ARM qlinear_thumb.S's)
void mt_t8(const uint8_t *xt, const uint8_t *w, const int32_t *p, int32_t *acc) {
    int32_t a[9] = {0};
    for (const uint8_t *end = xt + 8 * p[0]; xt != end; xt += 8, w += p[1]) {
        int32_t wv = (int8_t)*w;
        for (int lane = 0; lane < 8; lane++) {
            a[lane] += xt[lane] * wv;
        }
        a[8] += wv;
    }
    for (int lane = 0; lane < 9; lane++) {
        acc[lane] = a[lane];
    }
}
#endif

// Rows i0 .. i0 + 7 at once (k <= XT_K): their bytes transposed once (xt[8 * t + lane],
// each as u = b ^ flip, the input plus 128 for int8 inputs), then per column mt_t8's eight
// sums of u * w and sum w, so that the sum over k of (x - x_zp) * w is sum u * w - zpf * sum w
// (zpf = x_zp + flip); requantized per column with its constants unpacked once (rq_run)
// instead of out_byte per output (~90 instructions on armv6m). The biases within +-2**30:
// the sums (|.| < 2**22 here) plus the bias stay exact in 32 bits.
#define XT_K 96
#ifdef MT_THUMB_KERNELS
void mt_lane8(const uint8_t *x, uint8_t *xt, mp_int_t k, uint32_t flip);
#endif
static void rows8(const gemm_t *g, mp_int_t i0, uint32_t flip, int32_t zpf) {
    uint8_t xt[8 * XT_K], bytes[8];
    int32_t acc[9];
    const mp_int_t k = g->k, sx = g->sx_k, n = g->n;
    for (mp_int_t lane = 0; lane < 8; lane++) {
        const uint8_t *px = g->q + g->x + (i0 + lane) * g->sx_m;
        uint8_t *pt = xt + lane;
#ifdef MT_THUMB_KERNELS
        if (sx == 1 && k > 0) {         // (gcc's loop: 13 instructions a byte, 0.4 a MAC)
            mt_lane8(px, pt, k, flip);
            continue;
        }
#endif
        for (mp_int_t t = 0; t < k; t++, px += sx, pt += 8) {
            *pt = (uint8_t)(*px ^ flip);
        }
    }
    const int32_t *r = g->r;
    const int32_t p[2] = {k, g->sw_k};
    uint8_t *py = g->q + g->y + i0 * g->n;
    for (mp_int_t j = 0; j < g->n; j++) {
        mt_t8(xt, g->wb + g->w + j * g->sw_n, p, acc);
        const uint32_t base = (uint32_t)(g->bias >= 0 ? r[g->bias + j] : 0)
                              - (uint32_t)(zpf * acc[8]);
        rq_t rq;
        rq_init(&rq, r + g->req, r[g->req + 4 + 2 * j], r[g->req + 5 + 2 * j]);
        rq_run(&rq, acc, base, 8, bytes);
        uint8_t *out = py + j;          // column j of the eight rows (a pointer: gcc had
        for (mp_int_t lane = 0; lane < 8; lane++, out += n) {  // multiplied per byte)
            *out = bytes[lane];
        }
    }
}

// Whether the machine-word path computes this call's bytes exactly (see the top)
static bool in_domain(const gemm_t *g) {
    const int32_t *r = g->r;
    int32_t x_zp = r[g->req], y_zp = r[g->req + 1];
    if (g->k > K_LIMIT || x_zp < -128 || x_zp > 255 || y_zp < -128 || y_zp > 255) {
        return false;
    }
    for (mp_int_t j = 0; j < g->n; j++) {
        int32_t m0 = r[g->req + 4 + 2 * j];
        if (m0 < 0 || m0 > M0_LIMIT) {
            return false;
        }
    }
    return true;
}

// The module's globals (kept alive by the module object), where fastpath.py sets _pure
mp_obj_dict_t *module_globals;      // not static: mpy_ld cannot relocate static BSS

// The pure-Python kernel `name` called on the call's arguments: _pure[name](F, I, args)
mp_obj_t pure_kernel(qstr name, const mp_obj_t *in) {
    // the module's own globals (mp_load_global here would read the caller's)
    mp_obj_t pure = mp_obj_subscr(MP_OBJ_FROM_PTR(module_globals),
                                  MP_OBJ_NEW_QSTR(MP_QSTR__pure), MP_OBJ_SENTINEL);
    if (pure == mp_const_none) {
        mp_raise_ValueError(MP_ERROR_TEXT("arguments beyond the native kernel and no "
                                          "pure-Python kernel set"));
    }
    return mp_call_function_n_kw(mp_obj_subscr(pure, MP_OBJ_NEW_QSTR(name), MP_OBJ_SENTINEL),
                                 3, 0, in);
}

// A kernel call's arguments (F, I, args): args must hold count items, args[0] the byte
// arena (bufs[0], written), I the int32 arena (bufs[1], written when i_write: the Conv's
// scratch plane), the last item the weights' buffer (bufs[2]); the count - 2 integers
// between go to fields, in the args' order
void unpack_args(const mp_obj_t *in, size_t count, mp_rom_error_text_t wrong_count,
                        bool i_write, mp_buffer_info_t *bufs, mp_int_t *fields) {
    size_t len;
    mp_obj_t *a;
    mp_obj_get_array(in[2], &len, &a);
    if (len != count) {
        mp_raise_ValueError(wrong_count);
    }
    mp_get_buffer_raise(a[0], &bufs[0], MP_BUFFER_WRITE);
    mp_get_buffer_raise(in[1], &bufs[1], i_write ? MP_BUFFER_WRITE : MP_BUFFER_READ);
    mp_get_buffer_raise(a[count - 1], &bufs[2], MP_BUFFER_READ);
    for (size_t f = 0; f < count - 3; f++) {
        // a small int's value straight from its tagged word (what native_from_obj returns
        // for it, through mp_fun_table and a switch: ~20 instructions a field, ~260 of a
        // Gemm call's ~1,360); True/False and big ints take the call as before
        mp_obj_t o = a[f + 1];
        fields[f] = mp_obj_is_small_int(o) ? MP_OBJ_SMALL_INT_VALUE(o) : mp_obj_get_int(o);
    }
}

// qlinear_gemm(F, I, args): kernels/qlinear.py's signature, so it replaces that kernel as is
static mp_obj_t qlinear_gemm(size_t n_args, const mp_obj_t *in) {
    mp_buffer_info_t b[3];
    gemm_t g;
    unpack_args(in, 16, MP_ERROR_TEXT("qlinear_gemm: 16 arguments expected"), false, b,
                &g.y);                                      // y .. x_signed
    g.q = b[0].buf;
    g.r = b[1].buf;
    g.wb = b[2].buf;
    if (!in_domain(&g)) {
        return pure_kernel(MP_QSTR_qlinear_gemm, in);
    }
    uint32_t flip = g.x_signed ? 0x80 : 0;
    int32_t zpf = g.r[g.req] + (int32_t)flip;
    mp_int_t n4 = g.n & ~(mp_int_t)3, i = 0;
    bool small_bias = g.k <= XT_K && g.m >= 8;      // (only rows8 needs it)
    for (mp_int_t j = 0; small_bias && g.bias >= 0 && j < g.n; j++) {
        small_bias = g.r[g.bias + j] > -(1 << 30) && g.r[g.bias + j] < (1 << 30);
    }
    for (; small_bias && i + 8 <= g.m; i += 8) {
        rows8(&g, i, flip, zpf);
    }
    for (; i < g.m; i++) {
        for (mp_int_t j = 0; j < n4; j += 4) {
            dot4(&g, i, j, flip, zpf);
        }
        for (mp_int_t j = n4; j < g.n; j++) {
            dot1(&g, i, j, flip, zpf);
        }
    }
    return mp_const_none;
}
static MP_DEFINE_CONST_FUN_OBJ_VAR_BETWEEN(qlinear_gemm_obj, 3, 3, qlinear_gemm);

// qlinear_global_average_pool(F, I, (Q, y, x, req, planes, count, x_signed, y_signed)):
// kernels/qlinear.py's Y[p] = requant(sum over plane p of (X - x_zp)), req = [x_zp, y_zp,
// lo, hi, m0, shift]. A plane's sum is exact in 32 bits for count <= 2**22 (|x - x_zp| <=
// 383): the bytes b ^ flip summed, less count * (flip + x_zp). (The KWS DS-CNN's pool
// before its classifier: 64 planes of 125, ~0.49 M instructions with the viper kernel.)
static mp_obj_t qlinear_global_average_pool(size_t n_args, const mp_obj_t *in) {
    mp_int_t f[6];
    mp_obj_t *a;
    const int32_t *r = int_fields(in, 1, 6, 8, f, &a);
    const mp_int_t y = f[0], x = f[1], req = f[2], planes = f[3], count = f[4];
    const int32_t x_zp = r[req], y_zp = r[req + 1], m0 = r[req + 4], shift = r[req + 5];
    if (count > (1 << 22) || x_zp < -128 || x_zp > 255 || y_zp < -128 || y_zp > 255 ||
        m0 < 0 || m0 > M0_LIMIT) {
        return pure_kernel(MP_QSTR_qlinear_global_average_pool, in);
    }
    uint8_t *q = bytes_of(a[0], MP_BUFFER_WRITE);
    const uint32_t flip = f[5] ? 0x80 : 0;
    const uint32_t less = (flip + (uint32_t)x_zp) * (uint32_t)count;
    const uint8_t *p = q + x;
    for (mp_int_t plane = 0; plane < planes; plane++) {
        uint32_t sum = 0;
        for (const uint8_t *end = p + count; p < end; p++) {
            sum += *p ^ flip;
        }
        q[y + plane] = out_byte(r + req, (int32_t)(sum - less), m0, shift);
    }
    return mp_const_none;
}
static MP_DEFINE_CONST_FUN_OBJ_VAR_BETWEEN(qlinear_global_average_pool_obj, 3, 3,
                                           qlinear_global_average_pool);

mp_obj_t mpy_init(mp_obj_fun_bc_t *self, size_t n_args, size_t n_kw, mp_obj_t *args) {
    MP_DYNRUNTIME_INIT_ENTRY
    module_globals = self->context->module.globals;
    mp_store_global(MP_QSTR_qlinear_gemm, MP_OBJ_FROM_PTR(&qlinear_gemm_obj));
    mp_store_global(MP_QSTR_qlinear_conv, MP_OBJ_FROM_PTR(&qlinear_conv_obj));
    mp_store_global(MP_QSTR_qlinear_global_average_pool,
                    MP_OBJ_FROM_PTR(&qlinear_global_average_pool_obj));
    mp_store_global(MP_QSTR_int_gemm_update, MP_OBJ_FROM_PTR(&int_gemm_update_obj));
    inttrain_globals();
    mp_store_global(MP_QSTR_int_pool_grad, MP_OBJ_FROM_PTR(&int_pool_grad_obj));
    mp_store_global(MP_QSTR_int_clamp_mask, MP_OBJ_FROM_PTR(&int_clamp_mask_obj));
    mp_store_global(MP_QSTR_int_clamp_bias_grad, MP_OBJ_FROM_PTR(&int_clamp_bias_grad_obj));
    mp_store_global(MP_QSTR_int_conv_grad_input, MP_OBJ_FROM_PTR(&int_conv_grad_input_obj));
    mp_store_global(MP_QSTR_int_conv_update, MP_OBJ_FROM_PTR(&int_conv_update_obj));
    mp_store_global(MP_QSTR__pure, mp_const_none);   // set by kernels/fastpath.py
    MP_DYNRUNTIME_INIT_EXIT
}
