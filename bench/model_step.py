# Device side of bench/models.py: times train steps (forward + backward + optimizer) of any
# packed model and, in the same process, the interpreter's plain multiply-accumulate loop.
# Runs unchanged on MicroPython and CPython (only array, gc, sys, time, via mac_loop.py).
#   micropython bench/model_step.py ARTIFACT_DIR STEPS     (MICROPYPATH=device)
#   python      bench/model_step.py ARTIFACT_DIR STEPS     (PYTHONPATH=device)
# Prints one "RESULT key=value ..." line for the host script.
import gc
import sys

from fixed_batch import trainer
from mac_loop import now_us, plain_loop_rate, since_us

ROUNDS = 3

directory, steps = sys.argv[1], int(sys.argv[2])
model, train_step = trainer(directory)
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
