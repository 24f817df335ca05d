// What qlinear_native.c (the Gemm, the requantization, the module) and qconv_native.c
// (the Conv) share: one dynamic native module built from both (device/native/Makefile).
#ifndef MT_QLINEAR_NATIVE_H
#define MT_QLINEAR_NATIVE_H
#include "py/dynruntime.h"

#define M0_LIMIT (16777216)     // 2**24: the largest multiplier requant_pair derives
#define K_LIMIT (32768)         // terms whose sum is exact in an int32 (see the top)

// One channel's requantization with its constants unpacked once (rq_init), for a run of
// outputs (a Conv's plane, a pointwise Conv's pixels): exact in 32-bit words without
// requant_narrow's cases. For 0 <= a < 2**23, 0 < m0 <= 2**24 and 17 <= shift <= 47, with
// p = a * m0 (< 2**47), ml and mh its multiplier's low 16 and high 8 bits, al and ah a's:
//   H = floor(p / 2**16) = a * mh + ah * ml + floor(al * ml / 2**16)    (< 2**31)
//   L = p mod 2**16      = (al * ml) mod 2**16
// and with v = shift - 16 (1 .. 31), round half to even of p / 2**shift is
//   (H + 2**(v - 1) - 1 + (L != 0 or bit v of H)) >> v
// (p + 2**(shift - 1) - 1 + bit shift of p, floored: a remainder above half carries, one
// below does not, an exact half carries only onto an odd quotient; the carry out of the
// low 16 bits is whether L or that bit is nonzero). Other channels (crafted multipliers,
// shifts outside 17 .. 47) and |acc| >= 2**23 go to out_byte, the same bytes.
typedef struct {
    const int32_t *hdr;
    int32_t m0, shift;
    uint32_t ml, mh, v, half_m1, amax;
    int32_t y_zp, lo, hi;
} rq_t;

// One output byte from its accumulator and its channel's (m0, shift) (qlinear_native.c)
uint8_t out_byte(const int32_t *hdr, int64_t acc, int32_t m0, int32_t shift);
// (in the header: the Conv file calls it once per output channel)
static inline void rq_init(rq_t *c, const int32_t *hdr, int32_t m0, int32_t shift) {
    c->hdr = hdr;
    c->m0 = m0;
    c->shift = shift;
    c->ml = (uint32_t)m0 & 0xFFFF;
    c->mh = (uint32_t)m0 >> 16;
    bool fast = m0 > 0 && m0 <= M0_LIMIT && shift >= 17 && shift <= 47;
    c->v = fast ? (uint32_t)shift - 16 : 1;
    c->half_m1 = (1u << (c->v - 1)) - 1;
    c->amax = fast ? (1u << 23) : 0;        // |acc| at or beyond it: out_byte
    c->y_zp = hdr[1];
    c->lo = hdr[2];
    c->hi = hdr[3];
}

// n output bytes from n accumulators (plus base, in wrapping 32-bit arithmetic)
void rq_run(const rq_t *rq, const int32_t *acc, uint32_t base, mp_int_t n, uint8_t *out);

// qlinear_conv's arguments from y on (qconv_native.c unpacks them in this order)
typedef struct {
    mp_int_t y, x, w, bias, req, scratch, n_images, groups, cin_g, cout_g, in_h, in_w, out_h,
             out_w, k_h, k_w, s_h, s_w, d_h, d_w, pad_t, pad_l, x_signed;
} conv_t;
// Output channel mo's requantization (rq) and its accumulators' base: the bias less the
// padding-cancelling part zpc_sum_w = (x_zp + c) * sum w (wrapping 32-bit arithmetic), for
// the Conv paths that sum u = x + c over every tap (conv_patches, conv_direct, conv_dw3x3)
static inline uint32_t conv_channel_rq(rq_t *rq, const conv_t *c, const int32_t *r,
                                       mp_int_t mo, int32_t zpc_sum_w) {
    rq_init(rq, r + c->req, r[c->req + 4 + 2 * mo], r[c->req + 5 + 2 * mo]);
    return (uint32_t)(c->bias >= 0 ? r[c->bias + mo] : 0) - (uint32_t)zpc_sum_w;
}
#define CHUNK 32                // a Conv's outputs summed before they are requantized together
#define PATCH_BYTES 768         // the im2col path's patches (and the depthwise rows) on the stack
// The im2col path (qconv_patches.c): any Conv with K = cin_g * taps <= PATCH_BYTES / 8 and
// four or more output channels per group, x_zp + (128 for int8 inputs) a byte; each plane's
// outputs from the first-th on (row-major)
void conv_patches(const conv_t *c, uint8_t *q, const int32_t *r, const uint8_t *wbuf,
                  uint32_t flip, mp_int_t first);
// The direct path (qconv_direct.c, ARM builds) for those of them with K <= 72: each plane's
// outputs up to the one it returns (all, none, or the rows before the last out_h mod 8 ones)
mp_int_t conv_direct(const conv_t *c, uint8_t *q, int32_t *r, const uint8_t *wbuf,
                     uint32_t flip);

// The module's globals (kept alive by the module object), where fastpath.py sets _pure
extern mp_obj_dict_t *module_globals;
mp_obj_t pure_kernel(qstr name, const mp_obj_t *in);
void unpack_args(const mp_obj_t *in, size_t count, mp_rom_error_text_t wrong_count,
                 bool i_write, mp_buffer_info_t *bufs, mp_int_t *fields);
extern const mp_obj_fun_builtin_var_t qlinear_conv_obj;
extern const mp_obj_fun_builtin_var_t int_gemm_update_obj;   // inttrain_native.c
// inttrain_native.c's requant_narrow (|acc| < 2**29, 0 <= m0 <= 2**24) and update_step
int32_t requant29(int32_t acc, int32_t m0, int32_t shift);
int32_t update_step(int32_t *I, int32_t acc, int32_t m0, int32_t shift, mp_int_t random);
// intgrad_native.c: kernels/intgrad.py's
extern const mp_obj_fun_builtin_var_t int_pool_grad_obj, int_clamp_mask_obj,
    int_clamp_bias_grad_obj, int_conv_grad_input_obj, int_conv_update_obj;
// and the helpers inttrain_native.c shares: fixedpoint.round_shift (half to even), a kernel
// call's ints (I's words returned) and a buffer's bytes
int64_t rshift64(int64_t v, int e);
int32_t *int_fields(const mp_obj_t *in, size_t from, size_t count, size_t total,
                    mp_int_t *f, mp_obj_t **args);
uint8_t *bytes_of(mp_obj_t obj, int flags);
// inttrain_native.c: mp_store_global of its other kernels (int_gemm_grad_input,
// int_conv1x1_update, int_gemm_update_momentum), called by mpy_init
void inttrain_globals(void);

// Eight rows' sums against one weight vector w (stride sw), the rows' bytes interleaved
// (xt[8 * t + lane]), and the weights' sum: acc[0..7], acc[8] (p = [k, sw], k >= 1). On
// ARM qlinear_thumb.S's loop (armv7m: qlinear_thumb2.S's); else qlinear_native.c's C.
void mt_t8(const uint8_t *xt, const uint8_t *w, const int32_t *p, int32_t *acc);

#endif
