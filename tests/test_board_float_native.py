"""The native float kernels (device/native/float: a MicroPython 1.25 dynamic native module
built by `scripts/build_natmod.sh --float`) on the emulated boards: placed in the runtime's
ROMFS as microtrain/kernels/float_native.mpy, kernels/fastpath.py puts them in place of the
pure-Python Gemm, Conv, max pooling and optimizer kernels, and they write the bytes the
pure-Python kernels write on the same board (single-precision floats) over random
geometries and data (tests/device_scripts/float_native.py, float_native_conv.py,
float_native_pool.py, float_native_optim.py): on the Cortex-M3 with the armv7m build (its
hand-written Thumb-2 dot product) and the armv6m build (C), and on the RISC-V core
(rv32imc, C); and whole training runs (digits, LeNet) equal to the same board's pure-Python
runs. Needs the boards' firmware (skipped without it, failed when MICROTRAIN_REQUIRE_QEMU /
_RV32=1)."""
import os
import shutil
import subprocess

import pytest

from conftest import ROOT, run_on_emulated_board

from microtrain_host.tools import deploy

RV32 = "qemu-virt-rv32"
SCRIPTS = ROOT / "tests" / "device_scripts"
# prepended to a script for the RISC-V board: it fails on another firmware
ON_RV32 = "import sys\nassert sys.implementation._build == 'VIRT_RV32'\n"


