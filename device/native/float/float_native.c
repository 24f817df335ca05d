// Native forms of kernels/dense.py's float Gemm kernels (gemm, gemm_accumulate,
// batched_gemm: the forward pass, dX = dY.W and dW = X^T.dY, into an accumulation buffer or
// not), kernels/optim.py's updates (float_optim.c), reduce_sum, relu, relu_grad and the train
// call's gradient check (float_reduce.c), kernels/conv.py's 2-D Conv and its gradients
// (float_conv.c) and kernels/pool.py's max_pool and max_pool_grad (float_pool.c) as a MicroPython dynamic native module
// (an .mpy holding machine code; built by scripts/build_natmod.sh --float with MicroPython
// 1.25's py/dynruntime.mk). kernels/fastpath.py puts them in place of the pure-Python
// kernels when the module imports; those stay the reference.
//
// The same bits as the pure-Python kernels on the same board, whose floats are single
// precision: every product and every sum rounded to float32 in the pure kernel's order
// (s += a * b along k from 0.0, then alpha * s + beta * c), no fused multiply-add
// (-ffp-contract=off). The common case is f32.h's integer arithmetic (normal numbers), the
// rest the compiler's float arithmetic (libgcc's soft float, which MicroPython's floats use
// too; the FPU on an armv7emsp build). Arguments outside what the load-time check passes
// (an index out of the arena, an F that is not an array('f')) go to the pure-Python kernel,
// which the module finds in its global _pure (set by fastpath.py).
//
// Nothing is allocated on the heap.
#include "float_native.h"
#ifdef MT_F32_THUMB2
#include "f32_dot.h"
#endif

mp_obj_dict_t *module_globals;      // not static: mpy_ld cannot relocate static BSS

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

bool float_args(const mp_obj_t *in, size_t n_ints, size_t n_floats, mp_int_t *ints,
                uint32_t *floats, uint32_t **F, mp_int_t *len) {
    size_t count;
    mp_obj_t *a;
    mp_obj_get_array(in[2], &count, &a);
    mp_buffer_info_t buf;
    if (count != n_ints + n_floats || !mp_get_buffer(in[0], &buf, MP_BUFFER_WRITE)
        || buf.typecode != 'f') {
        return false;
    }
    *F = buf.buf;
    *len = buf.len / 4;
    for (size_t i = 0; i < n_ints; i++) {
        ints[i] = mp_obj_get_int(a[i]);
    }
    for (size_t i = 0; i < n_floats; i++) {
        floats[i] = f32_bits(mp_obj_get_float_to_f(a[n_ints + i]));
    }
    return true;
}

bool span_ok(mp_int_t off, mp_int_t n1, mp_int_t s1, mp_int_t n2, mp_int_t s2, mp_int_t len) {
    if (n1 <= 0 || n2 <= 0) {
        return true;
    }
    int64_t d1 = (int64_t)(n1 - 1) * s1, d2 = (int64_t)(n2 - 1) * s2;
    int64_t lo = off + (d1 < 0 ? d1 : 0) + (d2 < 0 ? d2 : 0);
    int64_t hi = off + (d1 > 0 ? d1 : 0) + (d2 > 0 ? d2 : 0);
    return lo >= 0 && hi < len;
}

uint32_t f32_mul_slow(uint32_t x, uint32_t y) {
    return f32_bits(f32_float(x) * f32_float(y));
}

uint32_t f32_add_slow(uint32_t x, uint32_t y) {
    return f32_bits(f32_float(x) + f32_float(y));
}

uint32_t f32_muladd_slow(uint32_t s, uint32_t x, uint32_t y) {
    return f32_add_slow(s, f32_mul_slow(x, y));
}

uint32_t f32_mul(uint32_t x, uint32_t y) {
#if !F32_HARD
    uint32_t p = f32_mul_fast(x, y);
    if (p != 0) {
        return p;
    }
#endif
    return f32_mul_slow(x, y);
}

uint32_t f32_add(uint32_t x, uint32_t y) {
#if !F32_HARD
    if (f32_normal(x) && f32_normal(y)) {
        uint32_t r = f32_add_fast(x, y);
        if (r != F32_NONE) {
            return r;
        }
    }
#endif
    return f32_add_slow(x, y);
}

// (the compiler's subtraction for the rest: its NaN may differ from an addition's)
uint32_t f32_sub(uint32_t x, uint32_t y) {
#if !F32_HARD
    if (f32_normal(x) && f32_normal(y)) {
        uint32_t r = f32_add_fast(x, y ^ F32_SIGN);
        if (r != F32_NONE) {
            return r;
        }
    }
#endif
    return f32_bits(f32_float(x) - f32_float(y));
}

