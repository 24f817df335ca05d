"""The native int8 Gemm and Conv (device/native: a MicroPython 1.25 dynamic native module
built by scripts/build_natmod.sh) on the emulated boards: the module, placed in the
runtime's ROMFS beside the kernels as microtrain/kernels/qlinear_native.mpy, gives the
pure-Python kernels' bytes over random geometries (tests/device_scripts/qlinear_native.py)
on the Cortex-M3 (armv6m and armv7m builds: the hand-written Thumb-1 loops) and on the RISC-V
core (rv32imc build: the same loops in C), and kernels/fastpath.py puts them in place of
the viper ones; likewise its integer training kernels, inttrain's int_gemm_update
(tests/device_scripts/inttrain_native.py) and intgrad's five (intgrad_native.py). The
board runs only the native kernels and prints a CRC-32 per case; CPython runs the same
script with the pure-Python kernels on the same cases (tests/micropython_random.py draws
what the board's `random` draws: cpython_cases). Needs the
boards' firmware (scripts/build_qemu_board.sh, build_qemu_rv32.sh: skipped without it,
failed when MICROTRAIN_REQUIRE_QEMU / MICROTRAIN_REQUIRE_QEMU_RV32=1); the module is built
here (the script installs its toolchain when missing)."""
import functools
import os
import shutil
import subprocess
import sys

import pytest

from conftest import DEVICE, ROOT, run_on_emulated_board

from microtrain_host.tools import boards, deploy, runtime


RV32 = "qemu-virt-rv32"
# prepended to the board scripts: the heap the module's import takes (its machine code is
# copied into RAM even from the ROM filesystem), what the fit check predicts
# (boards.NATIVE_HEAP_PER_MPY_BYTE); the package is imported first, so it is not counted
HEAP_PROBE = """
import gc
import microtrain.kernels
gc.collect()
_before = gc.mem_alloc()
import microtrain.kernels.qlinear_native
gc.collect()
print('native heap', gc.mem_alloc() - _before)
"""


def check_native_heap(out, module):
    """The fit check's figure for the module is an upper bound within 10 % of the board's."""
    measured = int(out.split("native heap")[1].split()[0])
    predicted = boards.native_heap({"m": module})
    assert measured <= predicted <= 1.1 * measured, (measured, predicted)
    return measured


