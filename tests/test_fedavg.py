"""Federated learning: parameters to and from a flat buffer, FedAvg of device checkpoints.

get_contiguous_parameters / copy_buffer_to_parameters in both modes (a model with a frozen
parameter, so the modes differ) against the checkpoint as the host reads it;
microtrain_host.tools.fedavg and `microtrain aggregate` of checkpoints that the device runtime
wrote (CPython and MicroPython) against numpy's weighted mean; clear errors.
"""
import os
import re
import subprocess
import sys

import numpy as np
import pytest

import microtrain_host as mh
from conftest import ROOT
from microtrain import CheckpointState, Module, Optimizer
from microtrain.errors import ParameterError
from microtrain_host.formats.checkpoint import read_checkpoint, write_checkpoint
from microtrain_host.cli import main
from test_resume import MODEL, lr_bits, run_device, write_batches

FROZEN = ["1.bias"]
ORDER = ["1.weight", "1.bias", "3.weight", "3.bias"]  # initializer order = blob order


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("fedavg")
    return mh.generate_artifacts(str(MODEL), loss="CrossEntropyLoss", optimizer="SGD",
                                 frozen_params=FROZEN, batch_size=8, artifact_directory=tmp)


def flat(ckpt, names):
    params = {**ckpt.trainable, **ckpt.frozen}
    return np.concatenate([params[n].reshape(-1) for n in names])


def test_contiguous_parameters_both_modes(artifacts, tmp_path):
    ckpt = read_checkpoint(artifacts.checkpoint)
    state = CheckpointState.load_checkpoint(artifacts.checkpoint)
    model = Module(artifacts.blob, state)
    trainable = [n for n in ORDER if n not in FROZEN]
    assert model.get_parameters_size(True) == flat(ckpt, trainable).size == 2410 - 32
    assert model.get_parameters_size(False) == flat(ckpt, ORDER).size == 2410
    assert np.array_equal(np.array(model.get_contiguous_parameters(True)), flat(ckpt, trainable))
    assert np.array_equal(np.array(model.get_contiguous_parameters(False)), flat(ckpt, ORDER))
    assert np.array_equal(np.array(model.get_contiguous_parameters()), flat(ckpt, ORDER))

    # trainable_only=True: the trainable parameters take the buffer, frozen ones stay.
    new = np.linspace(-1, 1, 2410, dtype=np.float32)
    model.copy_buffer_to_parameters(new[:2378].tolist(), trainable_only=True)
    at = 0
    for name in trainable:
        n = ckpt.trainable[name].size
        assert np.array_equal(np.array(state.parameters[name].data), new[at:at + n])
        at += n
    assert np.array_equal(np.array(state.parameters["1.bias"].data), ckpt.frozen["1.bias"])
    # trainable_only=False: every parameter, in blob order.
    model.copy_buffer_to_parameters(new.tolist(), trainable_only=False)
    assert np.array_equal(np.array(model.get_contiguous_parameters(False)), new)
    for bad, mode in ((new[:2378], False), (new, True), (new[:5], True)):
        with pytest.raises(ParameterError, match="parameter buffer has %d values" % bad.size):
            model.copy_buffer_to_parameters(bad.tolist(), trainable_only=mode)

    # The copied values are the ones that train: same loss as a checkpoint holding them.
    values = {}
    at = 0
    for name in ORDER:
        shape = {**ckpt.trainable, **ckpt.frozen}[name].shape
        values[name] = new[at:at + int(np.prod(shape))].reshape(shape)
        at += values[name].size
    write_checkpoint(tmp_path / "oracle", {n: values[n] for n in trainable},
                     {n: values[n] for n in FROZEN})
    oracle = Module(artifacts.blob, CheckpointState.load_checkpoint(str(tmp_path / "oracle")))
    x, y = np.linspace(0, 1, 8 * 64).tolist(), list(range(8))
    assert model(x, y) == oracle(x, y)


def train_clients(artifacts, tmp_path, micropython):
    """Three devices train from the global checkpoint on their own shards and save."""
    shards = [(0, 5), (5, 3), (8, 2)]  # (first batch, batches): 40, 24 and 16 samples
    paths = []
    for i, (first, count) in enumerate(shards):
        data = write_batches(tmp_path / f"shard{i}", count, offset=first)
        path = tmp_path / f"client{i}"
        if i == 2:  # the third device runs MicroPython
            run_device(micropython, artifacts.blob, artifacts.checkpoint, data, 0, count,
                       lr_bits(0.1), path, 1)
        else:
            state = CheckpointState.load_checkpoint(artifacts.checkpoint)
            model = Module(artifacts.blob, state)
            opt = Optimizer(artifacts.blob, model)
            opt.set_learning_rate(0.1)
            xs = np.fromfile(data / "x.f32", "<f4").reshape(count, -1)
            ys = np.fromfile(data / "y.i32", "<i4").reshape(count, -1)
            for x, y in zip(xs, ys):
                model(x.tolist(), y.tolist())
                opt.step()
                model.lazy_reset_grad()
            state.properties["samples"] = 8 * count
            CheckpointState.save_checkpoint(state, str(path), include_optimizer_state=True)
        paths.append(str(path))
    return paths, [8 * count for _, count in shards]


