"""Resume: train, save with optimizer state, load in a new process, continue.

The trajectory (every loss, the final parameters and the final checkpoint file, byte for
byte) equals an uninterrupted run, on CPython and on MicroPython, for AdamW, SGD and SGD
with momentum, and for a model with BatchNorm and Dropout (the generators' states are saved
with the optimizer state). Properties written on one side are read on the other. MicroPython
agrees with CPython within 1e-5 relative.
"""
import struct
import subprocess
import sys

import numpy as np
import pytest

import microtrain_host as mh
from conftest import DEVICE, ROOT, run_micropython
from microtrain import CheckpointState, Module, Optimizer
from microtrain.errors import CheckpointError
from microtrain_host.formats.checkpoint import read_checkpoint

SCRIPT = ROOT / "tests" / "device_scripts" / "resume_steps.py"
MODEL = ROOT / "examples" / "digits" / "mlp.onnx"
STEPS = 4  # before and after the save
OPTIMIZERS = {"AdamW": ({}, 0.01), "SGD": ({}, 0.1), "SGD-momentum": ({"momentum": 0.9}, 0.05)}


def lr_bits(lr):
    return "%08x" % struct.unpack("<I", struct.pack("<f", lr))[0]


def write_batches(directory, count, batch=8, offset=0):
    data = np.load(ROOT / "examples" / "digits" / "digits.npz")
    rows = slice(offset * batch, (offset + count) * batch)
    directory.mkdir(parents=True, exist_ok=True)
    data["x_train"][rows].astype("<f4").tofile(directory / "x.f32")
    data["y_train"][rows].astype("<i4").tofile(directory / "y.i32")
    return directory


def run_device(interpreter, *args):
    """Run resume_steps.py in a new process; returns its output lines."""
    args = [str(a) for a in args]
    if interpreter == "cpython":
        proc = subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True,
                              text=True, env={"PYTHONPATH": str(DEVICE), "PATH": "/usr/bin:/bin"})
        assert proc.returncode == 0, proc.stdout + proc.stderr
        return proc.stdout.splitlines()
    return run_micropython(interpreter, SCRIPT, *args, heap="4M").splitlines()


def losses(lines):
    return [line.split()[1] for line in lines if line.startswith("loss ")]


def as_floats(hex_bits):
    return np.array([struct.unpack("<f", struct.pack("<I", int(h, 16)))[0] for h in hex_bits])


def params(lines):
    return [line for line in lines if line.startswith("params ")]


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory):
    """The packed digits MLP per optimizer."""
    tmp = tmp_path_factory.mktemp("resume")
    out = {}
    for name, (options, lr) in OPTIMIZERS.items():
        art = mh.generate_artifacts(str(MODEL), loss="CrossEntropyLoss",
                                    optimizer=name.split("-")[0], batch_size=8,
                                    artifact_directory=tmp / name,
                                    optimizer_options=options or None)
        out[name] = (art, lr)
    out["data"] = write_batches(tmp / "data", 2 * STEPS)
    return out


def resume_run(interpreter, art, lr, data, tmp_path):
    """Output lines of the uninterrupted run and of the two halves of the interrupted one
    (each a new process), and the checkpoints they saved."""
    full_end = tmp_path / "uninterrupted"
    mid, resumed_end = tmp_path / "mid", tmp_path / "resumed"
    whole = run_device(interpreter, art.blob, art.checkpoint, data, 0, 2 * STEPS, lr_bits(lr),
                       full_end, 1)
    first = run_device(interpreter, art.blob, art.checkpoint, data, 0, STEPS, lr_bits(lr),
                       mid, 1)
    second = run_device(interpreter, art.blob, mid, data, STEPS, STEPS, lr_bits(lr),
                        resumed_end, 1)
    return whole, first, second, full_end, mid, resumed_end


