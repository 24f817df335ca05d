import os
import pathlib
import shutil
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
DEVICE = ROOT / "device"
if str(DEVICE) not in sys.path:
    sys.path.insert(0, str(DEVICE))
if str(ROOT / "host") not in sys.path:
    sys.path.insert(0, str(ROOT / "host"))


def micropython_binary():
    """Path of the MicroPython Unix port: $MICROTRAIN_MICROPYTHON, the cached build, or PATH."""
    for candidate in (os.environ.get("MICROTRAIN_MICROPYTHON"),
                      str(ROOT / ".cache" / "micropython" / "micropython"),
                      shutil.which("micropython")):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    return None


@pytest.fixture(scope="session")
def micropython():
    """The MicroPython binary. Missing: skip locally, fail when MICROTRAIN_REQUIRE_MICROPYTHON=1
    (CI sets it: a skipped MicroPython suite in CI is a failure)."""
    binary = micropython_binary()
    if binary is None:
        message = "MicroPython Unix port not found: run scripts/build_micropython.sh"
        if os.environ.get("MICROTRAIN_REQUIRE_MICROPYTHON") == "1":
            pytest.fail(message)
        pytest.skip(message)
    return binary


def run_micropython(binary, script, *args, heap="16M", timeout=600):
    """Run a script under MicroPython with the device package on its path; returns stdout."""
    env = dict(os.environ, MICROPYPATH=f"{DEVICE}:{ROOT / 'tests' / 'device_scripts'}")
    proc = subprocess.run([binary, "-X", f"heapsize={heap}", str(script), *map(str, args)],
                          capture_output=True, text=True, env=env, timeout=timeout)
    if proc.returncode != 0:
        raise AssertionError(f"MicroPython failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return proc.stdout


def emulated_board_plan(tmp_path, artifacts, files, in_rom=(), board="qemu-mps2-an385"):
    """A deploy plan for an emulated board (the Cortex-M3 qemu-mps2-an385 unless `board`
    names another): the whole device package, compiled by mpy-cross for its architecture, in
    a ROMFS image (its bytecode runs from flash), plus the files in_rom ([(local path, name
    in /rom)]); files ([(local path, name)]) copied to its filesystem."""
    from microtrain_host.tools import boards, deploy, runtime
    rt = tmp_path / "runtime"
    package = runtime.device_package_dir()
    sources = runtime.package_sources(sorted(str(p.relative_to(package))
                                             for p in (package / "microtrain").rglob("*.py")))
    board = boards.load_board(board)
    runtime.compile_runtime(sources, board["mpy_arch"], board["mpy_version"], rt)
    for local, name in in_rom:
        (rt / name).write_bytes(pathlib.Path(local).read_bytes())
    plan = deploy.Plan(board, "romfs", artifacts, {}, None, None, None, None)
    plan.romfs_image = tmp_path / "microtrain.romfs"
    plan.romfs_image.write_bytes(runtime.romfs_image(rt))
    plan.files = list(files)
    return plan


def run_on_emulated_board(firmware, tmp_path, script_text, in_rom=(), board="qemu-mps2-an385",
                          timeout=1800):
    """Run script_text on the emulated board `board` with the whole device package and
    in_rom ([(local path, name in /rom)]) in its ROMFS (emulated_board_plan), the image put
    in the ROM partition at power-on: copying it over the emulated UART takes ~18 s a run
    (test_board_qemu's int8 test keeps that path). Returns its stdout; a failed run fails."""
    from microtrain_host.tools import deploy
    plan = emulated_board_plan(tmp_path, tmp_path, [], in_rom=in_rom, board=board)
    script = tmp_path / "script.py"
    script.write_text(script_text)
    with deploy.QemuBoard(firmware, board=board, rom=plan.romfs_image) as qemu:
        command = deploy.mpremote_command(plan, qemu.port, script, rom_loaded=True)
        proc = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return proc.stdout


def lenet_board_artifacts(tmp_path, optimizer, steps):
    """(artifact directory, learning rate): the LeNet reference CNN exported by torch and
    packed with `optimizer` (its reference learning rate), and data.npz of `steps` batches of
    seeded inputs labelled by the argmax of their first ten values, for the emulated board."""
    import numpy as np
    import torch
    from microtrain_host import generate_artifacts
    from reference_models import lenet
    ref = lenet()
    onnx_path = tmp_path / "lenet.onnx"
    torch.onnx.export(ref.module, torch.randn(ref.batch, *ref.inputs), str(onnx_path),
                      input_names=["input"], output_names=["output"], dynamo=False,
                      opset_version=17, training=torch.onnx.TrainingMode.TRAINING,
                      do_constant_folding=False)
    artifacts = tmp_path / "build"
    lr = ref.lr[optimizer]
    generate_artifacts(str(onnx_path), loss="CrossEntropyLoss", optimizer=optimizer,
                       artifact_directory=str(artifacts), optimizer_options={"learning_rate": lr})
    rng = np.random.default_rng(3)
    x = rng.standard_normal((steps * ref.batch, *ref.inputs)).astype(np.float32)
    y = (x.reshape(len(x), -1)[:, :10].argmax(1)).astype(np.int64)
    np.savez(tmp_path / "data.npz", x_train=x, y_train=y, x_val=x[:ref.batch],
             y_val=y[:ref.batch])
    return artifacts, lr


def emulated_firmware(board, require):
    """The firmware of emulated board `board` (its profile's qemu section: the environment
    variable naming it, else the cached build). Missing (or no qemu binary for it): skip
    locally, fail when the environment variable `require` is 1 (CI sets it)."""
    from microtrain_host.tools import boards
    qemu = boards.load_board(board)["qemu"]
    path = pathlib.Path(os.environ.get(qemu["firmware_env"]) or ROOT / qemu["firmware"])
    if not path.exists() or shutil.which(qemu["system"]) is None:
        message = (f"emulated board {board} not built ({path}, {qemu['system']}): run "
                   f"{qemu['build']}")
        if os.environ.get(require) == "1":
            pytest.fail(message)
        pytest.skip(message)
    return path


@pytest.fixture(scope="session")
def firmware():
    """The emulated Cortex-M3's firmware ($MICROTRAIN_QEMU_FIRMWARE or the cached build).
    Missing (or no qemu-system-arm): skip locally, fail when MICROTRAIN_REQUIRE_QEMU=1."""
    return emulated_firmware("qemu-mps2-an385", "MICROTRAIN_REQUIRE_QEMU")


@pytest.fixture(scope="session")
def rv32_firmware():
    """The emulated RISC-V board's firmware (qemu-virt-rv32: $MICROTRAIN_QEMU_RV32_FIRMWARE
    or the cached build of scripts/build_qemu_rv32.sh). Missing (or no qemu-system-riscv32):
    skip locally, fail when MICROTRAIN_REQUIRE_QEMU_RV32=1."""
    return emulated_firmware("qemu-virt-rv32", "MICROTRAIN_REQUIRE_QEMU_RV32")


@pytest.fixture(scope="session")
def m4_firmware():
    """The emulated Cortex-M4F's firmware (qemu-mps2-an386: $MICROTRAIN_QEMU_M4_FIRMWARE or
    the cached build of scripts/build_qemu_board.sh MPS2_AN386). Missing (or no
    qemu-system-arm): skip locally, fail when MICROTRAIN_REQUIRE_QEMU_M4=1."""
    return emulated_firmware("qemu-mps2-an386", "MICROTRAIN_REQUIRE_QEMU_M4")


@pytest.fixture(scope="session")
def digits_int8(tmp_path_factory):
    """The digits MLP packed for QAT at batch 1, trained 2 epochs, exported as a QDQ model
    (qdq.onnx): what the integer training blobs are made from."""
    import microtrain_host as mh
    from microtrain_host.tools.train import train
    tmp = tmp_path_factory.mktemp("digits_inttrain")
    digits = ROOT / "examples" / "digits"
    mh.generate_artifacts(str(digits / "mlp.onnx"), artifact_directory=tmp, batch_size=1,
                          quantization=True)
    train(tmp, digits / "digits.npz", 2, 0.01, tmp / "trained")
    mh.export_inference_model(tmp, tmp / "trained", tmp / "qdq.onnx", qdq=True)
    return tmp