def build_module(arch):
    """The module built from today's sources (scripts/build_natmod.sh, cached). Without the
    architecture's cross compiler the test is skipped, unless an emulated board is
    required (MICROTRAIN_REQUIRE_QEMU[_RV32]=1, as scripts/test.sh sets): then the script installs
    it from Debian, and a module that cannot be built fails the test."""
    compiler = "riscv64-unknown-elf-gcc" if arch == "rv32imc" else "arm-none-eabi-gcc"
    required = {os.environ.get("MICROTRAIN_REQUIRE_QEMU"),
                os.environ.get("MICROTRAIN_REQUIRE_QEMU_RV32")} & {"1"}
    if shutil.which(compiler) is None and not required:
        pytest.skip(f"no {compiler}: scripts/build_natmod.sh {arch} installs it")
    proc = subprocess.run(["bash", str(ROOT / "scripts" / "build_natmod.sh"), arch],
                          capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout.split()[-1]


@functools.lru_cache(maxsize=None)
def cpython_cases(script_text):
    """The pure-Python kernels' side of a board script (tests/device_scripts/qlinear_native.py,
    inttrain_native.py, intgrad_native.py): the same script under CPython with PURE = True
    and tests/micropython_random.py as `random`, so that it makes the board's cases again;
    {(kernel, case number): (CRC, what the case was)} of its "case" lines."""
    boot = ("import sys, micropython_random\nsys.modules['random'] = micropython_random\n"
            "exec(compile(sys.stdin.read(), 'pure', 'exec'), {'__name__': '__main__'})\n")
    env = dict(os.environ, PYTHONPATH=f"{DEVICE}{os.pathsep}{ROOT / 'tests'}")
    proc = subprocess.run([sys.executable, "-c", boot], input="PURE = True\n" + script_text,
                          capture_output=True, text=True, env=env, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return case_lines(proc.stdout), proc.stdout


def case_lines(out):
    # "case N CRC [what]" or "case KERNEL N CRC [what]" -> {(kernel, N): (CRC, what)}
    cases = {}
    for line in out.splitlines():
        words = line.split(None, 4 if line.startswith("case int_") else 3)
        if words[:1] == ["case"]:
            kernel, words = (words[1], words[1:]) if words[1].startswith("int_") else ("", words)
            cases[kernel, int(words[1])] = (words[2], words[3] if len(words) > 3 else "")
    return cases


def check_against_cpython(out, script_text, cases):
    """The board's CRCs (the native kernels) are CPython's (the pure-Python kernels), case by
    case; returns CPython's output (its counts)."""
    pure, pure_out = cpython_cases(script_text)
    native = case_lines(out)
    assert len(pure) == cases and sorted(native) == sorted(pure), (len(native), out[-2000:])
    different = [what for key, (crc, what) in sorted(pure.items())
                 if native[key][0] != crc and crc != "crafted"]
    assert not different, f"{len(different)} cases differ, e.g. {different[:3]}"
    return pure_out


@pytest.fixture(scope="module")
def armv6m_module():
    return build_module("armv6m")


def run_on_board(firmware, tmp_path, module, script_text, board="qemu-mps2-an385"):
    return run_on_emulated_board(firmware, tmp_path, script_text, board=board,
                                 in_rom=[(module, "microtrain/kernels/qlinear_native.mpy")])


def native_script(name, cases, settings=""):
    """A native integer check as the board and CPython (cpython_cases) both run it: CASES
    (and settings), native_oracle.py (which picks the kernel a case runs on each side),
    native_cases.py where the check calls its run_cases, then tests/device_scripts/<name>."""
    scripts = ROOT / "tests" / "device_scripts"
    check = (scripts / name).read_text()
    loop = (scripts / "native_cases.py").read_text() if "run_cases(" in check else ""
    return (f"CASES = {cases}\n{settings}" + (scripts / "native_oracle.py").read_text() + loop
            + check)


def qlinear_script(cases):
    return native_script("qlinear_native.py", cases)


def check_cases(out, script, cases, fallback=True):
    """The board's run of a native check script gives CPython's bytes case by case and the
    same "cases N fallback F" line; with fallback, some cases went to the pure-Python
    kernel (arguments beyond the module's domain). CPython's output."""
    pure_out = check_against_cpython(out, script, cases)
    assert out.split()[-4:] == pure_out.split()[-4:], out[-2000:]   # "cases N fallback F"
    assert not fallback or int(pure_out.split()[-1]) > 0, out[-2000:]
    return pure_out


def check_qlinear(out, cases):
    # Gemm and Conv cases alternate; the board's native kernels give CPython's pure ones
    check_cases(out, qlinear_script(cases), cases)


@pytest.mark.parametrize("arch", ["armv6m", "armv7m"])
def test_native_int8_gemm_equals_pure_on_the_emulated_board(firmware, armv6m_module, arch,
                                                            tmp_path):
    # 240 Gemm and 240 Conv cases; armv6m runs on every ARM core, armv7m (Thumb-2 C around
    # the same Thumb-1 loops) on Cortex-M3 and later
    module = armv6m_module if arch == "armv6m" else build_module(arch)
    out = run_on_board(firmware, tmp_path, module, HEAP_PROBE + qlinear_script(480))
    check_qlinear(out, 480)
    print(f"{arch}: {check_native_heap(out, module):,d} B of heap at import")


@pytest.mark.parametrize("arch", ["armv6m", "armv7m"])
def test_native_direct_conv_equals_pure_on_the_emulated_board(firmware, armv6m_module, arch,
                                                              tmp_path):
    # 500 Convs shaped for the ARM builds' direct path (kinds 6 and 7: most take it,
    # qconv_direct.c, in each of its forms; the rest the im2col path or, crafted, the pure
    # kernel) between 500 Gemm cases
    module = armv6m_module if arch == "armv6m" else build_module(arch)
    script = native_script("qlinear_native.py", 1000, "CONV_KINDS = (6, 7)\n")
    out = run_on_board(firmware, tmp_path, module, script)
    check_cases(out, script, 1000, fallback=False)
    described = [w for _, w in cpython_cases(script)[0].values()]
    forms = [direct_form(what) for what in described]
    counts = {form: forms.count(form) for form in ("8x1", "4x2", "columns", "columns s2")}
    assert sum(counts.values()) >= 250 and min(counts.values()) >= 50, counts
    # the columns whose sums start from the padding terms left out (edge columns)
    edges = sum(1 for what, form in zip(described, forms)
                if form and form.startswith("columns") and leaves_out_padding(what))
    assert edges >= 50, edges


@pytest.mark.parametrize("arch", ["armv6m", "armv7m"])
def test_native_depthwise_pairs_equal_pure_on_the_emulated_board(firmware, armv6m_module,
                                                                 arch, tmp_path):
    # 300 3x3 depthwise Convs with "same" padding and stride 1 (kind 8) between 300 Gemm
    # cases: on armv7m most take the pairs of rows (dw3_pairs), the rest its row loop;
    # armv6m's row loop on the same cases
    module = armv6m_module if arch == "armv6m" else build_module(arch)
    script = native_script("qlinear_native.py", 600, "CONV_KINDS = (8,)\n")
    out = run_on_board(firmware, tmp_path, module, script)
    check_cases(out, script, 600, fallback=False)
    described = [w for _, w in cpython_cases(script)[0].values()]
    pairs = [what for what in described if takes_pairs(what)]
    assert len(pairs) >= 200, len(pairs)
    # odd and even heights, both row widths of P, planes in several chunks of sums
    shapes = [eval(what[4:])[12:14] for what in pairs]
    assert {h % 2 for h, _ in shapes} == {0, 1} and {w <= 6 for _, w in shapes} == {0, 1}
    assert sum(1 for h, w in shapes if h > (128 // w) & ~1) >= 20, shapes


def takes_pairs(what):
    """Whether a case's Conv takes the armv7m build's pairs of rows (qconv_native.c's
    dw3_pairs: 3x3 depthwise, "same" padding, stride 1, H + 2 rows of P in 256 words)."""
    if not what.startswith("conv") or what.endswith("crafted"):
        return False
    (_, _, _, _, _, _, _, groups, cin_g, cout_g, h, w, out_h, out_w, k_h, k_w, s_h, s_w, d_h,
     d_w, pad_t, pad_l, _, _) = eval(what[4:])
    return (cin_g, cout_g, k_h, k_w, s_h, s_w, d_h, d_w, pad_t, pad_l) == \
        (1, 1, 3, 3, 1, 1, 1, 1, 1, 1) and w <= 14 and (h + 2) * (8 if w <= 6 else 16) <= 256


def direct_form(what):
    """The direct path's form a case's Conv takes (qconv_direct.c's conditions and its
    stack budget: 768 band bytes, 48 sums), from the host's description of the case."""
    if not what.startswith("conv") or what.endswith("crafted"):
        return None
    (_, _, _, _, _, _, _, _, cin_g, cout_g, h, w, out_h, out_w, k_h, k_w, s_h, s_w, d_h, d_w,
     pad_t, pad_l, _, _) = eval(what[4:])
    pointwise = k_h == k_w == 1 and (s_h, s_w, pad_t, pad_l) == (1, 1, 0, 0) and \
        (out_h, out_w) == (h, w)
    if cout_g < 4 or cin_g * k_h * k_w > 72 or pointwise:
        return None
    if (s_h, s_w, d_h, d_w) == (1, 1, 1, 1):
        form = "8x1" if out_w % 8 == 0 else "4x2" if out_w % 4 == 0 and out_h % 2 == 0 and \
            out_w + k_w - 1 <= 16 else None
        pitch, step = (out_w + k_w - 1, 1) if form == "8x1" else (16, 2)
        if form and (step + k_h - 1) * pitch * cin_g <= 768 and step * out_w <= 48:
            return form
    rows = out_h // 8 * 8
    width = (out_w - 1) * s_w + (k_w - 1) * d_w + 1
    height = (rows - 1) * s_h + (k_h - 1) * d_h + 1
    if rows and s_h in (1, 2) and width * height * cin_g <= 768:
        return "columns" if s_h == 1 else "columns s2"
    return None


def leaves_out_padding(what):
    """Whether the columns form leaves out padding terms at some output column: a turn of
    four terms or more of its kx-major table whose input column lies outside the image."""
    (_, _, _, _, _, _, _, _, cin_g, _, _, w, _, out_w, k_h, k_w, _, s_w, _, d_w, _, pad_l,
     _, _) = eval(what[4:])
    block, K = cin_g * k_h, cin_g * k_h * k_w
    for ox in range(out_w):
        inside = [kx for kx in range(k_w) if 0 <= ox * s_w + kx * d_w - pad_l < w]
        if inside and ((inside[0] * block) // 4 > 0 or
                       ((inside[-1] + 1) * block + 3) // 4 < (K + 3) // 4):
            return True
    return False


@pytest.mark.parametrize("arch", ["armv6m", "armv7m", "rv32imc"])
def test_shipped_build_is_a_fresh_build_of_the_sources(arch):
    """What deploy and mip ship (device/microtrain/kernels/native, build_natmod.sh --ship)
    is byte for byte what the sources build to today (the build is reproducible: a fixed
    hash seed, a relative build path)."""
    shipped = DEVICE / "microtrain" / "kernels" / "native" / arch / "qlinear_native.mpy"
    assert shipped.read_bytes() == open(build_module(arch), "rb").read(), \
        f"stale: scripts/build_natmod.sh --ship {arch}"


def test_native_int8_gemm_equals_pure_on_the_rv32_board(rv32_firmware, tmp_path):
    module = build_module("rv32imc")
    out = run_on_board(rv32_firmware, tmp_path, module,
                       "import sys\nassert sys.implementation._build == 'VIRT_RV32'\n"
                       + HEAP_PROBE + qlinear_script(480), board=RV32)
    check_qlinear(out, 480)
    print(f"rv32imc: {check_native_heap(out, module):,d} B of heap at import")


@pytest.mark.parametrize("arch", ["armv6m", "armv7m"])
def test_native_global_average_pool_equals_pure_on_the_emulated_board(firmware, armv6m_module,
                                                                      arch, tmp_path):
    module = armv6m_module if arch == "armv6m" else build_module(arch)
    script = native_script("qlinear_native_pool.py", 300)
    check_cases(run_on_board(firmware, tmp_path, module, script), script, 300)


def test_native_global_average_pool_equals_pure_on_the_rv32_board(rv32_firmware, tmp_path):
    script = native_script("qlinear_native_pool.py", 300)
    check_cases(run_on_board(rv32_firmware, tmp_path, build_module("rv32imc"), script,
                             board=RV32), script, 300)


def test_fastpath_picks_the_native_gemm_when_it_imports(firmware, armv6m_module, tmp_path):
    """native > viper > pure: the Gemm, Conv and GlobalAveragePool are the module's, and inttrain's
    int_gemm_update, the other int8 kernels stay viper; the module's _pure holds both
    families' pure kernels (its fallback); use_fast(False) puts the pure-Python kernels
    back."""
    out = run_on_board(firmware, tmp_path, armv6m_module, """
from microtrain.kernels import qlinear, qlinear_native, qlinear_viper, inttrain, inttrain_viper
print('gemm', qlinear.qlinear_gemm is qlinear_native.qlinear_gemm)
print('conv', qlinear.qlinear_conv is qlinear_native.qlinear_conv)
print('pool', qlinear.qlinear_global_average_pool is qlinear_native.qlinear_global_average_pool)
print('update', inttrain.int_gemm_update is qlinear_native.int_gemm_update)
print('add', qlinear.qlinear_add is qlinear_viper.qlinear_add)
print('logits', inttrain.int_gemm_logits is inttrain_viper.int_gemm_logits)
print('fallback', qlinear_native._pure['qlinear_gemm'] is qlinear._pure['qlinear_gemm'],
      qlinear_native._pure['int_gemm_update'] is inttrain._pure['int_gemm_update'])
qlinear.use_fast(False)
print('pure', qlinear.qlinear_gemm is qlinear._pure['qlinear_gemm'])
""")
    for line in ("gemm True", "conv True", "pool True", "update True", "add True", "logits True",
                 "fallback True True", "pure True"):
        assert line in out, out[-2000:]


def test_int8_digits_inference_with_the_native_gemm_equals_cpython(firmware, tmp_path):
    """A whole model on the native kernels as deploy ships them: the digits MLP's int8 blob
    (the packager's export of a quantization-aware blob), its minimal runtime built by
    deploy.write_runtime for the emulated Cortex-M3 (which carries the shipped build for
    the board's mpy_arch) in ROMFS, gives CPython's pure-Python outputs bit for bit with the
    native Gemm picked by fastpath, and so does the same board with the pure kernels."""
    import numpy as np

    from microtrain import InferenceSession
    from microtrain_host import generate_artifacts
    from microtrain_host.cli import main
    digits = ROOT / "examples" / "digits"
    build = tmp_path / "build"
    generate_artifacts(str(digits / "mlp.onnx"), artifact_directory=str(build), batch_size=2,
                       optimizer="SGD", quantization=True)
    assert main(["export", str(build), "--checkpoint", str(build / "checkpoint"), "--qdq",
                 "-o", str(tmp_path / "qdq.onnx"),
                 "--int8-blob", str(tmp_path / "int8.mtb")]) == 0
    x = np.load(digits / "digits.npz")["x_val"][:2].astype("<f4")
    cpython = np.array(InferenceSession(str(tmp_path / "int8.mtb")).run(x.reshape(-1)),
                       np.float32)
    blob = tmp_path / "int8.mtb"
    board = boards.load_board("qemu-mps2-an385")
    plan = deploy.Plan(board, "romfs", tmp_path, {}, None, None, None, None)
    plan.native = boards.native_for(blob, board, "romfs")
    assert plan.native == {runtime.NATIVE_MODULE: runtime.native_build(board["mpy_arch"])}
    rt = deploy.write_runtime(plan, blob, tmp_path / "rt")
    # an inference run: the session, which a training runtime leaves out, and the blob
    runtime.compile_runtime(runtime.package_sources(["microtrain/inference.py"]),
                            board["mpy_arch"], board["mpy_version"], rt)
    (rt / "int8.mtb").write_bytes(blob.read_bytes())
    plan.romfs_image = tmp_path / "microtrain.romfs"
    plan.romfs_image.write_bytes(runtime.romfs_image(rt))
    plan.files = [(tmp_path / "x.f32", "x.f32")]
    (tmp_path / "x.f32").write_bytes(x.tobytes())
    script = tmp_path / "script.py"
    script.write_text("""
from array import array
from binascii import hexlify
from microtrain import InferenceSession
from microtrain.kernels import qlinear, qlinear_native
print('native', qlinear.qlinear_gemm is qlinear_native.qlinear_gemm)
x = array('f', open('x.f32', 'rb').read())
print('out', hexlify(bytes(InferenceSession('/rom/int8.mtb').run(x))).decode())
qlinear.use_fast(False)
print('pure', hexlify(bytes(InferenceSession('/rom/int8.mtb').run(x))).decode())
""")
    with deploy.QemuBoard(firmware, rom=plan.romfs_image) as qemu:
        command = deploy.mpremote_command(plan, qemu.port, script, rom_loaded=True)
        proc = subprocess.run(command, capture_output=True, text=True, timeout=900)
    lines = {line.split(" ", 1)[0]: line.split(" ", 1)[1] for line in proc.stdout.splitlines()
             if " " in line}
    assert proc.returncode == 0 and "pure" in lines, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert lines["native"].strip() == "True", proc.stdout[-2000:]
    for kind in ("out", "pure"):
        assert bytes.fromhex(lines[kind].strip()) == cpython.tobytes(), kind


@pytest.mark.parametrize("board", ["qemu-mps2-an385", RV32])
def test_native_int_gemm_update_equals_pure_on_the_emulated_boards(firmware, rv32_firmware,
                                                                   armv6m_module, board,
                                                                   tmp_path):
    # 200 random updates (tests/device_scripts/inttrain_native.py) on the M3 (armv6m build)
    # and on the RISC-V core (rv32imc build)
    rv32 = board == RV32
    module = build_module("rv32imc") if rv32 else armv6m_module
    script = native_script("inttrain_native.py", 200)
    out = run_on_board(rv32_firmware if rv32 else firmware, tmp_path, module, script,
                       board=board)
    check_cases(out, script, 200)


INTGRAD = ("int_pool_grad", "int_clamp_mask", "int_clamp_bias_grad", "int_conv_grad_input",
           "int_conv_update")


@pytest.mark.parametrize("board,arch", [("qemu-mps2-an385", "armv6m"),
                                        ("qemu-mps2-an385", "armv7m"), (RV32, "rv32imc")])
def test_native_intgrad_kernels_equal_pure_on_the_emulated_boards(firmware, rv32_firmware,
                                                                  board, arch, tmp_path):
    # kernels/intgrad.py's five kernels (device/native/intgrad_native.c), 200 random cases
    # each (tests/device_scripts/intgrad_native.py), against CPython's pure kernels
    rv32 = board == RV32
    script = native_script("intgrad_native.py", 200)
    out = run_on_board(rv32_firmware if rv32 else firmware, tmp_path, build_module(arch),
                       script, board=board)
    pure_out = check_against_cpython(out, script, 200 * len(INTGRAD))
    for name in INTGRAD:
        fallback = int(pure_out.split(name + " cases 200 fallback")[1].split()[0])
        assert f"{name} cases 200 fallback {fallback} different 0" in out, out[-3000:]
        if name not in ("int_pool_grad", "int_clamp_mask"):    # no fallback: any int32
            assert fallback > 0, out[-3000:]     # the pure kernels' fallback exercised


def test_native_bias_grad_over_several_chunks_equals_pure(firmware, armv6m_module, tmp_path):
    # int_clamp_bias_grad with planes of 8,192-8,390 positions (more than one chunk of
    # intgrad.MAX_BIAS_SUM: the fold between chunks), on the M3 (armv6m build)
    script = native_script("intgrad_native.py", 10, "BIG_CASES = True\n")
    out = run_on_board(firmware, tmp_path, armv6m_module, script)
    check_against_cpython(out, script, 10)
    assert "int_clamp_bias_grad cases 10 fallback" in out and out.split()[-1] == "0", out
