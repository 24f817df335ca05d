"""Memory moves (issue 11): updates applied in the backward pass (no gradient buffers) must
equal the separate optimizer step bit for bit, under CPython and MicroPython, with every
optimizer option that allows it, schedules and resume included; recomputed activations must
not change a single bit either and must shrink the arena; the ASCII plan must agree with the
planner's own lower bound."""
import subprocess
import sys

import numpy as np
import pytest
import torch

import microtrain_host as mh
from conftest import DEVICE, ROOT, run_micropython
from microtrain import CheckpointState, Module, Optimizer, TrainingError
from microtrain import blob as device_blob
from microtrain import parser as device_blob_parser
from microtrain_host import opcodes
from microtrain_host.errors import ArtifactError
from microtrain_host.tools.inspect import describe
from microtrain_host.tools.memory_plan import SYMBOLS, render, timelines
from reference_models import ds_cnn, lenet, mobilenet_v2_block, tiny_transformer
from test_models import example, make_data
from torch_reference import export, make_batches, mlp, write_batches

SCRIPT = ROOT / "tests" / "device_scripts" / "optim_steps.py"
TRAIN_STEPS = ROOT / "tests" / "device_scripts" / "train_steps.py"
BATCH, N_IN, N_OUT, CALLS = 8, 12, 3, 30
# name: (optimizer, options, schedule as optim_steps.py takes it)
CASES = {
    "sgd": ("SGD", {}, ("none", 0.05)),
    "momentum_nesterov_decay": ("SGD", {"momentum": 0.8, "nesterov": True, "weight_decay": 0.01,
                                        "l1_penalty": 1e-3, "l2_penalty": 1e-3},
                                ("linear", 5, 30, 0.05)),
    "dampening": ("SGD", {"momentum": 0.9, "dampening": 0.3}, ("invscaling", 0.05, 0.5)),
    "adamw": ("AdamW", {"weight_decay": 0.01, "l2_penalty": 1e-3}, ("linear", 3, 30, 0.01)),
    "adamw_no_bias_correction": ("AdamW", {"bias_correction": False}, ("constant", 0.01)),
}


def pack_mlp(directory, optimizer, options, **kwargs):
    model = mlp(N_IN, N_OUT)
    return mh.generate_artifacts(export(model, torch.zeros(1, N_IN)), loss="MSELoss",
                                 optimizer=optimizer, artifact_directory=directory,
                                 batch_size=BATCH, optimizer_options=options, **kwargs)


def run_script(interpreter, script, *args):
    if interpreter == "cpython":
        proc = subprocess.run([sys.executable, str(script), *map(str, args)],
                              capture_output=True, text=True,
                              env={"PYTHONPATH": str(DEVICE), "PATH": "/usr/bin:/bin"})
        if proc.returncode:
            raise AssertionError(proc.stderr)
        return proc.stdout
    return run_micropython(interpreter, script, *args)


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    """Each case packed twice: separate optimizer step, and updates in the backward pass."""
    result = {}
    for name, (optimizer, options, schedule) in CASES.items():
        directory = tmp_path_factory.mktemp(name)
        for fused in (False, True):
            pack_mlp(directory / str(fused), optimizer, options, update_in_backward=fused)
        xs, ys = make_batches("MSELoss", CALLS, BATCH, N_IN, N_OUT)
        write_batches(directory / "data.bin", xs, ys)
        result[name] = (directory, schedule)
    return result


def optim_run(interpreter, directory, fused, checkpoint, out, data, calls, schedule):
    return run_script(interpreter, SCRIPT, directory / str(fused), checkpoint, out, data, calls,
                      1, *schedule)


@pytest.mark.parametrize("case", sorted(CASES))
def test_update_in_backward_equals_the_optimizer_step_bit_for_bit(packed, case):
    directory, schedule = packed[case]
    runs = [optim_run("cpython", directory, fused, directory / str(fused) / "checkpoint",
                      directory / f"out{fused}", directory / "data.bin", CALLS, schedule)
            for fused in (False, True)]
    # Losses, learning rates, parameters and optimizer state, printed with repr: every bit.
    assert runs[0] == runs[1]
    assert runs[0].count("loss ") == CALLS


