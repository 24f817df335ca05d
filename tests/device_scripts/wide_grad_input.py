# kernels/intgrad.py int_conv_grad_input on an arena read from a file (tests/test_intgrad.py
# wide geometries), with the viper or the pure-Python kernels, under micropython.heap_lock()
# where there is one; writes the int32 arena back.
#   wide_grad_input.py fast|pure I_FILE W_FILE GEOMETRY
# GEOMETRY: the kernel's 19 ints gx, g, w, m, ..., pad_l, comma-separated (args[1:20]); the
# weights' bytes are args[0] and args[20].
import sys
from array import array
try:
    import micropython
except ImportError:
    micropython = None
from microtrain.kernels import intgrad

mode, i_file, w_file, geometry = sys.argv[1:5]
fast = intgrad.use_fast(mode == "fast")
assert fast == (mode == "fast" and micropython is not None), (mode, fast)
with open(i_file, "rb") as f:
    I = array("i", f.read())
with open(w_file, "rb") as f:
    W = bytearray(f.read())
args = (W,) + tuple(int(v) for v in geometry.split(",")) + (W,)
if micropython is not None:
    micropython.heap_lock()
try:
    intgrad.int_conv_grad_input(None, I, args)
finally:
    if micropython is not None:
        micropython.heap_unlock()
with open(i_file, "wb") as f:
    f.write(I)
