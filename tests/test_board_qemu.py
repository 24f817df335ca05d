"""Training on the emulated Cortex-M3 (MicroPython's qemu port, MPS2-AN385: single-precision
floats, 140 KiB heap) through `microtrain deploy`'s code path: the digits MLP with SGD and
AdamW against PyTorch float32 step for step, the checkpoint saved on the board read back on
the host, the fit check's prediction against the heap measured on the board, and the LeNet
reference model. Needs the firmware of scripts/build_qemu_board.sh: skipped without it,
failed when MICROTRAIN_REQUIRE_QEMU=1 (CI)."""
import re

import numpy as np
import pytest
import torch

from conftest import ROOT, emulated_board_plan, lenet_board_artifacts
from reference_models import lenet
from torch_reference import relative_error, torch_train

from microtrain import CheckpointState, Module
from microtrain_host import generate_artifacts
from microtrain_host.formats.checkpoint import read_checkpoint
from microtrain_host.tools import deploy

DIGITS = ROOT / "examples" / "digits"
STEPS = 20


def torch_model_from(module, checkpoint):
    state = CheckpointState.load_checkpoint(str(checkpoint))
    module.load_state_dict({name: torch.tensor(np.array(p.data, np.float32).reshape(p.shape))
                            for name, p in state.parameters.items()})
    return module


def train_on_board(firmware, artifacts, data, steps, lr, placement=None):
    plan = deploy.plan(artifacts, "qemu-mps2-an385", steps=steps, placement=placement)
    result = deploy.run(plan, data, lr=lr, firmware=firmware)
    return plan, result


@pytest.mark.parametrize("optimizer,lr", [("SGD", 0.1), ("AdamW", 0.01)])
def test_digits_mlp_trains_on_the_emulated_board_like_pytorch(firmware, tmp_path, optimizer, lr):
    import sys
    sys.path.insert(0, str(DIGITS))
    from make_model import build
    artifacts = tmp_path / "build"
    generate_artifacts(str(DIGITS / "mlp.onnx"), loss="CrossEntropyLoss", optimizer=optimizer,
                       artifact_directory=str(artifacts), batch_size=8,
                       optimizer_options={"learning_rate": lr})
    plan, result = train_on_board(firmware, artifacts, DIGITS / "digits.npz", STEPS, lr)

    data = np.load(DIGITS / "digits.npz")
    xs = data["x_train"][:STEPS * 8].astype(np.float32).reshape(STEPS, 8, 64)
    ys = data["y_train"][:STEPS * 8].astype(np.int64).reshape(STEPS, 8)
    model = torch_model_from(build(), artifacts / "checkpoint")
    losses, params = torch_train(model, "CrossEntropyLoss", optimizer, xs, ys, lr)

    print(f"\ndigits {optimizer}: losses {result.losses[0]:.4f} -> {result.losses[-1]:.4f}, "
          f"max relative error vs torch float32 {relative_error(result.losses, losses):.2e}; "
          f"peak heap predicted {plan.fit.train} measured {result.peak}; {result.heap}")
    assert len(result.losses) == STEPS
    assert relative_error(result.losses, losses) < 1e-3, (result.losses, losses.tolist())
    assert np.mean(result.losses[-5:]) < np.mean(result.losses[:5])
    # the board's checkpoint: read by the host reader, loaded by the device runtime
    host_view = read_checkpoint(str(result.checkpoint))
    assert sorted(host_view.trainable) == sorted(n for n, _ in model.named_parameters())
    state = CheckpointState.load_checkpoint(str(result.checkpoint))
    Module(str(artifacts / "model.mtb"), state)
    board_params = np.concatenate([np.array(host_view.trainable[n]).reshape(-1)
                                   for n, _ in model.named_parameters()])
    assert np.max(np.abs(board_params - params)) < 1e-4 * max(1.0, np.max(np.abs(params)))
    # the fit check against the heap the board measured between phases
    assert abs(plan.fit.train - result.peak) <= 0.10 * result.peak, (plan.fit.train, result.peak)


def test_lenet_trains_on_the_emulated_board_or_is_predicted_not_to(firmware, tmp_path):
    artifacts, lr = lenet_board_artifacts(tmp_path, "SGD", STEPS)
    ref = lenet()           # its weights are the checkpoint's (torch_model_from)
    data = np.load(tmp_path / "data.npz")
    x, y = data["x_train"], data["y_train"]
    plan = deploy.plan(artifacts, "qemu-mps2-an385", steps=STEPS)
    if not plan.fit.fits:
        with pytest.raises(deploy.DeployError, match="out of memory"):
            deploy.run(plan, tmp_path / "data.npz", lr=lr, firmware=firmware)
        return
    result = deploy.run(plan, tmp_path / "data.npz", lr=lr, firmware=firmware)
    model = torch_model_from(ref.module, artifacts / "checkpoint")
    losses, _ = torch_train(model, "CrossEntropyLoss", "SGD",
                            x.reshape(STEPS, ref.batch, *ref.inputs),
                            y.reshape(STEPS, ref.batch), lr)
    print(f"\nlenet SGD: losses {result.losses[0]:.4f} -> {result.losses[-1]:.4f}, max "
          f"relative error vs torch float32 {relative_error(result.losses, losses):.2e}; peak "
          f"heap predicted {plan.fit.train} measured {result.peak}; needed {plan.fit.needed}; "
          f"runtime {plan.fit.runtime_mpy} B .mpy; {result.heap}")
    assert relative_error(result.losses, losses) < 1e-3, (result.losses, losses.tolist())
    assert abs(plan.fit.train - result.peak) <= 0.10 * result.peak, (plan.fit.train, result.peak)