@pytest.mark.parametrize("case", ["momentum_nesterov_decay", "adamw"])
def test_update_in_backward_on_micropython_bit_for_bit(packed, micropython, case):
    directory, schedule = packed[case]
    runs = [optim_run(micropython, directory, fused, directory / str(fused) / "checkpoint",
                      directory / f"mp{fused}", directory / "data.bin", CALLS, schedule)
            for fused in (False, True)]
    assert runs[0] == runs[1]


def test_update_in_backward_resumes_bit_for_bit(packed, tmp_path):
    directory, schedule = packed["momentum_nesterov_decay"]
    whole = optim_run("cpython", directory, True, directory / "True" / "checkpoint",
                      tmp_path / "whole", directory / "data.bin", CALLS, schedule)
    xs, ys = make_batches("MSELoss", CALLS, BATCH, N_IN, N_OUT)
    half = CALLS // 2
    write_batches(tmp_path / "a.bin", xs[:half], ys[:half])
    write_batches(tmp_path / "b.bin", xs[half:], ys[half:])
    first = optim_run("cpython", directory, True, directory / "True" / "checkpoint",
                      tmp_path / "half", tmp_path / "a.bin", half, schedule)
    second = optim_run("cpython", directory, True, tmp_path / "half", tmp_path / "end",
                       tmp_path / "b.bin", half, schedule)

    def losses(text):
        return [line for line in text.split("\n") if line.startswith(("loss", "lr"))]
    assert losses(first) + losses(second) == losses(whole)
    assert second.split("params")[1] == whole.split("params")[1]   # parameters and momentum


def test_blob_has_no_gradient_buffers_and_updates_follow_the_last_reader(packed):
    directory, _ = packed["adamw"]
    fused = device_blob_parser.load(str(directory / "True" / "model.mtb"), keep_steps=True)
    plain = device_blob_parser.load(str(directory / "False" / "model.mtb"))
    assert list(fused.programs) == ["eval", "train", "backward_update"]
    assert "optimizer" not in fused.programs
    assert not any(device_blob.ROLE_NAMES[r] == "grad" for r in fused.roles)
    assert all(g < 0 for _, g, _ in fused.parameters)
    assert sorted(fused.updated_in_backward) == sorted(t for t, _, _ in fused.parameters)
    assert all(len(s) == 2 for _, _, s in fused.parameters)   # AdamW moments stay
    assert fused.float_arena < plain.float_arena
    steps = fused.step_records["train"] + fused.step_records["backward_update"]
    updates = [i for i, s in enumerate(steps) if s[0] == opcodes.ADAMW_GENERAL]
    assert len(updates) == len(fused.parameters)
    def touches(step, tid):     # the step reads or writes tensor tid's space (aliases too)
        return any(t != device_blob.NO_TENSOR and b.offsets[t] == fused.offsets[tid]
                   and b.sizes[t] == fused.sizes[tid] for t in step[1])
    b = fused
    for i in updates:
        param, grad = steps[i][1][0], steps[i][1][1]
        assert device_blob.ROLE_NAMES[fused.roles[grad]] == "activation"
        # Nothing after the update reads the parameter: it was read for the last time...
        assert not any(touches(s, param) for s in steps[i + 1:])
        # ... right before the update (or before other updates anchored at the same step).
        j = i - 1
        while steps[j][0] == opcodes.ADAMW_GENERAL:
            j -= 1
        assert any(touches(steps[k], param) or touches(steps[k], grad) for k in range(j, i))
    text = describe(directory / "True" / "model.mtb", steps=False)
    assert "updated in the backward pass (no gradient buffer)" in text
    assert "    gradient buffers" not in text   # no such line in the persistent part


