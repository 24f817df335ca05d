"""Integer training resumed from a checkpoint (device checkpoint.py, module.py): the momentum
velocities are saved as the parameters' optimizer state (momentum0, ONNX INT16 / INT32) and
the stochastic-rounding generators as microtrain.rng.<w>.dither properties, so N steps, a
save, a fresh load and M more steps equal N + M uninterrupted steps bit for bit (CPython,
and MicroPython with the viper and the pure-Python kernels); older checkpoints load with
zero velocities; crafted ones are refused; the host reader reads them."""
import struct
import subprocess
import sys
import zlib

import numpy as np
import pytest

from conftest import DEVICE, ROOT, run_micropython
from microtrain import CheckpointState, Module
from microtrain import checkpoint as device_checkpoint
from microtrain import checkpoint_writer as device_checkpoint_writer
from microtrain.errors import CheckpointError
from microtrain.flatbuf import Reader
from microtrain_host.formats.checkpoint import read_checkpoint
from microtrain_host.quant.inttrain import int8_training_artifacts, quantize_input
from microtrain_host.tools.inspect import describe
from test_inttrain import DIGITS

SCRIPT = ROOT / "tests" / "device_scripts" / "inttrain_resume.py"


@pytest.fixture(scope="module")
def momentum_run(digits_int8, tmp_path_factory):      # noqa: F811
    tmp = tmp_path_factory.mktemp("inttrain_resume")
    info = int8_training_artifacts(digits_int8 / "qdq.onnx", tmp / "int", 0.01, momentum=0.9)
    data = np.load(DIGITS / "digits.npz")
    (tmp / "data.bin").write_bytes(b"".join(
        quantize_input(x, info).tobytes() + np.int32(y).tobytes()
        for x, y in zip(data["x_train"][:30], data["y_train"][:30])))
    return info, tmp


def _halves(out):
    straight, resumed = out.split("straight\n", 1)[1].split("resumed\n")
    return straight, resumed


def test_resumed_run_equals_the_uninterrupted_one(momentum_run, micropython):
    info, tmp = momentum_run
    args = [info["blob"], info["checkpoint"], tmp / "data.bin", 12, 9]
    cpython = subprocess.run([sys.executable, str(SCRIPT), *map(str, args), "pure",
                              str(tmp / "c.ckpt")], capture_output=True, text=True,
                             env={"PYTHONPATH": str(DEVICE)}, check=True).stdout
    fast = run_micropython(micropython, SCRIPT, *args, "fast", tmp / "f.ckpt")
    pure = run_micropython(micropython, SCRIPT, *args, "pure", tmp / "p.ckpt")
    straight, resumed = _halves(cpython)
    assert straight == resumed
    assert _halves(fast) == _halves(pure) == (straight, straight)
    # the saved state is not trivially zero: velocities and generators moved
    w = info["weight"]
    lines = dict(line.rsplit(" ", 1) for line in straight.splitlines()
                 if line.startswith("microtrain.rng."))
    assert int(lines["microtrain.rng.%s.dither" % w]) != 0
    velocity = [line for line in straight.splitlines() if line.startswith("velocity " + w)]
    assert velocity[0].startswith("velocity %s 5 " % w)
    assert set(velocity[0].split()[3:]) != {"0"}
    # the host reads the checkpoint the device saved: integer parameters and velocities
    ckpt = read_checkpoint(tmp / "c.ckpt")
    n, k = info["classes"], info["features"]
    assert ckpt.trainable[w].dtype == np.int8 and ckpt.optimizer_step == 0
    assert ckpt.momentums[w][0].dtype == np.int16 and ckpt.momentums[w][0].shape == (n, k)
    assert ckpt.momentums[info["bias"]][0].dtype == np.int32
    assert np.abs(ckpt.momentums[w][0]).max() > 0
    assert "microtrain.rng.%s.dither" % w in ckpt.properties
    assert (tmp / "c.ckpt").read_bytes() == (tmp / "f.ckpt").read_bytes()
    text = describe(info["blob"], checkpoint=tmp / "c.ckpt")      # microtrain inspect
    assert w in text


def _train(model, info, steps):
    data = np.load(DIGITS / "digits.npz")
    for x, y in zip(data["x_train"][:steps], data["y_train"][:steps]):
        model(quantize_input(x, info).reshape(-1).tolist(), [int(y)])


def _velocity_bytes(state):
    return {name: bytes(view) for name, (_, view) in state.int_velocities.items()}


