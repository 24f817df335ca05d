// Native forms of kernels/reduce.py's reduce_sum (a Gemm's bias gradient, among others) and
// kernels/activation.py's relu and relu_grad, in the float_native module (float_native.c):
// the pure kernels' float32 operations in their order, reading and writing the arena in the
// same sequence.
#include "float_native.h"

#pragma GCC optimize ("Os")

#define REDUCE_BLOCK (64)   // reduce.py's BLOCK: a long row is summed in blocks of 64

// reduce_sum(F, I, args): y, x, d0, d1, d2, sy0, sy1, sy2, ny, scale; Y = scale * the sums
// of X (d0 x d1 x d2, contiguous) over the dimensions whose stride in Y is 0
static mp_obj_t reduce_sum(size_t n_args, const mp_obj_t *in) {
    mp_int_t a[9];
    uint32_t scale, *F;
    mp_int_t len;
    if (!float_args(in, 9, 1, a, &scale, &F, &len)) {
        return pure_kernel(MP_QSTR_reduce_sum, in);
    }
    mp_int_t y = a[0], x = a[1], d0 = a[2], d1 = a[3], d2 = a[4], sy0 = a[5], sy1 = a[6];
    mp_int_t sy2 = a[7], ny = a[8];
    // X's span, Y's ny elements, and the offsets i0 * sy0 + i1 * sy1 + i2 * sy2 the sums
    // land on within them
    int64_t lo = 0, hi = 0;
    const mp_int_t dims[3] = {d0, d1, d2}, strides[3] = {sy0, sy1, sy2};
    for (int k = 0; k < 3; k++) {
        int64_t reach = (int64_t)(dims[k] - 1) * strides[k];
        lo += reach < 0 ? reach : 0;
        hi += reach > 0 ? reach : 0;
    }
    if (d0 <= 0 || d1 <= 0 || d2 <= 0 || lo < 0 || hi >= ny
        || !span_ok(x, d0 * d1, d2, d2, 1, len) || !span_ok(y, ny, 1, 1, 0, len)) {
        return pure_kernel(MP_QSTR_reduce_sum, in);
    }
    for (mp_int_t i = 0; i < ny; i++) {
        F[y + i] = 0;
    }
    for (mp_int_t i0 = 0; i0 < d0; i0++) {
        for (mp_int_t i1 = 0; i1 < d1; i1++) {
            mp_int_t py = y + i0 * sy0 + i1 * sy1;
            if (sy2 == 0) {     // the row in blocks of 64, stored once
                uint32_t s = 0;
                for (mp_int_t left = d2; left > 0; left -= REDUCE_BLOCK) {
                    mp_int_t k = left > REDUCE_BLOCK ? REDUCE_BLOCK : left;
                    uint32_t block = 0;
                    for (mp_int_t t = 0; t < k; t++) {
                        block = f32_add(block, F[x++]);
                    }
                    s = f32_add(s, block);
                }
                F[py] = f32_add(F[py], s);
            } else {
                for (mp_int_t t = 0; t < d2; t++) {
                    F[py] = f32_add(F[py], F[x++]);
                    py += sy2;
                }
            }
        }
    }
    if (scale != 0x3f800000u) {     // scale != 1.0 (a NaN too)
        for (mp_int_t i = 0; i < ny; i++) {
            F[y + i] = f32_mul(F[y + i], scale);
        }
    }
    return mp_const_none;
}
MP_DEFINE_CONST_FUN_OBJ_VAR_BETWEEN(reduce_sum_obj, 3, 3, reduce_sum);

// relu(F, I, args): y, x, n; y = 0.0 if x <= 0.0 else x (a NaN passes through)
static mp_obj_t relu(size_t n_args, const mp_obj_t *in) {
    mp_int_t a[3];
    uint32_t *F;
    mp_int_t len;
    if (!float_args(in, 3, 0, a, NULL, &F, &len) || a[2] < 0
        || !span_ok(a[0], a[2], 1, 1, 0, len) || !span_ok(a[1], a[2], 1, 1, 0, len)) {
        return pure_kernel(MP_QSTR_relu, in);
    }
    for (mp_int_t i = 0; i < a[2]; i++) {
        uint32_t v = F[a[1] + i];
        // v <= 0.0: a zero or a negative number (not a NaN)
        F[a[0] + i] = ((v << 1) == 0 || (v > F32_SIGN && v <= 0xff800000u)) ? 0 : v;
    }
    return mp_const_none;
}
MP_DEFINE_CONST_FUN_OBJ_VAR_BETWEEN(relu_obj, 3, 3, relu);

