"""Learning on the device class by class (issue 25 scope 2): integer classifiers packed with
room for classes (unused slots marked by their bias, kernels/inttrain.py UNUSED_BIAS) and
microtrain.continual.Learner, which adds classes stage by stage, keeps the latent codes of
the captured samples in a sample store and replays them.

The oracle for the unused slots: a classifier with unused slots trains exactly as the same
classifier without them (same integers, same stochastic rounding draws), and that one is
checked against torch float64 in test_inttrain.py."""
import json
import shutil
import subprocess
import sys

import numpy as np
import pytest

from conftest import DEVICE, ROOT, run_micropython
from inttrain_helpers import Layer
from microtrain import CheckpointState, Module, Optimizer
from microtrain.continual import Learner
from microtrain.errors import CheckpointError, InputError
from microtrain.kernels import inttrain as K
from microtrain_host.formats.checkpoint import write_checkpoint
from microtrain_host.ops import inttrain as host_ops
from microtrain_host.quant.inttrain import int8_training_artifacts, quantize_input

DIGITS = ROOT / "examples" / "digits"
SCRIPT = ROOT / "tests" / "device_scripts" / "continual_run.py"
PLAN = "3,3,2,2"


def _layer(rng, n, k, m, unused=0):
    # a random int8 classifier layer of n classes with `unused` empty slots after them
    x = rng.integers(0, 256, (m, k))
    w = np.concatenate([rng.integers(-127, 128, (n, k)), np.zeros((unused, k), int)])
    bias = np.concatenate([rng.integers(-3000, 3000, n), [K.UNUSED_BIAS] * unused])
    sw = np.concatenate([rng.uniform(0.002, 0.02, n), [0.02] * unused])
    labels = rng.integers(0, n, m)
    return Layer(x, 128, w, bias, 0.05, sw, labels, 0.1), (x, w, bias, sw, labels)


def test_unused_slots_train_as_a_classifier_without_them():
    rng = np.random.default_rng(25)
    for trial in range(6):
        n, k, m, unused = int(rng.integers(2, 8)), int(rng.integers(1, 40)), int(
            rng.integers(1, 4)), int(rng.integers(1, 5))
        seed = int(rng.integers(1 << 30))
        plain, _ = _layer(np.random.default_rng(seed), n, k, m)
        padded, (x, w, bias, sw, labels) = _layer(np.random.default_rng(seed), n, k, m, unused)
        N = n + unused
        for step in range(3):
            for layer in (plain, padded):
                layer.forward()
            z = padded.ints("z", m * N).reshape(m, N)
            # the numpy mirrors compute the same integers, slots included
            w_now, b_now = padded.weights(), padded.ints("bias", N)
            assert np.array_equal(z, host_ops.logits(x, 128, w_now, b_now, 0.05, sw))
            loss_np, g_np = host_ops.softmax_ce(z, labels)
            g = padded.ints("g", m * N).reshape(m, N)
            assert np.array_equal(g, g_np)
            assert np.array_equal(padded.ints("loss", 2 * m).reshape(m, 2), loss_np)
            # used slots as without the unused ones; an unused one has no logit, probability 0
            assert np.array_equal(z[:, :n], plain.ints("z", m * n).reshape(m, n))
            assert (z[:, n:] == K.UNUSED_LOGIT).all() and (g[:, n:] == 0).all()
            assert np.array_equal(g[:, :n], plain.ints("g", m * n).reshape(m, n))
            assert np.array_equal(padded.ints("loss", 2 * m), plain.ints("loss", 2 * m))
            w_np, b_np = host_ops.update(w_now, b_now, x, 128, g, 0.05, sw, 0.1)
            for layer in (plain, padded):
                layer.update()
            assert np.array_equal(padded.weights(), w_np)
            assert np.array_equal(padded.ints("bias", N), b_np)
            assert np.array_equal(padded.weights()[:n], plain.weights())
            assert not padded.weights()[n:].any()
            assert (padded.ints("bias", N)[n:] == K.UNUSED_BIAS).all()
            assert np.array_equal(padded.ints("bias", N)[:n], plain.ints("bias", n))


