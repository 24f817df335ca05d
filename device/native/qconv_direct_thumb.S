@ qconv_direct.c's eight-lane loops: Thumb-1 (armv6m: every ARM core) or, in the armv7m
@ build (MT_THUMB2), Thumb-2 with MLA.
@
@   void mt_d8x1(const uint8_t *x, const int32_t *table, const int32_t *p, int32_t *acc)
@   void mt_d4x2(...)
@   void mt_d8(...)
@   void mt_d8s2(...)
@
@ p = [the table's end, groups, stride, x step, acc step, start] (stride and the steps in
@ bytes). The table holds (offset, weight) pairs, a multiple of four of them. For each
@ group g < groups, with x_g = x + g * (x step) and acc_g = acc + g * (acc step):
@   sum[lane] = start + sum over the pairs of x_g[offset + d(lane)] * weight,  lane < 8
@ (start: what the columns form's left-out padding terms add; setting the sums to it costs
@ what zeroing them did)
@ mt_d8x1: d(lane) = lane (eight outputs of a row), lanes 0-3's sums stored together at
@ acc_g, 4-7's at acc_g + stride (16: after them);
@ mt_d4x2: d(lane) = lane for lanes 0-3 and lane + 12 for 4-7 (the band row 16 bytes
@ below), stored as mt_d8x1's (stride: the output row below);
@ mt_d8: d(lane) = lane (eight outputs of a column), sum[lane] stored at acc_g + lane *
@ stride (one output row);
@ mt_d8s2: d(lane) = 2 * lane (a column of a Conv of stride 2 along it), stored as mt_d8's.
@ Inputs are unsigned bytes (the band holds them flipped); every input an immediate offset
@ from the term's pointer. Per term: one LDM for the pair, one add, then per lane LDRB,
@ MULS, ADD (Thumb-1: 26 for eight multiply-accumulates) or LDRB, MLA (Thumb-2: 19).
@
@ Registers: r0 the term's pointer, r1 the table's end, r2 weight, r3 input and product,
@ r4-r6 sums 0-2, SUM3, r8-r11 sums 4-7, TABLE, lr x_g (Thumb-1: SUM3 r12, TABLE r7, as
@ LDM's base must be a low register there; Thumb-2: r7 and r12). On the stack: the table's
@ start, groups left, acc_g, the stride, the x step, the acc step, the sums' start.

    .syntax unified
#ifdef MT_THUMB2
    .cpu cortex-m3
#define SUM3 r7
#define TABLE r12
#else
    .cpu cortex-m0
#define SUM3 r12
#define TABLE r7
#endif
    .thumb
    .text

#include "thumb_macros.h"

.macro d8_mac at, sum
    ldrb r3, [r0, #\at]
#ifdef MT_THUMB2
    mla \sum, r3, r2, \sum
#else
    muls r3, r2, r3
    add \sum, r3
#endif
.endm

@ lane i's input at i * scale, lanes 4-7 gap further
.macro d8_term scale, gap
    ldmia TABLE!, {r0, r2}
    add r0, lr
    d8_mac 0, r4
    d8_mac (1 * \scale), r5
    d8_mac (2 * \scale), r6
    d8_mac (3 * \scale), SUM3
    d8_mac (4 * \scale + \gap), r8
    d8_mac (5 * \scale + \gap), r9
    d8_mac (6 * \scale + \gap), r10
    d8_mac (7 * \scale + \gap), r11
.endm

@ one sum stored at r3, which moves on by r0 (Thumb-1 stores a high register through r2)
.macro store_next sum, high
#ifndef MT_THUMB2
    .if \high
    mov r2, \sum
    str r2, [r3]
    .else
    str \sum, [r3]
    .endif
#else
    str \sum, [r3]
#endif
    adds r3, r3, r0
.endm

.macro direct8 name, scale, gap, split
    func \name
#ifdef MT_THUMB2
    push {r4-r11, lr}
#else
    push {r4-r7, lr}
    push_high
#endif
    sub sp, #32
    str r1, [sp, #0]        @ the table's start
    str r3, [sp, #8]        @ acc_g
    ldr r1, [r2, #4]
    str r1, [sp, #4]        @ groups left
    ldr r1, [r2, #8]
    str r1, [sp, #12]       @ the stride
    ldr r1, [r2, #12]
    str r1, [sp, #16]       @ the x step
    ldr r1, [r2, #16]
    str r1, [sp, #20]       @ the acc step
    ldr r1, [r2, #20]
    str r1, [sp, #24]       @ the sums' start
    ldr r1, [r2, #0]        @ the table's end
    mov lr, r0
1:
    ldr r4, [sp, #24]
    movs r5, r4
    movs r6, r4
    mov SUM3, r4
    mov r8, r4
    mov r9, r4
    mov r10, r4
    mov r11, r4
    ldr TABLE, [sp, #0]
2:
    d8_term \scale, \gap
    d8_term \scale, \gap
    d8_term \scale, \gap
    d8_term \scale, \gap
    cmp TABLE, r1
    bne 2b
    ldr r3, [sp, #8]
    ldr r0, [sp, #12]
    .if \split
    adds r0, r0, r3
#ifdef MT_THUMB2
    stm r0, {r8-r11}
    stmia r3!, {r4-r7}
#else
    store_sums8 r3, r0
#endif
    .else
    store_next r4, 0
    store_next r5, 0
    store_next r6, 0
    store_next SUM3, 1
    store_next r8, 1
    store_next r9, 1
    store_next r10, 1
    store_next r11, 1
    .endif
    ldr r3, [sp, #8]
    ldr r0, [sp, #20]
    adds r3, r3, r0
    str r3, [sp, #8]
    ldr r0, [sp, #16]
    add lr, r0
    stack_countdown r0, 4
    beq 3f
    b 1b                    @ (Thumb-1's BNE reaches 256 bytes back)
3:
    add sp, #32
#ifdef MT_THUMB2
    pop {r4-r11, pc}
#else
    pop_high
    pop {r4-r7, pc}
#endif
    .size \name, . - \name
.endm

    direct8 mt_d8x1, 1, 0, 1
    direct8 mt_d4x2, 1, 12, 1
    direct8 mt_d8, 1, 0, 0
    direct8 mt_d8s2, 2, 0, 0
