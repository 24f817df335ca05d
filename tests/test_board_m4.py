"""The emulated Cortex-M4F (MicroPython's qemu port on qemu's mps2-an386 machine, built by
scripts/build_qemu_board.sh MPS2_AN386: the single-precision FPU switched on, floats in
hardware, .mpy native code for armv7emsp), the architecture of the boards with an FPU
(stm32f746-disco, the Pyboard, nRF52840). Floats computed by the FPU must be the Cortex-M3's
software floats bit for bit (both are IEEE single precision, rounded to nearest even):
the digits MLP trained with AdamW through `microtrain deploy` leaves the same checkpoint
bytes on both boards, and with the float module deploy ships there (its armv7emsp build)
the same as without. The native int8 module deploy ships for armv7emsp (the armv7m build)
gives the pure-Python kernels' bytes there. Needs both ARM firmwares: skipped without them,
failed when MICROTRAIN_REQUIRE_QEMU / MICROTRAIN_REQUIRE_QEMU_M4=1 (scripts/test.sh)."""
from conftest import ROOT
from test_board_natmod import (HEAP_PROBE, build_module, check_native_heap, check_qlinear,
                               qlinear_script, run_on_board)

from microtrain_host import generate_artifacts
from microtrain_host.tools import boards, deploy, runtime

DIGITS = ROOT / "examples" / "digits"
M4 = "qemu-mps2-an386"
STEPS = 6


def test_the_profile_says_fpu_and_armv7emsp():
    board = boards.load_board(M4)
    assert board["fpu"] and board["mpy_arch"] == "armv7emsp"
    assert runtime.native_build(board["mpy_arch"]) == runtime.native_build("armv7m")


def test_digits_adamw_on_the_fpu_board_leaves_the_m3_checkpoint(firmware, m4_firmware,
                                                                 tmp_path):
    # three deploy runs: the M3 with the float module deploy ships it (armv7m), the M4F
    # without a native module (its FPU's bytecode floats) and with the one deploy ships it
    # (the armv7emsp build, the FPU's instructions)
    artifacts = tmp_path / "build"
    generate_artifacts(str(DIGITS / "mlp.onnx"), loss="CrossEntropyLoss", optimizer="AdamW",
                       artifact_directory=str(artifacts), batch_size=8,
                       optimizer_options={"learning_rate": 0.01})
    results = {}
    for board, fw, native in (("qemu-mps2-an385", firmware, True), (M4, m4_firmware, False),
                              (M4, m4_firmware, True)):
        plan = deploy.plan(artifacts, board, steps=STEPS, native=native)
        shipped = runtime.native_build(plan.board["mpy_arch"], "float_native")
        assert plan.native == ({runtime.NATIVE_FLOAT_MODULE: shipped} if native else {})
        result = deploy.run(plan, DIGITS / "digits.npz", lr=0.01, firmware=fw)
        assert len(result.losses) == STEPS
        results[board, native] = (result.losses, result.checkpoint.read_bytes())
    m3, m4 = results["qemu-mps2-an385", True], results[M4, False]
    print(f"\nlosses on both boards {m4[0]}")
    assert m4[0] == m3[0] and m4[1] == m3[1]
    assert results[M4, True] == m4


def test_native_int8_module_equals_pure_on_the_fpu_board(m4_firmware, tmp_path):
    module = build_module(runtime.NATIVE_BUILD_FOR["armv7emsp"])   # the build deploy ships
    out = run_on_board(m4_firmware, tmp_path, module, HEAP_PROBE + qlinear_script(480),
                       board=M4)
    check_qlinear(out, 480)
    print(f"armv7m build on the Cortex-M4F: {check_native_heap(out, module):,d} B of heap")


# The float module's armv7emsp build (F32_HARD: the FPU's instructions are its arithmetic),
# the one deploy and mip's package-armv7emsp.json ship to FPU boards, on the Cortex-M4F: the
# bytes of the pure-Python kernels computed by the same FPU, over the cases
# tests/test_board_float_native.py runs on the M3.
def float_on_m4(m4_firmware, tmp_path, script):
    from test_board_float_native import build_module as build_float, run_on_board as run_float
    module = build_float("armv7emsp")
    assert open(module, "rb").read() == \
        runtime.native_build("armv7emsp", "float_native").read_bytes(), \
        "stale: scripts/build_natmod.sh --float --ship armv7emsp"
    return run_float(m4_firmware, tmp_path, module,
                     "import sys\nassert sys.implementation._build == 'MPS2_AN386'\n" + script,
                     board=M4)


def test_float_module_fpu_build_equals_pure_on_the_fpu_board(m4_firmware, tmp_path):
    from test_board_float_native import (check_conv, check_reduce, conv_script, gemm_script,
                                         optim_script, reduce_script)
    # the cases the M3 and RV32 run: the same C, the FPU's arithmetic in place of f32.h's
    out = float_on_m4(m4_firmware, tmp_path / "gemm", gemm_script(630))
    assert "fast True" in out and out.split()[-4:] == ["cases", "630", "different", "0"], \
        out[-2000:]
    out = float_on_m4(m4_firmware, tmp_path / "optim", optim_script(1000))
    words = out.split()
    assert "fast True" in out and words[-6:-2] == ["cases", "1000", "different", "0"], \
        out[-2000:]
    check_reduce(float_on_m4(m4_firmware, tmp_path / "reduce", reduce_script(1000)), 1000)
    check_conv(float_on_m4(m4_firmware, tmp_path / "conv", conv_script(600)), 600)


def test_a_soft_float_build_refuses_to_load_on_the_fpu_board(m4_firmware, tmp_path):
    # the armv7m float build (soft-float ABI) on the hard-float firmware: its import refuses
    # (one float round trip through the firmware's functions comes back wrong) and the
    # families keep their pure-Python kernels; deploy and package-armv7emsp.json give FPU
    # boards the armv7emsp build, but mip's package-armv7m.json would install this one there
    from test_board_float_native import build_module as build_float, run_on_board as run_float
    out = run_float(m4_firmware, tmp_path, build_float("armv7m"), """
try:
    import microtrain.kernels.float_native
    print('loaded')
except ValueError as e:
    print('refused', e)
from microtrain.kernels import dense, optim
print('pure', dense.gemm is dense._pure['gemm'], optim.adamw is optim._pure['adamw'])
""", board=M4)
    assert "refused float_native: float ABI not the firmware's" in out, out
    assert "pure True True" in out, out
