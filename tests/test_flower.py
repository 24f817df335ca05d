"""Federated learning on Flower (microtrain_host.flower, `microtrain federate`).

A bounded run through Flower's simulation engine (Ray): 8 emulated devices, 2 rounds. Its
aggregated parameters equal `microtrain aggregate` of the same device updates byte for
byte; each kept update is what the device runtime computes from the previous global model
(replayed here in-process); the mean is numpy's weighted average to float32 rounding; the
accuracy rises. MicroPython devices inside the simulation give the same bits as CPython
ones. Why stock Flower on float32 arrays cannot give those bits is pinned down too.

Needs the flower extra (flwr[simulation]): skipped without it locally, a failure when
MICROTRAIN_REQUIRE_FLOWER=1 (scripts/test.sh installs the extra and sets it)."""
import importlib.util
import os
import re
import subprocess
import sys

import numpy as np
import pytest

import microtrain_host as mh
from conftest import ROOT
from microtrain_host.cli import main
from microtrain_host.formats.checkpoint import read_checkpoint
from microtrain_host.tools import devices
from microtrain_host.tools.train import load_data

DATA = ROOT / "examples" / "digits" / "digits.npz"
MODEL = ROOT / "examples" / "digits" / "mlp.onnx"


@pytest.fixture(scope="module")
def flwr():
    if importlib.util.find_spec("flwr") is None or importlib.util.find_spec("ray") is None:
        message = "Flower is not installed: pip install 'microtrain[flower]'"
        if os.environ.get("MICROTRAIN_REQUIRE_FLOWER") == "1":
            pytest.fail(message)
        pytest.skip(message)
    import flwr
    return flwr


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory):
    out = tmp_path_factory.mktemp("flower") / "build"
    mh.generate_artifacts(str(MODEL), loss="CrossEntropyLoss", optimizer="AdamW",
                          batch_size=8, artifact_directory=str(out))
    return out


def federate_cli(*args):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(ROOT / "host"), str(ROOT / "device"), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, "-m", "microtrain_host.cli", "federate", *map(str, args)],
                          capture_output=True, text=True, env=env, timeout=900)
    return proc


def flat(path):
    """A checkpoint's parameters in blob order (the order the flat buffers use)."""
    ckpt = read_checkpoint(path)
    params = {**ckpt.trainable, **ckpt.frozen}
    return np.concatenate([params[n].reshape(-1) for n in ("1.weight", "1.bias", "3.weight",
                                                          "3.bias")])


def test_federate_in_flower_simulation_equals_aggregate_bit_for_bit(flwr, artifacts, tmp_path):
    clients, rounds, epochs, lr, seed = 8, 2, 2, 0.02, 3
    kept = tmp_path / "updates"
    proc = federate_cli(artifacts, "--data", DATA, "--clients", clients, "--rounds", rounds,
                        "--epochs", epochs, "--lr", lr, "--seed", seed, "--workers", 2,
                        "--keep-updates", kept, "-o", tmp_path / "final")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    assert f"Flower {flwr.__version__}'s strategy" in out
    accuracy = [float(a) for a in re.findall(r"^round \d+: global accuracy +([0-9.]+) %", out,
                                             re.M)]
    assert len(accuracy) == rounds + 1, out
    assert accuracy[0] < accuracy[1] < accuracy[2], out
    assert re.search(rf"^round 2: .* {clients} devices .* s \(\+ .* MiB server, .* MiB with "
                     rf"Ray's processes$", out, re.M), out

    x, y, x_val, y_val = load_data(DATA)
    shards = devices.noniid_shards(y, clients, 0.3, seed)
    device = devices.CPythonDevice(artifacts)
    from microtrain_host.flower import device_seed
    settings = {"clients": clients, "seed": seed}
    previous = devices.initial_buffer(artifacts)
    for r in range(1, rounds + 1):
        folder = kept / f"round{r}"
        updates = sorted(folder.glob("device*"))
        weights = (folder / "weights.txt").read_text().split()
        assert [u.name for u in updates] == [f"device{i:03d}" for i in range(clients)]
        assert weights == [str(len(s)) for s in shards]
        # microtrain aggregate on the same updates writes the same file, byte for byte.
        assert main(["aggregate", *map(str, updates), "--weights", *weights,
                     "-o", str(tmp_path / f"aggregate{r}")]) == 0
        assert (tmp_path / f"aggregate{r}").read_bytes() == (folder / "global").read_bytes()
        # The mean is the weighted mean (numpy's, to float32 rounding) of the updates ...
        stacked = np.stack([flat(u).astype(np.float64) for u in updates])
        oracle = np.average(stacked, axis=0, weights=[float(w) for w in weights])
        np.testing.assert_allclose(flat(folder / "global"), oracle, rtol=2e-7, atol=1e-9)
        # ... which the devices computed from the previous global model with the device
        # runtime: device 0 and the last one, replayed here, give the same bits.
        for i in (0, clients - 1):
            replay, samples, _ = device.train(previous, x[shards[i]], y[shards[i]], epochs, lr,
                                              device_seed(settings, r, i))
            assert samples == len(shards[i])
            assert np.array_equal(replay, flat(updates[i])), (r, i)
            assert not np.array_equal(replay, previous)
        previous = flat(folder / "global")
    assert (tmp_path / "final").read_bytes() == (kept / f"round{rounds}" / "global").read_bytes()
    # The reported accuracy is the final global model's, evaluated here again.
    _, final_accuracy = devices.evaluate(artifacts, previous, x_val, y_val)
    assert f"round {rounds}: global accuracy {100 * final_accuracy:5.1f} %" in out, out