def test_deploy_exits_non_zero_when_the_board_runs_out_of_memory(firmware, tmp_path, capsys):
    # MLP 128-128-10 with AdamW: 285 KB of arena against the board's 140 KiB heap (and a
    # 71 KB checkpoint to copy over the emulated UART); --force runs it anyway, the board's
    # own error comes back and the command fails
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    from microtrain_host.cli import main
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal(s).astype(np.float32) * 0.05, n)
             for n, s in (("w1", (128, 128)), ("b1", (128,)), ("w2", (128, 10)), ("b2", (10,)))]
    graph = helper.make_graph(
        [helper.make_node("Gemm", ["input", "w1", "b1"], ["h"]),
         helper.make_node("Relu", ["h"], ["r"]),
         helper.make_node("Gemm", ["r", "w2", "b2"], ["output"])], "mlp",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, [2, 128])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, [2, 10])], inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]),
              tmp_path / "big.onnx")
    np.savez(tmp_path / "data.npz", x_train=rng.standard_normal((4, 128)).astype(np.float32),
             y_train=np.arange(4) % 10, x_val=np.zeros((2, 128), np.float32),
             y_val=np.zeros(2, np.int64))
    build = tmp_path / "build"
    assert main(["pack", str(build.parent / "big.onnx"), "-o", str(build)]) == 0
    capsys.readouterr()
    args = ["deploy", str(build), "--board", "qemu-mps2-an385", "--steps", "2", "--data",
            str(tmp_path / "data.npz"), "--firmware", str(firmware)]
    assert main(args) == 1
    assert "predicted not to fit" in capsys.readouterr().err
    assert main(args + ["--force"]) == 2
    err = capsys.readouterr().err
    assert "training on qemu-mps2-an385 failed" in err
    needed = re.search(r"MemoryError: out of memory before import: the arenas and the blob "
                       r"file need (\d+) bytes in one block, the heap has (\d+) free", err)
    assert needed and int(needed.group(1)) > int(needed.group(2)), err
    assert not (build / "board_checkpoint").exists()