@pytest.mark.parametrize("optimizer", list(OPTIMIZERS))
@pytest.mark.parametrize("runtime", ["cpython", "micropython"])
def test_resume_in_a_new_process_is_bit_identical(artifacts, optimizer, runtime, tmp_path,
                                                  request):
    interpreter = request.getfixturevalue("micropython") if runtime == "micropython" \
        else "cpython"
    art, lr = artifacts[optimizer]
    whole, first, second, full_end, mid, resumed_end = resume_run(
        interpreter, art, lr, artifacts["data"], tmp_path)

    assert losses(whole) == losses(first) + losses(second)
    assert params(whole) == params(second)
    # The whole state - parameters, moments, step, properties - byte for byte.
    assert full_end.read_bytes() == resumed_end.read_bytes()
    ckpt = read_checkpoint(mid)
    assert ckpt.optimizer_step == STEPS
    expected_moments = 2 if optimizer == "AdamW" else 1 if optimizer == "SGD-momentum" else 0
    assert all(len(m) == expected_moments for m in ckpt.momentums.values())
    assert len(ckpt.momentums) == (len(ckpt.trainable) if expected_moments else 0)
    # Properties written by the first process, read by the second.
    assert second[0] == "props epoch=%d lr=%s note=trained to step %d" % (STEPS, lr_bits(lr),
                                                                        STEPS)
    assert ckpt.properties == {"epoch": STEPS, "lr": float(np.float32(lr)),
                               "note": f"trained to step {STEPS}"}
    # Training does move: the losses are not all equal.
    assert len(set(losses(whole))) > 1


@pytest.mark.parametrize("optimizer", ["AdamW", "SGD-momentum"])
@pytest.mark.parametrize("runtime", ["cpython", "micropython"])
def test_resume_from_a_checkpoint_buffer_equals_its_file(artifacts, optimizer, runtime,
                                                         tmp_path, request):
    # a checkpoint with optimizer state handed over as a buffer (frozen bytes, a file in
    # ROMFS) resumes exactly as from its file: parameters and moments streamed out of the
    # buffer into the arenas
    interpreter = request.getfixturevalue("micropython") if runtime == "micropython" \
        else "cpython"
    art, lr = artifacts[optimizer]
    data = artifacts["data"]
    mid = tmp_path / "mid"
    run_device(interpreter, art.blob, art.checkpoint, data, 0, STEPS, lr_bits(lr), mid, 1)
    from_file = run_device(interpreter, art.blob, mid, data, STEPS, STEPS, lr_bits(lr),
                           tmp_path / "from_file", 1)
    from_buffer = run_device(interpreter, art.blob, "buffer:%s" % mid, data, STEPS, STEPS,
                             lr_bits(lr), tmp_path / "from_buffer", 1)
    assert len(losses(from_file)) == STEPS
    assert from_buffer == from_file
    assert (tmp_path / "from_buffer").read_bytes() == (tmp_path / "from_file").read_bytes()


def test_resume_needs_the_optimizer_state(artifacts, tmp_path):
    """Resuming AdamW without its moments and step gives a different trajectory (so the
    bit-identical comparison above can fail)."""
    art, lr = artifacts["AdamW"]
    data = artifacts["data"]
    whole = run_device("cpython", art.blob, art.checkpoint, data, 0, 2 * STEPS, lr_bits(lr),
                       "-", 1)
    run_device("cpython", art.blob, art.checkpoint, data, 0, STEPS, lr_bits(lr),
               tmp_path / "params_only", 0)
    assert read_checkpoint(tmp_path / "params_only").momentums == {}
    second = run_device("cpython", art.blob, tmp_path / "params_only", data, STEPS, STEPS,
                        lr_bits(lr), "-", 1)
    assert losses(whole)[STEPS] == losses(second)[0]  # same parameters after the save
    assert losses(whole)[STEPS + 1:] != losses(second)[1:]


