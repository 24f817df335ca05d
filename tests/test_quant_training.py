"""Issue 10 acceptance: a quantization-aware training run of the digits MLP and of the
LeNet-style and DS-CNN reference models on the device runtime matches a PyTorch QAT run with
the same fake-quant configuration (tests/torch_qat.py, PyTorch's own FakeQuantize modules)
step by step within 1e-4 relative for 50 steps, the observers' ranges included; MicroPython
matches CPython."""
import copy

import numpy as np
import onnx
import pytest
import torch
from onnx import numpy_helper

import microtrain_host as mh
from conftest import ROOT, run_micropython
from microtrain import parser as device_blob_parser
from reference_models import ds_cnn, lenet
from test_models import make_data
from torch_qat import QATDSCNN, QATLeNet, QATMLP, qat_train
from torch_reference import export, parse_run, relative_error, run_device_cpython, \
    write_batches

STEPS = 50
DIGITS = ROOT / "examples" / "digits"


def digits_case():
    """The bundled MLP with its own weights, on the first 50 batches of 8 digits."""
    model = onnx.load(DIGITS / "mlp.onnx")
    values = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    module = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 32), torch.nn.ReLU(),
                                 torch.nn.Linear(32, 10))
    with torch.no_grad():
        for k in (1, 3):
            module[k].weight.copy_(torch.from_numpy(values[f"{k}.weight"]))
            module[k].bias.copy_(torch.from_numpy(values[f"{k}.bias"]))
    data = np.load(DIGITS / "digits.npz")
    xs = data["x_train"][:8 * STEPS].reshape(STEPS, 8, 64).astype(np.float32)
    ys = data["y_train"][:8 * STEPS].reshape(STEPS, 8).astype(np.int64)
    return model, module, QATMLP, xs, ys, 8


def reference_case(build, wrapper):
    ref = build()
    xs, ys = make_data(ref, STEPS)
    return (export(ref.module, torch.zeros((ref.batch,) + ref.inputs)), ref.module, wrapper,
            xs, ys, ref.batch)


CASES = {"digits_mlp": lambda: digits_case(),
         "lenet": lambda: reference_case(lenet, QATLeNet),
         "ds_cnn": lambda: reference_case(ds_cnn, QATDSCNN)}
LR = {"SGD": 0.05, "AdamW": 0.001}
RUNS = [(name, opt) for name in CASES for opt in ("SGD", "AdamW")]
# Relative tolerance on the 50 losses: 1e-4 for every run. (DS-CNN with AdamW once needed
# 1e-3: the device's bias correction used 0.999 while its kernels used float32(0.999), so
# every update was off by up to 6.4e-6 relative, the weights parted by ~60 ulp and a
# quantization tie flipped at step 35; with both sides on the blob's float32 betas the 50
# losses agree within 7e-8 and the weights within 2 ulp until a tie flips in the gradients
# of step 50, after its loss.)
TOLERANCE = {}
EXACT_STEPS = 2   # before the first update every case agrees to float32 rounding


class Runs(dict):
    def __init__(self, factory):
        super().__init__()
        self.factory = factory

    def __missing__(self, key):
        name, optimizer = key
        onnx_model, module, wrapper, xs, ys, batch = CASES[name]()
        tmp = self.factory.mktemp(f"qat_{name}_{optimizer}")
        mh.generate_artifacts(onnx_model, loss="CrossEntropyLoss", optimizer=optimizer,
                              artifact_directory=tmp, batch_size=batch, quantization=True)
        write_batches(tmp / "data.bin", xs, ys)
        reference = wrapper(copy.deepcopy(module)).train()
        # the device keeps the learning rate as a float32
        torch_losses = qat_train(reference, optimizer, xs, ys, float(np.float32(LR[optimizer])))
        device = run_device_cpython(tmp, tmp / "data.bin", STEPS, LR[optimizer])
        self[key] = (tmp, torch_losses, reference.ranges(), device)
        return self[key]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return Runs(tmp_path_factory)


def device_ranges(directory, params):
    """The observers' [min, max] from the device's contiguous parameters, in blob order."""
    b = device_blob_parser.load(str(directory / "model.mtb"))
    ranges, at = [], 0
    for tensor, _, _ in b.parameters:
        n = b.sizes[tensor]
        if b.names[tensor].endswith(".observer_range"):
            ranges.append(tuple(params[at:at + n]))
        at += n
    return ranges


