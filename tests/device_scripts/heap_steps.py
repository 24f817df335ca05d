# Heap use of train steps under MicroPython (gc.mem_alloc after gc.collect).
#   heap_steps.py ARTIFACT_DIR STEPS
# Runs 5 warm-up steps (train + optimizer), then STEPS more; prints the allocated heap
# bytes before and after those STEPS, which must be equal.
import gc
import sys
from array import array
from microtrain import CheckpointState, Module, Optimizer


def main(directory, steps):
    blob = directory + "/model.mtb"
    model = Module(blob, CheckpointState.load_checkpoint(directory + "/checkpoint"))
    opt = Optimizer(blob, model)
    b = model.blob
    x_id, y_id = b.programs["train"].inputs
    x = array("f", [((i * 37) % 17) / 17.0 - 0.5 for i in range(b.sizes[x_id])])
    y = array("i" if b.dtypes[y_id] == 1 else "f", [i % 2 for i in range(b.sizes[y_id])])
    for i in range(5 + steps):
        if i == 5:
            gc.collect()
            before = gc.mem_alloc()
        model(x, y)
        opt.step()
        model.lazy_reset_grad()
    gc.collect()
    print("%d %d" % (before, gc.mem_alloc()))


main(sys.argv[1], int(sys.argv[2]))
