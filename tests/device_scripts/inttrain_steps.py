# Integer training steps of an int8_train.mtb (quant/inttrain.py) on MicroPython (the
# viper kernels, every train step under micropython.heap_lock()) or with the pure-Python
# kernels, or on CPython: prints the trained int8 weights, int32 bias and the last loss ints
# so the test can compare the three runs byte for byte; saves the checkpoint.
#   inttrain_steps.py BLOB CKPT DATA STEPS fast|pure OUT_CKPT [buffer] [each]
# buffer: the blob given to the Module as bytes (as a blob in flash: its int8 weights read
# in place) rather than as a path. each: the header line first, then a line per step with
# its loss as the device reports it (integer_loss, after the lock is released: a float is
# an object) and its loss ints (tests/int8_acceptance_run.py).
# DATA: records of each train input's values in the program's input order (int8 / uint8: a
# byte each, int32: four, little endian): the quantized input, then the labels or target if
# the program takes one.
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
each = "each" in sys.argv[7:]
if "buffer" in sys.argv[7:]:
    with open(sys.argv[1], "rb") as f:
        source = f.read()
else:
    source = sys.argv[1]
model = Module(source, state)
if source is not sys.argv[1]:
    assert model.blob.weights is not None and len(model.blob.weights) == len(source)
b = model.blob
program = model._train
codes = ["i" if b.dtypes[t] == INT32 else "b" if b.dtypes[t] == INT8 else "B"
         for t in program.inputs]
widths = [b.sizes[t] * (4 if code == "i" else 1) for t, code in zip(program.inputs, codes)]
with open(sys.argv[3], "rb") as f:
    data = f.read()
record = sum(widths)
steps = int(sys.argv[4])
F, I = model.F, model.I
lock = micropython is not None and mode == "fast"
loss = program.outputs[0]
# kernels/intwide.py: imported at load by the checker of a wide layer (a minimal runtime
# without one does not carry it)
intwide = intgrad.intwide or inttrain.intwide
header = ("locked", lock, "viper",
          inttrain.int_gemm_update is not inttrain._pure["int_gemm_update"],
          "intgrad viper", intgrad.int_conv_update is not intgrad._pure["int_conv_update"],
          "wide viper",
          intwide is not None and intwide.gather_wide is not intwide._pure["gather_wide"])
# a model with a wide layer runs intwide's viper kernels with the families' (the Unix port
# has viper)
assert intwide is None or header[-1] == (micropython is not None and mode == "fast")
if each:
    print(*header)
kernel = args = None    # (module globals made before the lock: a dict that grows allocates)
for s in range(steps):
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
    if each:
        print("step", s, "loss", "%.6f" % integer_loss(model, program), "ints",
              " ".join(str(I[b.offsets[loss] + i]) for i in range(b.sizes[loss])))
if not each:
    print(*header)
names = sorted(state.parameters)
for name in names:
    p = state.parameters[name]
    print(name, " ".join(str(v) for v in p.data))
print("loss", " ".join(str(I[b.offsets[loss] + i]) for i in range(b.sizes[loss])))
CheckpointState.save_checkpoint(state, sys.argv[6])