def test_nan_loss_updates_nothing(packed, tmp_path):
    directory, _ = packed["momentum_nesterov_decay"]
    blob = str(directory / "True" / "model.mtb")
    state = CheckpointState.load_checkpoint(str(directory / "True" / "checkpoint"))
    model = Module(blob, state)
    with pytest.raises(TrainingError, match="create its Optimizer"):
        model([0.1] * (BATCH * N_IN), [0.0] * (BATCH * N_OUT))
    opt = Optimizer(blob, model)
    before = list(model.get_contiguous_parameters())
    x = [0.1] * (BATCH * N_IN)
    x[5] = float("nan")
    with pytest.raises(TrainingError, match="parameters were not updated"):
        model(x, [0.0] * (BATCH * N_OUT))
    assert list(model.get_contiguous_parameters()) == before
    assert opt.step_count == 0 and state.optimizer_step == 0
    x[5] = 0.2
    model(x, [0.0] * (BATCH * N_OUT))
    assert opt.step_count == 1 and list(model.get_contiguous_parameters()) != before
    after = list(model.get_contiguous_parameters())
    opt.step()              # the update has happened: step() does nothing
    model.lazy_reset_grad()
    assert list(model.get_contiguous_parameters()) == after and opt.step_count == 1
    assert all(state.parameters[n].grad is None for n in state.parameters)


def test_update_in_backward_refusals(tmp_path):
    with pytest.raises(ArtifactError, match="needs an optimizer"):
        pack_mlp(tmp_path, None, None, update_in_backward=True)
    with pytest.raises(ArtifactError, match="clip_grad_norm"):
        pack_mlp(tmp_path, "SGD", {"clip_grad_norm": 1.0}, update_in_backward=True)
    model = mlp(N_IN, N_OUT)
    with pytest.raises(ArtifactError, match="computed outside"):
        mh.generate_artifacts(export(model, torch.zeros(1, N_IN)), loss=None, optimizer="SGD",
                              artifact_directory=tmp_path, batch_size=BATCH,
                              update_in_backward=True)


# -- conv nets: recompute + updates in the backward pass --------------------------------

MOVES = [{"recompute": True}, {"update_in_backward": True},
         {"recompute": True, "update_in_backward": True}]


@pytest.mark.parametrize("build", [ds_cnn, mobilenet_v2_block, tiny_transformer, lenet])
def test_moves_change_no_bit_and_shrink_the_arena(tmp_path, build):
    runs, arenas = [], []
    for k, options in enumerate([{}] + MOVES):
        ref = build()   # fresh: an export runs a training-mode forward pass (BatchNorm)
        directory = tmp_path / str(k)
        artifacts = mh.generate_artifacts(export(ref.module, example(ref, ref.batch)),
                                          loss=ref.loss, optimizer="AdamW",
                                          artifact_directory=directory, batch_size=ref.batch,
                                          optimizer_options={"weight_decay": 0.01}, **options)
        xs, ys = make_data(ref, 12)
        write_batches(directory / "data.bin", xs, ys)
        runs.append(run_script("cpython", TRAIN_STEPS, directory, directory / "data.bin", 12,
                               ref.lr["AdamW"]))
        b = device_blob_parser.load(artifacts.blob)
        arenas.append(b.float_arena)
        recomputed = [n for n in b.names if n.endswith(".recomputed")]
        if options.get("recompute") and build in (ds_cnn, mobilenet_v2_block, tiny_transformer):
            assert recomputed, "these models keep BatchNorm/ReLU or LayerNorm outputs"
        if not options.get("recompute"):
            assert not recomputed
    assert all(run == runs[0] for run in runs[1:])
    plain, recompute, fused, both = arenas
    assert recompute <= plain and fused < plain and both <= fused and both <= recompute
    if build in (ds_cnn, mobilenet_v2_block):
        assert recompute < 0.8 * plain, arenas


def test_recomputed_steps_leave_the_running_statistics_alone(tmp_path):
    ref = ds_cnn()
    artifacts = mh.generate_artifacts(export(ref.module, example(ref, ref.batch)),
                                      loss=ref.loss, optimizer="SGD", artifact_directory=tmp_path,
                                      batch_size=ref.batch, recompute=True)
    b = device_blob_parser.load(artifacts.blob, keep_steps=True)
    norms = [s for s in b.step_records["train"] if s[0] == opcodes.BATCH_NORM_TRAINING]
    forward = [s for s in norms if not b.names[s[1][0]].endswith(".recomputed")]
    again = [s for s in norms if b.names[s[1][0]].endswith(".recomputed")]
    assert len(forward) == 5 and 1 <= len(again) <= 4   # the last block's: no gain
    assert all(s[1][4] != device_blob.NO_TENSOR for s in forward)
    assert all(s[1][4] == s[1][5] == device_blob.NO_TENSOR for s in again)


