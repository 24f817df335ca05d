# Device side of bench/float_callgrind.py: a fixed float workload whose instruction count
# callgrind measures (MicroPython Unix port, or CPython).
#   float_workload.py DIR N             N train steps of DIR (model(x, y); opt.step();
#                                       lazy_reset_grad), after one warm-up step
#   float_workload.py DIR N FAMILY      after the warm-up step, N passes over only the train
#                                       program's steps (and the backward_update program's)
#                                       whose kernel is in kernels/FAMILY.py
# The inputs are fixed, so the work is the same before and after a change. Prints a checksum
# of the arenas' bits: equal before and after a change that must not change a bit.
import sys
from array import array

from fixed_batch import trainer

directory = sys.argv[1]
runs = int(sys.argv[2])
family = sys.argv[3] if len(sys.argv) > 3 else None
model, train_step = trainer(directory)
train_step()
if family is None:
    for _ in range(runs):
        train_step()
else:
    module = __import__("microtrain.kernels." + family, None, None, [family])
    mine = [getattr(module, name) for name in dir(module)]
    programs = [model._train] + ([model._backward_update] if model._backward_update else [])
    steps = [(kernel, args) for p in programs for kernel, args in p.steps
             if any(kernel is k for k in mine)]
    F, I = model.F, model.I
    for _ in range(runs):
        for kernel, args in steps:
            kernel(F, I, args)
h = 0
for arena in (model.F, model.I):
    for v in array("I", bytes(arena)):
        h = (h * 31 + (v & 0xFFFFFFF)) & 0xFFFFFFF
print(family or "step", runs, h)
