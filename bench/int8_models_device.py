# Device side of bench/int8_models.py: one integer train step of a pack --int8 blob (its
# train program's steps, under micropython.heap_lock() on MicroPython) against one float
# train step (Module + Optimizer.step) of the float pack of the same model, in one process,
# best of ROUNDS each after a warm-up step.
#   int8_models_device.py INT_BLOB INT_CKPT FLOAT_BLOB FLOAT_CKPT ROUNDS
# Prints: int_us float_us locked
import gc
import sys
from array import array
from mac_loop import now_us, since_us
from microtrain import CheckpointState, Module, Optimizer
from microtrain.blob import FLOAT, INT32, INT8
from microtrain.feed import copy_inputs

try:
    import micropython
    lock, unlock = micropython.heap_lock, micropython.heap_unlock
except ImportError:
    lock = unlock = None

rounds = int(sys.argv[5])


def int_step_us(blob, checkpoint):
    model = Module(blob, CheckpointState.load_checkpoint(checkpoint))
    b = model.blob
    program = model._train
    inputs = []
    for t in program.inputs:
        if b.dtypes[t] == INT32:        # labels: class 1 (of at least two)
            inputs.append(array("i", [1] * b.sizes[t]))
        else:
            inputs.append(array("b" if b.dtypes[t] == INT8 else "B",
                                (i * 37 % 100 for i in range(b.sizes[t]))))
    F, I = model.F, model.I
    best = None
    for r in range(rounds + 1):
        copy_inputs(b, F, I, program, inputs, b.num_classes)
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
        if r and (best is None or t < best):
            best = t
    return best


def float_step_us(blob, checkpoint):
    model = Module(blob, CheckpointState.load_checkpoint(checkpoint))
    opt = Optimizer(blob, model)
    b = model.blob
    inputs = []
    for t in model._train.inputs:
        if b.dtypes[t] == FLOAT:        # the input, or a regression target
            inputs.append(array("f", ((i * 37 % 100) * 0.01 for i in range(b.sizes[t]))))
        else:
            inputs.append([1] * b.sizes[t])
    best = None
    for r in range(rounds + 1):
        t0 = now_us()
        model(*inputs)
        opt.step()
        model.lazy_reset_grad()
        t = since_us(t0)
        if r and (best is None or t < best):
            best = t
    return best


int_us = int_step_us(sys.argv[1], sys.argv[2])
gc.collect()
float_us = float_step_us(sys.argv[3], sys.argv[4])
print(int_us, float_us, lock is not None)
