@ qconv_direct.c's eight-lane loops: Thumb-1 (armv6m: every ARM core) or, in the armv7m
@ build (MT_THUMB2), Thumb-2 with MLA.
@
@   void mt_d8x1(const uint8_t *x, const int32_t *table, const int32_t *p, int32_t *acc)
@   void mt_d4x2(...)
@
@ p = [the table's end, groups, stride]. The table holds (offset, weight) pairs, a multiple
@ of four of them. For each group g < groups, with x_g = x + g * step and acc_g = acc +
@ g * step (ints):
@   acc_g[lane] = sum over the pairs of x_g[offset + d(lane)] * weight
@ mt_d8x1: step 8, d(lane) = lane, the eight sums stored together (stride 16);
@ mt_d4x2: step 4, d(lane) = lane for lanes 0-3 and lane + 12 for 4-7 (the band row 16
@ bytes below), lanes 4-7's sums stored at acc_g + stride bytes (the output row below).
@ Inputs are unsigned bytes (the band holds them flipped); every input an immediate offset
@ from the term's pointer. Per term: one LDM for the pair, one add, then per lane LDRB,
@ MULS, ADD (Thumb-1: 26 for eight multiply-accumulates) or LDRB, MLA (Thumb-2: 19).
@
@ Registers: r0 the term's pointer, r1 the table's end, r2 weight, r3 input and product,
@ r4-r6 sums 0-2, SUM3, r8-r11 sums 4-7, TABLE, lr x_g (Thumb-1: SUM3 r12, TABLE r7, as
@ LDM's base must be a low register there; Thumb-2: r7 and r12). On the stack: the table's
@ start, groups left, acc_g, the stride (Thumb-1: less 16).

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

.macro d8_term gap
    ldmia TABLE!, {r0, r2}
    add r0, lr
    d8_mac 0, r4
    d8_mac 1, r5
    d8_mac 2, r6
    d8_mac 3, SUM3
    d8_mac (4 + \gap), r8
    d8_mac (5 + \gap), r9
    d8_mac (6 + \gap), r10
    d8_mac (7 + \gap), r11
.endm

.macro direct8 name, gap, step
    func \name
#ifdef MT_THUMB2
    push {r4-r11, lr}
#else
    push {r4-r7, lr}
    push_high
#endif
    sub sp, #16
    str r1, [sp, #0]        @ the table's start
    ldr r4, [r2, #4]
    str r4, [sp, #4]        @ groups left
    str r3, [sp, #8]        @ acc_g
    ldr r4, [r2, #8]
#ifndef MT_THUMB2
    subs r4, #16            @ (from acc_g + 16, where the first four's STMIA leaves it)
#endif
    str r4, [sp, #12]       @ the stride
    ldr r1, [r2, #0]        @ the table's end
    mov lr, r0
1:
#ifdef MT_THUMB2
    zero_r4_r11
#else
    movs r4, #0
    movs r5, #0
    movs r6, #0
    mov r12, r4
    mov r8, r4
    mov r9, r4
    mov r10, r4
    mov r11, r4
#endif
    ldr TABLE, [sp, #0]
2:
    d8_term \gap
    d8_term \gap
    d8_term \gap
    d8_term \gap
    cmp TABLE, r1
    bne 2b
    ldr r3, [sp, #8]
    ldr r0, [sp, #12]
#ifdef MT_THUMB2
    add r0, r3
    stm r0, {r8-r11}
    stmia r3!, {r4-r7}
#else
    mov r7, r12
    stmia r3!, {r4-r7}
    adds r0, r0, r3
    mov r4, r8
    mov r5, r9
    mov r6, r10
    mov r7, r11
    stmia r0!, {r4-r7}
#endif
    .if \step == 8
    adds r3, #16
    .endif
    str r3, [sp, #8]
    movs r0, #\step
    add lr, r0
    ldr r0, [sp, #4]
    subs r0, #1
    str r0, [sp, #4]
    beq 3f
    b 1b                    @ (Thumb-1's BNE reaches 256 bytes back)
3:
    add sp, #16
#ifdef MT_THUMB2
    pop {r4-r11, pc}
#else
    pop_high
    pop {r4-r7, pc}
#endif
    .size \name, . - \name
.endm

    direct8 mt_d8x1, 0, 8
    direct8 mt_d4x2, 12, 4
