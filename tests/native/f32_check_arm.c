// Bare-metal check of device/native/float/f32_thumb2.S (mt_fdot, through f32_dot.h's
// dot_unpacked, as float_native.c calls it) on the emulated Cortex-M3 (qemu mps2-an385,
// semihosting): dot products of random runs against the same sums done with the compiler's
// float arithmetic (libgcc's soft float, which MicroPython's floats use on this core), bit
// for bit. tests/test_float_native.py builds and runs it. Prints "dots N terms T
// mismatches M", then exits.
#include <stdint.h>
#include "f32_dot.h"

uint32_t f32_muladd_slow(uint32_t s, uint32_t x, uint32_t y) {
    return f32_bits(f32_float(s) + f32_float(x) * f32_float(y));
}

// semihosting: SYS_WRITE0 (0x04), SYS_EXIT (0x18)
static void semihost(int op, const void *arg) {
    register int r0 __asm__("r0") = op;
    register const void *r1 __asm__("r1") = arg;
    __asm__ volatile ("bkpt 0xab" : "+r"(r0) : "r"(r1) : "memory");
}

static void put(const char *s) {
    semihost(0x04, s);
}

static void put_num(const char *label, uint32_t v) {
    char buf[16];
    int i = 15;
    buf[i] = 0;
    do {
        buf[--i] = '0' + v % 10;
        v /= 10;
    } while (v);
    put(label);
    put(buf + i);
}

static void put_hex(uint32_t v) {
    char buf[10];
    for (int i = 0; i < 8; i++) {
        buf[i] = "0123456789abcdef"[(v >> (28 - 4 * i)) & 15];
    }
    buf[8] = ' ';
    buf[9] = 0;
    put(buf);
}

static uint32_t state = 2463534242u;
static uint32_t rnd(void) {         // xorshift32
    state ^= state << 13;
    state ^= state >> 17;
    state ^= state << 5;
    return state;
}

// one term: a normal number of magnitude about 2**scale with a full or a short significand
// (short: exact products and sums, so ties), or a special: +-0, a subnormal, inf, NaN
static uint32_t draw(uint32_t mode, int scale) {
    uint32_t r = rnd();
    int e = 127 + scale + (int)(rnd() % 9) - 4;
    e = e < 1 ? 1 : e > 254 ? 254 : e;
    uint32_t mask = mode == 1 ? (rnd() % 2 ? 0x807f0000u : 0x807ffc00u) : 0x807fffffu;
    if (mode == 3 && rnd() % 4 == 0) {
        switch (rnd() % 4) {
        case 0: return r & F32_SIGN;                                // +-0
        case 1: return r & 0x807fffffu;                             // subnormal (or 0)
        case 2: return (r & F32_SIGN) | 0x7f800000u;                // +-inf
        default: return r | 0x7f800001u;                            // NaN
        }
    }
    if (mode == 4 && rnd() % 3 == 0) {
        return r & F32_SIGN;                                        // zeros, as after a ReLU
    }
    return (r & mask) | ((uint32_t)e << 23);
}

#define KMAX 128
#define ROWS 3
static uint32_t ra[ROWS * KMAX], rb[KMAX], ua[ROWS * 2 * KMAX], ub[2 * KMAX], sums[ROWS];

int main(void) {
    uint32_t dots = 0, terms = 0, mismatches = 0;
    for (uint32_t trial = 0; trial < 60000; trial++) {
        int k = 1 + rnd() % (trial % 4 == 0 ? KMAX : 24);
        // modes: 0 full significands, 1 short ones (ties), 2 cancellations, 3 specials,
        // 4 zeros; magnitudes moderate, or products near the underflow or overflow
        uint32_t mode = rnd() % 5;
        int scale_a = (int)(rnd() % 60) - 30, scale_b = (int)(rnd() % 60) - 30;
        uint32_t range = rnd() % 8;
        if (range == 0) {
            scale_a = -60 - (int)(rnd() % 8);
            scale_b = -60 - (int)(rnd() % 8);
        } else if (range == 1) {
            scale_a = 60 + (int)(rnd() % 6);
            scale_b = 60 + (int)(rnd() % 6);
        }
        int rows = 1 + rnd() % ROWS;
        for (int t = 0; t < k; t++) {
            rb[t] = draw(mode, scale_b);
            for (int i = 0; i < rows; i++) {
                uint32_t *a = ra + i * k;
                a[t] = draw(mode, scale_a);
                if (mode == 2 && t > 0 && rnd() % 2) {  // the previous term negated, or close
                    a[t] = (a[t - 1] ^ F32_SIGN) + (rnd() % 3) - 1;
                    rb[t] = rb[t - 1] + (rnd() % 2 ? 0 : (rnd() % 3) - 1);
                }
            }
        }
        for (int i = 0; i < rows; i++) {
            unpack_run(ua + 2 * k * i, ra + k * i, 1, k);
        }
        unpack_run(ub, rb, 1, k);
        fdot_job_t job = {ua, ub, k, rows, sums, 0, 0};
        dot_rows(&job, ra, k, 1, rb, 1);
        for (int i = 0; i < rows; i++) {
        uint32_t got = sums[i];
        uint32_t want = 0;
        for (int t = 0; t < k; t++) {
            want = f32_muladd_slow(want, ra[i * k + t], rb[t]);
        }
        dots++;
        terms += k;
        int nan_both = (got & 0x7fffffffu) > 0x7f800000u && (want & 0x7fffffffu) > 0x7f800000u;
        if (got != want && !nan_both) {
            if (mismatches++ < 8) {
                put("mismatch k ");
                put_num("", k);
                put(" got ");
                put_hex(got);
                put("want ");
                put_hex(want);
                put("\n");
            }
        }
        }
    }
    put_num("dots ", dots);
    put_num(" terms ", terms);
    put_num(" mismatches ", mismatches);
    put("\n");
    semihost(0x18, (const void *)0x20026);     // ADP_Stopped_ApplicationExit
    return 0;
}

// the vector table and reset: the stack at the top of the 4 MB RAM, bss cleared
extern uint32_t __bss_start__, __bss_end__;
void reset(void) {
    for (uint32_t *p = &__bss_start__; p < &__bss_end__; p++) {
        *p = 0;
    }
    main();
    for (;;) {
    }
}
__attribute__((section(".isr_vector"), used))
const void *const vectors[2] = {(void *)0x00400000, (void *)reset};