// One product's geometry: Y[m, n] = alpha * A[m, k] B[k, n] (+ beta * C[m, n]), strided
typedef struct {
    mp_int_t y, a, b, c, m, k, n, sa_m, sa_k, sb_k, sb_n, sc_m, sc_n;
} gemm_t;

// The sum over k of A[i, t] * B[t, j] from 0.0, in order (dense.py's inner loop)
static uint32_t dot(const uint32_t *pa, mp_int_t sa, const uint32_t *pb, mp_int_t sb,
                    mp_int_t k) {
    uint32_t s = 0;
    for (; k > 0; k--) {
        s = f32_muladd(s, *pa, *pb);
        pa += sa;
        pb += sb;
    }
    return s;
}

// Y[i, j] = alpha * s (+ beta * C[i, j]), rounded as dense.py's line
// (1.0 * x is x, but for a NaN, whose bits are libgcc's to choose)
static inline uint32_t scaled(uint32_t factor, uint32_t x) {
    if (factor == 0x3f800000u && (x & 0x7fffffffu) <= 0x7f800000u) {
        return x;
    }
    return f32_mul(factor, x);
}

static inline uint32_t out_value(const uint32_t *F, const gemm_t *g, mp_int_t i, mp_int_t j,
                                 uint32_t s, uint32_t alpha, uint32_t beta) {
    uint32_t t = scaled(alpha, s);
    if (g->c >= 0) {
        t = f32_add(t, scaled(beta, F[g->c + i * g->sc_m + j * g->sc_n]));
    }
    return t;
}

// dense._gemm, its arguments checked (span_ok); alpha and beta as bits
static void gemm_simple(uint32_t *F, const gemm_t *g, uint32_t alpha, uint32_t beta) {
    uint32_t *y = F + g->y;
    for (mp_int_t i = 0; i < g->m; i++) {
        const uint32_t *a_row = F + g->a + i * g->sa_m;
        for (mp_int_t j = 0; j < g->n; j++) {
            uint32_t s = dot(a_row, g->sa_k, F + g->b + j * g->sb_n, g->sb_k, g->k);
            *y++ = out_value(F, g, i, j, s, alpha, beta);
        }
    }
}

#ifdef MT_F32_THUMB2
#define ABUF_WORDS (1024)       // 4 KB of stack: rows of A unpacked
#define BBUF_WORDS (256)        // 1 KB: one column of B unpacked (k <= 128)
#define MAX_ROWS (64)           // rows of A a block at most (their sums: 256 B)

// Whether [lo1, hi1] and [lo2, hi2] (element indices) share an element
static bool overlap(int64_t lo1, int64_t hi1, int64_t lo2, int64_t hi2) {
    return lo1 <= hi2 && lo2 <= hi1;
}

static int64_t span_lo(mp_int_t off, mp_int_t n1, mp_int_t s1, mp_int_t n2, mp_int_t s2) {
    int64_t d1 = (int64_t)(n1 - 1) * s1, d2 = (int64_t)(n2 - 1) * s2;
    return off + (d1 < 0 ? d1 : 0) + (d2 < 0 ? d2 : 0);
}

static int64_t span_hi(mp_int_t off, mp_int_t n1, mp_int_t s1, mp_int_t n2, mp_int_t s2) {
    int64_t d1 = (int64_t)(n1 - 1) * s1, d2 = (int64_t)(n2 - 1) * s2;
    return off + (d1 > 0 ? d1 : 0) + (d2 > 0 ? d2 : 0);
}

// dense._gemm with A's rows (a block of them) and B's columns unpacked once for many dot
// products. The operands are read before any output is written, so Y must not overlap A
// or B, nor C unless C is Y element for element (gemm_accumulate): else gemm_simple.
static void gemm_run(uint32_t *F, const gemm_t *g, uint32_t alpha, uint32_t beta) {
    mp_int_t m = g->m, k = g->k, n = g->n;
    if (m <= 0 || n <= 0) {
        return;
    }
    int64_t ylo = g->y, yhi = g->y + (int64_t)m * n - 1;
    bool c_apart = g->c < 0 || (g->c == g->y && g->sc_m == n && g->sc_n == 1)
                   || !overlap(ylo, yhi, span_lo(g->c, m, g->sc_m, n, g->sc_n),
                               span_hi(g->c, m, g->sc_m, n, g->sc_n));
    if (k <= 0 || 2 * k > BBUF_WORDS || !c_apart
        || overlap(ylo, yhi, span_lo(g->a, m, g->sa_m, k, g->sa_k),
                   span_hi(g->a, m, g->sa_m, k, g->sa_k))
        || overlap(ylo, yhi, span_lo(g->b, k, g->sb_k, n, g->sb_n),
                   span_hi(g->b, k, g->sb_k, n, g->sb_n))) {
        gemm_simple(F, g, alpha, beta);
        return;
    }
    uint32_t abuf[ABUF_WORDS], bbuf[BBUF_WORDS], sums[MAX_ROWS];
    mp_int_t rows = ABUF_WORDS / (2 * k) < MAX_ROWS ? ABUF_WORDS / (2 * k) : MAX_ROWS;
    for (mp_int_t i0 = 0; i0 < m; i0 += rows) {
        mp_int_t i1 = i0 + rows < m ? i0 + rows : m;
        for (mp_int_t i = i0; i < i1; i++) {
            unpack_run(abuf + (i - i0) * 2 * k, F + g->a + i * g->sa_m, g->sa_k, k);
        }
        for (mp_int_t j = 0; j < n; j++) {
            const uint32_t *b_col = F + g->b + j * g->sb_n;
            unpack_run(bbuf, b_col, g->sb_k, k);
            fdot_job_t job = {abuf, bbuf, k, i1 - i0, sums, 0, 0};
            dot_rows(&job, F + g->a + i0 * g->sa_m, g->sa_m, g->sa_k, b_col, g->sb_k);
            for (mp_int_t i = i0; i < i1; i++) {
                F[g->y + i * n + j] = out_value(F, g, i, j, sums[i - i0], alpha, beta);
            }
        }
    }
}
#else
#define gemm_run gemm_simple
#endif

