"""Acceptance of issue 3: the reference CNNs (tests/reference_models.py) train 50 steps on the
device runtime with SGD and with AdamW, with losses equal to PyTorch's at every step
(CPython) and to CPython's (MicroPython); partial updates of the DS-CNN match PyTorch with
the same parameters frozen, on a smaller arena."""
import copy

import numpy as np
import pytest
import torch

import microtrain_host as mh
from conftest import ROOT, run_micropython
from microtrain import parser as device_blob_parser
from reference_models import REFERENCE_MODELS, ds_cnn
from torch_reference import (export, parse_run, relative_error, run_device_cpython, torch_train,
                             write_batches)

STEPS = 50
OPTIMIZERS = ("SGD", "AdamW")
CASES = [(build, opt) for build in REFERENCE_MODELS for opt in OPTIMIZERS]
IDS = [f"{build.__name__}-{opt}" for build, opt in CASES]


def make_data(ref, steps, distinct=4, seed=7):
    """`distinct` batches of random inputs with random class labels (or the input itself
    for the autoencoder), cycled over the steps: a task 50 steps can make progress on."""
    rng = np.random.default_rng(seed)
    if ref.vocabulary:
        xs = rng.integers(0, ref.vocabulary, (distinct, ref.batch) + ref.inputs)
    else:
        xs = rng.standard_normal((distinct, ref.batch) + ref.inputs).astype(np.float32)
    if ref.loss == "MSELoss":
        ys = xs.copy()
    else:
        # On a copy in eval mode: a train-mode forward would move BatchNorm's running
        # statistics away from the exported ones.
        classes = copy.deepcopy(ref.module).eval()(example(ref, 1)).shape[-1]
        ys = rng.integers(0, classes, (distinct, ref.batch)).astype(np.int64)
    cycle = np.arange(steps) % distinct
    return xs[cycle], ys[cycle]


def example(ref, batch):
    """An input of `batch` samples for export: zeros, token ids for an embedding model."""
    return torch.zeros((batch,) + ref.inputs, dtype=torch.int64 if ref.vocabulary else None)


def pack(ref, directory, optimizer, **kwargs):
    onnx_model = export(ref.module, example(ref, ref.batch))
    return mh.generate_artifacts(onnx_model, loss=ref.loss, optimizer=optimizer,
                                 artifact_directory=directory, batch_size=ref.batch, **kwargs)


def torch_state(module, names):
    """The module's parameters and buffers (BatchNorm running statistics) in the device's
    parameter order, flattened: the same vector get_contiguous_parameters() gives."""
    state = module.state_dict()
    return np.concatenate([state[n].detach().numpy().reshape(-1) for n in names])


def device_parameter_names(directory):
    b = device_blob_parser.load(str(directory / "model.mtb"))
    return [b.names[tensor] for tensor, _, _ in b.parameters]


def run_case(tmp, ref, optimizer, frozen=None):
    """Train torch and the device (CPython) on the same batches; returns both runs."""
    kwargs = {"frozen_params": frozen} if frozen else {}
    artifacts = pack(ref, tmp, optimizer, **kwargs)
    xs, ys = make_data(ref, STEPS)
    write_batches(tmp / "data.bin", xs, ys)
    reference = copy.deepcopy(ref.module).train()
    for name, p in reference.named_parameters():
        p.requires_grad_(name not in set(frozen or ()))
    lr = ref.lr[optimizer]
    torch_losses, _ = torch_train(reference, ref.loss, optimizer, xs, ys, lr)
    device = run_device_cpython(tmp, tmp / "data.bin", STEPS, lr)
    names = device_parameter_names(tmp)
    return artifacts, torch_losses, torch_state(reference, names), device


