# Issue 22's acceptance run: STEPS integer train steps of a pack --int8 blob, each step's
# train program under micropython.heap_lock() with the viper kernels ("fast" on
# MicroPython), or with the pure-Python kernels ("pure"), or on CPython. Prints a header
# line, then each step's loss as the device reports it (integer_loss, after the lock is
# released: a float is an object) and its loss ints, and the trained parameters, so the
# caller compares runs byte for byte; saves the checkpoint.
#   int8_acceptance_steps.py BLOB CKPT DATA STEPS fast|pure OUT_CKPT
# DATA: one record per training sample, each train input's bytes in the program's input
# order (int8 / uint8: a byte a value, int32: four, little endian); step s reads record
# s mod the record count.
import sys
from array import array
try:
    import micropython
except ImportError:
    micropython = None
from microtrain import CheckpointState, Module
from microtrain.blob import INT32, INT8
from microtrain.feed import copy_inputs
from microtrain.intparams import integer_loss
from microtrain.kernels import intgrad, inttrain, qlinear

mode = sys.argv[5]
if mode == "pure":
    qlinear.use_fast(False)
    inttrain.use_fast(False)
    intgrad.use_fast(False)
state = CheckpointState.load_checkpoint(sys.argv[2])
model = Module(sys.argv[1], state)
b = model.blob
program = model._train
codes = ["i" if b.dtypes[t] == INT32 else "b" if b.dtypes[t] == INT8 else "B"
         for t in program.inputs]
widths = [b.sizes[t] * (4 if code == "i" else 1) for t, code in zip(program.inputs, codes)]
with open(sys.argv[3], "rb") as f:
    data = f.read()
record = sum(widths)
records = len(data) // record
steps = int(sys.argv[4])
F, I = model.F, model.I
lock = micropython is not None and mode == "fast"
loss = program.outputs[0]
print("locked", lock, "viper", inttrain.int_gemm_update is not inttrain._pure["int_gemm_update"],
      "intgrad viper", intgrad.int_conv_update is not intgrad._pure["int_conv_update"])
for s in range(steps):
    at = (s % records) * record
    inputs = []         # the step's input arrays, made before the lock
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
    print("step", s, "loss", "%.6f" % integer_loss(model, program), "ints",
          " ".join(str(I[b.offsets[loss] + i]) for i in range(b.sizes[loss])))
for name in sorted(state.parameters):
    print(name, " ".join(str(v) for v in state.parameters[name].data))
CheckpointState.save_checkpoint(state, sys.argv[6])