// The spans of Y, A, B and C (when c >= 0) lie in F's len elements
static bool gemm_in(const gemm_t *g, mp_int_t len) {
    return (g->m <= 0 || g->n <= 0 || span_ok(g->y, g->m, g->n, g->n, 1, len))
           && (g->n <= 0 || span_ok(g->a, g->m, g->sa_m, g->k, g->sa_k, len))
           && (g->m <= 0 || span_ok(g->b, g->k, g->sb_k, g->n, g->sb_n, len))
           && (g->c < 0 || span_ok(g->c, g->m, g->sc_m, g->n, g->sc_n, len));
}

// gemm(F, I, args): y, a, b, c, m, k, n, sa_m, sa_k, sb_k, sb_n, sc_m, sc_n, alpha, beta
static mp_obj_t gemm(size_t n_args, const mp_obj_t *in) {
    gemm_t g;
    uint32_t f[2], *F;
    mp_int_t len;
    if (!float_args(in, 13, 2, &g.y, f, &F, &len) || !gemm_in(&g, len)) {
        return pure_kernel(MP_QSTR_gemm, in);
    }
    gemm_run(F, &g, f[0], f[1]);
    return mp_const_none;
}
static MP_DEFINE_CONST_FUN_OBJ_VAR_BETWEEN(gemm_obj, 3, 3, gemm);

// gemm_accumulate(F, I, args): y, a, b, reset, m, k, n, sa_m, sa_k, sb_k, sb_n, alpha;
// Y = alpha * A B after a lazy reset (F[reset] != 0, NaN included), else alpha * A B + Y
static mp_obj_t gemm_accumulate(size_t n_args, const mp_obj_t *in) {
    mp_int_t v[11];
    uint32_t alpha, *F;
    mp_int_t len;
    if (!float_args(in, 11, 1, v, &alpha, &F, &len) || v[3] < 0 || v[3] >= len) {
        return pure_kernel(MP_QSTR_gemm_accumulate, in);
    }
    gemm_t g = {v[0], v[1], v[2], (F[v[3]] << 1) != 0 ? -1 : v[0], v[4], v[5], v[6], v[7],
                v[8], v[9], v[10], v[6], 1};
    if (!gemm_in(&g, len)) {
        return pure_kernel(MP_QSTR_gemm_accumulate, in);
    }
    gemm_run(F, &g, alpha, 0x3f800000u);     // beta 1.0
    return mp_const_none;
}
static MP_DEFINE_CONST_FUN_OBJ_VAR_BETWEEN(gemm_accumulate_obj, 3, 3, gemm_accumulate);

