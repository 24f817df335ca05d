# Training script `microtrain deploy` runs on the board (mpremote run). deploy prepends the
# settings: STEPS (0: whole epochs), EPOCHS, LR (None: the blob's), LABELS ("i32" or "f32"),
# OUTPUT (the checkpoint to save), WITH_OPTIMIZER_STATE, RESERVE (bytes). Data streams from
# x_train.f32 and y_<LABELS> files, one batch in RAM. Prints one "step N LOSS" line per step
# and "heap PHASE BYTES" after each phase (live heap after gc.collect(), relative to before
# the import), then "peak BYTES"; an out-of-memory error names the phase and the bytes.
import gc
from array import array

gc.collect()
BASE = gc.mem_alloc()
# Imports and the checkpoint leave the heap fragmented, with no hole as large as the arena
# Module allocates. So a block of RESERVE bytes (the arenas, or the blob file if larger:
# Module reads the file into a buffer the size of the arenas and allocates them in its place,
# loader.load_into_arenas) is taken before anything else, low in the heap, and freed just
# before Module loads: the file's buffer, then the arenas land in that hole. A BytesIO preallocated to that size, because close()
# frees its buffer at once; a dropped bytearray stays until the GC finds no pointer to it,
# and MicroPython's GC scans the C stack conservatively, where stale copies linger.
import io
try:
    reserve = io.BytesIO(RESERVE)
except MemoryError:
    print("error: out of memory before import: the arenas and the blob file need %d bytes in "
          "one block, the heap has %d free" % (RESERVE, gc.mem_free()))
    raise
gc.collect()
RESERVED = gc.mem_alloc() - BASE
peak = 0
phase = "import"


def probe(name, quiet=False):
    global peak, phase
    gc.collect()
    used = gc.mem_alloc() - BASE - (RESERVED if reserve is not None else 0)
    peak = max(peak, used)
    if not quiet:
        print("heap", name, used)
    phase = name


def run():
    global reserve
    from microtrain import CheckpointState, Module, Optimizer
    probe("import")
    state = CheckpointState.load_checkpoint("checkpoint")
    probe("checkpoint")
    reserve.close()
    reserve = None
    # Collect every 4 KB allocated while Module loads: the garbage its reader makes then keeps
    # reusing the small holes instead of marching into the one kept for the arenas.
    gc.threshold(4096)
    model = Module("model.mtb", state)
    gc.threshold(-1)
    probe("module")
    opt = Optimizer("model.mtb", model)
    if LR is not None:
        opt.set_learning_rate(LR)
    b = model.blob
    x_id, y_id = b.programs["train"].inputs
    x = array("f", bytes(4 * b.sizes[x_id]))
    y = array("i" if LABELS == "i32" else "f", bytes(4 * b.sizes[y_id]))
    probe("optimizer")
    model.train()
    step = 0
    for epoch in range(EPOCHS):
        with open("x_train.f32", "rb") as fx, open("y_train." + LABELS, "rb") as fy:
            while fx.readinto(x) == 4 * len(x) and fy.readinto(y) == 4 * len(y):
                loss = model(x, y)
                opt.step()
                model.lazy_reset_grad()
                print("step", step, repr(loss))
                step += 1
                probe("train", True)
                if step == STEPS:
                    break
        if step == STEPS:
            break
    if step == 0:
        raise ValueError("x_train.f32 holds less than one batch")
    CheckpointState.save_checkpoint(state, OUTPUT, include_optimizer_state=WITH_OPTIMIZER_STATE)
    probe("save")


try:
    run()
except Exception as e:
    # the VM's MemoryError, or microtrain's OutOfMemoryError (the arenas), which names the bytes
    if isinstance(e, MemoryError) or type(e).__name__ == "OutOfMemoryError":
        gc.collect()
        print("error: out of memory after phase '%s' (live heap %d, free %d): %s"
              % (phase, gc.mem_alloc() - BASE, gc.mem_free(), e))
        import micropython
        micropython.mem_info()  # "max free sz": the largest hole, in 16-byte blocks
    raise
print("peak", peak)
