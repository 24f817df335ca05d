# Device side of bench/board_cost.py, on the emulated Cortex-M3 under qemu -icount shift=0
# (settings prepended by the host: KIND, BLOB, X, X_TYPE, Y, STEPS). Loads the files the
# host put in the ROM filesystem, runs one warm-up step (imports, first allocations, the
# optimizer's state), then STEPS counted ones, and prints "ticks N U" per counted step: the
# FPGAIO counter's ticks (25 MHz of virtual time = one per 40 instructions) of the step, and
# U of its optimizer update (Optimizer.step) alone. The garbage collector runs when it
# must, as in a training run: a step's count includes its share.
# KIND "train": model(x, y), opt.step(), lazy_reset_grad(); "infer": InferenceSession.run(x).
import gc
import machine
from array import array


def counter():
    return machine.mem32[0x40028018]


def load(name, typecode):
    with open("/rom/" + name, "rb") as f:
        return array(typecode, f.read())


gc.collect()
# the blob where it lies in the ROM filesystem (flash): int8 weights are read in place
blob = memoryview(open("/rom/" + BLOB, "rb"))
if KIND == "train":
    from microtrain import CheckpointState, Module, Optimizer
    gc.collect()
    state = CheckpointState.load_checkpoint("/rom/checkpoint")
    # collect every 4 KB while Module loads, as boards/train_on_board.py does: its reader's
    # garbage then reuses small holes instead of splitting the block the arenas need
    gc.threshold(4096)
    model = Module(blob, state)
    gc.threshold(-1)
    opt = Optimizer(blob, model)
    x, y = load(X, X_TYPE), load(Y, "i")

    def step():
        model(x, y)
        t0 = counter()
        opt.step()
        update = counter() - t0
        model.lazy_reset_grad()
        return update
else:
    from microtrain import InferenceSession
    gc.collect()
    session = InferenceSession(blob)
    x = load(X, X_TYPE)

    def step():
        session.run(x)
        return 0

step()
gc.collect()
for _ in range(STEPS):
    t0 = counter()
    update = step()
    # the whole step's ticks, and those of its optimizer update alone
    print("ticks", (counter() - t0) & 0xFFFFFFFF, update & 0xFFFFFFFF)
gc.collect()
print("heap", gc.mem_alloc())   # live after the steps: what the run keeps of the 140 KiB
