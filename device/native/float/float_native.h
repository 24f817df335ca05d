// What float_native.c (the dense kernels, the module), float_optim.c (the optimizer's
// updates), float_reduce.c (reduce_sum, relu, the gradient check), float_conv.c (the
// 2-D Conv and its gradients) and float_pool.c (max_pool and its gradient) share: one dynamic
// native module built from them (device/native/float/Makefile).
#ifndef MT_FLOAT_NATIVE_H
#define MT_FLOAT_NATIVE_H
#include "py/dynruntime.h"
#include "f32.h"

// The module's globals (kept alive by the module object), where fastpath.py sets _pure
extern mp_obj_dict_t *module_globals;
// The pure-Python kernel `name` called on the call's arguments (F, I, args)
mp_obj_t pure_kernel(qstr name, const mp_obj_t *in);

// A kernel call's arguments (F, I, args): args must hold n_ints integers then n_floats
// floats (Python floats, single precision on the boards this module is for); F must be an
// array('f'), whose elements and count are returned. False when they are not (the caller
// hands the call to the pure-Python kernel, which raises as it always did).
bool float_args(const mp_obj_t *in, size_t n_ints, size_t n_floats, mp_int_t *ints,
                uint32_t *floats, uint32_t **F, mp_int_t *len);

// Whether off + i * s1 + j * s2 for all 0 <= i < n1, 0 <= j < n2 lies in [0, len) (nothing
// is read for n1 or n2 <= 0)
bool span_ok(mp_int_t off, mp_int_t n1, mp_int_t s1, mp_int_t n2, mp_int_t s2, mp_int_t len);

// One operation with the compiler's float arithmetic (libgcc's soft float, or the FPU on
// an armv7emsp build), on bits: the reference each fast path falls back to
uint32_t f32_mul_slow(uint32_t x, uint32_t y);
uint32_t f32_add_slow(uint32_t x, uint32_t y);

// x * y, x + y and x - y rounded as the compiler's float arithmetic: f32.h's fast paths,
// then the slow ones (out of line: the optimizer's kernels call them many times over)
uint32_t f32_mul(uint32_t x, uint32_t y);
uint32_t f32_add(uint32_t x, uint32_t y);
uint32_t f32_sub(uint32_t x, uint32_t y);

// float_optim.c's and float_reduce.c's kernels
extern const mp_obj_fun_builtin_var_t sgd_obj, adamw_obj, sgd_general_obj,
    adamw_general_obj, accumulate_obj, reduce_sum_obj, relu_obj, relu_grad_obj,
    largest_abs_obj, load_floats_obj;
// float_conv.c's helpers, float_pool.c's too: n / d for d > 0 by shift and subtract (armv6m
// has no divide instruction; a few divisions per tap or window need no libgcc); whether
// 0 <= off and off + n <= len (n >= 0); the product of five factors in [1, 2**15], or
// len + 1 once it passes len (no overflow)
uint32_t mt_udiv(uint32_t n, uint32_t d);
bool mt_inside(mp_int_t off, int64_t n, mp_int_t len);
int64_t mt_product(const mp_int_t *f, mp_int_t len);

// float_conv.c's and float_pool.c's kernels
extern const mp_obj_fun_builtin_var_t max_pool_obj, max_pool_grad_obj;
extern const mp_obj_fun_builtin_var_t conv_obj, conv_grad_input_obj, conv_grad_weight_obj;
#endif