def test_federate_with_micropython_devices(flwr, artifacts, tmp_path, micropython):
    """Devices as MicroPython processes inside Flower's simulation: their updates are the
    CPython device runtime's, bit for bit."""
    kept = tmp_path / "updates"
    proc = federate_cli(artifacts, "--data", DATA, "--clients", 3, "--rounds", 1, "--epochs", 1,
                        "--runtime", "micropython", "--micropython", micropython,
                        "--workers", 2, "--keep-updates", kept)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "3 emulated devices (micropython)" in proc.stdout
    x, y, _, _ = load_data(DATA)
    shards = devices.noniid_shards(y, 3, 0.3, 0)
    from microtrain_host.flower import device_seed
    start = devices.initial_buffer(artifacts)
    for i, shard in enumerate(shards):
        replay, _, _ = devices.CPythonDevice(artifacts).train(
            start, x[shard], y[shard], 1, 0.02, device_seed({"clients": 3, "seed": 0}, 1, i))
        assert np.array_equal(replay, flat(kept / "round1" / f"device{i:03d}")), i


def test_micropython_device_equals_cpython_device(artifacts, micropython):
    x, y, _, _ = load_data(DATA)
    start = devices.initial_buffer(artifacts)
    a = devices.CPythonDevice(artifacts).train(start, x[:40], y[:40], 2, 0.02, 7)
    b = devices.MicroPythonDevice(artifacts, micropython).train(start, x[:40], y[:40], 2,
                                                                0.02, 7)
    assert np.array_equal(a[0], b[0]) and a[1] == b[1] == 40
    # the mean loss crosses a MicroPython repr(), which keeps 16 significant digits
    assert a[2] == pytest.approx(b[2], rel=1e-15)


def test_stock_flower_float32_arithmetic_is_why_updates_travel_as_float64(flwr, tmp_path):
    """Flower's aggregate_arrayrecords computes `array * (w / total)` and sums in the
    arrays' dtype: on float32 arrays (NumPy 2 keeps float32 * Python float in float32) every
    term and partial sum is rounded to float32, so the result differs from the float64 mean
    in many values, and depends on the order. On float64 arrays it is fedavg's arithmetic:
    the same bits in the same order."""
    from flwr.app import Array, ArrayRecord, MetricRecord, RecordDict
    from flwr.serverapp.strategy.strategy_utils import aggregate_arrayrecords
    from microtrain_host.formats.checkpoint import write_checkpoint
    rng = np.random.default_rng(0)
    updates = [rng.standard_normal(5000).astype(np.float32) for _ in range(7)]
    weights = [14, 15, 14, 15, 15, 14, 9]
    paths = []
    for i, u in enumerate(updates):
        paths.append(tmp_path / f"u{i}")
        write_checkpoint(paths[-1], {"p": u}, {})
    ours = mh.fedavg(paths, weights).trainable["p"]

    def flower(dtype, order):
        records = [RecordDict({"a": ArrayRecord({"p": Array(updates[i].astype(dtype))}),
                               "m": MetricRecord({"num-examples": weights[i]})})
                   for i in order]
        return aggregate_arrayrecords(records, "num-examples")["p"].numpy()

    wide = flower(np.float64, range(7))
    assert wide.dtype == np.float64 and np.array_equal(wide.astype(np.float32), ours)
    narrow = flower(np.float32, range(7))
    assert narrow.dtype == np.float32
    assert (narrow != ours).sum() > 100
    np.testing.assert_allclose(narrow, ours, rtol=1e-5, atol=1e-6)  # rounding, no more
    assert not np.array_equal(flower(np.float32, range(6, -1, -1)), narrow)


def test_noniid_shards():
    _, y, _, _ = load_data(DATA)
    shards = devices.noniid_shards(y, 100, 0.3, 0)
    assert np.array_equal(np.sort(np.concatenate(shards)), np.arange(len(y)))
    sizes, distinct, top = devices.describe_shards(y, shards)
    assert set(sizes) == {14, 15}
    # IID shards of 14-15 digits hold ~7.5 distinct labels, the commonest ~22 % of them.
    iid = devices.describe_shards(y, np.array_split(np.random.default_rng(0).permutation(
        len(y)), 100))
    assert np.mean(distinct) < np.mean(iid[1]) - 2 and np.mean(top) > np.mean(iid[2]) + 0.2
    assert all(np.array_equal(a, b) for a, b in zip(shards, devices.noniid_shards(y, 100, 0.3, 0)))
    assert not np.array_equal(shards[0], devices.noniid_shards(y, 100, 0.3, 1)[0])
    with pytest.raises(devices.FederateError, match="cannot make 2000 shards"):
        devices.noniid_shards(y, 2000)
    with pytest.raises(devices.FederateError, match="concentration must be positive"):
        devices.noniid_shards(y, 10, alpha=0)


def test_federate_refuses_before_starting_flower(flwr, artifacts, tmp_path):
    proc = federate_cli(artifacts, "--data", DATA, "--clients", 200, "--rounds", 1)
    assert proc.returncode == 2
    assert "leave 7 on the smallest, fewer than one batch (8)" in proc.stderr, proc.stderr
    proc = federate_cli(tmp_path, "--data", DATA, "--clients", 4)
    assert proc.returncode == 2 and "has no model.mtb: pack the model first" in proc.stderr
