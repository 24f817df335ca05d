# Integer training resumed from a checkpoint (device checkpoint.py: momentum velocities as
# momentum0, stochastic-rounding generators as microtrain.rng.<w>.dither): N + M steps in
# one run, then N steps, save_checkpoint(include_optimizer_state=True), a fresh state and
# Module from that file, M more steps. Prints both end states (parameters, velocities,
# generators) for the test to compare, on MicroPython (viper or pure kernels) or CPython.
#   inttrain_resume.py BLOB CKPT DATA N M fast|pure SAVED_CKPT
import gc
import sys
from array import array
from microtrain import CheckpointState, Module
from microtrain.feed import copy_inputs
from microtrain.kernels import inttrain, qlinear

blob, start, n_first, n_more = sys.argv[1], sys.argv[2], int(sys.argv[4]), int(sys.argv[5])
if sys.argv[6] == "pure":
    qlinear.use_fast(False)
    inttrain.use_fast(False)
saved = sys.argv[7]
with open(sys.argv[3], "rb") as f:
    data = f.read()


def train(model, first, count):
    b = model.blob
    program = model._train
    xin, lab = program.inputs
    nx, nl = b.sizes[xin], b.sizes[lab]
    code = "b" if b.dtypes[xin] == 2 else "B"
    record = nx + 4 * nl
    for s in range(first, first + count):
        at = (s % (len(data) // record)) * record
        copy_inputs(b, model.F, model.I, program, (array(code, data[at:at + nx]),
                    array("i", data[at + nx:at + record])), b.num_classes)
        for kernel, args in program.steps:
            kernel(model.F, model.I, args)


def show(model):
    state = model.state
    for name in sorted(state.parameters):
        print(name, " ".join(str(v) for v in state.parameters[name].data))
    for name in sorted(state.int_velocities):
        dtype, view = state.int_velocities[name]
        print("velocity", name, dtype, " ".join(str(v) for v in bytes(view)))
    randoms = model._random_states()
    for name in sorted(randoms):
        print(name, randoms[name])


model = Module(blob, CheckpointState.load_checkpoint(start))
train(model, 0, n_first + n_more)
print("straight")
show(model)
del model
gc.collect()
model = Module(blob, CheckpointState.load_checkpoint(start))
train(model, 0, n_first)
CheckpointState.save_checkpoint(model.state, saved, include_optimizer_state=True)
del model
gc.collect()
model = Module(blob, CheckpointState.load_checkpoint(saved))
train(model, n_first, n_more)
print("resumed")
show(model)
