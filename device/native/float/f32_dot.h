// The float Gemm's dot products on armv7m (float_native.c; tests/native/f32_check_arm.c):
// f32_thumb2.S's loop over terms unpacked once, and the terms it leaves done by f32.h.
#ifndef MT_F32_DOT_H
#define MT_F32_DOT_H
#include <stdint.h>
#include "f32.h"

// A column's dot products with rows of A for f32_thumb2.S's mt_fdot_rows (see there)
typedef struct {
    const uint32_t *a;      // the current row's unpacked terms (rows 8k bytes apart)
    const uint32_t *b;      // the column's unpacked terms
    int32_t k;
    int32_t rows;           // rows left, the current one included
    uint32_t *out;          // the current row's sum goes here
    int32_t t;              // terms of the current row done
    uint32_t s;             // their sum's bits
} fdot_job_t;

int mt_fdot_rows(fdot_job_t *job);

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

// out[i] = the sum from 0.0 of the k terms of row i (rows of them, ua 2k words apart) and
// ub: mt_fdot_rows, and f32_muladd for the terms it leaves (ra, rb: the terms' float bits;
// row i's term t at ra[i * sa_row + t * sa], rb[t * sb])
static void dot_rows(fdot_job_t *job, const uint32_t *ra, intptr_t sa_row, intptr_t sa,
                     const uint32_t *rb, intptr_t sb) {
    uint32_t *out0 = job->out;
    job->t = 0;
    job->s = 0;
    while (mt_fdot_rows(job)) {
        intptr_t i = job->out - out0, t = job->t, k = job->k;
        uint32_t s = job->s;
        do {    // until the sum is one the loop takes again: normal or zero
            s = f32_muladd(s, ra[i * sa_row + t * sa], rb[t * sb]);
            t++;
        } while (t < k && !f32_normal(s) && (s << 1) != 0);
        job->t = t;
        job->s = s;
    }
}
#endif
