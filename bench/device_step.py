# Device side of bench/train_step.py: times train steps and eval calls of the packed digits
# MLP (64-32-10; step_macs() assumes that shape) and, in the same process, the interpreter's
# plain float multiply-accumulate loop.
# Runs unchanged on MicroPython and CPython (only array, gc, sys, time, via mac_loop.py).
#   micropython bench/device_step.py ARTIFACT_DIR STEPS BATCH     (MICROPYPATH=device)
#   python      bench/device_step.py ARTIFACT_DIR STEPS BATCH     (PYTHONPATH=device)
# Prints human-readable lines and one "RESULT key=value ..." line for the host script.
import gc
import sys
from array import array

from mac_loop import now_us, plain_loop_rate, since_us

IMPL = sys.implementation.name
HAS_MEM_ALLOC = hasattr(gc, "mem_alloc")  # MicroPython only


def heap_used():
    gc.collect()
    return gc.mem_alloc() if HAS_MEM_ALLOC else -1


HEAP_BEFORE = heap_used()
from microtrain import CheckpointState, Module, Optimizer  # noqa: E402 (after the heap baseline)

directory, steps, batch = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
WARMUP = 3
ROUNDS = 5


def step_macs(b):
    # The 64-32-10 MLP: forward GEMMs, then backward dW2, dX2 (input of layer 2) and dW1;
    # the first layer's input needs no gradient. Bias, ReLU, loss and AdamW are not counted.
    forward = b * (64 * 32 + 32 * 10)
    backward = 10 * 32 * b + b * 10 * 32 + 32 * 64 * b
    return forward, backward


# -- load --------------------------------------------------------------------------------
state = CheckpointState.load_checkpoint(directory + "/checkpoint")
model = Module(directory + "/model.mtb", state)
opt = Optimizer(directory + "/model.mtb", model)
HEAP_AFTER = heap_used()

# Deterministic inputs in [0, 1) and labels 0..9 (no `random` needed).
x = array("f", [((i * 7919) % 1009) / 1009.0 for i in range(batch * 64)])
y = [i % 10 for i in range(batch)]


# -- timing --------------------------------------------------------------------------------
# The machine may be shared and noisy: each round times `steps` train steps, `steps` AdamW
# updates alone, `steps` eval calls and ~0.2 s of the plain MAC loop, back to back, so that
# all four see the same conditions; the best of ROUNDS rounds is kept for each.
def per_call_us(fn):
    t0 = now_us()
    for _ in range(steps):
        fn()
    return since_us(t0) / steps


def train_step():
    model(x, y)
    opt.step()
    model.lazy_reset_grad()


def eval_call():
    model(x, y)


for _ in range(WARMUP):
    model.train()
    train_step()
    model.eval()
    eval_call()
train_us = opt_us = eval_us = 1e30
loop_rate = 0.0
for _ in range(ROUNDS):
    model.train()
    train_us = min(train_us, per_call_us(train_step))
    opt_us = min(opt_us, per_call_us(opt.step))  # the AdamW update alone (part of a step)
    model.eval()
    eval_us = min(eval_us, per_call_us(eval_call))
    loop_rate = max(loop_rate, plain_loop_rate())
out = model(x, y)
loss = out[0] if isinstance(out, list) else out

fwd, bwd = step_macs(batch)
macs = fwd + bwd
rate = macs / (train_us / 1e6)
print("%s batch=%d: train step %.2f ms (%.2f MMAC/s, %.0f%% of plain MAC loop %.2f MMAC/s), "
      "eval %.2f ms" % (IMPL, batch, train_us / 1000, rate / 1e6, 100 * rate / loop_rate,
                        loop_rate / 1e6, eval_us / 1000))
print("%s batch=%d: %d MACs per train step (forward %d, backward %d); AdamW update alone "
      "%.2f ms; eval loss %.4f" % (IMPL, batch, macs, fwd, bwd, opt_us / 1000, loss))
if HAS_MEM_ALLOC:
    print("%s batch=%d: heap used %d bytes after loading (%d before importing microtrain)"
          % (IMPL, batch, HEAP_AFTER, HEAP_BEFORE))
print("RESULT impl=%s batch=%d steps=%d train_us=%.1f opt_us=%.1f eval_us=%.1f macs=%d "
      "loop_macs=%.0f heap_after=%d heap_before=%d"
      % (IMPL, batch, steps, train_us, opt_us, eval_us, macs, loop_rate, HEAP_AFTER,
         HEAP_BEFORE))
