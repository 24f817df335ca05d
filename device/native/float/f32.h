// Single-precision arithmetic on the bits of IEEE 754 binary32 values, rounded to nearest
// even as IEEE (and libgcc's soft float, which MicroPython's own floats use) rounds, for the
// common case only: normal operands and a normal result. Outside it (a zero the fast paths do
// not cover, a subnormal, an infinity, a NaN, an overflow or underflow) each returns a marker
// and the caller does that one operation with the compiler's float arithmetic, the
// reference. So every result is the correctly rounded one, bit for bit, and the common case
// costs integer instructions only: on a core without an FPU, libgcc's general routines
// (unpacking, special cases, calls) were most of a multiply-add (bench/board_float_probe.py).
//
// Included by float_native.c and float_optim.c, and by tests/test_float_native.py's host
// harness, which checks these paths against the host's hardware floats.
#ifndef MT_F32_H
#define MT_F32_H
#include <stdint.h>

// A single-precision FPU (an armv7emsp build): its instructions are the fast path
#if defined(__ARM_FP) && (__ARM_FP & 4)
#define F32_HARD 1
#else
#define F32_HARD 0
#endif

#define F32_SIGN 0x80000000u
#define F32_NONE 0xffffffffu    // "not the fast case": a NaN these paths never produce

typedef union {
    float f;
    uint32_t u;
} f32_t;

static inline uint32_t f32_bits(float f) {
    f32_t v;
    v.f = f;
    return v.u;
}

static inline float f32_float(uint32_t u) {
    f32_t v;
    v.u = u;
    return v.f;
}

// The exponent field is 1..254 (a normal number)
static inline int f32_normal(uint32_t x) {
    return ((x >> 23) & 0xff) - 1u <= 253u;
}

// Leading zeros of a nonzero word (armv6m has no clz instruction: a loop, not libgcc's call)
static inline uint32_t f32_clz(uint32_t r) {
#if defined(__thumb__) && !defined(__thumb2__)
    uint32_t n = 0;
    while (!(r & F32_SIGN)) {
        r <<= 1;
        n++;
    }
    return n;
#else
    return __builtin_clz(r);
#endif
}

// x * y rounded, for normal x and y whose product is normal (exponent field 1..254 after
// rounding): its bits; else 0 (never a normal product's bits).
static inline uint32_t f32_mul_fast(uint32_t x, uint32_t y) {
    uint32_t ex = (x >> 23) & 0xff, ey = (y >> 23) & 0xff;
    if (ex - 1u > 253u || ey - 1u > 253u) {
        return 0;
    }
    // the significands 1.f as 1.f * 2**31 and 1.f * 2**30: their product is 1.fx * 1.fy *
    // 2**61, in [2**61, 2**63), whose high word is in [2**29, 2**31)
    uint64_t p = (uint64_t)((x << 8) | F32_SIGN) * (((y << 8) | F32_SIGN) >> 1);
    uint32_t hi = (uint32_t)(p >> 32);
    int32_t e = (int32_t)(ex + ey) - 126;   // the biased exponent when hi >= 2**30
    // the low word's bits only decide a tie: any of them nonzero makes bit 0 (below the
    // rounding position either way) nonzero
    hi |= (uint32_t)p != 0;
    if (hi < 0x40000000u) {
        hi <<= 1;
        e--;
    }
    if ((uint32_t)(e - 1) > 252u) {
        return 0;
    }
    // 24 bits of significand are bits 30..7: round half to even at bit 7
    hi += 0x3f + ((hi >> 7) & 1);
    // a carry out of the significand (2**24) lands in the exponent field: still right
    return ((x ^ y) & F32_SIGN) + ((uint32_t)(e - 1) << 23) + (hi >> 7);
}

