@ qlinear_native.c's requantization runs in Thumb-1 (armv6m: every ARM core; a file of its
@ own beside qlinear_thumb.S's multiply-accumulate loops): mt_rq_run, and mt_rq_relu for a
@ channel with a fused Relu's bounds.

    .syntax unified
    .cpu cortex-m0
    .thumb
    .text

#include "thumb_macros.h"

@ r2 clamped to [lo, hi] (words at sp + lo_at, sp + hi_at), stored at out (r1), which moves
@ on: the end of every requantization below
.macro clamp_store lo_at, hi_at
    ldr r4, [sp, #\lo_at]
    cmp r2, r4
    bge 2f
    movs r2, r4
2:
    ldr r4, [sp, #\hi_at]
    cmp r2, r4
    ble 3f
    movs r2, r4
3:
    strb r2, [r1, #0]
    adds r1, #1
.endm

@ qlinear_native.c's per-channel requantization (rq_byte) of a run of accumulators:
@
#ifndef MT_THUMB2         /* the armv7m build: qrequant_thumb2.S's, with UMULL */
@   mp_int_t mt_rq_run(const int32_t *acc, uint8_t *out, mp_int_t n, const int32_t *p)
@
@ p = [base, ml, mh, v, half_m1, amax, y_zp, lo, hi] (rq_init's constants). For each of n
@ (>= 1) accumulators, a = |base + acc| (wrapping), and while a < amax:
@   p0 = (a & 0xFFFF) * ml, h = a * mh + (a >> 16) * ml + (p0 >> 16), L = p0 << 16
@   u = (h + half_m1 + (L != 0 or bit v of h)) >> v
@   out = clamp(+-u + y_zp, lo, hi)
@ Returns how many bytes it wrote: it stops before an accumulator at or beyond amax, which
@ the caller hands to out_byte. gcc's loop took ~60 instructions an output (its constants
@ reloaded from the stack); this one 40. u stays below 2**31 (h < 2**31, v >= 1), so
@ +-u + y_zp cannot overflow: rq_byte's bound of u at 2**20 changes no clamped byte for
@ bounds within +-2**20 of y_zp (every blob's: bytes).
@
@ Registers: r0 acc, r1 out, r2 a/h/u, r3 p0/L, r4 temporary, r5 ml, r6 mh/v, r7 the sign
@ mask; r8 base, r9 v, r10 mh, r11 amax, r12 out's end, lr half_m1; y_zp, lo, hi and out's
@ start on the stack.
    func mt_rq_run
    push {r4-r7, lr}
    push_high
    sub sp, #16
    ldr r4, [r3, #24]
    str r4, [sp, #0]        @ y_zp
    ldr r4, [r3, #28]
    str r4, [sp, #4]        @ lo
    ldr r4, [r3, #32]
    str r4, [sp, #8]        @ hi
    str r1, [sp, #12]       @ out's start
    ldr r4, [r3, #0]
    mov r8, r4
    ldr r5, [r3, #4]
    ldr r4, [r3, #8]
    mov r10, r4
    ldr r4, [r3, #12]
    mov r9, r4
    ldr r4, [r3, #16]
    mov lr, r4
    ldr r4, [r3, #20]
    mov r11, r4
    adds r2, r1, r2
    mov r12, r2
1:
    ldmia r0!, {r2}
    add r2, r8              @ + base
    asrs r7, r2, #31
    eors r2, r7
    subs r2, r2, r7         @ a = |acc|
    cmp r2, r11
    bhs 5f                  @ at or beyond amax: out_byte's
    uxth r3, r2
    muls r3, r5             @ p0 = al * ml
    lsrs r4, r2, #16
    muls r4, r5             @ ah * ml
    mov r6, r10
    muls r2, r6             @ a * mh
    adds r2, r2, r4
    lsrs r4, r3, #16
    adds r2, r2, r4         @ h
    lsls r3, r3, #16        @ L
    mov r6, r9
    movs r4, r2
    lsrs r4, r6
    lsls r4, r4, #31        @ bit v of h, at the top
    orrs r3, r4             @ nonzero: the carry into bit v
    mov r4, lr
    subs r3, r3, #1         @ C: r3 was nonzero
    adcs r2, r4             @ h + half_m1 + carry (< 2**32)
    lsrs r2, r6             @ u
    eors r2, r7
    subs r2, r2, r7         @ the sign back: round half to even is odd-symmetric
    ldr r4, [sp, #0]
    adds r2, r2, r4         @ + y_zp
    clamp_store 4, 8
    cmp r1, r12
    bne 1b
5:
    ldr r0, [sp, #12]
    subs r0, r1, r0         @ bytes written
    add sp, #16
    pop_high
    pop {r4-r7, pc}
    .size mt_rq_run, . - mt_rq_run

@ The same for a channel whose lower bound is at or above y_zp (a fused Relu: lo = y_zp):
@
@   mp_int_t mt_rq_relu(const int32_t *acc, uint8_t *out, mp_int_t n, const int32_t *p)
@
@ An accumulator at or below 0 rounds to at most 0, so +y_zp gives at most lo: lo, without
@ the multiplies (~10 instructions instead of 40; about half of a Relu layer's outputs).
@ The others are positive: no sign to take off and put back. 37 instructions an output.
@
@ Registers: as mt_rq_run's, with y_zp in r7 (no sign mask); lo, hi and out's start on the
@ stack.
    func mt_rq_relu
    push {r4-r7, lr}
    push_high
    sub sp, #16
    ldr r7, [r3, #24]       @ y_zp
    ldr r4, [r3, #28]
    str r4, [sp, #4]        @ lo
    ldr r4, [r3, #32]
    str r4, [sp, #8]        @ hi
    str r1, [sp, #12]       @ out's start
    ldr r4, [r3, #0]
    mov r8, r4
    ldr r5, [r3, #4]
    ldr r4, [r3, #8]
    mov r10, r4
    ldr r4, [r3, #12]
    mov r9, r4
    ldr r4, [r3, #16]
    mov lr, r4
    ldr r4, [r3, #20]
    mov r11, r4
    adds r2, r1, r2
    mov r12, r2
1:
    ldmia r0!, {r2}
    add r2, r8              @ + base
    cmp r2, #0
    ble 6f                  @ at or below 0: lo
    cmp r2, r11
    bhs 5f                  @ at or beyond amax: out_byte's
    uxth r3, r2
    muls r3, r5             @ p0 = al * ml
    lsrs r4, r2, #16
    muls r4, r5             @ ah * ml
    mov r6, r10
    muls r2, r6             @ a * mh
    adds r2, r2, r4
    lsrs r4, r3, #16
    adds r2, r2, r4         @ h
    lsls r3, r3, #16        @ L
    mov r6, r9
    movs r4, r2
    lsrs r4, r6
    lsls r4, r4, #31        @ bit v of h, at the top
    orrs r3, r4             @ nonzero: the carry into bit v
    mov r4, lr
    subs r3, r3, #1         @ C: r3 was nonzero
    adcs r2, r4             @ h + half_m1 + carry (< 2**32)
    lsrs r2, r6             @ u
    adds r2, r2, r7         @ + y_zp
    clamp_store 4, 8
    cmp r1, r12
    bne 1b
5:
    ldr r0, [sp, #12]
    subs r0, r1, r0         @ bytes written
    add sp, #16
    pop_high
    pop {r4-r7, pc}
6:
    ldr r2, [sp, #4]        @ lo
    b 3b
    .size mt_rq_relu, . - mt_rq_relu
#endif

@ One output of each of n consecutive channels (a Gemm row's columns j .. j + n - 1 outside
@ the blocks of eight rows), with each channel's constants taken straight from its (m0,
@ shift) pair instead of rq_init's record:
@
@   mp_int_t mt_rq_cols(const int32_t *sum, uint8_t *out, mp_int_t n, const int32_t *p)
@
@ p = [the first channel's (m0, shift) pair, its bias (n int32), y_zp, lo, hi]. For each of
@ n (>= 1) sums: acc = sum + bias (stops on a 32-bit overflow), a = |acc|, and while
@ a < 2**23, 0 < m0 <= 2**24 and 17 <= shift <= 47 (rq_init's fast channels), mt_rq_run's
@ arithmetic with v = shift - 16. Returns how many bytes it wrote: it stops before an
@ output outside that domain, which the caller hands to out_byte. ~50 instructions an
@ output where out_byte and its call took ~125 (in every ARM build).
@
@ Registers: r0 sum, r1 out, r2 acc/a/h/u, r3 p0/L, r4-r6 temporaries, r7 the sign mask;
@ r8 the pairs, r9 the biases, r10 y_zp, r11 2**23, r12 out's end; lo, hi and out's start
@ on the stack.
    func mt_rq_cols
    push {r4-r7, lr}
    push_high
    sub sp, #12
    str r1, [sp, #8]        @ out's start
    adds r2, r1, r2
    mov r12, r2
    ldr r4, [r3, #0]
    mov r8, r4
    ldr r4, [r3, #4]
    mov r9, r4
    ldr r4, [r3, #8]
    mov r10, r4
    ldr r4, [r3, #12]
    str r4, [sp, #0]        @ lo
    ldr r4, [r3, #16]
    str r4, [sp, #4]        @ hi
    movs r4, #1
    lsls r4, r4, #23
    mov r11, r4
1:
    ldr r2, [r0, #0]
    mov r3, r9
    ldr r4, [r3, #0]
    adds r2, r2, r4         @ + bias
    bvs 5f                  @ beyond 32 bits: out_byte's
    asrs r7, r2, #31
    eors r2, r7
    subs r2, r2, r7         @ a = |acc|
    cmp r2, r11
    bhs 5f
    mov r3, r8
    ldr r4, [r3, #0]        @ m0
    ldr r5, [r3, #4]        @ shift
    subs r6, r4, #1
    lsrs r6, r6, #24
    bne 5f                  @ m0 outside 1 .. 2**24
    subs r5, #17
    cmp r5, #30
    bhi 5f                  @ shift outside 17 .. 47
    adds r5, #1             @ v = shift - 16
    uxth r3, r2
    uxth r6, r4             @ ml
    muls r3, r6             @ p0 = al * ml
    lsrs r4, r4, #16        @ mh
    muls r4, r2             @ a * mh
    lsrs r2, r2, #16
    muls r2, r6             @ ah * ml
    adds r2, r2, r4
    lsrs r4, r3, #16
    adds r2, r2, r4         @ h
    lsls r3, r3, #16        @ L
    movs r4, r2
    lsrs r4, r5
    lsls r4, r4, #31        @ bit v of h, at the top
    orrs r3, r4             @ nonzero: the carry into bit v
    movs r4, #1
    lsls r4, r5
    lsrs r4, r4, #1
    subs r4, r4, #1         @ half_m1 = 2**(v - 1) - 1
    subs r3, r3, #1         @ C: r3 was nonzero
    adcs r2, r4             @ h + half_m1 + carry (< 2**32)
    lsrs r2, r5             @ u
    eors r2, r7
    subs r2, r2, r7         @ the sign back: round half to even is odd-symmetric
    add r2, r10             @ + y_zp
    clamp_store 0, 4
    adds r0, #4
    movs r4, #8
    add r8, r4              @ the next channel's pair
    movs r4, #4
    add r9, r4              @ and bias
    cmp r1, r12
    bne 1b
5:
    ldr r0, [sp, #8]
    subs r0, r1, r0         @ bytes written
    add sp, #12
    pop_high
    pop {r4-r7, pc}
    .size mt_rq_cols, . - mt_rq_cols