def test_viper_int8_kernels_equal_pure_on_the_emulated_board(firmware, tmp_path):
    """tests/device_scripts/qlinear_fast.py on the emulated Cortex-M3: the viper int8 kernels
    (compiled by mpy-cross for armv7m, 32-bit machine words, ptr32 loads signed) give the
    pure-Python kernels' bytes on random Gemm, Conv, pooling, Add and lookup cases."""
    plan = emulated_board_plan(tmp_path, tmp_path, [])
    script = tmp_path / "qlinear_fast.py"
    script.write_text("CASES = 240\n" + (ROOT / "tests" / "device_scripts" /
                                         "qlinear_fast.py").read_text())
    # no file to fetch back: the command ends with the run (with one, it fetches `trained`)
    assert deploy.mpremote_command(plan, "PORT", script)[-2:] == ["run", str(script)]
    assert deploy.mpremote_command(plan, "PORT", script, tmp_path / "t")[-6:] == \
        ["run", str(script), "+", "cp", ":trained", str(tmp_path / "t")]
    # the image in the ROM partition at power-on; test_int8_on_the_emulated_board copies it
    # over the UART and installs it as a board without the ROM ioctl would
    with deploy.QemuBoard(firmware, rom=plan.romfs_image) as qemu:
        command = deploy.mpremote_command(plan, qemu.port, script, rom_loaded=True)
        proc = deploy.subprocess.run(command, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert proc.stdout.split()[-4:] == ["cases", "240", "different", "0"], proc.stdout[-2000:]


BOARD_INT8_SCRIPT = """
import gc
import io
from array import array
# the arenas' block first, low in the heap (boards/train_on_board.py's reserve)
reserve = io.BytesIO(RESERVE)
from microtrain import CheckpointState, InferenceSession, Module
from microtrain.kernels import qlinear
# the imports' garbage collected before the checkpoint's tensors are read, as the board
# runner's import probe does (boards/train_on_board.py); without it the viper kernels' native
# code (~17 KB of .mpy) leaves the 140 KiB heap without an 8 KiB block
gc.collect()
# the int8 blob of a quantization-aware training blob, computed here in float32
state = CheckpointState.load_checkpoint('checkpoint')
reserve.close()
reserve = None
gc.threshold(4096)
module = Module('model.mtb', state)
gc.threshold(-1)
module.export_model_for_inferencing('trained', ['output'])
del module, state
gc.collect()
x = array('f', open('x.f32', 'rb').read())
print('fast', qlinear.FAST)
from binascii import hexlify
print('out', hexlify(bytes(InferenceSession('int8.mtb').run(x))).decode())
# the same blob in the ROM filesystem (flash), given as a buffer: its int8 weights are
# read where they lie in flash
rom = memoryview(open('/rom/int8.mtb', 'rb'))
session = InferenceSession(rom)
print('inplace', len(session.blob.weights) == len(rom), len(session.blob.in_place))
print('flash', hexlify(bytes(session.run(x))).decode())
del session, rom
gc.collect()
qlinear.use_fast(False)   # the pure-Python kernels: 12-bit limbs on 32-bit small ints
print('pure', hexlify(bytes(InferenceSession('int8.mtb').run(x))).decode())
print('peak', gc.mem_alloc())
"""


def test_int8_on_the_emulated_board(firmware, tmp_path):
    """The digits MLP in int8 on the emulated Cortex-M3 (32-bit small ints, float32): the
    device writes the int8 blob of its QAT training blob byte for byte as the host does, and
    runs the host's int8 blob, viper and pure-Python kernels alike, bit for bit as CPython."""
    from microtrain import InferenceSession, Optimizer
    from microtrain_host.cli import main
    build = tmp_path / "build"
    generate_artifacts(str(DIGITS / "mlp.onnx"), artifact_directory=str(build), batch_size=2,
                       optimizer="SGD", quantization=True)
    data = np.load(DIGITS / "digits.npz")
    state = CheckpointState.load_checkpoint(str(build / "checkpoint"))
    module = Module(str(build / "model.mtb"), state)
    opt = Optimizer(str(build / "model.mtb"), module)
    opt.set_learning_rate(0.05)
    xs = data["x_train"][:80].astype(np.float32).reshape(40, -1)
    ys = data["y_train"][:80].reshape(40, 2)
    for x, y in zip(xs, ys):
        module(list(x), [int(v) for v in y])
        opt.step()
        module.lazy_reset_grad()
    CheckpointState.save_checkpoint(state, str(build / "trained"))
    assert main(["export", str(build), "--checkpoint", str(build / "trained"), "--qdq", "-o",
                 str(tmp_path / "qdq.onnx"), "--int8-blob", str(tmp_path / "int8.mtb")]) == 0
    x = data["x_val"][:2].astype("<f4")
    (tmp_path / "x.f32").write_bytes(x.tobytes())
    plan = emulated_board_plan(      # bytecode in flash, and the int8 blob at /rom/int8.mtb
        tmp_path, build, [(build / "model.mtb", "model.mtb"), (build / "trained", "checkpoint"),
                          (tmp_path / "int8.mtb", "int8.mtb"), (tmp_path / "x.f32", "x.f32")],
        in_rom=[(tmp_path / "int8.mtb", "int8.mtb")])
    from microtrain import parser as device_blob_parser
    b = device_blob_parser.load(str(build / "model.mtb"))
    # the arenas take the place of the file's buffer (loader.load_into_arenas)
    reserve = max(4 * (b.float_arena + b.int_arena) + b.byte_arena,
                  (build / "model.mtb").stat().st_size) + 2048
    script = tmp_path / "int8_on_board.py"
    script.write_text(f"RESERVE = {reserve}\n" + BOARD_INT8_SCRIPT)
    with deploy.QemuBoard(firmware) as qemu:
        proc = deploy.subprocess.run(deploy.mpremote_command(plan, qemu.port, script,
                                                              tmp_path / "board_int8.mtb"),
                                     capture_output=True, text=True, timeout=900)
    lines = {line.split(" ", 1)[0]: line.split(" ", 1)[1] for line in proc.stdout.splitlines()
             if " " in line}
    assert proc.returncode == 0 and "pure" in lines, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert (tmp_path / "board_int8.mtb").read_bytes() == (tmp_path / "int8.mtb").read_bytes()
    cpython = np.array(InferenceSession(str(tmp_path / "int8.mtb")).run(x.reshape(-1)),
                       np.float32)
    for kind in ("out", "flash", "pure"):
        assert bytes.fromhex(lines[kind].strip()) == cpython.tobytes(), kind
    # both Gemm weights read from the whole blob in flash (a file's get a buffer of their own)
    assert lines["inplace"].split() == ["True", "2"]
    print(f"\nint8 on the emulated board: viper {lines['fast']}, export byte-identical, "
          f"outputs bit for bit; heap in use at the end {lines['peak']} B")
