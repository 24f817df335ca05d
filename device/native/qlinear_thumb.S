@ The hot loops of qlinear_native.c's int8 Gemm and Conv, in Thumb-1 (armv6m: runs on every
@ ARM core). First the Gemm for a weight with unit stride along k (W[n, k], transposed, as
@ torch's Linear). gcc cannot keep four sums, four weight distances and the zero point in
@ registers there (Thumb-1 has eight low registers, and its inline asm gets at most one
@ high one), so it spills the sums to the stack: ~7 instructions per multiply-accumulate.
@ Written by hand: 3.81 per multiply-accumulate (unsigned inputs), 4.06 (signed): four
@ terms a turn (4 / 4.125 with two, before 2026-11-28's last round).
@
@   void mt_dot4_u8(const uint8_t *px, const uint8_t *pe, const int32_t *p, int32_t *acc)
@   void mt_dot4_s8(...)  the same for int8 inputs
@
@ acc[j] += sum over px <= x < pe of (*x - p[4]) * (int8)x[p[j]], j = 0 .. 3: px moves, the
@ four weight rows lie at fixed distances p[0..3] from it (Thumb-1's ldrsb has only a
@ register-offset form), p[4] is the input zero point. (pe - px) is even and above 0:
@ four terms per turn of the loop, after two when (pe - px) mod 4 is 2.
@
@ Registers: r0 px, r1 input value, r2 product, r3-r6 distances, r7 zero point, r8-r11 sums,
@ r12 pe.

    .syntax unified
    .cpu cortex-m0
    .thumb
    .text

#include "thumb_macros.h"

#ifndef MT_THUMB2         /* the armv7m build: qlinear_thumb2.S's, with MLA */
@ one term: the input byte (sign-extended when \signed), less the zero point, times the
@ four weights, added to the four sums
.macro term signed
    ldrb r1, [r0, #0]
    .if \signed
    sxtb r1, r1
    .endif
    subs r1, r1, r7
    ldrsb r2, [r0, r3]
    muls r2, r1, r2
    add r8, r2
    ldrsb r2, [r0, r4]
    muls r2, r1, r2
    add r9, r2
    ldrsb r2, [r0, r5]
    muls r2, r1, r2
    add r10, r2
    ldrsb r2, [r0, r6]
    muls r2, r1, r2
    add r11, r2
    adds r0, #1
.endm

@ the four sums from acc (r3) into r8-r11, pe (r1) into r12; and back into acc (pushed
@ first, below the four saved high registers)
.macro acc_in
    ldr r4, [r3, #0]
    mov r8, r4
    ldr r4, [r3, #4]
    mov r9, r4
    ldr r4, [r3, #8]
    mov r10, r4
    ldr r4, [r3, #12]
    mov r11, r4
    mov r12, r1
.endm

.macro acc_out
    ldr r3, [sp, #16]       @ acc (pushed first, below the four saved high registers)
    mov r4, r8
    str r4, [r3, #0]
    mov r4, r9
    str r4, [r3, #4]
    mov r4, r10
    str r4, [r3, #8]
    mov r4, r11
    str r4, [r3, #12]
.endm

.macro dot4 name, signed
    func \name
    push {r3-r7, lr}
    push_high
    acc_in
    ldr r3, [r2, #0]
    ldr r4, [r2, #4]
    ldr r5, [r2, #8]
    ldr r6, [r2, #12]
    ldr r7, [r2, #16]
    mov r1, r12
    subs r1, r1, r0
    lsls r1, r1, #30        @ (pe - px) mod 4: 2 (two terms first) or 0
    beq 1f
    term \signed
    term \signed
    cmp r0, r12
    beq 2f
1:
    term \signed
    term \signed
    term \signed
    term \signed
    cmp r0, r12
    bne 1b
2:
    acc_out
    pop_high
    pop {r3-r7, pc}
    .size \name, . - \name
.endm

    dot4 mt_dot4_u8, 0
    dot4 mt_dot4_s8, 1

@ The same four sums for a weight W[k, n] (unit stride along n, sw along k; MatMul, Gemm
@ without transB):
@
@   void mt_dot4_kn_u8(const uint8_t *px, const uint8_t *pe, const int32_t *p, int32_t *acc)
@   void mt_dot4_kn_s8(...)  the same for int8 inputs
@
@ p = [w, sw, zp]: the four weights of a step are the bytes w[0..3], then w moves by sw.
@ Weights 1-3 are register-offset ldrsb loads (offsets 1, 2, 3 held in r4, r6, r7); weight 0
@ is ldrb + sxtb. 4.19 instructions per multiply-accumulate (unsigned inputs), 4.31
@ (signed): four terms a turn, after two when (pe - px) mod 4 is 2 (4.375 / 4.5 with two
@ a turn). (pe - px) is even and above 0.
@
@ Registers: r0 px, r1 input value, r2 product, r3 w, r4/r6/r7 the offsets 1/2/3, r5 zero
@ point, r8-r11 sums, r12 pe, lr sw.

.macro term_kn signed, at
    ldrb r1, [r0, #\at]
    .if \signed
    sxtb r1, r1
    .endif
    subs r1, r1, r5
    ldrb r2, [r3, #0]
    sxtb r2, r2
    muls r2, r1, r2
    add r8, r2
    ldrsb r2, [r3, r4]
    muls r2, r1, r2
    add r9, r2
    ldrsb r2, [r3, r6]
    muls r2, r1, r2
    add r10, r2
    ldrsb r2, [r3, r7]
    muls r2, r1, r2
    add r11, r2
    add r3, lr
.endm

.macro dot4_kn name, signed
    func \name
    push {r3-r7, lr}
    push_high
    acc_in
    ldr r3, [r2, #0]
    ldr r4, [r2, #4]
    mov lr, r4
    ldr r5, [r2, #8]
    movs r4, #1
    movs r6, #2
    movs r7, #3
    mov r1, r12
    subs r1, r1, r0
    lsls r1, r1, #30        @ (pe - px) mod 4: 2 (two terms first) or 0
    beq 1f
    term_kn \signed, 0
    term_kn \signed, 1
    adds r0, #2
    cmp r0, r12
    beq 2f
1:
    term_kn \signed, 0
    term_kn \signed, 1
    term_kn \signed, 2
    term_kn \signed, 3
    adds r0, #4
    cmp r0, r12
    bne 1b
2:
    acc_out
    pop_high
    pop {r3-r7, pc}
    .size \name, . - \name
.endm

    dot4_kn mt_dot4_kn_u8, 0
    dot4_kn mt_dot4_kn_s8, 1
#endif

@ qconv_native.c's Conv: one (tap, input channel)'s rectangle of the int32 accumulator
@ plane, for unit strides along x:
@
@   void mt_conv_rect_u8(int32_t *pa, const uint8_t *px, const int32_t *p)
@   void mt_conv_rect_s8(...)  the same for int8 inputs
@
@ p = [rows, cols, skip_a, skip_b, w, zw]: per row, pa[c] += x[c] * w - zw for c < cols
@ (x the byte, sign-extended for int8 inputs; zw = x_zp * w), then pa moves on by skip_a
@ bytes and px by skip_b to the next row. rows, cols >= 1. Four outputs per turn: 7
@ instructions per multiply-accumulate (unsigned inputs), 8 (signed); gcc's loop took 10.
@
@ Registers: r0 pa, r1 px, r2 product, r3 sum, r4 w, r5 zw, r6 columns left, r8 rows left,
@ r9 skip_a, r10 skip_b, r11 cols.

.macro rect_term signed, at
    ldrb r2, [r1, #\at]
    .if \signed
    sxtb r2, r2
    .endif
    muls r2, r4, r2
    subs r2, r2, r5
    ldr r3, [r0, #(4 * \at)]
    adds r3, r3, r2
    str r3, [r0, #(4 * \at)]
.endm

.macro conv_rect name, signed
    func \name
    push {r4-r7, lr}
    push_high
    ldr r3, [r2, #0]
    mov r8, r3
    ldr r3, [r2, #4]
    mov r11, r3
    ldr r3, [r2, #8]
    mov r9, r3
    ldr r3, [r2, #12]
    mov r10, r3
    ldr r4, [r2, #16]
    ldr r5, [r2, #20]
1:                          @ a row
    mov r6, r11
    subs r6, #4
    blt 3f
2:                          @ four outputs
    rect_term \signed, 0
    rect_term \signed, 1
    rect_term \signed, 2
    rect_term \signed, 3
    adds r1, #4
    adds r0, #16
    subs r6, #4
    bge 2b
3:
    adds r6, #4
    beq 5f
4:                          @ the last 1-3 outputs
    rect_term \signed, 0
    adds r1, #1
    adds r0, #4
    subs r6, #1
    bne 4b
5:
    add r0, r9
    add r1, r10
    mov r3, r8
    subs r3, #1
    mov r8, r3
    bne 1b
    pop_high
    pop {r4-r7, pc}
    .size \name, . - \name
.endm

    conv_rect mt_conv_rect_u8, 0
    conv_rect mt_conv_rect_s8, 1

@ qconv_native.c's pointwise Conv (1x1, stride 1, no padding): four neighbouring pixels
@ of one output channel at once, each weight loaded once for the four inputs:
@
@   void mt_pw4_u8(const uint8_t *px, const uint8_t *pw, const int32_t *p, int32_t *acc)
@   void mt_pw4_s8(...)  the same for int8 inputs (sign-extended)
@
@ p = [cin, step]: acc[j] = sum over ci < cin of x[ci * step + j] * (int8)pw[ci], j = 0 .. 3
@ (the zero point's part is the caller's: x_zp * sum w). cin >= 1; two input channels per
@ turn of the loop after an odd cin's first. 4.125 instructions per multiply-accumulate
@ (unsigned inputs), 5.125 (signed).
@
@ Registers: r0 px, r1 pw, r2 weight, r3 input/product, r4-r7 sums, r8 step, r12 pw's end.

@ one input byte (sign-extended when signed) times the weight r2, added to a sum
.macro pw4_mac signed, at, sum
    ldrb r3, [r0, #\at]
    .if \signed
    sxtb r3, r3
    .endif
    muls r3, r2, r3
    adds \sum, \sum, r3
.endm

.macro pw_term signed, woff
    ldrb r2, [r1, #\woff]
    sxtb r2, r2
    pw4_mac \signed, 0, r4
    pw4_mac \signed, 1, r5
    pw4_mac \signed, 2, r6
    pw4_mac \signed, 3, r7
    add r0, r8
.endm

.macro pw4 name, signed
    func \name
    push {r3-r7, lr}
    mov r4, r8
    push {r4}
    ldr r4, [r2, #4]
    mov r8, r4
    ldr r2, [r2, #0]
    adds r3, r1, r2
    mov r12, r3
    movs r4, #0
    movs r5, #0
    movs r6, #0
    movs r7, #0
    lsrs r2, r2, #1
    bcc 1f
    pw_term \signed, 0
    adds r1, #1
1:
    cmp r1, r12
    beq 3f
2:
    pw_term \signed, 0
    pw_term \signed, 1
    adds r1, #2
    cmp r1, r12
    bne 2b
3:
    ldr r3, [sp, #4]        @ acc (pushed first, below the saved r8)
    stmia r3!, {r4-r7}
    pop {r4}
    mov r8, r4
    pop {r3-r7, pc}
    .size \name, . - \name
.endm

    pw4 mt_pw4_u8, 0
    pw4 mt_pw4_s8, 1

#ifndef MT_THUMB2         /* the armv7m build: qlinear_thumb2.S's, with MLA */
@ The same for eight neighbouring pixels (each weight loaded once for eight inputs; the
@ pointwise Conv's blocks of eight, mt_pw4 after them for a block of four):
@
@   void mt_pw8_u8(const uint8_t *px, const uint8_t *pw, const int32_t *p, int32_t *acc)
@   void mt_pw8_s8(...)
@
@ p = [cin, step], acc[0..7]. 3.56 instructions per multiply-accumulate (unsigned inputs),
@ 4.56 (signed).
@
@ Registers: r0 px, r1 pw, r2 weight, r3 input/product, r4-r7 sums 0-3, r8-r11 sums 4-7,
@ r12 pw's end, lr step.

.macro pw8_mac signed, at, sum
    ldrb r3, [r0, #\at]
    .if \signed
    sxtb r3, r3
    .endif
    muls r3, r2, r3
    add \sum, r3
.endm

.macro pw8_term signed, woff
    ldrb r2, [r1, #\woff]
    sxtb r2, r2
    pw8_mac \signed, 0, r4
    pw8_mac \signed, 1, r5
    pw8_mac \signed, 2, r6
    pw8_mac \signed, 3, r7
    pw8_mac \signed, 4, r8
    pw8_mac \signed, 5, r9
    pw8_mac \signed, 6, r10
    pw8_mac \signed, 7, r11
    add r0, lr
.endm

.macro pw8 name, signed
    func \name
    push {r3-r7, lr}
    push_high
    ldr r4, [r2, #4]
    mov lr, r4
    ldr r2, [r2, #0]
    adds r3, r1, r2
    mov r12, r3
    movs r4, #0
    mov r8, r4
    mov r9, r4
    mov r10, r4
    mov r11, r4
    movs r5, #0
    movs r6, #0
    movs r7, #0
    lsrs r2, r2, #1
    bcc 1f
    pw8_term \signed, 0
    adds r1, #1
1:
    cmp r1, r12
    beq 3f
2:
    pw8_term \signed, 0
    pw8_term \signed, 1
    adds r1, #2
    cmp r1, r12
    bne 2b
3:
    ldr r3, [sp, #16]       @ acc (pushed first, below the four saved high registers)
    stmia r3!, {r4-r7}
    mov r4, r8
    mov r5, r9
    mov r6, r10
    mov r7, r11
    stmia r3!, {r4-r7}
    pop_high
    pop {r3-r7, pc}
    .size \name, . - \name
.endm

    pw8 mt_pw8_u8, 0
    pw8 mt_pw8_s8, 1
#endif

@ qconv_native.c's 3x3 depthwise Conv (conv_dw3x3): rows of outputs' sums from their
@ padded input rows, laid out DW_RS = 14 bytes apart (so that every tap is an immediate
@ offset: 0-2, 14-16, 28-30), the nine weights in registers:
@
#ifndef MT_THUMB2         /* the armv7m build: qlinear_thumb2.S's, with MLA */
@   void mt_dw3_s1(const uint8_t *p, int32_t *acc, const int32_t *geo, const int32_t *w)
@   void mt_dw3_s2(...)  the same with stride 2 along x
@
@ geo = [cols, rows, skip]: per row, acc[i] = sum over ky, kx < 3 of
@ p[i * stride + 14 * ky + kx] * w[3 * ky + kx] for i < cols (the bytes unsigned), acc moves
@ on by cols, then p by skip bytes more to the next row's start. cols, rows >= 1.
@ 37 instructions an output (gcc's C: ~65); mt_dw3_s1 takes them in pairs (below).
@
@ Registers: r0 p, r1 acc, r2 weight/temporary, r3 byte/product, r4 sum, r5-r7 w0-w2,
@ r8-r12 and lr w3-w8; the row's end in acc, rows left, skip and 4 * cols on the stack.

@ six weights, from r3 + at on, into r8-r12 and lr (through r4)
.macro dw3_high at
    ldr r4, [r3, #\at]
    mov r8, r4
    ldr r4, [r3, #(\at + 4)]
    mov r9, r4
    ldr r4, [r3, #(\at + 8)]
    mov r10, r4
    ldr r4, [r3, #(\at + 12)]
    mov r11, r4
    ldr r4, [r3, #(\at + 16)]
    mov r12, r4
    ldr r4, [r3, #(\at + 20)]
    mov lr, r4
.endm

.macro dw3_tap at, w
    ldrb r3, [r0, #\at]
    mov r2, \w
    muls r3, r2, r3
    adds r4, r4, r3
.endm

.macro dw3 name, step
    func \name
    push {r4-r7, lr}
    push_high
    sub sp, #16
    ldr r4, [r2, #0]
    lsls r4, r4, #2
    str r4, [sp, #12]       @ 4 * cols
    ldr r4, [r2, #4]
    str r4, [sp, #4]        @ rows left
    ldr r4, [r2, #8]
    str r4, [sp, #8]        @ skip
    dw3_high 12
    ldr r5, [r3, #0]
    ldr r6, [r3, #4]
    ldr r7, [r3, #8]
1:                          @ a row
    ldr r3, [sp, #12]
    adds r3, r1, r3
    str r3, [sp, #0]        @ its end in acc
2:                          @ an output
    ldrb r4, [r0, #0]
    muls r4, r5, r4
    ldrb r3, [r0, #1]
    muls r3, r6, r3
    adds r4, r4, r3
    ldrb r3, [r0, #2]
    muls r3, r7, r3
    adds r4, r4, r3
    dw3_tap 14, r8
    dw3_tap 15, r9
    dw3_tap 16, r10
    dw3_tap 28, r11
    dw3_tap 29, r12
    dw3_tap 30, lr
    stmia r1!, {r4}
    adds r0, #\step
    ldr r3, [sp, #0]
    cmp r1, r3
    bne 2b
    ldr r3, [sp, #8]
    adds r0, r0, r3         @ the next row's start
    stack_countdown r3, 4
    bne 1b
    add sp, #16
    pop_high
    pop {r4-r7, pc}
    .size \name, . - \name
.endm

@ mt_dw3_s1 takes its outputs two at a time (a row's last one alone when cols is odd): a
@ weight moved from its high register once serves both, and the second sum lives in r7,
@ so w2 joins the high registers and w8 the stack: 64 instructions a pair, 35 the last
@ odd one (37 an output before). (mt_dw3_s2 cannot: the second output's last tap, 32
@ bytes on, is beyond LDRB's immediate offsets.)
@
@ Registers: r0 p, r1 acc, r2 weight, r3 byte/product, r4 and r7 the sums, r5-r6 w0-w1,
@ r8-r12 and lr w2-w7; on the stack the pairs' end in acc, rows left, skip, 4 * the cols
@ in pairs, w8, cols & 1.

@ tap `at` of both outputs (their bytes at and at + 1) by the weight in \w
.macro dw3_pair at, w
    ldrb r3, [r0, #\at]
    muls r3, \w, r3
    adds r4, r4, r3
    ldrb r3, [r0, #(\at + 1)]
    muls r3, \w, r3
    adds r7, r7, r3
.endm

    func mt_dw3_s1
    push {r4-r7, lr}
    push_high
    sub sp, #24
    ldr r4, [r2, #0]
    movs r5, #1
    ands r5, r4
    str r5, [sp, #20]       @ cols & 1
    subs r4, r4, r5
    lsls r4, r4, #2
    str r4, [sp, #12]       @ 4 * the cols in pairs
    ldr r4, [r2, #4]
    str r4, [sp, #4]        @ rows left
    ldr r4, [r2, #8]
    str r4, [sp, #8]        @ skip
    dw3_high 8
    ldr r4, [r3, #32]
    str r4, [sp, #16]       @ w8
    ldr r5, [r3, #0]
    ldr r6, [r3, #4]
1:                          @ a row
    ldr r3, [sp, #12]
    adds r3, r1, r3
    str r3, [sp, #0]        @ its pairs' end in acc
    cmp r1, r3
    beq 3f
2:                          @ two outputs
    ldrb r4, [r0, #0]
    muls r4, r5, r4
    ldrb r7, [r0, #1]
    muls r7, r5, r7
    dw3_pair 1, r6
    mov r2, r8
    dw3_pair 2, r2
    mov r2, r9
    dw3_pair 14, r2
    mov r2, r10
    dw3_pair 15, r2
    mov r2, r11
    dw3_pair 16, r2
    mov r2, r12
    dw3_pair 28, r2
    mov r2, lr
    dw3_pair 29, r2
    ldr r2, [sp, #16]
    dw3_pair 30, r2
    stmia r1!, {r4, r7}
    adds r0, #2
    ldr r3, [sp, #0]
    cmp r1, r3
    bne 2b
3:
    ldr r3, [sp, #20]
    cmp r3, #0
    beq 4f
    ldrb r4, [r0, #0]       @ the row's last output, alone
    muls r4, r5, r4
    ldrb r3, [r0, #1]
    muls r3, r6, r3
    adds r4, r4, r3
    dw3_tap 2, r8
    dw3_tap 14, r9
    dw3_tap 15, r10
    dw3_tap 16, r11
    dw3_tap 28, r12
    dw3_tap 29, lr
    ldr r2, [sp, #16]
    ldrb r3, [r0, #30]
    muls r3, r2, r3
    adds r4, r4, r3
    stmia r1!, {r4}
    adds r0, #1
4:
    ldr r3, [sp, #8]
    adds r0, r0, r3         @ the next row's start
    stack_countdown r3, 4
    beq 5f
    b 1b                    @ (Thumb-1's BNE reaches 256 bytes back)
5:
    add sp, #24
    pop_high
    pop {r4-r7, pc}
    .size mt_dw3_s1, . - mt_dw3_s1

    dw3 mt_dw3_s2, 2
#endif

#ifndef MT_THUMB2         /* the armv7m build: qlinear_thumb2.S's */
@ Eight rows' sums against one weight vector, the eight rows' bytes interleaved (a block
@ of eight outputs' operands transposed: xt[8 * t + lane]), and the weights' own sum:
@
@   void mt_t8(const uint8_t *xt, const uint8_t *w, const int32_t *p, int32_t *acc)
@
@ p = [k, sw]: acc[lane] = sum over t < k of xt[8 * t + lane] * (int8)w[t * sw], lane < 8,
@ and acc[8] = sum over t < k of (int8)w[t * sw] (the zero point's part, x_zp * sum w, is
@ the caller's). Each weight loaded once for eight products, every input an immediate
@ offset. k >= 1: k mod 4 single terms first, then four terms per turn of the loop; a unit
@ stride (sw 1: a transposed Gemm weight, a Conv's) loads the four weights at immediate
@ offsets. The Gemm's rows in blocks of eight, the Conv's patches (qconv_native.c): 3.53
@ instructions per multiply-accumulate with sw 1 (27 a term and 5 per four), 3.50 else
@ (27 a term: a register-offset LDRSB from w - sw, then w moves on; 3.63 with LDRB + SXTB
@ and sw in r12 before 2026-11-28's last round, 3.81 with two terms a turn and no
@ unit-stride form before its rework).
@
@ Registers: r0 xt, r1 w - sw, r2 weight, r3 input/product, r4-r6 sums 0-2, r12 sum 3,
@ r8-r11 sums 4-7, r7 sw, lr the weights' sum; xt's end and the single terms' count on the
@ stack.

.macro t8_mac at, sum
    ldrb r3, [r0, #\at]
    muls r3, r2, r3
    add \sum, r3
.endm

.macro t8_lanes at
    t8_mac (\at + 0), r4
    t8_mac (\at + 1), r5
    t8_mac (\at + 2), r6
    t8_mac (\at + 3), r12
    t8_mac (\at + 4), r8
    t8_mac (\at + 5), r9
    t8_mac (\at + 6), r10
    t8_mac (\at + 7), r11
.endm

@ a term whose weight lies at r1 + sw, then r1 moves on by sw
.macro t8_term at
    ldrsb r2, [r1, r7]
    add lr, r2
    adds r1, r1, r7
    t8_lanes \at
.endm

@ a term whose weight lies at r1 + wi (sw 1: wi counts from 1)
.macro t8_unit at, wi
    ldrb r2, [r1, #\wi]
    sxtb r2, r2
    add lr, r2
    t8_lanes \at
.endm

    func mt_t8
    push {r3-r7, lr}
    push_high
    sub sp, #8
    ldr r3, [r2, #0]
    lsls r4, r3, #3
    adds r4, r0, r4
    str r4, [sp, #0]        @ xt's end
    ldr r7, [r2, #4]        @ sw
    subs r1, r1, r7         @ w - sw: each term's LDRSB reads at r1 + sw
    movs r4, #0
    mov lr, r4
    mov r8, r4
    mov r9, r4
    mov r10, r4
    mov r11, r4
    mov r12, r4
    movs r5, #0
    movs r6, #0
    lsls r3, r3, #30
    lsrs r3, r3, #30        @ k mod 4
    beq 1f
    str r3, [sp, #4]
4:
    t8_term 0
    adds r0, #8
    stack_countdown r3, 4
    bne 4b
1:
    ldr r3, [sp, #0]
    cmp r0, r3
    bne 6f
    b 3f                    @ (beq's reach is 256 bytes)
6:
    cmp r7, #1
    bne 2f
5:
    t8_unit 0, 1
    t8_unit 8, 2
    t8_unit 16, 3
    t8_unit 24, 4
    adds r1, #4
    adds r0, #32
    ldr r3, [sp, #0]
    cmp r0, r3
    bne 5b
    b 3f
2:
    t8_term 0
    t8_term 8
    t8_term 16
    t8_term 24
    adds r0, #32
    ldr r3, [sp, #0]
    cmp r0, r3
    bne 2b
3:
    ldr r3, [sp, #24]       @ acc (pushed first, below the four saved high registers)
    store_sums8 r3, r3
    mov r4, lr
    str r4, [r3, #0]
    add sp, #8
    pop_high
    pop {r3-r7, pc}
    .size mt_t8, . - mt_t8
#endif

@ qlinear_native.c's rows8: one input row into its lane of the transposed block,
@
@   void mt_lane8(const uint8_t *x, uint8_t *xt, mp_int_t k, uint32_t flip)
@
@ xt[8 * t] = x[t] ^ flip for t < k (k >= 1; x's bytes consecutive: a Gemm row). Four
@ bytes a turn, the stores at immediate offsets: 4 instructions a byte (gcc's loop took
@ 13, its pointers and flip reloaded from the stack), in every ARM build.
@
@ Registers: r0 x, r1 xt, r2 turns left, r3 flip, r4 the byte, r5 k mod 4.
    func mt_lane8
    push {r4, r5, lr}
    lsls r5, r2, #30
    lsrs r5, r5, #30        @ k mod 4: single bytes first
    beq 2f
1:
    ldrb r4, [r0, #0]
    eors r4, r3
    strb r4, [r1, #0]
    adds r0, #1
    adds r1, #8
    subs r5, #1
    bne 1b
2:
    lsrs r2, r2, #2
    beq 3f
4:
    ldrb r4, [r0, #0]
    eors r4, r3
    strb r4, [r1, #0]
    ldrb r4, [r0, #1]
    eors r4, r3
    strb r4, [r1, #8]
    ldrb r4, [r0, #2]
    eors r4, r3
    strb r4, [r1, #16]
    ldrb r4, [r0, #3]
    eors r4, r3
    strb r4, [r1, #24]
    adds r0, #4
    adds r1, #32
    subs r2, #1
    bne 4b
3:
    pop {r4, r5, pc}
    .size mt_lane8, . - mt_lane8

@ qconv_native.c's copy_rows (both ARM builds): the depthwise path's input rows into its
@ padded band.
@
@   void mt_copy_rows(uint8_t *dst, const uint8_t *src, const int32_t *geo)
@
@ geo = [n, rows, src pitch, dst pitch, flip]: rows rows of n >= 1 bytes, each b ^ flip,
@ the rows src pitch and dst pitch bytes apart; each row's bytes from the last, by an index
@ that counts down: 5 instructions a byte and 5 a row (gcc's C: 8 and ~10, flip reloaded
@ from the stack per byte).
@
@ Registers: r0 dst, r1 src, r2 the index, r3 n, r4 rows left, r5 the byte, r6 flip, r12
@ and lr the pitches.

    func mt_copy_rows
    push {r4-r6, lr}
    ldr r3, [r2, #8]
    mov r12, r3             @ src pitch
    ldr r3, [r2, #12]
    mov lr, r3              @ dst pitch
    ldr r3, [r2, #0]        @ n
    ldr r4, [r2, #4]        @ rows left
    ldr r6, [r2, #16]       @ flip
    cmp r4, #0
    ble 3f
1:                          @ a row
    subs r2, r3, #1
2:                          @ a byte
    ldrb r5, [r1, r2]
    eors r5, r6
    strb r5, [r0, r2]
    subs r2, #1
    bpl 2b
    add r1, r12
    add r0, lr
    subs r4, #1
    bne 1b
3:
    pop {r4-r6, pc}
    .size mt_copy_rows, . - mt_copy_rows