// relu_grad(F, I, args): dx, dy, y, n; dx = dy where y > 0.0, else 0.0
static mp_obj_t relu_grad(size_t n_args, const mp_obj_t *in) {
    mp_int_t a[4];
    uint32_t *F;
    mp_int_t len;
    if (!float_args(in, 4, 0, a, NULL, &F, &len) || a[3] < 0
        || !span_ok(a[0], a[3], 1, 1, 0, len) || !span_ok(a[1], a[3], 1, 1, 0, len)
        || !span_ok(a[2], a[3], 1, 1, 0, len)) {
        return pure_kernel(MP_QSTR_relu_grad, in);
    }
    for (mp_int_t i = 0; i < a[3]; i++) {
        uint32_t v = F[a[2] + i];
        // v > 0.0: a positive number (not a zero, not a NaN)
        F[a[0] + i] = ((int32_t)v > 0 && v <= 0x7f800000u) ? F[a[1] + i] : 0;
    }
    return mp_const_none;
}
MP_DEFINE_CONST_FUN_OBJ_VAR_BETWEEN(relu_grad_obj, 3, 3, relu_grad);

// largest_abs(F, off, n, worst): the loop of module.py's Module._largest_gradient over one
// gradient buffer (the train call's check that no gradient is NaN or beyond what a float32
// moment or update can hold): the larger of worst and |F[off + i]| for i < n, or the first
// NaN met (returned as read). In bytecode that loop took half of a native digits AdamW step
// (2,300 instructions per gradient element: a boxed float per comparison, and their
// collection). The method calls it for a span inside F and a worst of +0.0 or more (0.0,
// then what the previous buffer gave); anything else is refused.
static mp_obj_t largest_abs(size_t n_args, const mp_obj_t *in) {
    mp_buffer_info_t buf;
    mp_get_buffer_raise(in[0], &buf, MP_BUFFER_READ);
    mp_int_t off = mp_obj_get_int(in[1]), n = mp_obj_get_int(in[2]);
    uint32_t worst = f32_bits(mp_obj_get_float_to_f(in[3]));
    if (buf.typecode != 'f' || off < 0 || n > (mp_int_t)(buf.len / 4) - off
        || worst > 0x7f800000u) {   // (worst below zero, -0.0 or a NaN)
        mp_raise_ValueError(MP_ERROR_TEXT("largest_abs: not a span of an array('f') "
                                          "and a worst >= 0.0"));
    }
    // g fails the loop's test -worst <= g <= worst exactly when |g| > worst or g is a NaN,
    // and then worst = |g| (g is not a zero there): on bits, |g| is g without its sign, and
    // the order of non-negative floats is that of their bits
    const uint32_t *F = (const uint32_t *)buf.buf + off;
    uint32_t w = worst;
    for (mp_int_t i = 0; i < n; i++) {
        uint32_t a = F[i] & ~F32_SIGN;
        if (a > w) {
            if (a > 0x7f800000u) {
                return mp_obj_new_float_from_f(f32_float(F[i]));
            }
            w = a;
        }
    }
    return w == worst ? in[3] : mp_obj_new_float_from_f(f32_float(w));
}
MP_DEFINE_CONST_FUN_OBJ_VAR_BETWEEN(largest_abs_obj, 4, 4, largest_abs);

// load_floats(F, off, values, n): feed.py's copy of a float input into the arena when the
// values are an array('f') of n elements and F[off:off + n] lies in F: what its loop stores
// (each value read as a float and stored back to float32: the same bits, as every value of
// an array('f') is a float32 and passes the loop's range check) in one copy. False for
// anything else: the loop copies and checks. In bytecode that loop cost ~1,500 instructions
// per value (a boxed float per read and per comparison): 0.8 M of a native digits step.
static mp_obj_t load_floats(size_t n_args, const mp_obj_t *in) {
    mp_buffer_info_t f, v;
    mp_int_t off = mp_obj_get_int(in[1]), n = mp_obj_get_int(in[3]);
    if (!mp_get_buffer(in[0], &f, MP_BUFFER_WRITE) || f.typecode != 'f'
        || !mp_get_buffer(in[2], &v, MP_BUFFER_READ) || v.typecode != 'f'
        || n < 0 || (mp_int_t)(v.len / 4) != n || off < 0
        || n > (mp_int_t)(f.len / 4) - off) {
        return mp_const_false;
    }
    uint32_t *to = (uint32_t *)f.buf + off;
    const uint32_t *from = v.buf;
    // (memmove, were the values a view of F itself; no libc to call in a native module)
    if (to < from) {
        for (mp_int_t i = 0; i < n; i++) {
            to[i] = from[i];
        }
    } else {
        for (mp_int_t i = n; i-- > 0;) {
            to[i] = from[i];
        }
    }
    return mp_const_true;
}
MP_DEFINE_CONST_FUN_OBJ_VAR_BETWEEN(load_floats_obj, 4, 4, load_floats);
