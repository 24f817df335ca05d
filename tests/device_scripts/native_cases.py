# Prepended after native_oracle.py to the native checks that call run_cases
# (tests/test_board_natmod.py's native_script: the others, intgrad_native.py among them,
# leave its bytecode out of a heap they use to the last kilobytes).


def run_cases(default, draw):
    # The checks' loop (qlinear_native.py, qlinear_native_pool.py, inttrain_native.py):
    # CASES cases (the test sets it; else default), each from draw(done): None (nothing
    # drawn: draw again) or (kernel, I, args, crafted, arenas, what). The kernel's call
    # writes the arenas; prints "case N CRC" (their CRC-32) per case, with `what` on
    # CPython's run (a failure's message names the case), then "cases N fallback F".
    import gc
    from binascii import crc32
    try:
        count = CASES
    except NameError:
        count = default
    cases = fallback = 0
    while cases < count:
        gc.collect()            # the last case's arrays (the large pointwise ones ~20 KB)
        case = draw(cases)
        if case is None:
            continue
        kernel, I, args, crafted, arenas, what = case
        kernel(None, I, args)
        crc = 0
        for arena in arenas:
            crc = crc32(arena, crc)
        cases += 1
        fallback += crafted
        print("case", cases, crc, what if PURE else "")
    print("cases", cases, "fallback", fallback)
