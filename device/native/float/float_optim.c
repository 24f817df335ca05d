// Native forms of kernels/optim.py's float updates (sgd, sgd_general, adamw, adamw_general)
// and its gradient accumulation (accumulate), in the float_native module (float_native.c):
// the pure kernels' operations, in their order, each rounded to float32 as MicroPython's
// single-precision floats round them (f32.h's fast paths, the compiler's float arithmetic
// for the rest; sqrt correctly rounded, as MicroPython's math.sqrt), reading and writing
// the arena in the same sequence. An element whose update would store an infinity or a NaN
// is left as it was and counted in kernels/optim.py's `refused`, as there.
#include "float_native.h"

// Not the Gemm's inner loop: small code (the module's machine code takes heap) over speed
#pragma GCC optimize ("Os")

#define ONE (0x3f800000u)
#define INF (0x7f800000u)

// -inf < x < inf
static inline bool finite(uint32_t x) {
    return (x & 0x7fffffffu) < INF;
}

// x < inf (NaN: false)
static inline bool below_inf(uint32_t x) {
    return x < INF || (x >= F32_SIGN && x <= (F32_SIGN | INF));
}

// x > 0.0 and x < 0.0 as float comparisons (NaN: neither)
static inline bool positive(uint32_t x) {
    return (int32_t)x > 0 && x <= INF;
}

static inline bool negative(uint32_t x) {
    return x > F32_SIGN && x <= (F32_SIGN | INF);
}

// The parameter, gradient and state spans of an update (n elements from each offset) and
// the single elements lie in F's len elements
static bool in_arena(const mp_int_t *spans, size_t n_spans, const mp_int_t *singles,
                     size_t n_singles, mp_int_t n, mp_int_t len) {
    for (size_t i = 0; i < n_spans; i++) {
        if (n > 0 && !span_ok(spans[i], n, 1, 1, 0, len)) {
            return false;
        }
    }
    for (size_t i = 0; i < n_singles; i++) {
        if (singles[i] < 0 || singles[i] >= len) {
            return false;
        }
    }
    return n >= 0;
}

// kernels/optim.py's `refused` += count: its globals are those of its pure kernels, which
// fastpath.py gave this module (_pure); storing a small int allocates nothing
static void count_refused(qstr kernel, mp_int_t count) {
    mp_obj_t pure = mp_obj_subscr(MP_OBJ_FROM_PTR(module_globals),
                                  MP_OBJ_NEW_QSTR(MP_QSTR__pure), MP_OBJ_SENTINEL);
    if (pure == mp_const_none) {
        return;
    }
    mp_obj_fun_bc_t *f = MP_OBJ_TO_PTR(mp_obj_subscr(pure, MP_OBJ_NEW_QSTR(kernel),
                                                     MP_OBJ_SENTINEL));
    mp_obj_t g = MP_OBJ_FROM_PTR(f->context->module.globals);
    mp_obj_t key = MP_OBJ_NEW_QSTR(MP_QSTR_refused);
    mp_obj_t old = mp_obj_subscr(g, key, MP_OBJ_SENTINEL);
    mp_obj_subscr(g, key, MP_OBJ_NEW_SMALL_INT(MP_OBJ_SMALL_INT_VALUE(old) + count));
}

// x's penalty term l1 * sign(x): l1, -l1 or 0.0 (optim.py's conditional expression)
static inline uint32_t l1_term(uint32_t x, uint32_t l1) {
    return positive(x) ? l1 : (negative(x) ? l1 ^ F32_SIGN : 0);
}

// sgd(F, I, args): p, g, lr, n; p -= lr * g
static mp_obj_t sgd(size_t n_args, const mp_obj_t *in) {
    mp_int_t v[4];
    uint32_t *F;
    mp_int_t len;
    if (!float_args(in, 4, 0, v, NULL, &F, &len)
        || !in_arena(v, 2, v + 2, 1, v[3], len)) {
        return pure_kernel(MP_QSTR_sgd, in);
    }
    uint32_t *p = F + v[0];
    const uint32_t *g = F + v[1];
    uint32_t rate = F[v[2]];
    mp_int_t refused = 0;
    for (mp_int_t i = 0; i < v[3]; i++) {
        uint32_t x = p[i];
        p[i] = f32_sub(x, f32_mul(rate, g[i]));
        if (!finite(p[i])) {
            p[i] = x;
            refused++;
        }
    }
    if (refused) {
        count_refused(MP_QSTR_sgd, refused);
    }
    return mp_const_none;
}
MP_DEFINE_CONST_FUN_OBJ_VAR_BETWEEN(sgd_obj, 3, 3, sgd);

