# Device side of bench/inttrain_step.py: one integer train step (kernels/inttrain.py, every
# step of the train program under micropython.heap_lock() on MicroPython) against the float
# train step (Module + Optimizer) of the same model training the same layer, in one run.
#   inttrain_device.py INT_BLOB INT_CKPT FLOAT_BLOB FLOAT_CKPT ROUNDS
# Prints: int_us float_us ratio locked
import sys
from array import array
from mac_loop import now_us, since_us
from microtrain import CheckpointState, Module, Optimizer
from microtrain.feed import copy_inputs

try:
    import micropython
    lock, unlock = micropython.heap_lock, micropython.heap_unlock
except ImportError:
    lock = unlock = None

rounds = int(sys.argv[5])
state = CheckpointState.load_checkpoint(sys.argv[2])
model = Module(sys.argv[1], state)
b = model.blob
program = model._train
xin, lab = program.inputs
x = array("B" if b.dtypes[xin] == 3 else "b", (i * 37 % 100 for i in range(b.sizes[xin])))
labels = array("i", [1] * b.sizes[lab])
F, I = model.F, model.I
best_int = None
for r in range(rounds):
    copy_inputs(b, F, I, program, (x, labels), b.num_classes)
    t0 = now_us()
    if lock:
        lock()
    try:
        for kernel, args in program.steps:
            kernel(F, I, args)
    finally:
        if unlock:
            unlock()
    t = since_us(t0)
    best_int = t if best_int is None or t < best_int else best_int
del model, state, b, F, I
import gc
gc.collect()
fstate = CheckpointState.load_checkpoint(sys.argv[4])
fmodel = Module(sys.argv[3], fstate)
opt = Optimizer(sys.argv[3], fmodel)
fb = fmodel.blob
n = fb.sizes[fmodel._train.inputs[0]]
fx = array("f", ((i * 37 % 100) * 0.01 for i in range(n)))
flab = [1] * fb.sizes[fmodel._train.inputs[1]]
best_float = None
for r in range(rounds):
    t0 = now_us()
    fmodel(fx, flab)
    opt.step()
    fmodel.lazy_reset_grad()
    t = since_us(t0)
    best_float = t if best_float is None or t < best_float else best_float
print(best_int, best_float, best_float / best_int, lock is not None)
