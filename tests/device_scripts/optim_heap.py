# Heap check of tests/test_optimizers.py under MicroPython: 100 train + optimizer + scheduler
# steps of ARTIFACT_DIR leave gc.mem_alloc() where it was (the extras allocate nothing).
#   optim_heap.py ARTIFACT_DIR
import gc
import sys
from array import array
from microtrain import CheckpointState, Module, Optimizer, LinearLRScheduler


def main(directory):
    state = CheckpointState.load_checkpoint(directory + "/checkpoint")
    model = Module(directory + "/model.mtb", state)
    opt = Optimizer(directory + "/model.mtb", model)
    schedule = LinearLRScheduler(opt, 5, 200, 0.05)
    b = model.blob
    x_id, y_id = b.programs["train"].inputs
    x = array("f", [((i * 7) % 11) / 11.0 for i in range(b.sizes[x_id])])
    y = array("f", [((i * 5) % 7) / 7.0 for i in range(b.sizes[y_id])])

    def steps(n):
        for _ in range(n):
            model(x, y)
            opt.step()
            schedule.step()
            model.lazy_reset_grad()

    steps(5)
    gc.collect()
    before = gc.mem_alloc()
    steps(100)
    gc.collect()
    after = gc.mem_alloc()
    print("heap %d %d" % (before, after))


main(sys.argv[1])
