// Host check of device/native/float/f32.h (tests/test_float_native.py builds and runs it):
// each fast path, the division and the square root against the host's hardware
// single-precision arithmetic (x86-64 SSE:
// IEEE 754 binary32, round to nearest even, no excess precision; -ffp-contract=off), on
// random operands of several magnitudes, operands built to make ties, cancellations and
// carries, and the special values. Prints "cases N mismatches M fast F".
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#include "f32.h"

uint32_t f32_muladd_slow(uint32_t s, uint32_t x, uint32_t y) {
    volatile float p = f32_float(x) * f32_float(y);
    volatile float r = f32_float(s) + p;
    return f32_bits(r);
}

static uint64_t state = 88172645463325252ull;
static uint32_t rnd(void) {         // xorshift64
    state ^= state << 13;
    state ^= state >> 7;
    state ^= state << 17;
    return (uint32_t)(state >> 32);
}

static const uint32_t SPECIAL[] = {0, F32_SIGN, 0x7f800000u, 0xff800000u, 0x7fc00000u,
                                   0x00000001u, 0x007fffffu, 0x00800000u, 0x7f7fffffu,
                                   0x3f800000u, 0xbf800000u, 0x3f7fffffu, 0x3f800001u};

// a random binary32 of a kind: any bits, a moderate exponent, near 1, special
static uint32_t draw(int kind, uint32_t base) {
    uint32_t r = rnd();
    switch (kind % 8) {
    case 0: return r;                                           // anything
    case 1: return (r & 0x807fffffu) | ((100 + (rnd() % 56)) << 23);  // 2**-27 .. 2**28
    case 2: return (r & 0x807fffffu) | ((120 + (rnd() % 16)) << 23);  // near 1
    case 3: return SPECIAL[r % (sizeof SPECIAL / sizeof SPECIAL[0])] ^ (rnd() & F32_SIGN);
    case 4: return (r & 0x80000000u) | (rnd() % 3 == 0 ? 0 : (r & 0x7f800000u)) | (r & 7);
    case 5: return (base ^ (r & F32_SIGN)) + (int32_t)(rnd() % 5) - 2;   // near -base, base
    case 6: return (r & (r & 1 ? 0x807f0000u : 0x807ff800u))       // short significands:
                   | ((110 + (rnd() % 36)) << 23);                   // exact or tied products
    default: return (r & 0x80000000u) | ((r % 3 ? 1 + rnd() % 30 : 225 + rnd() % 30) << 23)
                        | (rnd() & 0x7fffffu);                      // near under/overflow
    }
}

static int same(uint32_t a, uint32_t b) {
    // NaNs are compared as NaNs only by the slow path, which is the reference itself
    return a == b;
}

int main(int argc, char **argv) {
    long n = argc > 1 ? atol(argv[1]) : 1000000;
    long mismatches = 0, fast = 0;
    for (long i = 0; i < n; i++) {
        uint32_t x = draw(rnd(), 0), y = draw(rnd(), x);
        uint32_t s = draw(rnd(), x);
        // the multiply alone
        uint32_t p = f32_mul_fast(x, y);
        volatile float pf = f32_float(x) * f32_float(y);
        if (p != 0) {
            fast++;
            if (!same(p, f32_bits(pf))) {
                if (mismatches++ < 10) {
                    printf("mul %08x %08x: %08x want %08x\n", x, y, p, f32_bits(pf));
                }
            }
        }
        // the add alone (normal operands), and s + p for a p close to -s (cancellation)
        for (int t = 0; t < 2; t++) {
            uint32_t a = t ? s : x, b = t ? draw(5, s) : y;
            if (f32_normal(a) && f32_normal(b)) {
                uint32_t r = f32_add_fast(a, b);
                volatile float rf = f32_float(a) + f32_float(b);
                if (r != F32_NONE) {
                    fast++;
                    if (!same(r, f32_bits(rf))) {
                        if (mismatches++ < 10) {
                            printf("add %08x %08x: %08x want %08x\n", a, b, r, f32_bits(rf));
                        }
                    }
                }
            }
        }
        // the division (every case but a NaN's bits) and the square root
        uint32_t q = f32_div(x, y);
        volatile float qf = f32_float(x) / f32_float(y);
        fast++;
        int q_nan = (q & 0x7fffffffu) > 0x7f800000u;
        if (q_nan ? !((f32_bits(qf) & 0x7fffffffu) > 0x7f800000u) : !same(q, f32_bits(qf))) {
            if (mismatches++ < 10) {
                printf("div %08x %08x: %08x want %08x\n", x, y, q, f32_bits(qf));
            }
        }
        uint32_t ax = x & 0x7fffffffu;
        if (ax <= 0x7f800000u) {
            uint32_t r = f32_sqrt(ax);
            volatile float rf = sqrtf(f32_float(ax));
            if (!same(r, f32_bits(rf))) {
                if (mismatches++ < 10) {
                    printf("sqrt %08x: %08x want %08x\n", ax, r, f32_bits(rf));
                }
            }
        }
        // the multiply-add
        uint32_t m = f32_muladd(s, x, y);
        uint32_t want = f32_muladd_slow(s, x, y);
        if (!same(m, want) && !((m & 0x7fffffffu) > 0x7f800000u
                                 && (want & 0x7fffffffu) > 0x7f800000u)) {
            if (mismatches++ < 10) {
                printf("muladd %08x %08x %08x: %08x want %08x\n", s, x, y, m, want);
            }
        }
    }
    printf("cases %ld mismatches %ld fast %ld\n", n, mismatches, fast);
    return mismatches != 0;
}