// One AdamW element (optim.py's adamw and adamw_general after their gradient): m, v, p
// written, true when kept (else all three back as they were)
static inline bool adamw_step(uint32_t *F, mp_int_t p, mp_int_t m, mp_int_t v, uint32_t grad,
                              uint32_t x, uint32_t old_m, uint32_t old_v, const uint32_t *k) {
    // k: beta1, beta2, eps, c1, c2, size, decay
    F[m] = f32_add(f32_mul(k[0], old_m), f32_mul(k[3], grad));
    F[v] = f32_add(f32_mul(k[1], old_v), f32_mul(f32_mul(k[4], grad), grad));
    uint32_t s = F[v];
    // s >= 0.0 (-0.0 included) or NaN
    uint32_t root = (s <= INF || s == F32_SIGN) ? f32_sqrt(s) : 0x7fc00000u;
    F[p] = f32_mul(f32_sub(x, f32_div(f32_mul(k[5], F[m]), f32_add(root, k[2]))), k[6]);
    if (!(finite(F[p]) && finite(F[m]) && below_inf(s))) {
        F[p] = x;
        F[m] = old_m;
        F[v] = old_v;
        return false;
    }
    return true;
}

// adamw(F, I, args): p, g, m, v, lr, step_size, n, beta1, beta2, eps, weight_decay
static mp_obj_t adamw(size_t n_args, const mp_obj_t *in) {
    mp_int_t a[7];
    uint32_t f[4], *F;
    mp_int_t len;
    if (!float_args(in, 7, 4, a, f, &F, &len) || !in_arena(a, 4, a + 4, 2, a[6], len)) {
        return pure_kernel(MP_QSTR_adamw, in);
    }
    uint32_t k[7] = {f[0], f[1], f[2], f32_sub(ONE, f[0]), f32_sub(ONE, f[1]), F[a[5]],
                     f32_sub(ONE, f32_mul(F[a[4]], f[3]))};
    mp_int_t refused = 0;
    for (mp_int_t i = 0; i < a[6]; i++) {
        uint32_t grad = F[a[1] + i];
        refused += !adamw_step(F, a[0] + i, a[2] + i, a[3] + i, grad, F[a[0] + i],
                               F[a[2] + i], F[a[3] + i], k);
    }
    if (refused) {
        count_refused(MP_QSTR_adamw, refused);
    }
    return mp_const_none;
}
MP_DEFINE_CONST_FUN_OBJ_VAR_BETWEEN(adamw_obj, 3, 3, adamw);

// (g + 2 * l2 * x + l1 * sign(x)) * c: the general forms' gradient
static inline uint32_t general_grad(uint32_t g, uint32_t x, uint32_t two_l2, uint32_t l1,
                                    uint32_t c) {
    return f32_mul(f32_add(f32_add(g, f32_mul(two_l2, x)), l1_term(x, l1)), c);
}

// adamw_general(F, I, args): p, g, m, v, lr, step_size, coef, n, beta1, beta2, eps,
// weight_decay, l1, l2
static mp_obj_t adamw_general(size_t n_args, const mp_obj_t *in) {
    mp_int_t a[8];
    uint32_t f[6], *F;
    mp_int_t len;
    mp_int_t singles[3] = {0, 0, 0};
    bool ok = float_args(in, 8, 6, a, f, &F, &len);
    if (ok) {
        singles[0] = a[4];
        singles[1] = a[5];
        singles[2] = a[6] >= 0 ? a[6] : 0;
    }
    if (!ok || !in_arena(a, 4, singles, 3, a[7], len)) {
        return pure_kernel(MP_QSTR_adamw_general, in);
    }
    uint32_t k[7] = {f[0], f[1], f[2], f32_sub(ONE, f[0]), f32_sub(ONE, f[1]), F[a[5]],
                     f32_sub(ONE, f32_mul(F[a[4]], f[3]))};
    uint32_t c = a[6] >= 0 ? F[a[6]] : ONE;
    uint32_t two_l2 = f32_mul(0x40000000u, f[5]), l1 = f[4];
    mp_int_t refused = 0;
    for (mp_int_t i = 0; i < a[7]; i++) {
        uint32_t x = F[a[0] + i], old_m = F[a[2] + i], old_v = F[a[3] + i];
        uint32_t grad = general_grad(F[a[1] + i], x, two_l2, l1, c);
        refused += !adamw_step(F, a[0] + i, a[2] + i, a[3] + i, grad, x, old_m, old_v, k);
    }
    if (refused) {
        count_refused(MP_QSTR_adamw_general, refused);
    }
    return mp_const_none;
}
MP_DEFINE_CONST_FUN_OBJ_VAR_BETWEEN(adamw_general_obj, 3, 3, adamw_general);

