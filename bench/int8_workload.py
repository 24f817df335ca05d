# Device side of bench/int8_callgrind.py: a fixed int8 workload whose instruction count
# callgrind measures (MicroPython Unix port; viper kernels, or pure with "pure" last).
#   int8_workload.py DIR infer N [pure]         N int8 forwards of DIR/int8.mtb on DIR/x.f32
#   int8_workload.py DIR train NAME N [pure]    N integer train steps of DIR/NAME (under
#                                               micropython.heap_lock() with the viper kernels)
# Prints a checksum of the outputs or of the trained parameters: equal before and after a
# change that must not change a bit (and between viper and pure).
import sys
from array import array
try:
    import micropython
except ImportError:
    micropython = None
from microtrain.kernels import intgrad, inttrain, qlinear

root = sys.argv[1] + "/"
pure = sys.argv[-1] == "pure"
if pure:
    qlinear.use_fast(False)
    inttrain.use_fast(False)
    intgrad.use_fast(False)


def checksum(values, h):
    for v in values:
        h = (h * 31 + (v & 0xFFFFFFFF)) & 0xFFFFFFF
    return h


if sys.argv[2] == "infer":
    from microtrain import InferenceSession
    runs = int(sys.argv[3])
    session = InferenceSession(root + "int8.mtb")
    with open(root + "x.f32", "rb") as f:
        x = array("f", f.read())
    h = 0
    for _ in range(runs):
        h = checksum(array("i", bytes(session.run(x))), h)
    print("infer", runs, h)
else:
    from microtrain import CheckpointState, Module
    from microtrain.feed import copy_inputs
    d = root + sys.argv[3] + "/"
    runs = int(sys.argv[4])
    state = CheckpointState.load_checkpoint(d + "int8_train.ckpt")
    model = Module(d + "int8_train.mtb", state)
    b = model.blob
    program = model._train
    xin, lab = program.inputs
    nx, nl = b.sizes[xin], b.sizes[lab]
    code = "b" if b.dtypes[xin] == 2 else "B"
    with open(d + "data.bin", "rb") as f:
        data = f.read()
    record = nx + 4 * nl
    F, I = model.F, model.I
    lock = micropython is not None and not pure
    for s in range(runs):
        at = (s % (len(data) // record)) * record
        copy_inputs(b, F, I, program, (array(code, data[at:at + nx]),
                                       array("i", data[at + nx:at + record])), b.num_classes)
        if lock:
            micropython.heap_lock()
        try:
            for kernel, args in program.steps:
                kernel(F, I, args)
        finally:
            if lock:
                micropython.heap_unlock()
    h = 0
    for name in sorted(state.parameters):
        h = checksum(state.parameters[name].data, h)
    print("train", sys.argv[3], runs, h)
