@ The float Gemm's inner loop in Thumb-2 (armv7m builds: Cortex-M3 and later without an
@ FPU), by hand: a dot product of two runs of unpacked single-precision terms, every product
@ and every sum rounded to nearest even as IEEE (libgcc's soft float, MicroPython's floats)
@ rounds them, in order. gcc's C for the same steps (f32.h) took ~88 instructions a term,
@ libgcc's calls ~87; this loop ~34.
@
@ int mt_fdot_rows(fdot_job_t *job)       (f32_dot.h)
@   The dot products of `rows` rows of A (8k bytes apart) with one column of B, each of k
@   terms unpacked by f32_dot.h's unpack_run: two words a term, the significand with its
@   leading 1 at bit 31 (bits 8..31), then the sign (bit 31) | the biased exponent +
@   2**29 - 64; a zero, a subnormal, an infinity or a NaN has the sentinel 0x40000000,
@   0x48000000 or 0x50000000 (| its sign) instead. Each row's sum starts at job's (t, s):
@   terms done, their sum (the first row's as the caller sets it, 0 and +0 for the next
@   ones), and its bits go to *out, out advancing a word a row. Returns 0 when all rows are
@   done, or 1 when it leaves a term to the caller: job's a, out and rows at that row, t
@   the terms done, s their sum; the term is not the common case (a special operand other
@   than a zero times a finite number, a product or sum outside the normal range, a sum
@   ending exactly halfway with bits shifted out). The caller adds it (f32.h) and resumes
@   when the sum is normal or zero.
@
@ Inside, the sum is S (its significand, leading 1 at bit 31, low 8 bits 0) and Es (sign |
@ exponent - 2 + 2**30); a product's sign | exponent is E = the two exponent words' sum
@ (their signs' sum at bit 31 is the product's sign), the same scale when its significand
@ (the high word of the 64-bit product) has bit 31 set. The exponents are checked at once:
@ 2 * (E - 2**30) = (E << 1) + 2**31 (mod 2**32, the sign shifted out) must be at most 504
@ (product exponent 2 .. 254 before normalizing), which the sentinels never are.
@
@ Rounding: the product's exactly (its low word is the sticky bit); the sum's from the bits
@ kept: the smaller operand's bits shifted out below bit 0 make the kept sum low by less
@ than one unit (high for a difference), which changes the rounding at bit 8 only when
@ the kept bits are an exact half (0x80). Exponents at most 7 apart shift no bit out (the
@ operands' low 8 bits are 0; a carried sum's halving neither): a true tie, to even (d = 1
@ makes one in two sums one); further apart such a term goes to the caller, whose C rounds
@ it exactly. A difference renormalized by more than one place had no bits shifted out
@ (exponents at most one apart).

    .syntax unified
    .thumb
    .text
    .align  2

@ job's fields (f32_dot.h fdot_job_t)
    .equ    J_A, 0
    .equ    J_B, 4
    .equ    J_K, 8
    .equ    J_ROWS, 12
    .equ    J_OUT, 16
    .equ    J_T, 20
    .equ    J_S, 24

@ The next terms' product: r6:r8 = A's significand x B's (r6, r7 A's words; r8, r9 B's),
@ rounded to r6 (leading 1 at bit 31, low 8 bits 0), its sign | exponent in r10; to
@ `special` for a sentinel or an exponent out of range, to `carry` when the rounding carries
@ out (which comes back to `ok`)
    .macro  PRODUCT special, carry, ok
    ldrd    r6, r7, [r0], #8        @ A's significand, sign | exponent
    ldrd    r8, r9, [r1], #8        @ B's
    umull   r8, r6, r6, r8          @ r6:r8 the product, in [2**62, 2**64)
    add     r10, r7, r9             @ E: the signs' sum at bit 31 is the product's sign
    add     r11, r12, r10, lsl #1
    cmp     r11, #504
    bhi     \special
    cmp     r6, #0
    bmi     1f
    lsl     r6, r6, #1              @ (the low word's top bit is sticky only)
    sub     r10, r10, #1
1:  and     r11, r6, #0x100         @ round half to even at bit 8: + 0x7f + (odd or sticky)
    orr     r8, r8, r11
    cmp     r8, #1
    adcs    r6, r6, #0x7f
    bcs     \carry
