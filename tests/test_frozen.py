"""Frozen parameters keep their values exactly, get no gradient buffer or optimizer state,
and training the rest matches PyTorch with the same parameters frozen."""
import copy

import numpy as np
import pytest
import torch

import microtrain_host as mh
from microtrain import CheckpointState, Module, Optimizer, ParameterError
from microtrain import parser as blobfile_parser
from microtrain_host.tools.inspect import describe
from torch_reference import (export, make_batches, mlp, relative_error, run_device_cpython,
                             torch_train, write_batches)

FROZEN = ["0.weight", "0.bias"]


@pytest.mark.parametrize("optimizer", ["SGD", "AdamW"])
def test_frozen_first_layer(tmp_path, optimizer):
    model = mlp(10, 4)
    art = mh.generate_artifacts(export(model, torch.zeros(1, 10)), frozen_params=FROZEN,
                                loss="CrossEntropyLoss", optimizer=optimizer,
                                artifact_directory=tmp_path, batch_size=8)
    assert art.frozen == FROZEN
    xs, ys = make_batches("CrossEntropyLoss", 40, 8, 10, 4)
    write_batches(tmp_path / "data.bin", xs, ys)

    reference = copy.deepcopy(model)
    for name, p in reference.named_parameters():
        p.requires_grad_(name not in FROZEN)
    torch_losses, torch_params = torch_train(reference, "CrossEntropyLoss", optimizer, xs, ys, 0.05)
    losses, params, _ = run_device_cpython(tmp_path, tmp_path / "data.bin", 40, 0.05)
    assert relative_error(losses, torch_losses) <= 1e-4
    assert np.max(np.abs(params - torch_params)) <= 1e-4

    # Frozen values bit for bit; trainable ones moved.
    initial = {n: p.detach().numpy().reshape(-1) for n, p in model.named_parameters()}
    sizes = [initial[n].size for n in initial]
    offsets = np.cumsum([0] + sizes)
    for (name, values), start in zip(initial.items(), offsets):
        trained = params[start:start + values.size].astype(np.float32)
        if name in FROZEN:
            assert trained.tobytes() == values.astype(np.float32).tobytes(), name
        else:
            assert not np.array_equal(trained, values), name

    # No gradient buffer, no optimizer state, no gradient step for the frozen layer.
    b = blobfile_parser.load(str(tmp_path / "model.mtb"), keep_steps=True)
    for tensor, grad, state in b.parameters:
        frozen = b.names[tensor] in FROZEN
        assert (grad < 0) == frozen and (not state) == (frozen or optimizer == "SGD")
    assert not any(n.startswith("0.weight_grad") or n.startswith("0.bias_grad") for n in b.names)
    text = describe(tmp_path / "model.mtb")
    for name in FROZEN:
        assert f"{name}" in text and "frozen (no gradient buffer)" in text
    # The backward pass stops at the first trainable layer: the only GEMMs of the train
    # program are 3 forward + dW, dX for layer 2 + dW for layer 3 (no dX into layer 1).
    gemms = [r for r in b.step_records["train"] if r[0] in (1, 2)]  # GEMM, GEMM_ACCUMULATE
    assert len(gemms) == 3 + 2 + 1
    # inspect reports what the pruning saved against training every parameter.
    full = mh.generate_artifacts(export(model, torch.zeros(1, 10)), loss="CrossEntropyLoss",
                                 optimizer=optimizer, artifact_directory=tmp_path / "full",
                                 batch_size=8)
    everything = blobfile_parser.load(full.blob, keep_steps=True)  # the tools' fields
    assert (b.full_training_arena, b.full_training_steps) == (
        everything.float_arena, len(everything.programs["train"].steps))
    assert b.float_arena < b.full_training_arena
    assert everything.full_training_arena == 0  # nothing frozen, nothing to report
    assert (f"partial update   {b.float_arena:8d}  vs {b.full_training_arena} training every "
            f"parameter: pruning saved {b.full_training_arena - b.float_arena}") in text


def test_frozen_state_flags_are_checked(tmp_path):
    mh.generate_artifacts(export(mlp(10, 4), torch.zeros(1, 10)), frozen_params=FROZEN,
                          artifact_directory=tmp_path, batch_size=8)
    state = CheckpointState.load_checkpoint(str(tmp_path / "checkpoint"))
    assert not state.parameters["0.weight"].requires_grad
    assert state.parameters["2.weight"].requires_grad
    model = Module(str(tmp_path / "model.mtb"), state)
    Optimizer(str(tmp_path / "model.mtb"), model)
    assert model.get_parameters_size(trainable_only=True) < model.get_parameters_size(False)
    assert state.parameters["0.weight"].grad is None


def test_nominal_state_needs_every_parameter(tmp_path):
    art = mh.generate_artifacts(export(mlp(10, 4), torch.zeros(1, 10)), frozen_params=FROZEN,
                                artifact_directory=tmp_path, batch_size=8,
                                nominal_checkpoint=True)
    full = Module(art.blob, CheckpointState.load_checkpoint(art.checkpoint))
    state = CheckpointState.load_checkpoint(art.nominal_checkpoint)
    assert state.is_nominal
    model = Module(art.blob, state)
    x = [0.1] * (8 * 10)
    y = [1] * 8
    with pytest.raises(ParameterError, match="nominal"):
        model(x, y)
    model.copy_buffer_to_parameters(full.get_contiguous_parameters(trainable_only=True))
    with pytest.raises(ParameterError, match="nominal"):  # frozen ones are still missing
        model(x, y)
    model.copy_buffer_to_parameters(full.get_contiguous_parameters(), trainable_only=False)
    assert model(x, y) == full(x, y)