// batched_gemm(F, I, args): y, a, b, d0, d1, d2, sa0, sa1, sa2, sb0, sb1, sb2, m, k, n,
// sa_m, sa_k, sb_k, sb_n, alpha; Y[i] = alpha * A[i] B[i] over the batch indices, Y
// contiguous
static mp_obj_t batched_gemm(size_t n_args, const mp_obj_t *in) {
    mp_int_t v[19];
    uint32_t alpha, *F;
    mp_int_t len;
    if (!float_args(in, 19, 1, v, &alpha, &F, &len)) {
        return pure_kernel(MP_QSTR_batched_gemm, in);
    }
    mp_int_t d0 = v[3], d1 = v[4], d2 = v[5];
    gemm_t g = {v[0], 0, 0, -1, v[12], v[13], v[14], v[15], v[16], v[17], v[18], 0, 0};
    // every matrix's spans: check the corners of the batch (strides may be negative)
    for (mp_int_t c = 0; c < 8; c++) {
        mp_int_t i0 = c & 1 ? d0 - 1 : 0, i1 = c & 2 ? d1 - 1 : 0, i2 = c & 4 ? d2 - 1 : 0;
        g.y = v[0] + ((i0 * d1 + i1) * d2 + i2) * g.m * g.n;
        g.a = v[1] + i0 * v[6] + i1 * v[7] + i2 * v[8];
        g.b = v[2] + i0 * v[9] + i1 * v[10] + i2 * v[11];
        if (d0 > 0 && d1 > 0 && d2 > 0 && !gemm_in(&g, len)) {
            return pure_kernel(MP_QSTR_batched_gemm, in);
        }
    }
    g.y = v[0];
    for (mp_int_t i0 = 0; i0 < d0; i0++) {
        for (mp_int_t i1 = 0; i1 < d1; i1++) {
            g.a = v[1] + i0 * v[6] + i1 * v[7];
            g.b = v[2] + i0 * v[9] + i1 * v[10];
            for (mp_int_t i2 = 0; i2 < d2; i2++) {
                gemm_run(F, &g, alpha, 0);
                g.y += g.m * g.n;
                g.a += v[8];
                g.b += v[11];
            }
        }
    }
    return mp_const_none;
}
static MP_DEFINE_CONST_FUN_OBJ_VAR_BETWEEN(batched_gemm_obj, 3, 3, batched_gemm);

mp_obj_t mpy_init(mp_obj_fun_bc_t *self, size_t n_args, size_t n_kw, mp_obj_t *args) {
    // A build whose float ABI is not the firmware's (an armv6m or armv7m build, soft float,
    // on an FPU board's hard-float firmware: MicroPython loads it, older ARM code being
    // allowed) would hand every float to the firmware's functions in the wrong registers
    // (on the emulated Cortex-M4F every digits loss came out ln 10). One round trip through
    // them tells; refused here, before the globals swap, the import raises ValueError and
    // kernels/fastpath.py keeps the pure-Python kernels.
    // (compared as bits: no float compare linked for it)
    if (f32_bits(mp_obj_get_float_to_f(mp_obj_new_float_from_f(1.5f))) != 0x3fc00000u
        || f32_bits(mp_obj_get_float_to_f(mp_obj_new_float_from_f(-0.375f))) != 0xbec00000u) {
        mp_raise_ValueError(MP_ERROR_TEXT("float_native: float ABI not the firmware's"));
    }
    MP_DYNRUNTIME_INIT_ENTRY
    module_globals = self->context->module.globals;
    mp_store_global(MP_QSTR_gemm, MP_OBJ_FROM_PTR(&gemm_obj));
    mp_store_global(MP_QSTR_gemm_accumulate, MP_OBJ_FROM_PTR(&gemm_accumulate_obj));
    mp_store_global(MP_QSTR_batched_gemm, MP_OBJ_FROM_PTR(&batched_gemm_obj));
    mp_store_global(MP_QSTR_sgd, MP_OBJ_FROM_PTR(&sgd_obj));
    mp_store_global(MP_QSTR_adamw, MP_OBJ_FROM_PTR(&adamw_obj));
    mp_store_global(MP_QSTR_sgd_general, MP_OBJ_FROM_PTR(&sgd_general_obj));
    mp_store_global(MP_QSTR_adamw_general, MP_OBJ_FROM_PTR(&adamw_general_obj));
    mp_store_global(MP_QSTR_accumulate, MP_OBJ_FROM_PTR(&accumulate_obj));
    mp_store_global(MP_QSTR_reduce_sum, MP_OBJ_FROM_PTR(&reduce_sum_obj));
    mp_store_global(MP_QSTR_relu, MP_OBJ_FROM_PTR(&relu_obj));
    mp_store_global(MP_QSTR_relu_grad, MP_OBJ_FROM_PTR(&relu_grad_obj));
    mp_store_global(MP_QSTR_largest_abs, MP_OBJ_FROM_PTR(&largest_abs_obj));
    mp_store_global(MP_QSTR_load_floats, MP_OBJ_FROM_PTR(&load_floats_obj));
    mp_store_global(MP_QSTR_conv, MP_OBJ_FROM_PTR(&conv_obj));
    mp_store_global(MP_QSTR_conv_grad_input, MP_OBJ_FROM_PTR(&conv_grad_input_obj));
    mp_store_global(MP_QSTR_conv_grad_weight, MP_OBJ_FROM_PTR(&conv_grad_weight_obj));
    mp_store_global(MP_QSTR_max_pool, MP_OBJ_FROM_PTR(&max_pool_obj));
    mp_store_global(MP_QSTR_max_pool_grad, MP_OBJ_FROM_PTR(&max_pool_grad_obj));
    mp_store_global(MP_QSTR__pure, mp_const_none);   // set by kernels/fastpath.py
    MP_DYNRUNTIME_INIT_EXIT
}
