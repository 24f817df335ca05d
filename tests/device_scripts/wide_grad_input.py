# The wide input gradients on an arena read from a file (tests/test_intgrad.py):
# kernels/intgrad.py int_conv_grad_input or kernels/inttrain.py int_gemm_grad_input, with the
# viper or the pure-Python kernels, under micropython.heap_lock() where there is one; writes
# the int32 arena back.
#   wide_grad_input.py fast|pure conv|gemm I_FILE W_FILE INTS
# INTS: the kernel's ints after its byte buffer, comma-separated (conv: args[1:20], gx, g, w,
# m, ..., pad_l; gemm: args[1:8], d, g, w, factors, m, k, n); the weights' bytes are args[0]
# (and the conv's args[20]).
import sys
from array import array
try:
    import micropython
except ImportError:
    micropython = None
from microtrain.kernels import fastpath, intgrad, inttrain

mode, kernel, i_file, w_file, ints = sys.argv[1:6]
family = intgrad if kernel == "conv" else inttrain
fast = family.use_fast(mode == "fast")
assert fast == (mode == "fast" and micropython is not None), (mode, fast)
# what the checker of a wide layer does at load: intwide imported, switched as the family
fastpath.load_helper(family.__dict__, "intwide",
                     "int_conv_grad_input" if kernel == "conv" else "int_gemm_grad_input")
from microtrain.kernels import intwide
assert (intwide.gather_wide is not intwide._pure["gather_wide"]) == fast
with open(i_file, "rb") as f:
    I = array("i", f.read())
with open(w_file, "rb") as f:
    W = bytearray(f.read())
args = (W,) + tuple(int(v) for v in ints.split(","))
if kernel == "conv":
    args += (W,)
run = intgrad.int_conv_grad_input if kernel == "conv" else inttrain.int_gemm_grad_input
if micropython is not None:
    micropython.heap_lock()
try:
    run(None, I, args)
finally:
    if micropython is not None:
        micropython.heap_unlock()
with open(i_file, "wb") as f:
    f.write(I)
