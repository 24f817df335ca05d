"""Issue 22's acceptance (a) on the suite's budget: the MLP, the 1-D conv IMU classifier and
the conv -> Flatten -> Gemm net (tests/int8_acceptance_models.py), each packed with the one
command (int8pack.pack_int8) as the classifier alone and as the sparse update (every
layer's bias + the last block), train 50 integer steps on CPython, on the MicroPython Unix
port with the viper kernels under heap_lock() and with the pure-Python kernels: identical
parameters, loss ints and checkpoints, every trained tensor moved, and the loss falls (the
mean of the last 5 steps below that of the first 5). bench/int8_models.py runs all seven
models this way (the MLPerf Tiny four are too slow for the suite) and measures the rest of
the README's table."""
import pytest

import int8_acceptance_run as run
from microtrain import CheckpointState

STEPS = 50
CASES = [(name, config) for name in ("mlp", "imu_1d", "conv_flatten_gemm")
         for config in ("classifier", "sparse")]


@pytest.mark.parametrize("name,config", CASES, ids=lambda v: v)
def test_fifty_integer_steps_identical_everywhere_and_the_loss_falls(name, config, micropython,
                                                                     tmp_path):
    model, calibration, x, y = run.prepare(name, tmp_path, STEPS)
    info = run.pack(name, config, model, calibration, tmp_path / "int8")
    assert isinstance(info, dict), info
    # the classifier: its weight and bias; sparse: every layer's bias besides
    assert (len(info["parameters"]) == 2) == (config == "classifier"), info["parameters"]
    (tmp_path / "data.bin").write_bytes(run.records(info, x, y))
    outs, identical = run.train_everywhere(micropython, info, tmp_path / "data.bin", STEPS,
                                           tmp_path)
    assert outs["viper"].startswith("locked True viper True intgrad viper True"), outs["viper"]
    assert outs["pure"].startswith("locked False viper False intgrad viper False")
    assert identical
    losses = run.losses(outs["cpython"])
    assert len(losses) == STEPS
    first, last = run.falls(losses)
    assert last < first, (first, last, losses)
    start = CheckpointState.load_checkpoint(info["checkpoint"]).parameters
    after = CheckpointState.load_checkpoint(str(tmp_path / "cpython.ckpt")).parameters
    assert sorted(after) == sorted(info["parameters"])
    still = [n for n in start if bytes(after[n].data) == bytes(start[n].data)]
    assert not still, still
    print(f"{name} {config}: {len(after)} trained tensors, loss {first:.4f} -> {last:.4f}")
