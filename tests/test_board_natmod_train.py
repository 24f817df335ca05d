"""The native module's integer training kernels of kernels/inttrain.py besides
int_gemm_update (device/native/inttrain_native.c: int_gemm_grad_input, int_conv1x1_update,
int_gemm_update_momentum) on the emulated boards, with tests/test_board_natmod.py's
method: the board runs only the native kernels on random cases
(tests/device_scripts/inttrain_native_train.py) and prints a CRC-32 per case; CPython runs
the same script with the pure-Python kernels as a 32-bit port runs them (cpython_cases),
and the two are compared case by case. Then kernels/fastpath.py's choice of them, and a
whole integer training run that uses them (the packager's SGD-momentum head over a 1x1
convolution) on the emulated Cortex-M3 with the native module, bit for bit CPython's."""
import pytest

from conftest import ROOT
from test_board_natmod import (HEAP_PROBE, RV32, build_module, check_against_cpython,
                               check_native_heap, run_on_board)

KERNELS = ("int_gemm_grad_input", "int_conv1x1_update", "int_gemm_update_momentum")
CASES = 200


def train_script(cases=CASES):
    return f"CASES = {cases}\n" + (ROOT / "tests" / "device_scripts" /
                                   "inttrain_native_train.py").read_text()


@pytest.mark.parametrize("board,arch", [("qemu-mps2-an385", "armv6m"),
                                        ("qemu-mps2-an385", "armv7m"), (RV32, "rv32imc")])
def test_native_inttrain_kernels_equal_pure_on_the_emulated_boards(firmware, rv32_firmware,
                                                                   board, arch, tmp_path):
    # 200 random cases per kernel against CPython's pure kernels (the input gradients whose
    # sums wrap the int32 arena against the board's own pure kernel); the heap the module
    # takes at import is what the fit check predicts, within 10 %
    rv32 = board == RV32
    module = build_module(arch)
    script = train_script()
    out = run_on_board(rv32_firmware if rv32 else firmware, tmp_path, module,
                       HEAP_PROBE + script, board=board)
    pure_out = check_against_cpython(out, script, CASES * len(KERNELS))
    for name in KERNELS:
        fallback = int(pure_out.split(name + " cases %d fallback" % CASES)[1].split()[0])
        assert f"{name} cases {CASES} fallback {fallback} different 0" in out, out[-3000:]
        assert fallback > 0, out[-3000:]     # the pure kernels' fallback exercised
    print(f"{arch}: {check_native_heap(out, module):,d} B of heap at import")


def test_fastpath_picks_the_native_training_kernels(firmware, tmp_path):
    """native > viper > pure: inttrain's update kernels are the module's (the logits stay
    viper), the module's _pure holds the family's pure kernels, use_fast(False) puts them
    back."""
    out = run_on_board(firmware, tmp_path, build_module("armv6m"), """
from microtrain.kernels import inttrain, inttrain_viper, qlinear_native
for name in %r:
    print(name, getattr(inttrain, name) is getattr(qlinear_native, name),
          qlinear_native._pure[name] is inttrain._pure[name])
print('logits', inttrain.int_gemm_logits is inttrain_viper.int_gemm_logits)
inttrain.use_fast(False)
print('pure', all(getattr(inttrain, n) is inttrain._pure[n] for n in %r))
""" % (KERNELS, KERNELS))
    for line in [f"{name} True True" for name in KERNELS] + ["logits True", "pure True"]:
        assert line in out, out[-2000:]