def device_params(path):
    """Parameters as the device runtime reads them, float64."""
    state = CheckpointState.load_checkpoint(path)
    return {n: np.array(p.data, np.float64).reshape(p.shape)
            for n, p in state.parameters.items()}


def test_fedavg_of_device_checkpoints_is_the_weighted_mean(artifacts, tmp_path, micropython):
    paths, weights = train_clients(artifacts, tmp_path, micropython)
    clients = [device_params(p) for p in paths]
    out = tmp_path / "global"
    result = mh.fedavg(paths, weights=weights, output=out)
    for name in ORDER:
        expected = np.average(np.stack([c[name] for c in clients]), axis=0,
                              weights=weights).astype(np.float32)
        got = {**result.trainable, **result.frozen}[name]
        np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-9)
        assert got.shape == clients[0][name].shape
    # Trainable parameters differ between devices; the frozen one is the same everywhere
    # and comes out unchanged, bit for bit.
    assert not np.array_equal(clients[0]["3.weight"], clients[2]["3.weight"])
    initial = read_checkpoint(artifacts.checkpoint).frozen["1.bias"]
    assert np.array_equal(result.frozen["1.bias"], initial)
    # Optimizer state and properties are dropped; the device runtime loads the result.
    written = read_checkpoint(out)
    assert written.optimizer_step is None and written.momentums == {}
    assert written.properties == {} and list(written.frozen) == FROZEN
    model = Module(artifacts.blob, CheckpointState.load_checkpoint(str(out)))
    assert np.array_equal(np.array(model.get_contiguous_parameters(False)),
                          flat(result, ORDER))
    # Equal weights by default.
    plain = mh.fedavg(paths)
    np.testing.assert_allclose(plain.trainable["3.bias"],
                               np.mean([c["3.bias"] for c in clients], axis=0), rtol=1e-6)

    # The command line does the same.
    cli_out = tmp_path / "global_cli"
    assert main(["aggregate", *paths, "--weights", *map(str, weights), "-o",
                 str(cli_out)]) == 0
    assert cli_out.read_bytes() == out.read_bytes()


def test_fedavg_errors(artifacts, tmp_path, capsys):
    good = artifacts.checkpoint
    ckpt = read_checkpoint(good)
    write_checkpoint(tmp_path / "renamed", {"fc.weight": ckpt.trainable["1.weight"]},
                     ckpt.frozen)
    reshaped = dict(ckpt.trainable, **{"3.bias": np.zeros(11, np.float32)})
    write_checkpoint(tmp_path / "reshaped", reshaped, ckpt.frozen)
    write_checkpoint(tmp_path / "all_trainable", {**ckpt.trainable, **ckpt.frozen}, {})
    write_checkpoint(tmp_path / "nominal", ckpt.trainable, ckpt.frozen, nominal=True)
    cases = [
        ([good, tmp_path / "renamed"], None, r"hold different trainable parameters; .*"
                                             r"lacks \['1.weight', '3.bias', '3.weight'\]"),
        ([good, tmp_path / "reshaped"], None, r"'3.bias' has shape \[11\] in .*reshaped' "
                                              r"but \[10\] in"),
        ([good, tmp_path / "all_trainable"], None, "different trainable parameters"),
        ([good, tmp_path / "nominal"], None, "nominal checkpoint"),
        ([good, good], [1], "1 weights for 2 checkpoints"),
        ([good, good], [1, -1], "non-negative"),
        ([good, good], [0, 0], "not all zero"),
        ([good, good], ["a", 1], "must be numbers"),
        ([], None, "at least one checkpoint"),
        ([tmp_path / "missing"], None, "cannot read checkpoint"),
    ]
    for paths, weights, message in cases:
        with pytest.raises(mh.CheckpointError, match=message):
            mh.fedavg(paths, weights=weights)
    assert main(["aggregate", str(good), str(tmp_path / "reshaped"), "-o",
                 str(tmp_path / "out")]) == 2
    assert "microtrain aggregate: error: parameter '3.bias' has shape" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_federated_example_accuracy_rises(tmp_path, micropython):
    """examples/federated for 2 rounds with its device 0 running client.py under MicroPython
    (the others under CPython): global validation accuracy rises round after round (2.6 %,
    39.2 %, 80.7 % measured)."""
    proc = subprocess.run([sys.executable, str(ROOT / "examples" / "federated" / "federated.py"),
                           "--rounds", "2", "--work", str(tmp_path)], capture_output=True,
                          text=True, env=dict(os.environ, MICROTRAIN_MICROPYTHON=micropython))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert re.search(r"^device 0: .*MicroPython$", proc.stdout, re.M), proc.stdout
    accuracies = [float(a) for a in re.findall(r"global validation accuracy +([0-9.]+) %",
                                               proc.stdout)]
    assert len(accuracies) == 3, proc.stdout
    assert all(a < b for a, b in zip(accuracies, accuracies[1:])), proc.stdout
    assert accuracies[-1] >= 75.0, proc.stdout