def test_an_unused_label_keeps_the_loss_a_softmax():
    # a crafted label naming an unused slot: no division by zero, the sum stays >= 1.0 (the
    # Learner refuses such labels before a step; the kernel must not fail on them)
    z = np.array([[K.UNUSED_LOGIT, K.UNUSED_LOGIT, K.UNUSED_LOGIT],
                  [500, K.UNUSED_LOGIT, -20]])
    loss, g = host_ops.softmax_ce(z, np.array([1, 1]))
    assert (loss[:, 1] >= K.ONE).all()
    from array import array
    I = array("i", z.reshape(-1).tolist() + [0] * 6 + [0] * 4 + [1, 1]
              + host_ops.exp_table().tolist())
    K.int_softmax_ce(None, I, (0, 6, 12, 16, 18, 2, 3))
    assert np.array_equal(np.array(I[6:12]).reshape(2, 3), g)


@pytest.fixture(scope="module")
def room(digits_int8, tmp_path_factory):
    """The digits classifier as an integer training blob with room for 10 classes, none in
    use, and the digits data quantized for it."""
    tmp = tmp_path_factory.mktemp("continual")
    info = int8_training_artifacts(digits_int8 / "qdq.onnx", tmp / "blob", 0.05,
                                   max_classes=10, keep_classes=0)
    data = np.load(DIGITS / "digits.npz")
    for part, count in (("train", 400), ("val", 200)):
        quantize_input(data["x_" + part][:count], info).tofile(tmp / f"x_{part}.q8")
        data["y_" + part][:count].astype("<i4").tofile(tmp / f"y_{part}.i32")
    return tmp, info


def test_pack_with_room_for_classes(room, digits_int8, tmp_path):
    _, info = room
    assert info["classes"] == 10 and info["classes_in_use"] == 0
    state = CheckpointState.load_checkpoint(info["checkpoint"])
    assert list(state.parameters[info["bias"]].data) == [K.UNUSED_BIAS] * 10
    assert not any(state.parameters[info["weight"]].data)
    # kept classes stay, the slots after them start unused; every scale positive
    kept = int8_training_artifacts(digits_int8 / "qdq.onnx", tmp_path / "k", 0.05,
                                   max_classes=14, keep_classes=7)
    state = CheckpointState.load_checkpoint(kept["checkpoint"])
    bias = list(state.parameters[kept["bias"]].data)
    assert kept["classes_in_use"] == 7 and bias[7:] == [K.UNUSED_BIAS] * 7
    assert K.UNUSED_BIAS not in bias[:7] and min(kept["weight_scales"]) > 0
    assert len(kept["weight_scales"]) == 14
    for wrong in ({"max_classes": 5, "keep_classes": 7}, {"keep_classes": 11},
                  {"max_classes": 1, "keep_classes": 0}, {"max_classes": 2000}):
        with pytest.raises(Exception, match="classes"):
            int8_training_artifacts(digits_int8 / "qdq.onnx", tmp_path / "w", 0.05, **wrong)


def test_cli_export_with_room_for_classes(digits_int8, tmp_path):
    base = [sys.executable, "-m", "microtrain_host.cli", "export", str(digits_int8),
            "--checkpoint", str(digits_int8 / "trained"), "--qdq", "-o", str(tmp_path / "q.onnx")]
    out = subprocess.run(base + ["--int8-train", str(tmp_path / "int8"), "--int8-max-classes",
                                 "16", "--int8-keep-classes", "0"],
                         capture_output=True, text=True, check=True).stdout
    assert "[16, 32] (0 classes in use)" in out
    info = json.loads((tmp_path / "int8" / "int8_train.json").read_text())
    assert info["classes"] == 16 and info["classes_in_use"] == 0
    for extra, message in ((["--int8-max-classes", "12"], "--int8-max-classes needs --int8-train"),
                           (["--int8-train", str(tmp_path / "x"), "--int8-max-classes", "1"],
                            "give 2 to 1024")):
        refused = subprocess.run(base + extra, capture_output=True, text=True)
        assert refused.returncode == 2 and message in refused.stderr
        assert "Traceback" not in refused.stderr and len(refused.stderr.splitlines()) == 1