\ok:
    bic     r6, r6, #0xff
    .endm

@ Pack S (r4), Es (r5) into r6: sign | biased exponent - 1 << 23, + the significand
    .macro  PACK
    bic     r6, r5, #0x80000000
    sub     r6, r6, #0x40000000
    add     r6, r6, #1
    lsl     r6, r6, #23
    add     r6, r6, r4, lsr #8
    and     r7, r5, #0x80000000
    orr     r6, r6, r7
    .endm

    .global mt_fdot_rows
    .type   mt_fdot_rows, %function
    .thumb_func
mt_fdot_rows:
    push    {r4-r11, lr}
    mov     r3, r0                  @ the job
    mov     r12, #0x80000000
row:
    ldr     r0, [r3, #J_A]
    ldr     r1, [r3, #J_B]
    ldr     r2, [r3, #J_K]
    ldr     r6, [r3, #J_T]
    ldr     r4, [r3, #J_S]
    sub     r2, r2, r6              @ terms left
    add     r0, r0, r6, lsl #3
    add     r1, r1, r6, lsl #3
    cmp     r2, #0
    ble     row_stored              @ none: the sum as given
    lsls    r6, r4, #1
    beq     zloop                   @ +-0: the zero phase
    ubfx    r5, r4, #23, #8         @ a normal sum: unpacked
    sub     r5, r5, #2
    add     r5, r5, #0x40000000
    and     r6, r4, #0x80000000
    orr     r5, r5, r6              @ Es
    lsl     r4, r4, #8
    orr     r4, r4, #0x80000000     @ S
loop:
    PRODUCT special, p_carry, p_ok
    sub     r11, r10, r5
    sbfx    r11, r11, #0, #31       @ d = P's exponent - S's (signs dropped)
    cmp     r11, #0
    blt     s_big
    teq     r10, r5
    bmi     p_sub
    lsr     r8, r4, r11             @ same signs, P's exponent at least S's
    adds    r8, r6, r8
    bcs     p_add_carry
p_round:                            @ r8: the sum (leading 1 at bit 31), r10: sign | exponent
    and     r9, r8, #0xff
    cmp     r9, #0x80
    beq     p_tie
p_up:
    adds    r8, r8, #0x80
    bcs     p_round_carry
p_down:
    bic     r4, r8, #0xff
    mov     r5, r10
    subs    r2, r2, #1
    bne     loop
    b       row_done

s_big:                              @ S's exponent above P's
    neg     r11, r11
    teq     r10, r5
    bmi     s_sub
    lsr     r8, r6, r11
    adds    r8, r4, r8
    bcs     s_add_carry
s_round:                            @ r8: the sum, S's sign and exponent
    and     r9, r8, #0xff
    cmp     r9, #0x80
    beq     s_tie
s_up:
    adds    r8, r8, #0x80
    bcs     s_round_carry
s_down:
    bic     r4, r8, #0xff
    subs    r2, r2, #1
    bne     loop
    b       row_done

p_tie:                              @ the kept bits end exactly halfway: a tie when no bit
    cmp     r11, #7                 @ was shifted out (|d| <= 7: the operands' low 8 bits
    bhi     leave                   @ are 0; <= 7 for a sum carried out and halved too)
    tst     r8, #0x100
    beq     p_down                  @ to even
    b       p_up
s_tie:
    cmp     r11, #7
    bhi     leave
    tst     r8, #0x100
    beq     s_down
    b       s_up

p_carry:                            @ the product rounded up to 2**32: 2**31, exponent + 1
    mov     r6, #0x80000000
    add     r10, r10, #1
    add     r11, r12, r10, lsl #1
    cmp     r11, #504
    bhi     leave
    b       p_ok

s_add_carry:                        @ the sum carried out of bit 31: halve it, exponent + 1
    add     r10, r5, #1
    b       1f
p_add_carry:
    add     r10, r10, #1
1:  rrx     r8, r8                  @ the carry back in at bit 31 (the bit shifted out is
    add     r9, r12, r10, lsl #1    @ 0 for |d| <= 7: see the ties)
    cmp     r9, #504
    bhi     leave
    b       p_round

s_round_carry:                      @ rounded up to 2**32: 2**31, exponent + 1
    mov     r10, r5
p_round_carry:
    add     r10, r10, #1
    add     r9, r12, r10, lsl #1
    cmp     r9, #504
    bhi     leave
    mov     r4, #0x80000000
    mov     r5, r10
    subs    r2, r2, #1
    bne     loop
    b       row_done

p_sub:                              @ signs differ, P's exponent at least S's: P - S
    lsr     r8, r4, r11
    subs    r8, r6, r8
    bcc     p_sub_negative          @ S > P (exponents equal): the sum takes S's sign
    bmi     p_round
    beq     zero
    b       cancel
p_sub_negative:
    rsbs    r8, r8, #0
    eor     r10, r10, #0x80000000
    bmi     p_round
    b       cancel
s_sub:                              @ signs differ, S's exponent above P's: S - P (> 0)
    lsr     r8, r6, r11
    subs    r8, r4, r8
    bmi     s_round
    mov     r10, r5
cancel:                             @ renormalize r8 (> 0), exponent r10
    clz     r9, r8
    lsl     r8, r8, r9
    sub     r10, r10, r9
    add     r9, r12, r10, lsl #1    @ 2 * (exponent - 2): at least -2 (exponent 1)
    add     r9, r9, #2
    cmp     r9, #506
    bhi     leave
    b       p_round

special:                            @ a sentinel or the product's exponent out of range
    bic     r10, r7, #0x80000000
    bic     r11, r9, #0x80000000
    cmp     r10, #0x40000000
    beq     a_zero
    cmp     r11, #0x40000000
    bne     leave                   @ no zero: the caller's
    cmp     r10, #0x50000000        @ B zero: a zero product unless A is inf or NaN
    beq     leave
    b       skip
a_zero:
    cmp     r11, #0x50000000
    beq     leave
skip:                               @ S + (+-0) = S (S is not zero)
    subs    r2, r2, #1
    bne     loop
    b       row_done

zero:                               @ an exact 0: +0 (round to nearest), then the zero phase
    movs    r4, #0
    subs    r2, r2, #1
    beq     row_stored
zloop:                              @ the sum r4 is +-0: it becomes the first nonzero product
    PRODUCT zspecial, z_carry, z_ok
    mov     r4, r6
    mov     r5, r10
    subs    r2, r2, #1
    bne     loop
    b       row_done
z_carry:
    mov     r6, #0x80000000
    add     r10, r10, #1
    add     r11, r12, r10, lsl #1
    cmp     r11, #504
    bhi     zleave
    b       z_ok
zspecial:                           @ a zero product keeps the sum 0 (-0 only if both are)
    bic     r10, r7, #0x80000000
    bic     r11, r9, #0x80000000
    cmp     r10, #0x40000000
    beq     za_zero
    cmp     r11, #0x40000000
    bne     zleave
    cmp     r10, #0x50000000
    beq     zleave
    b       zskip
za_zero:
    cmp     r11, #0x50000000
    beq     zleave
zskip:
    eor     r11, r7, r9
    and     r4, r4, r11
    subs    r2, r2, #1
    bne     zloop
    b       row_stored

row_done:                           @ the row's sum (S, Es) to *out, then the next row
    PACK
    mov     r4, r6
row_stored:                         @ the row's sum's bits in r4
    ldr     r7, [r3, #J_OUT]
    str     r4, [r7], #4
    str     r7, [r3, #J_OUT]
    ldr     r6, [r3, #J_ROWS]
    subs    r6, r6, #1
    str     r6, [r3, #J_ROWS]
    beq     all_done
    ldr     r0, [r3, #J_A]
    ldr     r2, [r3, #J_K]
    add     r0, r0, r2, lsl #3
    str     r0, [r3, #J_A]
    movs    r6, #0
    str     r6, [r3, #J_T]
    str     r6, [r3, #J_S]
    b       row
all_done:
    movs    r0, #0
    pop     {r4-r11, pc}

leave:                              @ this term not added: the sum of the terms before it
    PACK
    mov     r4, r6
zleave:
    str     r4, [r3, #J_S]
    ldr     r1, [r3, #J_A]
    sub     r0, r0, r1
    lsr     r0, r0, #3
    sub     r0, r0, #1
    str     r0, [r3, #J_T]
    movs    r0, #1
    pop     {r4-r11, pc}
    .size   mt_fdot_rows, .-mt_fdot_rows