def test_checkpoint_without_velocities_loads_them_as_zero(momentum_run, digits_int8,  # noqa: F811
                                                          tmp_path):
    info, _ = momentum_run
    state = CheckpointState.load_checkpoint(info["checkpoint"])   # the host's: no optimizer group
    assert state.int_velocities == {}
    model = Module(info["blob"], state)
    assert sorted(state.int_velocities) == sorted([info["weight"], info["bias"]])
    assert all(not any(v) for v in _velocity_bytes(state).values())
    _train(model, info, 3)
    assert any(any(v) for v in _velocity_bytes(state).values())
    # saved without optimizer state (as ORT's default): the velocities restart at zero
    path = str(tmp_path / "plain.ckpt")
    CheckpointState.save_checkpoint(state, path)
    again = CheckpointState.load_checkpoint(path)
    assert again.int_velocities == {} and not again.random_states
    Module(info["blob"], again)
    assert all(not any(v) for v in _velocity_bytes(again).values())
    # a model trained without momentum does not carry a saved velocity on
    CheckpointState.save_checkpoint(state, path, include_optimizer_state=True)
    plain = int8_training_artifacts(digits_int8 / "qdq.onnx", tmp_path / "plain", 0.01)
    state = CheckpointState.load_checkpoint(path)
    assert sorted(state.int_velocities) == sorted([info["weight"], info["bias"]])
    Module(plain["blob"], state)
    assert state.int_velocities == {}


def _momentum0(data, param):
    # (tensor table position) of param's momentum0 in the checkpoint bytes (no trailer)
    r = Reader(memoryview(data), CheckpointError)
    group = r.tables(r.root(), 2, "groups")[0]
    for ps in r.tables(group, 3, "states"):
        if r.string(ps, 0, "name") == param:
            return r, r.tables(ps, 1, "momentums")[0]
    raise AssertionError(param)


def _with_crc(body):
    return bytes(body) + struct.pack("<I", zlib.crc32(bytes(body)) & 0xFFFFFFFF) + b"MTCK"


def test_crafted_velocities_are_refused(momentum_run, tmp_path):
    info, _ = momentum_run
    state = CheckpointState.load_checkpoint(info["checkpoint"])
    model = Module(info["blob"], state)
    _train(model, info, 2)
    good = tmp_path / "good.ckpt"
    CheckpointState.save_checkpoint(state, str(good), include_optimizer_state=True)
    body = bytearray(good.read_bytes()[:-8])
    n, k = info["classes"], info["features"]
    w = info["weight"]
    # wrong size: dims [n, k - 1] and as many int16s (a well-formed tensor, too small)
    r, t = _momentum0(body, w)
    dims, count = r.vector(t, 2, 8, "dims")
    raw, nbytes = r.vector(t, 4, 1, "raw")
    assert count == 2 and nbytes == 2 * n * k
    small = bytearray(body)
    struct.pack_into("<q", small, dims + 8, k - 1)
    struct.pack_into("<I", small, raw - 4, 2 * n * (k - 1))
    path = tmp_path / "small.ckpt"
    path.write_bytes(_with_crc(small))
    with pytest.raises(CheckpointError, match=r"integer momentum velocity \(momentum0\) of '%s' "
                       r"has %d values; the parameter has %d" % (w, n * (k - 1), n * k)):
        CheckpointState.load_checkpoint(str(path))
    # wrong type: the bias' velocity as n int16s (the model keeps int32s)
    r, t = _momentum0(body, info["bias"])
    raw, nbytes = r.vector(t, 4, 1, "raw")
    assert nbytes == 4 * n
    narrow = bytearray(body)
    struct.pack_into("<i", narrow, r.field(t, 3), 5)
    struct.pack_into("<I", narrow, raw - 4, 2 * n)
    path.write_bytes(_with_crc(narrow))
    state = CheckpointState.load_checkpoint(str(path))
    with pytest.raises(CheckpointError, match=r"integer momentum velocity \(momentum0\) of '%s' "
                       r"has %d values of ONNX type 5; the model needs %d of type 6"
                       % (info["bias"], n, n)):
        Module(info["blob"], state)


def test_failed_save_keeps_the_previous_checkpoint(momentum_run, tmp_path, monkeypatch):
    info, _ = momentum_run
    state = CheckpointState.load_checkpoint(info["checkpoint"])
    model = Module(info["blob"], state)
    _train(model, info, 2)
    path = str(tmp_path / "keep.ckpt")
    CheckpointState.save_checkpoint(state, path, include_optimizer_state=True)
    before = open(path, "rb").read()
    _train(model, info, 2)

    def broken(stream, root, identifier):
        stream.write(b"half a checkpoint")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(device_checkpoint_writer.fbwriter, "write", broken)
    with pytest.raises(CheckpointError, match="No space left"):
        CheckpointState.save_checkpoint(state, path, include_optimizer_state=True)
    assert open(path, "rb").read() == before
    loaded = CheckpointState.load_checkpoint(path)
    assert loaded.int_velocities[info["weight"]][0] == 5
