# int8 inference under micropython.heap_lock(): every int8 step of an inference blob (the
# qlinear kernels' viper fast paths) runs with the heap locked; the float boundary steps
# (QuantizeLinear of the input, DequantizeLinear of the output: float results are heap
# objects on this port) run just before and after. Also checks the viper kernels give the
# pure-Python kernels' bytes.
#   int8_heap_lock.py BLOB INPUT_F32
import sys
from array import array
import micropython
from microtrain import InferenceSession
from microtrain.kernels import qlinear

session = InferenceSession(sys.argv[1])
x = array("f", open(sys.argv[2], "rb").read())
b = session.blob
program = session._program
int8 = [getattr(qlinear, name) for name in qlinear._FAST_NAMES] + [qlinear.qlinear_max_pool]
from microtrain.feed import copy_inputs
copy_inputs(b, session.F, session.I, program, (x,), 0)
F, I = session.F, session.I
locked = 0
for kernel, args in program.steps:
    if kernel in int8:
        micropython.heap_lock()
        try:
            kernel(F, I, args)
        finally:
            micropython.heap_unlock()
        locked += 1
    else:
        kernel(F, I, args)
out = program.outputs[0]
fast = bytes(session.blob.Q)
print("locked", locked, "of", len(program.steps))
qlinear.use_fast(False)
pure = InferenceSession(sys.argv[1])
pure.run(x)
print("same", bytes(pure.blob.Q) == fast)
