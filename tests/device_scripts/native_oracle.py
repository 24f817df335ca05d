# Prepended to the native module's integer checks (qlinear_native.py, inttrain_native.py,
# intgrad_native.py, inttrain_native_train.py; tests/test_board_natmod.py's native_script):
# the board runs a case on the native module's kernel (its fallback the family's pure
# kernels); CPython's run of the same script (PURE = True, cpython_cases) on the family's
# pure kernel, and the test compares the two.
try:
    PURE                    # the host's run sets it
except NameError:
    PURE = False


def kernel_of(family, name):
    # the kernel `name` of the family module the cases run
    if PURE:
        return family._pure[name]
    from microtrain.kernels import qlinear_native
    qlinear_native._pure = family._pure
    return getattr(qlinear_native, name)

