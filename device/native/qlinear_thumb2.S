@ Thumb-2 forms (armv7m build: Cortex-M3 and later; the Makefile assembles this file for
@ armv7m instead of qlinear_thumb.S's loops of the same names, MT_THUMB2) of the loops
@ whose cost the armv7m build can cut: MLA (multiply-accumulate in one instruction),
@ LDRSB with an immediate offset (no SXTB) and all thirteen registers. Same arguments, same
@ sums as qlinear_thumb.S's (see there). The M3 has no DSP extension: no SMLAD / SXTB16.

    .syntax unified
    .cpu cortex-m3
    .thumb
    .text

#include "thumb_macros.h"

@   void mt_pw8_u8(const uint8_t *px, const uint8_t *pw, const int32_t *p, int32_t *acc)
@   void mt_pw8_s8(...)
@ p = [cin, step]: acc[j] = sum over ci < cin of x[ci * step + j] * (int8)pw[ci], j < 8.
@ 2.38 instructions per multiply-accumulate, either input kind.
@ Registers: r0 px, r1 pw, r2 weight, r3 input, r4-r11 sums, r12 pw's end, lr step.

.macro pw8t_mac signed, at, sum
    .if \signed
    ldrsb r3, [r0, #\at]
    .else
    ldrb r3, [r0, #\at]
    .endif
    mla \sum, r3, r2, \sum
.endm

.macro pw8t_term signed
    ldrsb r2, [r1], #1
    pw8t_mac \signed, 0, r4
    pw8t_mac \signed, 1, r5
    pw8t_mac \signed, 2, r6
    pw8t_mac \signed, 3, r7
    pw8t_mac \signed, 4, r8
    pw8t_mac \signed, 5, r9
    pw8t_mac \signed, 6, r10
    pw8t_mac \signed, 7, r11
    add r0, lr
.endm

.macro pw8t name, signed
    func \name
    push {r3-r11, lr}
    ldr lr, [r2, #4]
    ldr r3, [r2, #0]
    add r12, r1, r3
    zero_r4_r11
    tst r3, #1
    beq 1f
    pw8t_term \signed
1:
    cmp r1, r12
    beq 3f
2:
    pw8t_term \signed
    pw8t_term \signed
    cmp r1, r12
    bne 2b
3:
    ldr r3, [sp, #0]        @ acc (the first register pushed)
    stmia r3, {r4-r11}
    pop {r3-r11, pc}
    .size \name, . - \name
.endm

    pw8t mt_pw8_u8, 0
    pw8t mt_pw8_s8, 1

@   void mt_t8(const uint8_t *xt, const uint8_t *w, const int32_t *p, int32_t *acc)
@ p = [k, sw]: acc[lane] = sum over t < k of xt[8 * t + lane] * (int8)w[t * sw], lane < 8;
@ acc[8] = sum over t < k of (int8)w[t * sw]. k mod 4 single terms, then four a turn (sw 1:
@ the weights at immediate offsets): 2.41 instructions per multiply-accumulate with sw 1,
@ 2.5 else (2.63 with two terms a turn, before 2026-11-28's rework).
@ Registers: r0 xt, r1 w, r2 weight, r3 input, r4-r11 sums, r12 sw, lr the weights' sum;
@ xt's end and the single terms' count on the stack.

.macro t8t_lanes at
    pw8t_mac 0, (\at + 0), r4
    pw8t_mac 0, (\at + 1), r5
    pw8t_mac 0, (\at + 2), r6
    pw8t_mac 0, (\at + 3), r7
    pw8t_mac 0, (\at + 4), r8
    pw8t_mac 0, (\at + 5), r9
    pw8t_mac 0, (\at + 6), r10
    pw8t_mac 0, (\at + 7), r11
.endm

.macro t8t_term at
    ldrsb r2, [r1]
    add r1, r12
    add lr, r2
    t8t_lanes \at
.endm

.macro t8t_unit at, wi
    ldrsb r2, [r1, #\wi]
    add lr, r2
    t8t_lanes \at
.endm

    func mt_t8
    push {r3-r11, lr}
    ldr r3, [r2, #0]
    add r4, r0, r3, lsl #3
    and r3, r3, #3
    push {r3, r4}           @ the single terms' count, xt's end
    ldr r12, [r2, #4]
    zero_r4_r11
    mov lr, r4
    cmp r3, #0
    beq 1f
4:
    t8t_term 0
    adds r0, #8
    stack_countdown r3, 0
    bne 4b
1:
    ldr r3, [sp, #4]
    cmp r0, r3
    beq 3f
    cmp r12, #1
    bne 2f
5:
    t8t_unit 0, 0
    t8t_unit 8, 1
    t8t_unit 16, 2
    t8t_unit 24, 3
    adds r1, #4
    adds r0, #32
    ldr r3, [sp, #4]
    cmp r0, r3
    bne 5b
    b 3f
2:
    t8t_term 0
    t8t_term 8
    t8t_term 16
    t8t_term 24
    adds r0, #32
    ldr r3, [sp, #4]
    cmp r0, r3
    bne 2b
3:
    add sp, #8
    ldr r3, [sp, #0]        @ acc
    stmia r3!, {r4-r11}
    str lr, [r3]
    pop {r3-r11, pc}
    .size mt_t8, . - mt_t8

@   void mt_dot4_u8(const uint8_t *px, const uint8_t *pe, const int32_t *p, int32_t *acc)
@   void mt_dot4_s8(...)
@ acc[j] += sum over px <= x < pe of (*x - p[4]) * (int8)x[p[j]], j < 4 (qlinear_thumb.S's
@ mt_dot4): the input byte loaded with a post-increment, so the four weights lie at
@ p[j] - 1 from the moved pointer. (pe - px) even and above 0. 2.75 instructions per
@ multiply-accumulate.
@ Registers: r0 px, r1 input, r2 weight, r4-r7 distances less 1, r8 zero point, r9-r11 and
@ lr sums, r12 pe.

.macro dot4t_term signed
    .if \signed
    ldrsb r1, [r0], #1
    .else
    ldrb r1, [r0], #1
    .endif
    sub r1, r8
    ldrsb r2, [r0, r4]
    mla r9, r1, r2, r9
    ldrsb r2, [r0, r5]
    mla r10, r1, r2, r10
    ldrsb r2, [r0, r6]
    mla r11, r1, r2, r11
    ldrsb r2, [r0, r7]
    mla lr, r1, r2, lr
.endm

.macro dot4t name, signed
    func \name
    push {r3-r11, lr}
    ldm r2, {r4-r8}
    subs r4, #1
    subs r5, #1
    subs r6, #1
    subs r7, #1
    ldm r3, {r9-r11, lr}
    mov r12, r1
1:
    dot4t_term \signed
    dot4t_term \signed
    cmp r0, r12
    bne 1b
    ldr r3, [sp, #0]
    stm r3, {r9-r11, lr}
    pop {r3-r11, pc}
    .size \name, . - \name
.endm

    dot4t mt_dot4_u8, 0
    dot4t mt_dot4_s8, 1

@   void mt_dot4_kn_u8(const uint8_t *px, const uint8_t *pe, const int32_t *p, int32_t *acc)
@   void mt_dot4_kn_s8(...)
@ p = [w, sw, zp]: the four weights of a step are the bytes w[0..3], then w moves by sw
@ (qlinear_thumb.S's mt_dot4_kn). (pe - px) even and above 0. 2.75 instructions per
@ multiply-accumulate.
@ Registers: r0 px, r1 input, r2 weight, r3 w, r4 sw, r5 zero point, r9-r11 and lr sums,
@ r12 pe.

.macro dot4knt_term signed
    .if \signed
    ldrsb r1, [r0], #1
    .else
    ldrb r1, [r0], #1
    .endif
    sub r1, r5
    ldrsb r2, [r3, #0]
    mla r9, r1, r2, r9
    ldrsb r2, [r3, #1]
    mla r10, r1, r2, r10
    ldrsb r2, [r3, #2]
    mla r11, r1, r2, r11
    ldrsb r2, [r3, #3]
    mla lr, r1, r2, lr
    add r3, r4
.endm

.macro dot4knt name, signed
    func \name
    push {r3-r11, lr}
    ldm r3, {r9-r11, lr}
    ldm r2, {r3-r5}
    mov r12, r1
1:
    dot4knt_term \signed
    dot4knt_term \signed
    cmp r0, r12
    bne 1b
    ldr r3, [sp, #0]
    stm r3, {r9-r11, lr}
    pop {r3-r11, pc}
    .size \name, . - \name
.endm

    dot4knt mt_dot4_kn_u8, 0
    dot4knt mt_dot4_kn_s8, 1

@   void mt_dw3_s1(const uint8_t *p, int32_t *acc, const int32_t *geo, const int32_t *w)
@   void mt_dw3_s2(...)  the same with stride 2 along x
@ qlinear_thumb.S's depthwise row loop (see there: geo = [cols, rows, skip], rows of the
@ band 14 bytes apart, the bytes unsigned) with the nine weights in r4-r12 and MLA: 22
@ instructions an output (Thumb-1's 37: each weight moved to a low register to multiply).
@ Registers: r0 p, r1 acc, r2 sum, r3 byte, r4-r12 w0-w8, lr the row's end in acc; rows
@ left, skip and 4 * cols on the stack.

.macro dw3t_tap at, w
    ldrb r3, [r0, #\at]
    mla r2, r3, \w, r2
.endm

.macro dw3t name, step
    func \name
    push {r4-r11, lr}
    sub sp, #12
    ldr r4, [r2, #0]
    lsls r4, r4, #2
    str r4, [sp, #8]        @ 4 * cols
    ldr r4, [r2, #4]
    str r4, [sp, #0]        @ rows left
    ldr r4, [r2, #8]
    str r4, [sp, #4]        @ skip
    ldm r3, {r4-r12}
1:                          @ a row
    ldr r3, [sp, #8]
    add lr, r1, r3          @ its end in acc
2:                          @ an output
    ldrb r2, [r0, #0]
    mul r2, r2, r4
    dw3t_tap 1, r5
    dw3t_tap 2, r6
    dw3t_tap 14, r7
    dw3t_tap 15, r8
    dw3t_tap 16, r9
    dw3t_tap 28, r10
    dw3t_tap 29, r11
    dw3t_tap 30, r12
    str r2, [r1], #4
    adds r0, #\step
    cmp r1, lr
    bne 2b
    ldr r3, [sp, #4]
    add r0, r3              @ the next row's start
    stack_countdown r3, 0
    bne 1b
    add sp, #12
    pop {r4-r11, pc}
    .size \name, . - \name
.endm

    dw3t mt_dw3_s1, 1
    dw3t mt_dw3_s2, 2

@   void mt_dw3p8(const uint32_t *P, int32_t *acc, const int32_t *geo, const int32_t *w)
@   void mt_dw3p16(...)  rows 16 words apart
@ The depthwise 3x3 Conv ("same" padding, stride 1) two output rows at a time, with one
@ SMLAL per tap for both (qconv_native.c's dw3_pairs): P holds, for each padded input row
@ pr and column pc, s[pr][pc] + (s[pr + 1][pc] << 20) (s the input values, -128 .. 255;
@ rows 8 or 16 words apart; mt_dw3p_fill), so that sum over the taps of P * w is the row's
@ sum plus the next row's sum times 2**20 (the first below 9 * 255 * 128 < 2**19 in
@ magnitude: sign-extending its 20 bits gives it, and the whole plus 2**19 shifted down by
@ 20 the other). geo = [4 * cols, row pairs]: writes
@ acc[row * cols + col] for 2 * pairs rows (the last pair's second row too, which the
@ caller's buffer holds). 30 instructions a pair of outputs (the MLA row loop's 22 an
@ output). Registers: r0 P, r1 acc, r2:r3 the pair's 64-bit sum, r4-r12 w0-w8, lr the tap
@ and scratch; on the stack 4 * cols - 4 (the second row's offset after the first's
@ store), the row's end in acc, pairs left, P's skip to the next pair of rows, 4 * cols.
.macro dw3p_tap at, w
    ldr lr, [r0, #\at]
    smlal r2, r3, lr, \w
.endm

.macro dw3p name, rs
    func \name
    push {r4-r11, lr}
    sub sp, #20
    ldr r4, [r2, #0]        @ 4 * cols
    str r4, [sp, #16]
    subs r5, r4, #4
    str r5, [sp, #0]
    rsb r5, r4, #(8 * \rs)
    str r5, [sp, #12]       @ two rows of P less the row's columns
    ldr r4, [r2, #4]
    str r4, [sp, #8]        @ pairs
    ldm r3, {r4-r12}
1:                          @ a pair of rows
    ldr lr, [sp, #16]
    add lr, r1, lr
    str lr, [sp, #4]        @ the first row's end in acc
2:                          @ a pair of outputs
    ldr lr, [r0, #0]
    smull r2, r3, lr, r4
    dw3p_tap 4, r5
    dw3p_tap 8, r6
    dw3p_tap (4 * \rs), r7
    dw3p_tap (4 * \rs + 4), r8
    dw3p_tap (4 * \rs + 8), r9
    dw3p_tap (8 * \rs), r10
    dw3p_tap (8 * \rs + 4), r11
    dw3p_tap (8 * \rs + 8), r12
    sbfx lr, r2, #0, #20    @ the first row's sum
    str lr, [r1], #4
    adds r2, r2, #0x80000
    adc r3, r3, #0
    lsrs r2, r2, #20
    orr r2, r2, r3, lsl #12 @ the second row's
    ldr lr, [sp, #0]
    str r2, [r1, lr]
    adds r0, #4
    ldr lr, [sp, #4]
    cmp r1, lr
    bne 2b
    ldr lr, [sp, #12]
    add r0, lr              @ P's next pair of rows
    ldr lr, [sp, #16]
    add r1, lr              @ past the second row in acc
    stack_countdown lr, 8
    bne 1b
    add sp, #20
    pop {r4-r11, pc}
    .size \name, . - \name
.endm

    dw3p mt_dw3p8, 8
    dw3p mt_dw3p16, 16

@   void mt_dw3p_fill(uint32_t *P, const uint8_t *x, const int32_t *geo)
@ dw3_pairs' P for one channel: geo = [cols, rows, skip, signed, zp]: for each padded row pr
@ (0 .. rows, padding above and below: zp), P[pr][1 + col] = s[pr][col] + (s[pr + 1][col]
@ << 20), s the input bytes as the Conv reads them (signed or not) and the padding zp; P's
@ rows skip bytes apart from one row's end to the next's start. Inside rows two entries a
@ turn, 9 instructions (four loads, two adds, a STRD and the count; 6 an entry one at a
@ time). Registers: r0 P, r1 the upper row, r2 the lower row, r3 entries (pairs) left,
@ r4-r5 and r10-r11 bytes, r6 the padding, r7 cols, r8 rows left, r9 skip, r12 scratch.
.macro dw3p_load dst, src, signed
    .if \signed
    ldrsb \dst, [\src], #1
    .else
    ldrb \dst, [\src], #1
    .endif
.endm

.macro dw3p_fill_rows signed
    mov r2, r1              @ row 0: the padding above row 0 of x
    mov r3, r7
1:
    dw3p_load r5, r2, \signed
    add r12, r6, r5, lsl #20
    str r12, [r0], #4
    subs r3, #1
    bne 1b
    add r0, r9
    subs r8, #1             @ rows 1 .. rows - 1: two rows of x
    beq 4f
2:
    lsrs r3, r7, #1         @ pairs of entries; C: an odd one first
    bcc 3f
    dw3p_load r4, r1, \signed
    dw3p_load r5, r2, \signed
    add r12, r4, r5, lsl #20
    str r12, [r0], #4
3:
    cbz r3, 7f
6:
    dw3p_load r4, r1, \signed
    dw3p_load r5, r2, \signed
    dw3p_load r10, r1, \signed
    dw3p_load r11, r2, \signed
    add r12, r4, r5, lsl #20
    add r11, r10, r11, lsl #20
    strd r12, r11, [r0], #8
    subs r3, #1
    bne 6b
7:
    add r0, r9
    subs r8, #1
    bne 2b
4:                          @ row `rows`: the last row of x over the padding below
    mov r3, r7
5:
    dw3p_load r4, r1, \signed
    add r12, r4, r6, lsl #20
    str r12, [r0], #4
    subs r3, #1
    bne 5b
.endm

    func mt_dw3p_fill
    push {r4-r11, lr}
    ldr r7, [r2, #0]        @ cols
    ldr r8, [r2, #4]        @ rows
    ldr r9, [r2, #8]        @ skip
    ldr r6, [r2, #16]       @ zp
    ldr r3, [r2, #12]
    cmp r3, #0
    bne 8f
    dw3p_fill_rows 0
    pop {r4-r11, pc}
8:
    dw3p_fill_rows 1
    pop {r4-r11, pc}
    .size mt_dw3p_fill, . - mt_dw3p_fill