class Runs(dict):
    """Each case trained once, on first use, by torch and by the device under CPython."""

    def __init__(self, tmp_path_factory):
        super().__init__()
        self.tmp_path_factory = tmp_path_factory

    def __missing__(self, case):
        build, optimizer = case
        ref = build()
        tmp = self.tmp_path_factory.mktemp(f"{ref.name}_{optimizer}")
        self[case] = (tmp, ref) + run_case(tmp, ref, optimizer)
        return self[case]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return Runs(tmp_path_factory)


@pytest.mark.parametrize("build,optimizer", CASES, ids=IDS)
def test_reference_model_matches_torch(runs, build, optimizer):
    _, ref, _, torch_losses, torch_params, (losses, params, _) = runs[build, optimizer]
    assert len(losses) == STEPS
    assert relative_error(losses, torch_losses) <= 1e-4, (ref.name, losses[:4], torch_losses[:4])
    assert_parameters_match(params, torch_params, optimizer)
    assert losses[-10:].mean() < losses[:10].mean()  # it learned something


def assert_parameters_match(params, torch_params, optimizer):
    """Parameters and BatchNorm running statistics after the run. SGD: within 1e-4. AdamW
    divides by sqrt(v): where a gradient is rounding noise (a dead unit's), float32
    differences flip the sign of a full-size step, so single elements may drift apart by a
    few learning rates while the losses still agree; bound the mean and the worst case."""
    scale = max(1.0, float(np.max(np.abs(torch_params))))
    diff = np.abs(params - torch_params) / scale
    if optimizer == "SGD":
        assert diff.max() <= 1e-4, diff.max()
    else:
        assert diff.mean() <= 1e-4 and diff.max() <= 1e-2, (diff.mean(), diff.max())


@pytest.mark.parametrize("build,optimizer", CASES, ids=IDS)
def test_reference_model_micropython_matches_cpython(runs, micropython, build, optimizer):
    tmp, ref, _, _, _, (losses, params, eval_loss) = runs[build, optimizer]
    out = run_micropython(micropython, ROOT / "tests" / "device_scripts" / "train_steps.py",
                          tmp, tmp / "data.bin", STEPS, repr(ref.lr[optimizer]))
    mp_losses, mp_params, mp_eval = parse_run(out)
    assert relative_error(mp_losses, losses) <= 1e-5
    assert np.max(np.abs(mp_params - params)) <= 1e-5 * max(1.0, np.max(np.abs(params)))
    assert abs(mp_eval - eval_loss) <= 1e-5 * max(1.0, abs(eval_loss))


# -- partial updates: on-device personalisation of the DS-CNN --------------------------

def _bias_only(names):
    return [n for n in names if not n.endswith(".bias")]


def _last_layers_only(names):
    # Train the last depthwise-separable block (blocks.6-11) and the classifier.
    last = ("classifier.", "blocks.6.", "blocks.7.", "blocks.9.", "blocks.10.")
    return [n for n in names if not n.startswith(last)]


@pytest.mark.parametrize("optimizer", OPTIMIZERS)
@pytest.mark.parametrize("freeze", [_bias_only, _last_layers_only], ids=["bias_only",
                                                                        "last_layers"])
def test_ds_cnn_partial_update_matches_torch(tmp_path, runs, freeze, optimizer):
    ref = ds_cnn()
    names = [n for n, _ in ref.module.named_parameters()]
    frozen = freeze(names)
    artifacts, torch_losses, torch_params, (losses, params, _) = run_case(
        tmp_path, ref, optimizer, frozen)
    assert set(artifacts.frozen) >= set(frozen)
    assert relative_error(losses, torch_losses) <= 1e-4
    assert_parameters_match(params, torch_params, optimizer)

    full = device_blob_parser.load(str(runs[ds_cnn, optimizer][0] / "model.mtb"))
    partial = device_blob_parser.load(str(tmp_path / "model.mtb"))
    assert partial.float_arena < full.float_arena, (partial.float_arena, full.float_arena)
    assert len(partial.programs["train"].steps) < len(full.programs["train"].steps)