def build_module(arch):
    """The module built from today's sources (scripts/build_natmod.sh --float, cached);
    skipped without the cross compiler unless an emulated board is required."""
    compiler = "riscv64-unknown-elf-gcc" if arch == "rv32imc" else "arm-none-eabi-gcc"
    required = {os.environ.get("MICROTRAIN_REQUIRE_QEMU"),
                os.environ.get("MICROTRAIN_REQUIRE_QEMU_RV32")} & {"1"}
    if shutil.which(compiler) is None and not required:
        pytest.skip(f"no {compiler}: scripts/build_natmod.sh --float {arch} installs it")
    proc = subprocess.run(["bash", str(ROOT / "scripts" / "build_natmod.sh"), "--float", arch],
                          capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout.split()[-1]


def run_on_board(firmware, tmp_path, module, script_text, board="qemu-mps2-an385"):
    return run_on_emulated_board(firmware, tmp_path, script_text, board=board,
                                 in_rom=[(module, "microtrain/kernels/float_native.mpy")])


def gemm_script(cases):
    return f"CASES = {cases}\n" + (SCRIPTS / "float_native.py").read_text()


def nan_bits(out):
    return int(out.split("nan_bits")[1].split()[0])


@pytest.mark.parametrize("arch", ["armv7m", "armv6m"])
def test_native_float_gemm_equals_pure_on_the_emulated_m3(firmware, arch, tmp_path):
    # 630 cases: 210 each of gemm, gemm_accumulate, batched_gemm
    out = run_on_board(firmware, tmp_path, build_module(arch), gemm_script(630))
    assert "fast True" in out, out[-2000:]
    assert out.split()[-4:] == ["cases", "630", "different", "0"], out[-2000:]
    # the armv7m build links the firmware's own libgcc routines: even its NaNs are the
    # same bits; the armv6m build's (libgcc's armv6m soft float) differ in a NaN's sign
    if arch == "armv7m":
        assert nan_bits(out) == 0, out[-2000:]


def test_native_float_gemm_equals_pure_on_the_rv32_board(rv32_firmware, tmp_path):
    out = run_on_board(rv32_firmware, tmp_path, build_module("rv32imc"),
                       ON_RV32 + gemm_script(630), board=RV32)
    assert "fast True" in out, out[-2000:]
    assert out.split()[-4:] == ["cases", "630", "different", "0"], out[-2000:]


def optim_script(cases):
    return f"CASES = {cases}\n" + (SCRIPTS / "float_native_optim.py").read_text()


@pytest.mark.parametrize("arch", ["armv7m", "armv6m"])
def test_native_float_updates_equal_pure_on_the_emulated_m3(firmware, arch, tmp_path):
    # 1,000 cases: 200 each of sgd, adamw, sgd_general, adamw_general, accumulate; the
    # elements refused (left as they were, counted in optim.refused) counted alike
    out = run_on_board(firmware, tmp_path, build_module(arch), optim_script(1000))
    assert "fast True" in out, out[-2000:]
    words = out.split()
    assert words[-6:-2] == ["cases", "1000", "different", "0"], out[-2000:]
    assert int(words[-1]) > 100, out[-2000:]       # the refusals were exercised


def test_native_float_updates_equal_pure_on_the_rv32_board(rv32_firmware, tmp_path):
    out = run_on_board(rv32_firmware, tmp_path, build_module("rv32imc"),
                       ON_RV32 + optim_script(1000), board=RV32)
    assert "fast True" in out, out[-2000:]
    words = out.split()
    assert words[-6:-2] == ["cases", "1000", "different", "0"], out[-2000:]


def reduce_script(cases):
    return f"CASES = {cases}\n" + (SCRIPTS / "float_native_reduce.py").read_text()


def check_reduce(out, cases=1000):
    # 1,000 cases: 200 each of reduce_sum, relu, relu_grad, largest_abs, load_floats; the
    # calls reaching past F's end raised alike
    assert "fast True" in out, out[-2000:]
    words = out.split()
    assert words[-6:-2] == ["cases", str(cases), "different", "0"], out[-2000:]
    assert int(words[-1]) > 5 * cases // 1000, out[-2000:]   # the refusals were exercised


@pytest.mark.parametrize("arch", ["armv7m", "armv6m"])
def test_native_reduce_relu_and_gradient_check_equal_pure_on_the_emulated_m3(firmware, arch,
                                                                              tmp_path):
    check_reduce(run_on_board(firmware, tmp_path, build_module(arch), reduce_script(1000)))


def test_native_reduce_relu_and_gradient_check_equal_pure_on_the_rv32_board(rv32_firmware,
                                                                             tmp_path):
    check_reduce(run_on_board(rv32_firmware, tmp_path, build_module("rv32imc"),
                              ON_RV32 + reduce_script(1000), board=RV32))


def after_helpers(script, cases):
    # float_native.py's data helpers (all before its first case), then `script`'s cases
    helpers = (SCRIPTS / "float_native.py").read_text().split("\ndef gemm_case")[0]
    return f"CASES = {cases}\n" + helpers + "\n" + (SCRIPTS / script).read_text()


def conv_script(cases):
    return after_helpers("float_native_conv.py", cases)


def check_conv(out, cases=600):
    # 600 cases: 200 each of conv, conv_grad_input, conv_grad_weight; the calls reaching
    # past F's end raised alike
    assert "conv_fast True" in out, out[-2000:]
    words = out.split()
    assert words[-6:-2] == ["cases", str(cases), "different", "0"], out[-2000:]
    assert int(words[-1]) > 3 * cases // 600, out[-2000:]   # the refusals were exercised


@pytest.mark.parametrize("arch", ["armv7m", "armv6m"])
def test_native_float_conv_equals_pure_on_the_emulated_m3(firmware, arch, tmp_path):
    check_conv(run_on_board(firmware, tmp_path, build_module(arch), conv_script(600)))


def test_native_float_conv_equals_pure_on_the_rv32_board(rv32_firmware, tmp_path):
    check_conv(run_on_board(rv32_firmware, tmp_path, build_module("rv32imc"),
                            ON_RV32 + conv_script(600), board=RV32))


def pool_script(cases):
    return after_helpers("float_native_pool.py", cases)


def check_pool(out):
    # 400 cases: 200 each of max_pool, max_pool_grad; the calls reaching past F's end
    # raised alike
    assert "pool_fast True" in out, out[-2000:]
    words = out.split()
    assert words[-6:-2] == ["cases", "400", "different", "0"], out[-2000:]
    assert int(words[-1]) > 3, out[-2000:]


@pytest.mark.parametrize("arch", ["armv7m", "armv6m"])
def test_native_max_pool_equals_pure_on_the_emulated_m3(firmware, arch, tmp_path):
    check_pool(run_on_board(firmware, tmp_path, build_module(arch), pool_script(400)))


def test_native_max_pool_equals_pure_on_the_rv32_board(rv32_firmware, tmp_path):
    check_pool(run_on_board(rv32_firmware, tmp_path, build_module("rv32imc"),
                            ON_RV32 + pool_script(400), board=RV32))


# A training run on the board from the runtime in ROMFS, its blob and checkpoint there,
# batches read from x.f32 / y.i32: PURE (prepended) selects the families' pure-Python
# kernels; prints whether fastpath picked what it should, the losses and the arena's CRC-32
TRAIN_RUN = """
# as boards/train_on_board.py starts: the block the arenas (or the blob file) need asked
# for on the empty heap and given back at once, before the imports split the heap
import gc
import io
gc.collect()
io.BytesIO(RESERVE).close()
gc.collect()
from array import array
from binascii import crc32, hexlify
from microtrain import CheckpointState, Module, Optimizer, feed, module
from microtrain.kernels import float_native
families = [__import__('microtrain.kernels.' + f, None, None, ('use_fast',)) for f in FAMILIES]
if PURE:
    for family in families:
        family.use_fast(False)
    module.largest_abs = None       # the gradient check's and the input copy's own loops
    feed._LOAD = None
    print('picked', all(getattr(f, k) is f._pure[k] for f in families for k in f._pure))
else:
    print('picked', all(getattr(f, k) is getattr(float_native, k)
                        for f in families for k in f._pure)
          and module.largest_abs is float_native.largest_abs
          and feed._LOAD is float_native.load_floats
          and all(f._pure for f in families))
import gc
state = CheckpointState.load_checkpoint('/rom/checkpoint')
# loaded as boards/train_on_board.py does: a collection every 4 KB while Module loads (its
# reader's garbage reuses small holes, not the block the arenas need)
blob = '/rom/model.mtb'
families = None
gc.collect()
gc.threshold(4096)
model = Module(blob, state)
gc.threshold(-1)
opt = Optimizer(blob, model)
losses = array('f')
# a batch at a time from the files, as a deployed run reads them (all at once would take
# the heap the arenas need)
fx, fy = open('x.f32', 'rb'), open('y.i32', 'rb')
for step in range(STEPS):
    losses.append(model(array('f', fx.read(X_BYTES)), array('i', fy.read(Y_BYTES))))
    opt.step()
    model.lazy_reset_grad()
print('losses', hexlify(bytes(losses)).decode())
# the arena's CRC-32 (a copy of it would not fit beside it)
print('arena', crc32(memoryview(model.F)))
"""


def train_native_and_pure(firmware, tmp_path, build, arch, x, y, steps, x_bytes, families):
    """The artifacts in `build` trained `steps` steps on the emulated Cortex-M3 from the
    runtime deploy.write_runtime writes with the float module's `arch` build in ROMFS, twice
    from the same checkpoint: with the native kernels fastpath picks, then with
    use_fast(False); asserts the picks and that both runs give the same losses bit for bit
    and the same arena. Returns the losses (float32)."""
    import numpy as np

    from microtrain_host.tools import boards, runtime
    (tmp_path / "x.f32").write_bytes(x.astype("<f4").tobytes())
    (tmp_path / "y.i32").write_bytes(y.astype("<i4").tobytes())
    board = boards.load_board("qemu-mps2-an385")
    plan = deploy.Plan(board, "romfs", build, {}, None, None, None, None)
    plan.native = {runtime.NATIVE_FLOAT_MODULE: build_module(arch)}
    rt = deploy.write_runtime(plan, build / "model.mtb", tmp_path / "rt")
    for name in ("model.mtb", "checkpoint"):
        (rt / name).write_bytes((build / name).read_bytes())
    plan.romfs_image = tmp_path / "microtrain.romfs"
    plan.romfs_image.write_bytes(runtime.romfs_image(rt))
    plan.files = [(tmp_path / "x.f32", "x.f32"), (tmp_path / "y.i32", "y.i32")]
    reserve = boards.predict(build, board, "romfs", native=plan.native).reserve
    runs = {}
    for pure in (False, True):      # two runs of the same board (its firmware, its heap)
        script = tmp_path / "script.py"
        script.write_text(f"PURE = {pure}\nSTEPS = {steps}\nX_BYTES = {x_bytes}\n"
                          f"Y_BYTES = {4 * len(y) // steps}\nFAMILIES = {families!r}\n"
                          f"RESERVE = {reserve}\n"
                          + TRAIN_RUN)
        with deploy.QemuBoard(firmware, rom=plan.romfs_image) as qemu:
            proc = subprocess.run(deploy.mpremote_command(plan, qemu.port, script,
                                                          rom_loaded=True),
                                  capture_output=True, text=True, timeout=1800)
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
        runs[pure] = dict(line.split(" ", 1) for line in proc.stdout.splitlines()
                          if line.startswith(("picked ", "losses ", "arena ")))
        assert runs[pure]["picked"] == "True", proc.stdout[-2000:]
    for what in ("losses", "arena"):
        assert runs[False][what] == runs[True][what], what
    losses = np.frombuffer(bytes.fromhex(runs[False]["losses"]), "<f4")
    assert len(losses) == steps
    return losses


@pytest.mark.parametrize("arch", ["armv7m", "armv6m"])
def test_digits_training_with_the_native_module_equals_the_boards_pure_run(firmware, arch,
                                                                          tmp_path):
    """A whole training run as deploy ships it: the digits MLP (AdamW, batch 8), its minimal
    runtime written by deploy.write_runtime for the emulated Cortex-M3 with the float module
    (the build for the board, armv7m; and armv6m, which every ARM core loads) in ROMFS,
    trains 12 steps with the native kernels picked by fastpath (Gemm, AdamW, reduce_sum,
    relu, relu_grad; the gradient check and the input copy too); a second run of the same
    board from the same checkpoint with use_fast(False) (the pure-Python kernels) gives the
    same losses bit for bit and the same arena (parameters, gradients, moments: its
    CRC-32)."""
    import numpy as np

    from microtrain_host import generate_artifacts
    from microtrain_host.tools import boards, runtime
    digits = ROOT / "examples" / "digits"
    build = tmp_path / "build"
    generate_artifacts(str(digits / "mlp.onnx"), artifact_directory=str(build), batch_size=8,
                       optimizer="AdamW", optimizer_options={"learning_rate": 0.01})
    data = np.load(digits / "digits.npz")
    if arch == "armv7m":    # what deploy ships to this board
        assert boards.native_for(build / "model.mtb", boards.load_board("qemu-mps2-an385"),
                                 "romfs") == {
            runtime.NATIVE_FLOAT_MODULE: runtime.native_build("armv7m", "float_native")}
    losses = train_native_and_pure(firmware, tmp_path, build, arch, data["x_train"][:96],
                                   data["y_train"][:96], 12, 2048,
                                   ("dense", "optim", "reduce", "activation"))
    assert losses[-1] < losses[0]      # it trained


def test_lenet_training_with_the_native_module_equals_the_boards_pure_run(firmware,
                                                                         tmp_path):
    """The LeNet reference CNN (SGD, batch 4), as above with the armv7m build, which deploy
    ships to the M3 with it (with AdamW it leaves the module out: boards.NATIVE_SLACK): its
    Convs, their input and weight gradients and its max pooling native too, 4 steps equal to
    the same board's pure-Python run (losses and arena)."""
    import numpy as np

    from conftest import lenet_board_artifacts
    from microtrain_host.tools import boards, runtime
    build, _ = lenet_board_artifacts(tmp_path, "SGD", 4)
    data = np.load(tmp_path / "data.npz")
    x = data["x_train"]
    assert boards.choose_native(build, boards.load_board("qemu-mps2-an385"), "romfs") == (
        {runtime.NATIVE_FLOAT_MODULE: runtime.native_build("armv7m", "float_native")}, None)
    losses = train_native_and_pure(firmware, tmp_path, build, "armv7m", x, data["y_train"],
                                   4, x[0].size * 4 * 4,
                                   ("dense", "optim", "reduce", "activation", "conv", "pool"))
    assert np.isfinite(losses).all()