def test_micropython_runs_the_moves_like_cpython(tmp_path, micropython):
    ref = ds_cnn()
    directory = tmp_path / "both"
    mh.generate_artifacts(export(ref.module, example(ref, ref.batch)), loss=ref.loss,
                          optimizer="SGD", artifact_directory=directory, batch_size=ref.batch,
                          optimizer_options={"momentum": 0.9}, recompute=True,
                          update_in_backward=True)
    xs, ys = make_data(ref, 6)
    write_batches(directory / "data.bin", xs, ys)
    args = (directory, directory / "data.bin", 6, ref.lr["SGD"])
    cpython = run_script("cpython", TRAIN_STEPS, *args).split()
    mp = run_micropython(micropython, TRAIN_STEPS, *args).split()
    assert len(mp) == len(cpython)
    a = np.array([float(v) for v in mp if v not in ("params", "eval")])
    c = np.array([float(v) for v in cpython if v not in ("params", "eval")])
    assert np.max(np.abs(a - c) / np.maximum(np.abs(c), 1.0)) <= 1e-5


# -- the ASCII plan ------------------------------------------------------------------------

@pytest.mark.parametrize("options", [{}, {"recompute": True, "update_in_backward": True}])
def test_plan_peak_is_the_planners_lower_bound(tmp_path, options):
    ref = ds_cnn()
    artifacts = mh.generate_artifacts(export(ref.module, example(ref, ref.batch)),
                                      loss=ref.loss, optimizer="AdamW", artifact_directory=tmp_path,
                                      batch_size=ref.batch, **options)
    b = device_blob_parser.load(artifacts.blob, keep_steps=True)
    found = timelines(b)
    assert [t.name for t in found] == (["train", "eval"] + (["optimizer"] if not options else []))
    # The host planner recorded persistent part + the largest peak of live temporaries.
    assert found[0].base + max(t.peak for t in found) == b.lower_bound
    train = found[0]
    text = render(b, train)
    rows = [line for line in text.split("\n") if "|" in line and line.split()[0].isdigit()]
    assert len(rows) == len(train.steps)
    peak_rows = [r for r in rows if r.endswith("<- peak")]
    assert len(peak_rows) == 1 and peak_rows[0].split()[0] == str(train.peak_step)
    region = max(x.offset + x.size for x in train.buffers) - train.base
    scale = max(1, -(-region // 64))
    for k, x in enumerate(train.buffers[:len(SYMBOLS)]):
        symbol = SYMBOLS[k]
        if x.size < 2 * scale:
            continue    # may share its only column with another buffer
        alive = [int(r.split()[0]) for r in rows if symbol in r.split("|")[1]]
        assert alive == list(range(x.first, x.last + 1)), (symbol, b.names[x.tensor])
    assert text in describe(artifacts.blob, steps=False, plan=True)


# -- ReLU masks ------------------------------------------------------------------------------

@pytest.mark.parametrize("n", [1, 29, 30, 31, 61, 90])
def test_relu_mask_kernels_equal_relu_and_its_gradient(n):
    from array import array
    from microtrain.kernels import activation
    rng = np.random.default_rng(n)
    x = rng.standard_normal(n).astype(np.float32)
    x[::7] = 0.0
    x[1::11] = -0.0
    if n > 5:
        x[5] = np.nan
    dy = rng.standard_normal(n).astype(np.float32)
    words = (n + 29) // 30
    # F: x, dy, y, dx (masked) | y, dx (plain); I: the mask, with guard words around it
    F = array("f", list(x) + list(dy) + [7.0] * (4 * n))
    I = array("i", [-1] * (words + 2))
    y1, dx1, y2, dx2 = 2 * n, 3 * n, 4 * n, 5 * n
    activation.relu_masked(F, I, (y1, 0, 1, n))
    activation.relu_mask_grad(F, I, (dx1, n, 1, n))
    activation.relu(F, I, (y2, 0, n))
    activation.relu_grad(F, I, (dx2, n, y2, n))
    bits = lambda a, b: np.frombuffer(F, np.float32)[a:a + n].tobytes() == \
        np.frombuffer(F, np.float32)[b:b + n].tobytes()  # noqa: E731
    assert bits(y1, y2) and bits(dx1, dx2)
    assert I[0] == -1 and I[words + 1] == -1       # nothing written outside the mask
    assert all(0 <= I[1 + w] < 2**30 for w in range(words))   # small ints everywhere


def sparse_ds_cnn(directory, **moves):
    from microtrain_host.pipeline.sparse import sparse_update
    ref = ds_cnn()
    model = export(ref.module, example(ref, ref.batch))
    mh.generate_artifacts(model, requires_grad=sparse_update(model, True, 1), loss=ref.loss,
                          optimizer="SGD", artifact_directory=directory, batch_size=ref.batch,
                          optimizer_options={"momentum": 0.9}, **moves)
    xs, ys = make_data(ref, 8)
    write_batches(directory / "data.bin", xs, ys)
    return device_blob_parser.load(str(directory / "model.mtb"), keep_steps=True), ref.lr["SGD"]


def test_relu_masks_replace_kept_relu_outputs(tmp_path, micropython):
    plain, lr = sparse_ds_cnn(tmp_path / "plain")
    masked, _ = sparse_ds_cnn(tmp_path / "masked", recompute=True, update_in_backward=True)
    masks = [n for n in masked.names if n.endswith(".mask")]
    # The stem and the four convolutions of the two blocks: their ReLU outputs are read
    # by ReluGrad only (the frozen convolutions after them need no activations).
    assert len(masks) == 5
    ops = [s[0] for p in masked.step_records.values() for s in p]
    assert ops.count(opcodes.RELU_MASKED) == 5 and ops.count(opcodes.RELU_MASK_GRAD) == 5
    assert opcodes.RELU_GRAD not in ops
    assert masked.float_arena < 0.7 * plain.float_arena
    assert masked.int_arena == plain.int_arena + sum(
        masked.sizes[masked.tensor_id(n)] for n in masks)
    for interpreter in ("cpython", micropython):
        runs = [run_script(interpreter, TRAIN_STEPS, d, d / "data.bin", 8, lr)
                for d in (tmp_path / "plain", tmp_path / "masked")]
        assert runs[0] == runs[1], interpreter


# -- the command line and the reader -------------------------------------------------------

def test_digits_example_trains_with_the_moves_from_the_command_line(tmp_path, capsys):
    from microtrain_host.cli import main
    digits = ROOT / "examples" / "digits"
    out = tmp_path / "build"
    assert main(["pack", str(digits / "mlp.onnx"), "-o", str(out), "--batch-size", "8",
                 "--update-in-backward", "--recompute", "--train-last", "1",
                 "--train-biases"]) == 0
    text = capsys.readouterr().out
    assert "updates          in the backward pass (3 parameters" in text
    assert not (out / "optimizer_model.onnx").exists()
    assert main(["train", str(out), "--data", str(digits / "digits.npz"), "--epochs", "3",
                 "--lr", "0.01"]) == 0
    accuracy = [float(a) for a in __import__("re").findall(r"val accuracy ([0-9.]+)%",
                                                         capsys.readouterr().out)]
    # Only the last layer's weights and the biases train: the frozen first layer's random
    # features still carry the digits most of the way.
    assert len(accuracy) == 3 and accuracy[-1] >= 80.0, accuracy
    assert main(["export", str(out), "--checkpoint", str(out / "trained_checkpoint"), "-o",
                 str(tmp_path / "model.onnx")]) == 0


def test_the_reader_refuses_a_blob_whose_update_program_is_missing(packed, tmp_path):
    import zlib
    from microtrain import BlobError
    directory, _ = packed["sgd"]
    data = bytearray((directory / "True" / "model.mtb").read_bytes())
    at = data.find(b"backward_update")
    data[at:at + 15] = b"backward_updatX"
    body = bytes(data[4:-4])
    data[-4:] = (zlib.crc32(body) & 0xFFFFFFFF).to_bytes(4, "little")
    with pytest.raises(BlobError, match="updated in the backward pass need the programs"):
        device_blob_parser.parse(bytes(data))