def _run(room, tmp_path, mode, interpreter=None, pure=False):
    tmp, info = room
    run = tmp_path / f"run_{mode}_{'cpython' if interpreter is None else 'micropython'}" \
        f"{'_pure' if pure else ''}"
    args = [info["blob"], info["checkpoint"], run, tmp, PLAN, 8, 3, 0.05, mode] + (
        ["pure"] if pure else [])
    if interpreter is None:
        out = subprocess.run([sys.executable, str(SCRIPT), *map(str, args)], capture_output=True,
                             text=True, check=True,
                             env={"PYTHONPATH": str(DEVICE), "PATH": "/usr/bin:/bin"}).stdout
    else:
        out = run_micropython(interpreter, SCRIPT, *args)
    return out, (run / "checkpoint").read_bytes()


def _accuracies(out):
    return [tuple(int(v) for v in line.split()[5].split("/")) for line in out.splitlines()
            if line.startswith("stage")]


def test_stages_with_replay_remember_and_without_forget(room, tmp_path):
    replay, _ = _run(room, tmp_path, "replay")
    alone, _ = _run(room, tmp_path, "noreplay")
    print(replay, alone)
    ours, theirs = _accuracies(replay), _accuracies(alone)
    assert [line.split()[3] for line in replay.splitlines()] == ["3", "6", "8", "10"]
    # the first stage is the same run; after it, training on the new classes alone forgets
    # the old ones, replaying the store does not
    assert ours[0] == theirs[0]
    final = ours[-1][0] / ours[-1][1]
    assert final > 0.6 and final > theirs[-1][0] / theirs[-1][1] + 0.3
    assert "store [8, 8, 8, 8, 8, 8, 8, 8, 8, 8]" in replay


def test_a_run_on_micropython_ends_as_on_cpython(micropython, room, tmp_path):
    # the viper kernels (and the pure ones on MicroPython) with unused slots: the same
    # checkpoint bytes at the end of the four stages as CPython's
    out, expected = _run(room, tmp_path, "replay")
    fast, got = _run(room, tmp_path, "replay", micropython)
    assert fast == out and got == expected
    _, pure = _run(room, tmp_path, "replay", micropython, pure=True)
    assert pure == expected


