# Integer training steps of an int8_train.mtb with any inputs (quant/inttrain.py: the
# input, then the labels or target if the program takes one) on MicroPython (the viper
# kernels, every train step under micropython.heap_lock()) or with the pure-Python kernels,
# or on CPython: prints the trained parameters and the last loss ints, for the test to
# compare the runs byte for byte.
#   intloss_steps.py BLOB CKPT DATA STEPS fast|pure
# DATA: records of each train input's bytes (int8 / uint8: one byte a value, int32: four,
# little endian), in the program's input order.
import sys
from array import array
try:
    import micropython
except ImportError:
    micropython = None
from microtrain import CheckpointState, Module
from microtrain.blob import INT32, INT8
from microtrain.feed import copy_inputs
from microtrain.kernels import inttrain, qlinear

mode = sys.argv[5]
if mode == "pure":
    qlinear.use_fast(False)
    inttrain.use_fast(False)
state = CheckpointState.load_checkpoint(sys.argv[2])
model = Module(sys.argv[1], state)
b = model.blob
program = model._train
codes = [("i" if b.dtypes[t] == INT32 else "b" if b.dtypes[t] == INT8 else "B")
         for t in program.inputs]
widths = [b.sizes[t] * (4 if code == "i" else 1) for t, code in zip(program.inputs, codes)]
with open(sys.argv[3], "rb") as f:
    data = f.read()
record = sum(widths)
F, I = model.F, model.I
lock = micropython is not None and mode == "fast"
for s in range(int(sys.argv[4])):
    at = (s % (len(data) // record)) * record
    inputs = []
    for code, width in zip(codes, widths):
        inputs.append(array(code, data[at:at + width]))
        at += width
    copy_inputs(b, F, I, program, inputs, b.num_classes)
    if lock:
        micropython.heap_lock()
    try:
        for kernel, args in program.steps:
            kernel(F, I, args)
    finally:
        if lock:
            micropython.heap_unlock()
print("locked", lock)
for name in sorted(state.parameters):
    print(name, " ".join(str(v) for v in state.parameters[name].data))
loss = program.outputs[0]
print("loss", " ".join(str(I[b.offsets[loss] + i]) for i in range(b.sizes[loss])))
