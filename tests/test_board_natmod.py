"""The native int8 Gemm (device/native: a MicroPython 1.25 dynamic native module built for
armv6m by scripts/build_natmod.sh) on the emulated Cortex-M3: the module, placed in the
runtime's ROMFS beside the kernels as microtrain/kernels/qlinear_native.mpy, gives the
pure-Python kernel's bytes over random geometries (tests/device_scripts/qlinear_native.py),
and kernels/fastpath.py puts it in place of the viper Gemm. Needs the firmware of
scripts/build_qemu_board.sh (skipped without it, failed when MICROTRAIN_REQUIRE_QEMU=1);
the module is built here (the script installs its toolchain when missing)."""
import subprocess

import pytest

from conftest import ROOT, emulated_board_plan

from microtrain_host.tools import deploy


@pytest.fixture(scope="module")
def armv6m_module():
    proc = subprocess.run(["bash", str(ROOT / "scripts" / "build_natmod.sh"), "armv6m"],
                          capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout.split()[-1]


def run_on_board(firmware, tmp_path, module, script_text):
    plan = emulated_board_plan(tmp_path, tmp_path, [],
                               in_rom=[(module, "microtrain/kernels/qlinear_native.mpy")])
    script = tmp_path / "script.py"
    script.write_text(script_text)
    with deploy.QemuBoard(firmware) as qemu:
        command = deploy.mpremote_command(plan, qemu.port, script, tmp_path / "unused")[:-4]
        proc = subprocess.run(command, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return proc.stdout


def test_native_int8_gemm_equals_pure_on_the_emulated_board(firmware, armv6m_module, tmp_path):
    out = run_on_board(firmware, tmp_path, armv6m_module,
                       "CASES = 240\n" + (ROOT / "tests" / "device_scripts" /
                                          "qlinear_native.py").read_text())
    words = out.split()
    assert words[-6:-2] == ["cases", "240", "different", "0"], out[-2000:]
    assert int(words[-1]) > 0, out[-2000:]     # the pure-Python fallback was exercised


def test_fastpath_picks_the_native_gemm_when_it_imports(firmware, armv6m_module, tmp_path):
    """native > viper > pure: the Gemm is the module's, the other int8 kernels stay viper;
    use_fast(False) puts the pure-Python kernels back."""
    out = run_on_board(firmware, tmp_path, armv6m_module, """
from microtrain.kernels import qlinear, qlinear_native, qlinear_viper
print('gemm', qlinear.qlinear_gemm is qlinear_native.qlinear_gemm)
print('conv', qlinear.qlinear_conv is qlinear_viper.qlinear_conv)
print('fallback', qlinear_native._pure is qlinear._pure)
qlinear.use_fast(False)
print('pure', qlinear.qlinear_gemm is qlinear._pure['qlinear_gemm'])
""")
    assert "gemm True" in out and "conv True" in out, out[-2000:]
    assert "fallback True" in out and "pure True" in out, out[-2000:]
