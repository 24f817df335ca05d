// The float Gemm's dot products on armv7m (float_native.c; tests/native/f32_check_arm.c):
// f32_thumb2.S's loop over terms unpacked once, and the terms it leaves done by f32.h.
#ifndef MT_F32_DOT_H
#define MT_F32_DOT_H
#include <stdint.h>
#include "f32.h"

// f32_thumb2.S: the sum of unpacked terms, from *s (normal), until one it leaves
uint32_t mt_fdot(const uint32_t *a, const uint32_t *b, int32_t k, uint32_t *s);

// n terms src[0], src[stride], ... unpacked for mt_fdot: the significand with its leading
// 1 at bit 31, then sign | exponent + 2**29 - 64, or sign | a special's sentinel
static void unpack_run(uint32_t *dst, const uint32_t *src, intptr_t stride, intptr_t n) {
    for (; n > 0; n--) {
        uint32_t x = *src;
        uint32_t e = (x >> 23) & 0xff;
        dst[0] = (x << 8) | F32_SIGN;
        if (e - 1u <= 253u) {
            dst[1] = (x & F32_SIGN) | (e + 0x1fffffc0u);
        } else {
            dst[1] = (x & F32_SIGN) | ((x << 1) == 0 ? 0x40000000u
                                       : e == 0 ? 0x48000000u : 0x50000000u);
        }
        src += stride;
        dst += 2;
    }
}

// The sum of k terms from 0.0: mt_fdot while the sum is normal, f32_muladd for the terms
// it leaves (ra, rb: the terms' float bits, with their strides)
static uint32_t dot_unpacked(const uint32_t *ua, const uint32_t *ub, const uint32_t *ra,
                             intptr_t sa, const uint32_t *rb, intptr_t sb, intptr_t k) {
    uint32_t s = 0;
    intptr_t t = 0;
    while (t < k) {
        if (f32_normal(s)) {
            t += mt_fdot(ua + 2 * t, ub + 2 * t, k - t, &s);
            if (t >= k) {
                break;
            }
        }
        s = f32_muladd(s, ra[t * sa], rb[t * sb]);
        t++;
    }
    return s;
}
#endif