@pytest.mark.parametrize("name,optimizer", RUNS, ids=[f"{n}-{o}" for n, o in RUNS])
def test_qat_matches_torch(runs, name, optimizer):
    tmp, torch_losses, torch_ranges, (losses, params, _) = runs[name, optimizer]
    assert len(losses) == STEPS
    tolerance = TOLERANCE.get((name, optimizer), 1e-4)
    assert relative_error(losses[:EXACT_STEPS], torch_losses[:EXACT_STEPS]) <= 1e-6
    print(f"{name} {optimizer}: 50 losses within {relative_error(losses, torch_losses):.1e} "
          f"relative of PyTorch QAT")
    assert relative_error(losses, torch_losses) <= tolerance, (losses[:5], torch_losses[:5])
    ranges = device_ranges(tmp, params)
    assert len(ranges) == len(torch_ranges)
    assert relative_error(np.ravel(ranges), np.ravel(torch_ranges)) <= max(tolerance, 1e-4)
    assert losses[-10:].mean() < losses[:10].mean()


@pytest.mark.parametrize("name,optimizer", [("digits_mlp", "AdamW"), ("lenet", "SGD"),
                                            ("ds_cnn", "SGD")])
def test_qat_micropython_matches_cpython(runs, micropython, name, optimizer):
    tmp, _, _, (losses, params, eval_loss) = runs[name, optimizer]
    out = run_micropython(micropython, ROOT / "tests" / "device_scripts" / "train_steps.py",
                          tmp, tmp / "data.bin", STEPS, repr(LR[optimizer]))
    mp_losses, mp_params, mp_eval = parse_run(out)
    assert relative_error(mp_losses, losses) <= 1e-5
    finite = np.isfinite(params)
    assert np.array_equal(finite, np.isfinite(mp_params))
    assert np.max(np.abs(mp_params[finite] - params[finite])) <= 1e-5 * max(
        1.0, np.max(np.abs(params[finite])))
    assert abs(mp_eval - eval_loss) <= 1e-5 * max(1.0, abs(eval_loss))


def test_qat_resume_is_bit_identical(tmp_path):
    """The observers' ranges are frozen parameters: a checkpoint saved mid-run holds them
    (ORT's layout, frozen_params) and a resumed run continues bit-identically."""
    from microtrain import CheckpointState, Module, Optimizer
    mh.generate_artifacts(str(DIGITS / "mlp.onnx"), artifact_directory=tmp_path, batch_size=8,
                          quantization=True)
    data = np.load(DIGITS / "digits.npz")
    xs = data["x_train"][:80].reshape(10, -1).astype(np.float32)
    ys = data["y_train"][:80].reshape(10, 8).astype(np.int64)
    blob = str(tmp_path / "model.mtb")

    def run(state, steps, save=None):
        model = Module(blob, state)
        opt = Optimizer(blob, model)
        losses = []
        for x, y in zip(xs[steps], ys[steps]):
            losses.append(model(list(x), [int(v) for v in y]))
            opt.step()
            model.lazy_reset_grad()
        if save:
            CheckpointState.save_checkpoint(state, save, include_optimizer_state=True)
        return losses

    whole = run(CheckpointState.load_checkpoint(str(tmp_path / "checkpoint")), slice(0, 10),
                str(tmp_path / "whole"))
    first = run(CheckpointState.load_checkpoint(str(tmp_path / "checkpoint")), slice(0, 5),
                str(tmp_path / "half"))
    saved = CheckpointState.load_checkpoint(str(tmp_path / "half"))
    observed = saved.parameters["input.observer_range"]
    assert not observed.requires_grad and list(observed.data) == [0.0, 1.0]
    second = run(saved, slice(5, 10), str(tmp_path / "resumed"))
    assert first + second == whole
    assert (tmp_path / "resumed").read_bytes() == (tmp_path / "whole").read_bytes()
    from microtrain_host.formats.checkpoint import read_checkpoint
    host = read_checkpoint(str(tmp_path / "resumed"))
    assert "output.observer_range" in host.frozen and np.all(np.isfinite(
        host.frozen["output.observer_range"]))