def test_the_learner_refuses_what_it_cannot_do(room, tmp_path, digits_int8):
    tmp, info = room
    learner = Learner(info["blob"], info["checkpoint"], str(tmp_path / "run"))
    with pytest.raises(InputError, match="no stage under way"):
        learner.train(1, 0.01)
    with pytest.raises(InputError, match="begin_stage first"):
        learner.capture_latent(bytes(32), 0)
    assert learner.begin_stage(4) == 0 and learner.classes == 4
    with pytest.raises(InputError, match="added 4 classes, not 2"):
        learner.begin_stage(2)
    with pytest.raises(InputError, match="not a class in use"):
        learner.capture_latent(bytes(32), 4)
    with pytest.raises(InputError, match="fewer than a batch"):
        learner.train(1, 0.01)
    learner.capture_latent(bytes(range(32)), 1)
    with pytest.raises(InputError, match="epochs must be an int >= 1"):
        learner.train(0, 0.01)
    learner.train(1, 0.01)
    assert learner.stages_done == 1
    with pytest.raises(InputError, match="exceed the classifier's room for 10"):
        learner.begin_stage(7)
    learner.close()
    # a blob without room: its classes all in use
    plain = int8_training_artifacts(digits_int8 / "qdq.onnx", tmp_path / "b", 0.05)
    assert plain["classes_in_use"] == 10
    full = Learner(plain["blob"], plain["checkpoint"], str(tmp_path / "full"))
    assert full.classes == 10
    with pytest.raises(InputError, match="room for 10 classes, all in use"):
        full.add_class()
    # a program that trains a layer before the classifier (a step after the classifier's
    # first that is none of its kernels: an integer backward into the layers before)
    steps = full.module.blob.programs["train"].steps
    with pytest.raises(InputError, match="trains layers before it too"):
        full._head(steps + [(K.int_gemm_grad_input, ())], "train")
    full.close()
    # a crafted checkpoint: a slot in use after an unused one, a progress out of range
    state = CheckpointState.load_checkpoint(info["checkpoint"])
    bias = np.array(state.parameters[info["bias"]].data, np.int32)
    bias[3] = 0
    write_checkpoint(tmp_path / "gap", {info["weight"]: np.zeros((10, 32), np.int8),
                                        info["bias"]: bias}, {}, keep_integers=True)
    with pytest.raises(CheckpointError, match="slot 3 of the classifier is in use after"):
        Learner(info["blob"], str(tmp_path / "gap"), str(tmp_path / "gap_run"))
    (tmp_path / "bad_run").mkdir()
    state = CheckpointState.load_checkpoint(str(tmp_path / "run" / "checkpoint"))
    model = Module(info["blob"], state)
    Optimizer(info["blob"], model)
    state.properties["continual.open"] = 7
    CheckpointState.save_checkpoint(state, str(tmp_path / "bad_run" / "checkpoint"))
    with pytest.raises(CheckpointError, match="continual.open = 7"):
        Learner(info["blob"], info["checkpoint"], str(tmp_path / "bad_run"))
    shutil.rmtree(tmp_path / "bad_run")


def test_a_stage_resumed_with_fewer_epochs_than_it_did_ends(room, tmp_path):
    _, info = room
    learner = Learner(info["blob"], info["checkpoint"], str(tmp_path / "run"), every=1)
    learner.begin_stage(2)
    for i in range(4):
        learner.capture_latent(bytes([i] * 32), i % 2)

    def cut(epoch, step, per_epoch, loss):
        if epoch == 1 and step == 1:
            raise KeyboardInterrupt      # stands for a power cut after the step's save

    with pytest.raises(KeyboardInterrupt):
        learner.train(3, 0.05, report=cut)
    learner.close()
    resumed = Learner(info["blob"], info["checkpoint"], str(tmp_path / "run"), every=1)
    assert resumed.stages_done == 0 and resumed.captured == 4
    assert resumed.train(1, 0.05) == 4 and resumed.stages_done == 1
    resumed.close()
    again = Learner(info["blob"], info["checkpoint"], str(tmp_path / "run"))
    assert again.stages_done == 1 and again.classes == 2 and again.captured == 0
    again.close()


def test_train_and_deploy_take_an_integer_training_blob_with_room(room, tmp_path):
    # the tools quantize the float samples for the blob's uint8 input (issue 22): train runs
    # and writes its checkpoint, deploy plans the quantized bytes, not float32 ones
    _, info = room
    (tmp_path / "art").mkdir()
    shutil.copy(info["blob"], tmp_path / "art" / "model.mtb")
    shutil.copy(info["checkpoint"], tmp_path / "art" / "checkpoint")
    data = str(DIGITS / "digits.npz")
    for command in (["train", str(tmp_path / "art"), "--data", data, "--epochs", "1"],
                    ["deploy", str(tmp_path / "art"), "--board", "rp2040-pico", "--dry-run",
                     "--data", data]):
        out = subprocess.run([sys.executable, "-m", "microtrain_host.cli", *command],
                             capture_output=True, text=True)
        assert out.returncode == 0, out.stderr
        assert "Traceback" not in out.stderr and "x_train.f32" not in out.stdout
    assert (tmp_path / "art" / "trained_checkpoint").exists()
    assert "x_train.u8" in out.stdout
