# Training script `microtrain deploy` runs on the board (mpremote run). deploy prepends the
# settings: STEPS (0: whole epochs), EPOCHS, LR (None: the blob's), INPUTS ("f32", or "i8" /
# "u8": an integer training blob's samples, quantized on the host), LABELS ("i32" or "f32";
# None: the input is its own target, an autoencoder's),
# OUTPUT (the checkpoint to save), WITH_OPTIMIZER_STATE, RESERVE (bytes), BLOB (the blob's
# path: "model.mtb", or "/rom/model.mtb" in the ROMFS image, then opened as a buffer so
# that its int8 weights stay in flash). Data streams from x_train.<INPUTS> and
# y_train.<LABELS> files, one batch in RAM. Prints one "step N LOSS" line per step,
# N counted from the checkpoint's optimizer step (a resumed run continues the numbering)
# and "heap PHASE BYTES" after each phase (live heap after gc.collect(), relative to before
# the import), then "peak BYTES"; an out-of-memory error names the phase and the bytes.
import gc
from array import array

gc.collect()
BASE = gc.mem_alloc()
# The arenas (or the blob file, if larger) need one block of RESERVE bytes: asked for first,
# on the empty heap, so that a model that cannot fit says so before anything is imported.
# The block is given back at once: the checkpoint reader streams (it keeps no buffer, so
# the heap stays in one piece) and the blob loader puts the file's buffer, then the arenas,
# at the bottom of the heap itself (loader.py). Holding the block while the checkpoint
# loads, as this script once did, made a resumed run's Module find no block for its arenas.
# A BytesIO preallocated to that size, because close() frees its buffer at once; a dropped
# bytearray stays until the GC finds no pointer to it, and MicroPython's GC scans the C
# stack conservatively, where stale copies linger.
import io
try:
    reserve = io.BytesIO(RESERVE)
except MemoryError:
    # raised with the figures: the host reports a board's failure by its last exception line
    raise MemoryError("out of memory before import: the arenas and the blob file need %d "
                      "bytes in one block, the heap has %d free" % (RESERVE, gc.mem_free()))
reserve.close()
reserve = None
gc.collect()
peak = 0
phase = "import"


def probe(name, quiet=False):
    global peak, phase
    gc.collect()
    used = gc.mem_alloc() - BASE
    peak = max(peak, used)
    if not quiet:
        print("heap", name, used)
    phase = name


def run():
    from microtrain import CheckpointState, Module, Optimizer
    probe("import")
    state = CheckpointState.load_checkpoint("checkpoint")
    probe("checkpoint")
    # Collect every 4 KB allocated while Module loads: the garbage its reader makes then keeps
    # reusing the small holes instead of marching into the one kept for the arenas.
    gc.threshold(4096)
    blob = memoryview(open(BLOB, "rb")) if BLOB.startswith("/rom/") else BLOB
    model = Module(blob, state)
    gc.threshold(-1)
    probe("module")
    opt = Optimizer(blob, model)
    if LR is not None:
        opt.set_learning_rate(LR)
    b = model.blob
    ids = b.programs["train"].inputs
    item = 4 if INPUTS == "f32" else 1
    x = array({"f32": "f", "i8": "b", "u8": "B"}[INPUTS], bytes(item * b.sizes[ids[0]]))
    # (LABELS None: the input is its own target, an autoencoder's)
    y = array("i" if LABELS == "i32" else "f", bytes(4 * b.sizes[ids[-1]] if LABELS else 0))
    probe("optimizer")
    model.train()
    first = step = opt.step_count
    for epoch in range(EPOCHS):
        with open("x_train." + INPUTS, "rb") as fx, open(
                "y_train." + LABELS if LABELS else "x_train." + INPUTS, "rb") as fy:
            while fx.readinto(x) == item * len(x) and (not LABELS or
                                                       fy.readinto(y) == 4 * len(y)):
                loss = model(x, y) if LABELS else model(x)
                opt.step()
                model.lazy_reset_grad()
                print("step", step, repr(loss))
                step += 1
                probe("train", True)
                if step - first == STEPS:
                    break
        if step - first == STEPS:
            break
    if step == first:
        raise ValueError("x_train.%s holds less than one batch" % INPUTS)
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