@pytest.mark.parametrize("optimizer", ["AdamW", "SGD"])
def test_micropython_agrees_with_cpython(artifacts, micropython, optimizer, tmp_path):
    """Within 1e-5 relative, and each interpreter resumes the other's checkpoint."""
    art, lr = artifacts[optimizer]
    data = artifacts["data"]
    runs = {}
    for name, interpreter in (("cpython", "cpython"), ("micropython", micropython)):
        mid = tmp_path / f"mid_{name}"
        first = run_device(interpreter, art.blob, art.checkpoint, data, 0, STEPS,
                           lr_bits(lr), mid, 1)
        runs[name] = (first, mid)
    cp_first, cp_mid = runs["cpython"]
    mp_first, mp_mid = runs["micropython"]
    a, b = as_floats(losses(mp_first)), as_floats(losses(cp_first))
    assert np.all(np.abs(a - b) <= 1e-5 * np.maximum(np.abs(b), 1e-3))
    mp_ckpt, cp_ckpt = read_checkpoint(mp_mid), read_checkpoint(cp_mid)
    for name, value in cp_ckpt.trainable.items():
        np.testing.assert_allclose(mp_ckpt.trainable[name], value, rtol=1e-5, atol=1e-8)
    # Cross-resume: CPython continues from MicroPython's file and the other way round.
    cp_then = run_device("cpython", art.blob, mp_mid, data, STEPS, STEPS, lr_bits(lr), "-", 1)
    mp_then = run_device(micropython, art.blob, cp_mid, data, STEPS, STEPS, lr_bits(lr), "-", 1)
    a, b = as_floats(losses(mp_then)), as_floats(losses(cp_then))
    assert np.all(np.abs(a - b) <= 1e-5 * np.maximum(np.abs(b), 1e-3))


def test_switching_optimizers_needs_a_checkpoint_without_optimizer_state(artifacts, tmp_path):
    """SGD-with-momentum state (one moment per parameter) cannot silently seed AdamW (two)."""
    sgd, lr = artifacts["SGD-momentum"]
    run_device("cpython", sgd.blob, sgd.checkpoint, artifacts["data"], 0, 2, lr_bits(lr),
               tmp_path / "sgd_state", 1)
    adamw = artifacts["AdamW"][0]
    model = Module(adamw.blob, CheckpointState.load_checkpoint(str(tmp_path / "sgd_state")))
    with pytest.raises(CheckpointError, match=r"1 optimizer moment\(s\) for '1.weight'; this "
                                              r"optimizer \(AdamW\) keeps 2"):
        Optimizer(adamw.blob, model)


# -- Dropout: the generators' states travel with the optimizer state --------------------------

DROPOUT_OPTIMIZERS = {"AdamW": 0.01, "SGD": 0.1}


@pytest.fixture(scope="module")
def dropout_artifacts(tmp_path_factory):
    """Linear -> BatchNorm1d -> ReLU -> Dropout(0.3) -> Linear on the digits, per optimizer."""
    import torch
    from torch_reference import export

    torch.manual_seed(3)
    net = torch.nn.Sequential(torch.nn.Linear(64, 16), torch.nn.BatchNorm1d(16),
                              torch.nn.ReLU(), torch.nn.Dropout(0.3), torch.nn.Linear(16, 10))
    onnx_model = export(net, torch.zeros(8, 64))
    assert [n.op_type for n in onnx_model.graph.node].count("Dropout") == 1
    tmp = tmp_path_factory.mktemp("resume_dropout")
    out = {name: (mh.generate_artifacts(onnx_model, loss="CrossEntropyLoss", optimizer=name,
                                        batch_size=8, artifact_directory=tmp / name), lr)
           for name, lr in DROPOUT_OPTIMIZERS.items()}
    out["data"] = write_batches(tmp / "data", 2 * STEPS)
    return out


