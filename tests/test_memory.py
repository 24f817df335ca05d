"""Steps do not grow the heap on CPython (the MicroPython check, gc.mem_alloc, is in
device_scripts/device_checks.py)."""
import tracemalloc
from array import array

import torch

import microtrain_host as mh
from microtrain import CheckpointState, Module, Optimizer
from torch_reference import export, mlp


def assert_steps_do_not_grow_the_heap(steps):
    """After warm-up, 100 calls of steps(1) leave no new allocation in microtrain's files."""
    steps(5)
    tracemalloc.start()
    steps(5)
    before = tracemalloc.take_snapshot()
    steps(100)
    after = tracemalloc.take_snapshot()
    tracemalloc.stop()
    device = [s for s in after.compare_to(before, "filename") if "microtrain" in str(s.traceback)]
    assert sum(s.size_diff for s in device) <= 0, [str(s) for s in device[:5]]


def test_train_steps_do_not_grow_the_heap(tmp_path):
    mh.generate_artifacts(export(mlp(12, 5), torch.zeros(1, 12)), artifact_directory=tmp_path,
                          batch_size=8)
    state = CheckpointState.load_checkpoint(str(tmp_path / "checkpoint"))
    model = Module(str(tmp_path / "model.mtb"), state)
    opt = Optimizer(str(tmp_path / "model.mtb"), model)
    x = array("f", [((i * 7) % 11) / 11.0 for i in range(8 * 12)])
    y = array("i", [i % 5 for i in range(8)])

    def steps(n):
        for _ in range(n):
            model(x, y)
            opt.step()
            model.lazy_reset_grad()

    assert_steps_do_not_grow_the_heap(steps)
