@ The float Gemm's inner loop in Thumb-2 (armv7m builds: Cortex-M3 and later without an
@ FPU), by hand: a dot product of two runs of unpacked single-precision terms, every product
@ and every sum rounded to nearest even as IEEE (libgcc's soft float, MicroPython's floats)
@ rounds them, in order. gcc's C for the same steps (f32.h) took ~88 instructions a term,
@ libgcc's calls ~87; this loop ~34.
@
@ uint32_t mt_fdot(const uint32_t *a, const uint32_t *b, int32_t k, uint32_t *s)
@   a, b   k terms each, unpacked by float_native.c (unpack_run): two words a term, the
@          significand with its leading 1 at bit 31 (bits 8..31), then the sign (bit 31) |
@          the biased exponent + 2**29 - 64; a zero, a subnormal, an infinity or a NaN has
@          the sentinel 0x40000000, 0x48000000 or 0x50000000 (| its sign) instead
@   *s     the running sum's bits, a normal number, in and out
@   returns the terms it added (k, or fewer: it leaves term [returned] to the caller, the
@   sum before it in *s, when that term is not the common case: a special operand other
@   than a zero times a finite number, a product or sum outside the normal range, a sum that
@   is an exact tie before its rounding; or it stops after a term whose sum is exactly 0,
@   *s = +0)
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
@ the kept bits are an exact half (0x80): such a term goes to the caller, whose C rounds
@ it exactly. A difference renormalized by more than one place had no bits shifted out
@ (exponents at most one apart).

    .syntax unified
    .thumb
    .text
    .align  2
    .global mt_fdot
    .type   mt_fdot, %function
    .thumb_func
mt_fdot:
    push    {r4-r11, lr}
    push    {r0, r3}                @ [sp]: a at the start (to count terms), [sp, 4]: s
    ldr     r4, [r3]
    ubfx    r5, r4, #23, #8
    sub     r5, r5, #2
    add     r5, r5, #0x40000000
    and     r6, r4, #0x80000000
    orr     r5, r5, r6              @ Es
    lsl     r4, r4, #8
    orr     r4, r4, #0x80000000     @ S
    mov     r12, #0x80000000
    cmp     r2, #0
    ble     done
loop:
    ldrd    r6, r7, [r0], #8        @ A's significand, sign | exponent
    ldrd    r8, r9, [r1], #8        @ B's
    umull   r8, r6, r6, r8          @ r6:r8 the product, in [2**62, 2**64)
    add     r10, r7, r9             @ E
    add     r11, r12, r10, lsl #1
    cmp     r11, #504
    bhi     special
    cmp     r6, #0
    bmi     1f
    lsl     r6, r6, #1              @ (the low word's top bit is sticky only)
    sub     r10, r10, #1
1:  and     r11, r6, #0x100         @ round half to even at bit 8: + 0x7f + (odd or sticky)
    orr     r8, r8, r11
    cmp     r8, #1
    adcs    r6, r6, #0x7f
    bcs     p_carry
p_ok:
    bic     r6, r6, #0xff           @ P
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
    and     r11, r8, #0xff
    cmp     r11, #0x80
    beq     leave
    adds    r8, r8, #0x80
    bcs     p_round_carry
    bic     r4, r8, #0xff
    mov     r5, r10
    subs    r2, r2, #1
    bne     loop
    b       done

s_big:                              @ S's exponent above P's
    neg     r11, r11
    teq     r10, r5
    bmi     s_sub
    lsr     r8, r6, r11
    adds    r8, r4, r8
    bcs     s_add_carry
s_round:                            @ r8: the sum, S's sign and exponent
    and     r11, r8, #0xff
    cmp     r11, #0x80
    beq     leave
    adds    r8, r8, #0x80
    bcs     s_round_carry
    bic     r4, r8, #0xff
    subs    r2, r2, #1
    bne     loop
    b       done

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
1:  rrx     r8, r8                  @ the carry back in at bit 31 (the bit shifted out can
    add     r11, r12, r10, lsl #1   @ only make a kept exact half inexact: a tie anyway)
    cmp     r11, #504
    bhi     leave
    b       p_round

s_round_carry:                      @ rounded up to 2**32: 2**31, exponent + 1
    mov     r10, r5
p_round_carry:
    add     r10, r10, #1
    add     r11, r12, r10, lsl #1
    cmp     r11, #504
    bhi     leave
    mov     r4, #0x80000000
    mov     r5, r10
    subs    r2, r2, #1
    bne     loop
    b       done

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
    clz     r11, r8
    lsl     r8, r8, r11
    sub     r10, r10, r11
    add     r11, r12, r10, lsl #1   @ 2 * (exponent - 2): at least -2 (exponent 1)
    add     r11, r11, #2
    cmp     r11, #506
    bhi     leave
    b       p_round

zero:                               @ an exact 0: +0 (round to nearest), after this term
    movs    r4, #0
    ldr     r3, [sp, #4]
    str     r4, [r3]
    ldr     r1, [sp]
    sub     r0, r0, r1
    lsr     r0, r0, #3
    add     sp, sp, #8
    pop     {r4-r11, pc}

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
    b       done

leave:                              @ this term not added: the terms before it
    sub     r0, r0, #8
done:                               @ pack S, Es into *s; return the terms added
    bic     r6, r5, #0x80000000
    sub     r6, r6, #0x40000000
    add     r6, r6, #1              @ the biased exponent - 1
    lsl     r6, r6, #23
    add     r6, r6, r4, lsr #8      @ + the significand with its leading 1
    and     r7, r5, #0x80000000
    orr     r6, r6, r7
    ldr     r3, [sp, #4]
    str     r6, [r3]
    ldr     r1, [sp]
    sub     r0, r0, r1
    lsr     r0, r0, #3
    add     sp, sp, #8
    pop     {r4-r11, pc}
    .size   mt_fdot, .-mt_fdot
