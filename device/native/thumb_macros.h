// The assembler macros the Thumb files share (qlinear_thumb.S, qrequant_thumb.S,
// qconv_direct_thumb.S and the Thumb-2 ones #include this: gcc runs cpp over .S files).
#ifndef MT_THUMB_MACROS_H
#define MT_THUMB_MACROS_H

@ a global Thumb function's entry
.macro func name
    .align 2
    .global \name
    .type \name, %function
    .thumb_func
\name:
.endm

@ r8-r11 saved on the stack (through r4-r7, which the caller's push has saved) and restored:
@ the Thumb-1 loops keep sums, weights or pointers there
.macro push_high
    mov r4, r8
    mov r5, r9
    mov r6, r10
    mov r7, r11
    push {r4-r7}
.endm

.macro pop_high
    pop {r4-r7}
    mov r8, r4
    mov r9, r5
    mov r10, r6
    mov r11, r7
.endm

@ (Thumb-1) eight sums r4-r6, r12, r8-r11 stored: the first four at \lo, the others at \hi
@ (both move on; the same register: eight in a row); r4-r7 overwritten
.macro store_sums8 lo, hi
    mov r7, r12
    stmia \lo!, {r4-r7}
    mov r4, r8
    mov r5, r9
    mov r6, r10
    mov r7, r11
    stmia \hi!, {r4-r7}
.endm

@ a count kept on the stack at sp + \at, less one (through \reg): Z when it reaches 0
.macro stack_countdown reg, at
    ldr \reg, [sp, #\at]
    subs \reg, #1
    str \reg, [sp, #\at]
.endm

@ (Thumb-2) eight sums in r4-r11 set to zero
.macro zero_r4_r11
    movs r4, #0
    movs r5, #0
    movs r6, #0
    movs r7, #0
    mov r8, r4
    mov r9, r4
    mov r10, r4
    mov r11, r4
.endm

#endif