// sgd_general(F, I, args): p, g, lr, step, buf, coef, n, nesterov, momentum, dampening,
// weight_decay, l1, l2
static mp_obj_t sgd_general(size_t n_args, const mp_obj_t *in) {
    mp_int_t a[8];
    uint32_t f[5], *F;
    mp_int_t len;
    bool ok = float_args(in, 8, 5, a, f, &F, &len);
    mp_int_t p = a[0], g = a[1], buf = a[4], coef = a[5], n = a[6];
    mp_int_t spans[3] = {p, g, buf >= 0 ? buf : p};
    mp_int_t singles[3] = {a[2], buf >= 0 ? a[3] : a[2], coef >= 0 ? coef : a[2]};
    if (!ok || !in_arena(spans, 3, singles, 3, n, len)) {
        return pure_kernel(MP_QSTR_sgd_general, in);
    }
    uint32_t momentum = f[0], dampening = f[1], weight_decay = f[2], l1 = f[3];
    uint32_t rate = F[a[2]];
    uint32_t c = coef >= 0 ? F[coef] : ONE;
    uint32_t two_l2 = f32_mul(0x40000000u, f[4]);
    mp_int_t refused = 0;
    if (buf < 0) {
        for (mp_int_t i = 0; i < n; i++) {
            uint32_t x = F[p + i];
            uint32_t d = general_grad(F[g + i], x, two_l2, l1, c);
            F[p + i] = f32_sub(x, f32_mul(rate, f32_add(d, f32_mul(weight_decay, x))));
            if (!finite(F[p + i])) {
                F[p + i] = x;
                refused++;
            }
        }
    } else {
        // the first step (F[step] == 1.0): buf = d, i.e. 0 * buf + 1 * d
        bool first = F[a[3]] == ONE;
        uint32_t keep = first ? 0 : momentum;
        uint32_t take = first ? ONE : f32_sub(ONE, dampening);
        for (mp_int_t i = 0; i < n; i++) {
            uint32_t x = F[p + i];
            uint32_t d = general_grad(F[g + i], x, two_l2, l1, c);
            d = f32_add(d, f32_mul(weight_decay, x));
            uint32_t old_b = F[buf + i];
            uint32_t b = f32_add(f32_mul(keep, old_b), f32_mul(take, d));
            F[buf + i] = b;
            F[p + i] = f32_sub(x, f32_mul(rate, a[7] ? f32_add(d, f32_mul(momentum, b)) : b));
            if (!(finite(F[p + i]) && finite(F[buf + i]))) {
                F[p + i] = x;
                F[buf + i] = old_b;
                refused++;
            }
        }
    }
    if (refused) {
        count_refused(MP_QSTR_sgd_general, refused);
    }
    return mp_const_none;
}
MP_DEFINE_CONST_FUN_OBJ_VAR_BETWEEN(sgd_general_obj, 3, 3, sgd_general);

// accumulate(F, I, args): buf, value, reset, n; buf = value after a lazy reset (F[reset]
// != 0.0), else buf + value
static mp_obj_t accumulate(size_t n_args, const mp_obj_t *in) {
    mp_int_t a[4];
    uint32_t *F;
    mp_int_t len;
    if (!float_args(in, 4, 0, a, NULL, &F, &len) || !in_arena(a, 2, a + 2, 1, a[3], len)) {
        return pure_kernel(MP_QSTR_accumulate, in);
    }
    uint32_t *buf = F + a[0];
    const uint32_t *value = F + a[1];
    if ((F[a[2]] << 1) != 0) {
        for (mp_int_t i = 0; i < a[3]; i++) {
            buf[i] = value[i];
        }
    } else {
        for (mp_int_t i = 0; i < a[3]; i++) {
            buf[i] = f32_add(buf[i], value[i]);
        }
    }
    return mp_const_none;
}
MP_DEFINE_CONST_FUN_OBJ_VAR_BETWEEN(accumulate_obj, 3, 3, accumulate);
