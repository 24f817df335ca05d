# Device side of bench/models.py: times train steps (forward + backward + optimizer) of any
# packed model and, in the same process, the interpreter's plain multiply-accumulate loop.
# Runs unchanged on MicroPython and CPython (only array, gc, sys, time).
#   micropython bench/model_step.py ARTIFACT_DIR STEPS     (MICROPYPATH=device)
#   python      bench/model_step.py ARTIFACT_DIR STEPS     (PYTHONPATH=device)
# Prints one "RESULT key=value ..." line for the host script.
import gc
import sys
from array import array

try:
    from time import ticks_diff, ticks_us  # MicroPython

    def now_us():
        return ticks_us()

    def since_us(t0):
        return ticks_diff(ticks_us(), t0)
except ImportError:  # CPython
    from time import perf_counter

    def now_us():
        return perf_counter() * 1e6

    def since_us(t0):
        return perf_counter() * 1e6 - t0

from microtrain import CheckpointState, Module, Optimizer  # noqa: E402

ROUNDS = 3


def plain_dot(F, G, k, sa, sb):
    # The inner loop of kernels/dense.gemm: strided indices, one MAC per trip.
    pa = 0
    pb = 0
    s = 0.0
    for _ in range(k):
        s += F[pa] * G[pb]
        pa += sa
        pb += sb
    return s


def plain_loop_rate(seconds=0.2):
    n = 1024
    F = array("f", [((i * 37) % 101) / 101.0 for i in range(n)])
    G = array("f", [((i * 53) % 97) / 97.0 for i in range(n)])
    calls = 0
    t0 = now_us()
    while True:
        plain_dot(F, G, n, 1, 1)
        calls += 1
        dt = since_us(t0)
        if dt >= seconds * 1e6:
            return calls * n / (dt / 1e6)


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