// x + y rounded, for normal x and y: its bits (+0 when they cancel exactly, as IEEE's
// round-to-nearest gives), or F32_NONE when the sum is not normal with an exponent field
// below 254 (then the caller's float arithmetic does it).
static inline uint32_t f32_add_fast(uint32_t x, uint32_t y) {
    uint32_t ax = x & ~F32_SIGN, ay = y & ~F32_SIGN;
    if (ax < ay) {          // x the larger in magnitude: its sign is the sum's
        uint32_t t = x;
        x = y;
        y = t;
        t = ax;
        ax = ay;
        ay = t;
    }
    uint32_t ex = ax >> 23;
    uint32_t d = ex - (ay >> 23);
    // significands with the leading 1 at bit 29: a carry fits at bit 30, and 6 bits below
    // the rounding position keep guard, round and sticky through the alignment
    uint32_t mx = ((ax << 8) | F32_SIGN) >> 2;
    uint32_t my = ((ay << 8) | F32_SIGN) >> 2;
    if (d != 0) {           // align y, its bits shifted out kept as a sticky bit 0
        if (d > 29) {
            my = 1;
        } else {
            my = (my >> d) | ((my << (32 - d)) != 0);
        }
    }
    uint32_t r;
    if ((int32_t)(x ^ y) >= 0) {
        r = mx + my;
        if (r >= 0x40000000u) {
            r = (r >> 1) | (r & 1);
            ex++;
        }
    } else {
        r = mx - my;        // >= 0: |x| >= |y|
        if (r < 0x20000000u) {
            if (r == 0) {
                return 0;
            }
            // d >= 2 shifts by one at most; d <= 1 lost no bits to the sticky: exact
            uint32_t n = f32_clz(r) - 2;
            r <<= n;
            ex -= n;
        }
    }
    if (ex - 1u > 252u) {   // subnormal (ex wrapped below 1) or near overflow
        return F32_NONE;
    }
    r += 0x1f + ((r >> 6) & 1);
    return (x & F32_SIGN) + ((ex - 1) << 23) + (r >> 6);
}

// The significand (leading 1 at bit 23) and biased exponent of a nonzero finite |x|,
// a subnormal's normalized (its exponent then 0 or below)
static inline uint32_t f32_unpack(uint32_t ax, int32_t *e) {
    int32_t ex = (int32_t)(ax >> 23);
    uint32_t m = ax & 0x7fffffu;
    if (ex) {
        m |= 0x800000u;
    } else {
        ex = 1;
        while (!(m & 0x800000u)) {
            m <<= 1;
            ex--;
        }
    }
    *e = ex;
    return m;
}

// x / y correctly rounded to nearest even, infinities, zeros and subnormals as IEEE; every
// NaN result is the default NaN 0x7fc00000 (libgcc's may differ in sign: the kernels never
// keep one, an update that would is refused). Long division: with the core's divide
// instruction where it has one (8 quotient bits a step), else one bit a step:
// libgcc's armv6m division cannot be linked into a native module (its jump table needs an
// absolute relocation, which mpy_ld refuses); either gives the same bits.
static inline uint32_t f32_div(uint32_t x, uint32_t y) {
#if F32_HARD
    if (1) {
        return f32_bits(f32_float(x) / f32_float(y));
    }
#endif
    uint32_t sign = (x ^ y) & F32_SIGN;
    uint32_t ax = x & ~F32_SIGN, ay = y & ~F32_SIGN;
    if (ax > 0x7f800000u || ay > 0x7f800000u || (ax == 0x7f800000u && ay == 0x7f800000u)
        || (ax == 0 && ay == 0)) {
        return 0x7fc00000u;
    }
    if (ax == 0x7f800000u || ay == 0) {
        return sign | 0x7f800000u;
    }
    if (ay == 0x7f800000u || ax == 0) {
        return sign;
    }
    int32_t ex, ey;
    uint32_t mx = f32_unpack(ax, &ex), my = f32_unpack(ay, &ey);
    int32_t e = ex - ey + 127;  // the quotient's biased exponent, once mx >= my
    if (mx < my) {
        mx <<= 1;
        e--;
    }
    // 25 quotient bits, floor(mx * 2**24 / my): 24 kept and the next one; sticky: the rest
    // is not zero
#if defined(__ARM_FEATURE_IDIV) || defined(__riscv_div)
    // the core divides (Thumb-2's udiv on armv7m, rv32imc's divu): 8, 8, 8 and 1 bits, each
    // remainder below my < 2**24 shifted on (mx < 2 my < 2**25: mx << 7 fits a word)
    uint32_t rem = mx << 7, q = rem / my;
    rem -= q * my;
    for (int i = 0; i < 2; i++) {
        uint32_t d = (rem << 8) / my;
        rem = (rem << 8) - d * my;
        q = (q << 8) | d;
    }
    uint32_t d = (rem << 1) / my;
    rem = (rem << 1) - d * my;
    q = (q << 1) | d;
    uint32_t sticky = rem != 0;
#else
    // armv6m has no divide instruction (and libgcc's cannot be linked): bit by bit
    uint32_t q = 0;
    for (int i = 0; i < 25; i++) {
        q <<= 1;
        if (mx >= my) {
            mx -= my;
            q |= 1;
        }
        mx <<= 1;
    }
    uint32_t sticky = mx != 0;
#endif
    // the quotient is q * 2**(e - 151), plus a bit when sticky
    if (e >= 1) {
        uint32_t r = (q >> 1) + ((q & 1) & (sticky | (q >> 1)));
        uint32_t bits = ((uint32_t)(e - 1) << 23) + r;
        return sign | (bits < 0x7f800000u ? bits : 0x7f800000u);
    }
    // subnormal: in units of 2**-149 it is q * 2**(e - 2)
    uint32_t sh = (uint32_t)(2 - e);
    if (sh > 26) {
        return sign;
    }
    uint32_t n = q >> sh, guard = (q >> (sh - 1)) & 1;
    sticky |= (q & ((1u << (sh - 1)) - 1)) != 0;
    return sign | (n + (guard & (sticky | n)));
}

