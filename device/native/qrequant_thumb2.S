@ Thumb-2 forms (armv7m build: Cortex-M3 and later) of qrequant_thumb.S's mt_rq_run and
@ mt_rq_relu: the same arguments, the same bytes (see there and qlinear_native.h's rq_t).
@ UMULL gives p = a * m0 whole (a < 2**23, m0 <= 2**24: p < 2**47), so H = p >> 16 and
@ L = p mod 2**16 take three instructions instead of the Thumb-1 form's six multiplies and
@ shifts; the clamp bounds sit in registers. 27 instructions an output (mt_rq_run; Thumb-1
@ 40), 21 for a Relu channel's positive accumulators (37), ~8 for the others (2026-11-28).
@ A channel whose shift is 32 or less (every channel of the KWS DS-CNN: 30-32) rounds in 5
@ instead of 9 (rq2_short): 23 an output, 17 for a Relu channel's positive ones.
@ The caller calls them only when amax is 2**23 (rq_init's fast channels): its constant here.

    .syntax unified
    .cpu cortex-m3
    .thumb
    .text

#include "thumb_macros.h"

@   mp_int_t mt_rq_run(const int32_t *acc, uint8_t *out, mp_int_t n, const int32_t *p)
@ p = [base, ml, mh, v, half_m1, amax, y_zp, lo, hi]; n >= 1. Writes out[i] for each
@ accumulator acc[i] + base (wrapping) until one at or beyond 2**23 in magnitude; returns
@ the bytes written.
@ Registers: r0 acc, r1 out, r2 a, r3 p's low word, r4 its high word / H / u, r5 m0, r6 bit
@ v, r7 sign mask, r8 base, r9 v, r10 y_zp, r11 lo, r12 out's end, lr half_m1; hi and out's
@ start on the stack.

.macro rq2_load
    ldr r8, [r3, #0]        @ base
    ldr r4, [r3, #8]
    ldr r5, [r3, #4]
    orr r5, r5, r4, lsl #16 @ m0 = ml + mh * 2**16
    ldr r9, [r3, #12]       @ v
    ldr lr, [r3, #16]       @ half_m1
    ldr r10, [r3, #24]      @ y_zp
    ldr r11, [r3, #28]      @ lo
    ldr r4, [r3, #32]
    push {r1, r4}           @ out's start, hi
    add r12, r1, r2
.endm

@ r4 = round half to even of r2 * m0 / 2**(v + 16), r2 < 2**23
.macro rq2_round
    umull r3, r4, r2, r5
    lsls r4, r4, #16
    orr r4, r4, r3, lsr #16 @ H = p >> 16 (< 2**31)
    lsls r3, r3, #16        @ L, at the top
    lsr r6, r4, r9
    orr r3, r3, r6, lsl #31 @ nonzero: the carry into bit v (L, or bit v of H)
    subs r3, r3, #1         @ C: it was nonzero
    adcs r4, lr             @ H + half_m1 + carry (< 2**32)
    lsr r4, r4, r9          @ u
.endm

@ With shift = v + 16 <= 32 the product can be taken already scaled so that its high word is
@ the quotient and its low word the remainder, as a fraction of 2**32: (a << j) * (m0 << k)
@ with j + k = 32 - shift, j = max(0, 9 - v) and k = 16 - v - j (both words fit: a << j <
@ 2**31, m0 << k <= 2**31). rq2_short_setup turns r5 into m0 << k, r9 into j and lr into
@ 2**31 - 1; then rq2_short rounds half to even in 5 instructions: the remainder plus
@ 2**31 - 1 plus the quotient's low bit carries exactly when the remainder is above half,
@ or half on an odd quotient.
.macro rq2_short_setup
    rsbs r6, r9, #9         @ 9 - v
    it lt
    movlt r6, #0            @ j
    rsb r3, r9, #16
    subs r3, r3, r6         @ k
    lsls r5, r5, r3
    mov r9, r6
    mvn lr, #0x80000000     @ 2**31 - 1
.endm

@ r4 = round half to even of r2 * m0 / 2**(v + 16), r2 < 2**23, v <= 16 (after the setup)
.macro rq2_short
    lsls r2, r2, r9
    umull r3, r4, r2, r5
    lsrs r6, r4, #1         @ C: the quotient's low bit
    adcs r3, r3, lr
    adc r4, r4, #0          @ u
.endm

@ r4 + y_zp clamped to [lo, hi] and stored
.macro rq2_store
    add r4, r10
    cmp r4, r11
    it lt
    movlt r4, r11
    ldr r6, [sp, #4]
    cmp r4, r6
    it gt
    movgt r4, r6
    strb r4, [r1], #1
.endm

@ mt_rq_run's loop with a rounding (rq2_round, or rq2_short after its setup); on to 5f
.macro rq2_run_loop round
1:
    ldr r2, [r0], #4
    add r2, r8              @ + base
    asrs r7, r2, #31
    eors r2, r7
    subs r2, r2, r7         @ a = |acc|
    cmp r2, #0x800000
    bhs 5f                  @ at or beyond amax: out_byte's
    \round
    eors r4, r7
    subs r4, r4, r7         @ the sign back: round half to even is odd-symmetric
    rq2_store
    cmp r1, r12
    bne 1b
    b 5f
.endm

    func mt_rq_run
    push {r4-r11, lr}
    rq2_load
    cmp r9, #16
    bls 2f
    rq2_run_loop rq2_round
2:                          @ shift <= 32
    rq2_short_setup
    rq2_run_loop rq2_short
5:
    pop {r0, r4}
    subs r0, r1, r0         @ bytes written
    pop {r4-r11, pc}
    .size mt_rq_run, . - mt_rq_run

@ mt_rq_relu's two loops with a rounding (rq2_round, or rq2_short after its setup); on to 5f
.macro rq2_relu_loops round
    cmp r11, r10
    bne 3f
7:                          @ lo = y_zp
    ldr r2, [r0], #4
    add r2, r8              @ + base
    cmp r2, #0
    ble 8f                  @ at or below 0: lo
    cmp r2, #0x800000
    bhs 5f                  @ at or beyond amax: out_byte's
    \round
    add r4, r10
    cmp r4, r7
    it gt
    movgt r4, r7
    strb r4, [r1], #1
    cmp r1, r12
    bne 7b
    b 5f
8:
    strb r11, [r1], #1
    cmp r1, r12
    bne 7b
    b 5f
3:
    ldr r2, [r0], #4
    add r2, r8              @ + base
    cmp r2, #0
    ble 6f                  @ at or below 0: lo
    cmp r2, #0x800000
    bhs 5f                  @ at or beyond amax: out_byte's
    \round
    rq2_store
    cmp r1, r12
    bne 3b
    b 5f
6:
    strb r11, [r1], #1
    cmp r1, r12
    bne 3b
    b 5f
.endm

@   mp_int_t mt_rq_relu(const int32_t *acc, uint8_t *out, mp_int_t n, const int32_t *p)
@ lo at or above y_zp: an accumulator at or below 0 gives lo (qrequant_thumb.S's); hi in r7
@ (no sign mask here), and where lo is y_zp (a plain Relu) u + y_zp cannot fall below it:
@ no lower clamp (21 instructions a positive accumulator, 17 with rq2_short).
    func mt_rq_relu
    push {r4-r11, lr}
    rq2_load
    ldr r7, [sp, #4]        @ hi
    cmp r9, #16
    bls 2f
    rq2_relu_loops rq2_round
2:                          @ shift <= 32
    rq2_short_setup
    rq2_relu_loops rq2_short
5:
    pop {r0, r4}
    subs r0, r1, r0         @ bytes written
    pop {r4-r11, pc}
    .size mt_rq_relu, . - mt_rq_relu