@pytest.mark.parametrize("optimizer", list(DROPOUT_OPTIMIZERS))
@pytest.mark.parametrize("runtime", ["cpython", "micropython"])
def test_resume_with_dropout_and_batch_norm_is_bit_identical(dropout_artifacts, optimizer,
                                                             runtime, tmp_path, request):
    """The checkpoint saved with optimizer state holds the Dropout generator's state
    (property microtrain.rng.0), so the resumed run draws the masks the uninterrupted run
    draws: the same losses, parameters (running statistics included) and final file."""
    interpreter = request.getfixturevalue("micropython") if runtime == "micropython" \
        else "cpython"
    art, lr = dropout_artifacts[optimizer]
    whole, first, second, full_end, mid, resumed_end = resume_run(
        interpreter, art, lr, dropout_artifacts["data"], tmp_path)

    assert losses(whole) == losses(first) + losses(second)
    assert params(whole) == params(second)
    assert full_end.read_bytes() == resumed_end.read_bytes()
    # The reserved property is in the file (an int64 for ORT) but not among the user's.
    rng = read_checkpoint(mid).properties["microtrain.rng.0"]
    assert 0 < rng < 2**60
    assert read_checkpoint(resumed_end).properties["microtrain.rng.0"] != rng
    assert second[0] == "props epoch=%d lr=%s note=trained to step %d" % (STEPS, lr_bits(lr),
                                                                        STEPS)
    state = CheckpointState.load_checkpoint(str(mid))
    assert state.random_states == {"microtrain.rng.0": rng}
    assert "microtrain.rng.0" not in state.properties
    assert len(set(losses(whole))) > 1


def test_resume_with_dropout_needs_the_generator_state(dropout_artifacts, tmp_path):
    """Saved without optimizer state, the checkpoint has no generator state; with plain SGD
    (no moments) that is the only difference, and the resumed run draws other masks: the
    first resumed loss already differs, so the comparison above can fail."""
    art, lr = dropout_artifacts["SGD"]
    data = dropout_artifacts["data"]
    whole = run_device("cpython", art.blob, art.checkpoint, data, 0, 2 * STEPS, lr_bits(lr),
                       "-", 1)
    run_device("cpython", art.blob, art.checkpoint, data, 0, STEPS, lr_bits(lr),
               tmp_path / "params_only", 0)
    saved = read_checkpoint(tmp_path / "params_only")
    assert not any(name.startswith("microtrain.rng.") for name in saved.properties)
    second = run_device("cpython", art.blob, tmp_path / "params_only", data, STEPS, STEPS,
                        lr_bits(lr), "-", 1)
    assert losses(whole)[STEPS] != losses(second)[0]
    assert params(whole) != params(second)


def test_set_seed_overrides_a_restored_generator_state(dropout_artifacts, tmp_path):
    art, lr = dropout_artifacts["SGD"]
    run_device("cpython", art.blob, art.checkpoint, dropout_artifacts["data"], 0, STEPS,
               lr_bits(lr), tmp_path / "mid", 1)
    x = np.fromfile(dropout_artifacts["data"] / "x.f32", "<f4")[:8 * 64].tolist()
    y = np.fromfile(dropout_artifacts["data"] / "y.i32", "<i4")[:8].tolist()

    def first_loss(forget, seed):
        state = CheckpointState.load_checkpoint(str(tmp_path / "mid"))
        if forget:
            state.random_states = {}
        model = Module(str(art.blob), state)
        if seed is not None:
            model.set_seed(seed)
        return model(x, y)

    assert first_loss(False, 7) == first_loss(True, 7)         # set_seed wins over the file
    assert first_loss(False, None) != first_loss(True, None)   # the file's state was restored


def test_generator_state_properties_are_reserved_and_checked(dropout_artifacts, tmp_path):
    art, _ = dropout_artifacts["SGD"]
    state = CheckpointState.load_checkpoint(str(art.checkpoint))
    state.properties["microtrain.rng.0"] = 5
    with pytest.raises(CheckpointError, match="'microtrain.rng.0': names starting with "
                                              "'microtrain.rng.' are reserved"):
        CheckpointState.save_checkpoint(state, str(tmp_path / "ckpt"), True)
    del state.properties["microtrain.rng.0"]
    state.random_states = {"microtrain.rng.0": 2**30}   # a = 1, b = 0: no generator state
    with pytest.raises(CheckpointError, match="'microtrain.rng.0' = 1073741824 is not a "
                                              "Dropout generator state"):
        Module(str(art.blob), state)