// sqrt(x) correctly rounded for x >= +0, -0 or +inf (as MicroPython's math.sqrt: lib/libm's
// single-precision sqrt); digit by digit, the 25th bit rounding (a square root is never
// exactly halfway between two floats)
static inline uint32_t f32_sqrt(uint32_t x) {
#if F32_HARD
    if (1) {                    // the FPU's square root, correctly rounded (no libm call)
        float r;
        __asm__ ("vsqrt.f32 %0, %1" : "=t" (r) : "t" (f32_float(x)));
        return f32_bits(r);
    }
#endif
    if ((x << 1) == 0 || x == 0x7f800000u) {
        return x;
    }
    int32_t e;
    uint32_t m = f32_unpack(x, &e);
    e -= 127;
    if (e & 1) {                // an even exponent: m * 2**e = (2m) * 2**(e - 1)
        m <<= 1;
    }
    e >>= 1;                    // (arithmetic: floor)
    m <<= 1;                    // the root of m * 2**-23 in [1, 2): 25 bits, digit by digit
    uint32_t q = 0, s = 0;
    for (uint32_t r = 0x1000000u; r != 0; r >>= 1) {
        uint32_t t = s + r;
        if (t <= m) {
            s = t + r;
            m -= t;
            q += r;
        }
        m <<= 1;
    }
    return (uint32_t)((e + 126) << 23) + ((q + 1) >> 1);
}

// s + x * y, the product rounded, then the sum: the compiler's float arithmetic
uint32_t f32_muladd_slow(uint32_t s, uint32_t x, uint32_t y);

// s + x * y, the product rounded, then the sum (as `s += x * y` in MicroPython's floats)
static inline uint32_t f32_muladd(uint32_t s, uint32_t x, uint32_t y) {
#if F32_HARD
    return f32_bits(f32_float(s) + f32_float(x) * f32_float(y));
#endif
    uint32_t p = f32_mul_fast(x, y);
    if (p != 0) {
        if (f32_normal(s)) {
            uint32_t r = f32_add_fast(s, p);
            if (r != F32_NONE) {
                return r;
            }
        } else if ((s << 1) == 0) {
            return p;       // 0 + p, exactly
        }
    } else if (((x << 1) == 0 && ((y >> 23) & 0xff) != 0xff)
               || ((y << 1) == 0 && ((x >> 23) & 0xff) != 0xff)) {
        // a zero product (a zero times a finite number), common after a ReLU: s unchanged
        // unless s is a zero too (then -0 only when both are), an infinity or a NaN
        if ((s << 1) == 0) {
            return s & (x ^ y);
        }
        if (((s >> 23) & 0xff) != 0xff) {
            return s;
        }
    }
    return f32_muladd_slow(s, x, y);
}
#endif
