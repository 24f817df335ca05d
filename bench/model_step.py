# Device side of bench/models.py: times train steps (forward + backward + optimizer) of any
# packed model and, in the same process, the interpreter's plain multiply-accumulate loop.
# Runs unchanged on MicroPython and CPython (only array, gc, sys, time, via mac_loop.py).
#   micropython bench/model_step.py ARTIFACT_DIR STEPS     (MICROPYPATH=device)
#   python      bench/model_step.py ARTIFACT_DIR STEPS     (PYTHONPATH=device)
# Prints one "RESULT key=value ..." line for the host script.
import gc
import sys
from array import array

from mac_loop import now_us, plain_loop_rate, since_us
from microtrain import CheckpointState, Module, Optimizer

ROUNDS = 3

directory, steps = sys.argv[1], int(sys.argv[2])
state = CheckpointState.load_checkpoint(directory + "/checkpoint")
model = Module(directory + "/model.mtb", state)
opt = Optimizer(directory + "/model.mtb", model)
b = model.blob
x_id, y_id = b.programs["train"].inputs
x = array("f", [((i * 7919) % 1009) / 1009.0 - 0.5 for i in range(b.sizes[x_id])])
if b.num_classes:
    y = array("i", [i % b.num_classes for i in range(b.sizes[y_id])])
else:
    y = array("f", [((i * 104729) % 1013) / 1013.0 - 0.5 for i in range(b.sizes[y_id])])


def train_step():
    model(x, y)
    opt.step()
    model.lazy_reset_grad()


train_step()  # warm-up
gc.collect()
train_us = 1e30
loop_rate = 0.0
for _ in range(ROUNDS):
    # Steps and the plain loop back to back, so both see the same machine load.
    t0 = now_us()
    for _ in range(steps):
        train_step()
    train_us = min(train_us, since_us(t0) / steps)
    loop_rate = max(loop_rate, plain_loop_rate())
print("RESULT impl=%s train_us=%.1f loop_macs=%.0f"
      % (sys.implementation.name, train_us, loop_rate))
