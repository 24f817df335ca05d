"""Acceptance: MLPs x the four losses x both optimizers, 100 steps on the device runtime,
against PyTorch (CPython) and against CPython (MicroPython)."""
import copy

import numpy as np
import pytest
import torch

import microtrain_host as mh
from conftest import run_micropython, ROOT
from torch_reference import (LOSSES, export, make_batches, mlp, parse_run, relative_error,
                             run_device_cpython, torch_train, write_batches)

STEPS = 100
BATCH = 8
N_IN = 12
N_OUT = {"CrossEntropyLoss": 5, "MSELoss": 3, "BCEWithLogitsLoss": 3, "L1Loss": 3}
LR = {"SGD": 0.05, "AdamW": 0.01}
CASES = [(loss, opt) for loss in LOSSES for opt in ("SGD", "AdamW")]


def prepare(tmp_path, loss, optimizer, steps=STEPS, **kwargs):
    model = mlp(N_IN, N_OUT[loss])
    onnx_model = export(model, torch.zeros(1, N_IN))
    mh.generate_artifacts(onnx_model, loss=loss, optimizer=optimizer, artifact_directory=tmp_path,
                          batch_size=BATCH, **kwargs)
    xs, ys = make_batches(loss, steps, BATCH, N_IN, N_OUT[loss])
    write_batches(tmp_path / "data.bin", xs, ys)
    return model, xs, ys


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Each case trained once by torch and by the device runtime under CPython."""
    results = {}
    for loss, optimizer in CASES:
        tmp = tmp_path_factory.mktemp(f"{loss}_{optimizer}")
        model, xs, ys = prepare(tmp, loss, optimizer)
        reference = torch_train(copy.deepcopy(model), loss, optimizer, xs, ys, LR[optimizer])
        device = run_device_cpython(tmp, tmp / "data.bin", STEPS, LR[optimizer])
        results[loss, optimizer] = (tmp, reference, device)
    return results


@pytest.mark.parametrize("loss,optimizer", CASES)
def test_device_matches_torch(runs, loss, optimizer):
    _, (torch_losses, torch_params), (losses, params, _) = runs[loss, optimizer]
    assert len(losses) == STEPS
    assert relative_error(losses, torch_losses) <= 1e-4, (losses[:5], torch_losses[:5])
    assert np.max(np.abs(params - torch_params)) <= 1e-4 * max(1.0, np.max(np.abs(torch_params)))
    assert losses[-10:].mean() < losses[:10].mean()  # it learned something


@pytest.mark.parametrize("loss,optimizer", CASES)
def test_micropython_matches_cpython(runs, micropython, loss, optimizer):
    tmp, _, (losses, params, eval_loss) = runs[loss, optimizer]
    out = run_micropython(micropython, ROOT / "tests" / "device_scripts" / "train_steps.py",
                          tmp, tmp / "data.bin", STEPS, repr(LR[optimizer]))
    mp_losses, mp_params, mp_eval = parse_run(out)
    assert relative_error(mp_losses, losses) <= 1e-5
    assert np.max(np.abs(mp_params - params)) <= 1e-5 * max(1.0, np.max(np.abs(params)))
    assert abs(mp_eval - eval_loss) <= 1e-5 * max(1.0, abs(eval_loss))


def test_bce_gradient_at_zero_logits_matches_torch(tmp_path):
    """A zero-initialised output layer puts every logit at exactly 0, where max(x, 0) and
    |x| have no derivative: the gradient there must still be sigmoid(0) - t."""
    model = mlp(N_IN, 3)
    with torch.no_grad():
        model[-1].weight.zero_()
        model[-1].bias.zero_()
    mh.generate_artifacts(export(model, torch.zeros(1, N_IN)), loss="BCEWithLogitsLoss",
                          optimizer="SGD", artifact_directory=tmp_path, batch_size=BATCH)
    xs, ys = make_batches("BCEWithLogitsLoss", 10, BATCH, N_IN, 3)
    write_batches(tmp_path / "data.bin", xs, ys)
    torch_losses, torch_params = torch_train(copy.deepcopy(model), "BCEWithLogitsLoss", "SGD",
                                             xs, ys, 0.5)
    losses, params, _ = run_device_cpython(tmp_path, tmp_path / "data.bin", 10, 0.5)
    assert relative_error(losses, torch_losses) <= 1e-4
    assert np.max(np.abs(params - torch_params)) <= 1e-4
