"""The native int8 kernels as users get them (host side; the boards: test_board_natmod.py):
the builds shipped in the device package (scripts/build_natmod.sh --ship) are those of
today's sources and of the architecture their directory names; the minimal runtime of a
blob whose kernels have a native form carries the board's build, and a board without one
gets none; `deploy --dry-run` lists it with its bytes; the fit check counts its heap; mip's
package-<arch>.json files list it."""
import hashlib
import json
import re
import shutil

import pytest

from conftest import DEVICE, ROOT
from microtrain_host.cli import main
from microtrain_host.tools import boards, deploy, runtime

NATIVE = DEVICE / "microtrain" / "kernels" / "native"
# the .mpy header's third byte: the architecture << 2 | the sub-version (3 for v6.3);
# py/persistentcode.h's MP_NATIVE_ARCH_* numbers
ARCH_NUMBER = {"armv6m": 4, "armv7m": 5, "armv7emsp": 7, "xtensawin": 10, "rv32imc": 11}


def test_shipped_builds_are_of_todays_sources_and_their_architecture():
    native = ROOT / "device" / "native"
    sources = ([native / "Makefile"] + sorted(native.glob("*.c")) + sorted(native.glob("*.S"))
               + sorted(native.glob("*.h")))
    digest = hashlib.sha256(b"".join(p.read_bytes() for p in sources)).hexdigest()
    assert (NATIVE / "SOURCES.sha256").read_text().split() == [digest], \
        "device/native changed: run scripts/build_natmod.sh --ship armv6m armv7m rv32imc"
    assert runtime.native_package_archs() == ["armv6m", "armv7emsp", "armv7m", "rv32imc"]
    for arch in sorted(set(runtime.NATIVE_BUILD_FOR.values())):   # armv7emsp: armv7m's
        head = (NATIVE / arch / "qlinear_native.mpy").read_bytes()[:3]
        assert head == bytes([ord("M"), 6, ARCH_NUMBER[arch] << 2 | 3]), arch


def test_every_board_architecture_gets_a_build_it_loads_or_none():
    for name in boards.board_names():
        arch = boards.load_board(name)["mpy_arch"]
        build = runtime.native_build(arch)
        if arch == "xtensawin":
            assert build is None
            continue
        # MicroPython 1.25 loads an ARM module of its own or an earlier ARM architecture
        # (MPY_FEATURE_ARCH_TEST), another architecture's only when it is the same
        loaded = build.read_bytes()[2] >> 2
        if arch.startswith("arm"):
            assert ARCH_NUMBER["armv6m"] <= loaded <= ARCH_NUMBER[arch], name
        else:
            assert loaded == ARCH_NUMBER[arch], name
        # the float module passes floats: an FPU board (hard-float ABI) takes its own build
        float_build = runtime.native_build(arch, "float_native")
        if arch == "armv7emsp":
            assert float_build.read_bytes()[2] >> 2 == ARCH_NUMBER[arch], name
        else:
            assert float_build.parent == build.parent, name


@pytest.mark.parametrize("arch", ["armv6m", "armv7emsp", "armv7m", "rv32imc"])
def test_mip_package_of_each_architecture_lists_its_build(arch):
    text = (DEVICE / f"package-{arch}.json").read_text()
    assert json.loads(text) == json.loads(runtime.package_json(arch)), \
        "stale: regenerate device/package-*.json with runtime.package_json(arch)"
    urls = dict(json.loads(text)["urls"])
    pure = dict(json.loads((DEVICE / "package.json").read_text())["urls"])
    assert set(urls) - set(pure) == {"microtrain/kernels/qlinear_native.mpy",
                                     "microtrain/kernels/float_native.mpy"}
    # mip resolves the URLs against the package file's directory
    for module in ("qlinear_native", "float_native"):   # the builds deploy ships
        assert (DEVICE / urls[f"microtrain/kernels/{module}.mpy"]).read_bytes() == \
            runtime.native_build(arch, module).read_bytes()
    if arch == "armv7emsp":   # the int8 module has no float in its calls: armv7m's build
        assert urls["microtrain/kernels/qlinear_native.mpy"].endswith("armv7m/qlinear_native.mpy")
        assert urls["microtrain/kernels/float_native.mpy"].endswith(
            "armv7emsp/float_native.mpy")
    assert all((DEVICE / url).exists() for url in urls.values())


@pytest.fixture(scope="module")
def int8_artifacts(tmp_path_factory):
    """The digits MLP's integer training artifacts (classifier trained, the first layer a
    frozen int8 Gemm) as deploy takes them: model.mtb and checkpoint."""
    from microtrain_host import export_inference_model, generate_artifacts
    from microtrain_host.quant.inttrain import int8_training_artifacts
    tmp = tmp_path_factory.mktemp("natmod_ship")
    digits = ROOT / "examples" / "digits"
    generate_artifacts(str(digits / "mlp.onnx"), artifact_directory=str(tmp / "qat"),
                       batch_size=1, quantization=True)
    export_inference_model(tmp / "qat", tmp / "qat" / "checkpoint", tmp / "qdq.onnx", qdq=True)
    info = int8_training_artifacts(tmp / "qdq.onnx", tmp / "int", 0.05)
    art = tmp / "art"
    art.mkdir()
    shutil.copy(info["blob"], art / "model.mtb")
    shutil.copy(tmp / "int" / "int8_train.ckpt", art / "checkpoint")
    return art


def test_runtime_of_an_int8_blob_carries_the_boards_build(int8_artifacts):
    blob = int8_artifacts / "model.mtb"
    assert "qlinear_gemm" in {runtime.BY_CODE[op].kernel for op in runtime.op_codes(blob)}
    rp2040 = boards.load_board("rp2040-pico")
    assert boards.native_for(blob, rp2040, "romfs") == {
        "microtrain/kernels/qlinear_native.mpy": NATIVE / "armv6m" / "qlinear_native.mpy"}
    assert boards.native_for(blob, boards.load_board("pyboard"), "files") == {
        "microtrain/kernels/qlinear_native.mpy": NATIVE / "armv7m" / "qlinear_native.mpy"}
    # no build for the ESP32's Xtensa, and none with a frozen runtime: no error, viper runs
    assert boards.native_for(blob, boards.load_board("esp32"), "files") == {}
    assert boards.native_for(blob, rp2040, "frozen") == {}


def test_native_defines_lists_what_the_module_defines():
    """runtime.NATIVE_DEFINES (which viper modules a runtime with the int8 module leaves
    out) names exactly the kernels the module's sources store in its globals."""
    stored = set()
    for source in (ROOT / "device" / "native").glob("*.c"):
        stored |= set(re.findall(r"mp_store_global\(MP_QSTR_(\w+)", source.read_text()))
    assert stored - {"_pure"} == set().union(*runtime.NATIVE_DEFINES.values())
    # and each family's names are kernels of that family
    for family, names in runtime.NATIVE_DEFINES.items():
        module = __import__(f"microtrain.kernels.{family}", None, None, ("x",))
        assert all(callable(getattr(module, name, None)) for name in names), family


def test_a_float_blob_gets_the_float_module(tmp_path):
    assert main(["pack", str(ROOT / "examples" / "digits" / "mlp.onnx"), "-o",
                 str(tmp_path), "--batch-size", "2"]) == 0
    blob = tmp_path / "model.mtb"
    assert runtime.native_modules(blob, "armv6m") == {
        runtime.NATIVE_FLOAT_MODULE: NATIVE / "armv6m" / "float_native.mpy"}
    # an FPU board its own build (the armv7m build's soft-float ABI garbles floats crossing
    # its hard-float firmware: tests/test_board_m4.py), Xtensa none
    assert runtime.native_modules(blob, "armv7m") == {
        runtime.NATIVE_FLOAT_MODULE: NATIVE / "armv7m" / "float_native.mpy"}
    assert runtime.native_modules(blob, "armv7emsp") == {
        runtime.NATIVE_FLOAT_MODULE: NATIVE / "armv7emsp" / "float_native.mpy"}
    assert runtime.native_modules(blob, "xtensawin") == {}
    # the runtime carrying it keeps the Gemm and optimizer families' switch to it, and
    # fastpath.py; without it the switch is cut
    with_module = runtime.minimal_sources(blob, native={runtime.NATIVE_FLOAT_MODULE: "x"})
    without = runtime.minimal_sources(blob)
    assert "microtrain/kernels/fastpath.py" in with_module
    assert "microtrain/kernels/fastpath.py" not in without
    for family in ("dense", "optim"):
        text = with_module[f"microtrain/kernels/{family}.py"]
        assert "FAST = use_fast()" in text and "float_native" in text
        assert "FAST = use_fast()" not in without[f"microtrain/kernels/{family}.py"]
    # ... and the runtime's own lookups of it (feed.FLOAT_NATIVE, its load_floats and
    # module.py's largest_abs) are None without it, on the lines they had
    for path, name in (("microtrain/feed.py", "FLOAT_NATIVE"), ("microtrain/feed.py", "_LOAD"),
                       ("microtrain/module.py", "largest_abs")):
        kept, cut = with_module[path].split("\n"), without[path].split("\n")
        assert len(cut) == len(kept) and kept.count(name + " = None") == 0, (path, name)
        assert cut.count(name + " = None") == 1, (path, name)
    assert not any("microtrain.kernels.float_native" in text for text in without.values())


def test_shipped_float_builds_are_of_todays_sources():
    native = ROOT / "device" / "native" / "float"
    sources = ([native / "Makefile"] + sorted(native.glob("*.c")) + sorted(native.glob("*.S"))
               + sorted(native.glob("*.h")))
    digest = hashlib.sha256(b"".join(p.read_bytes() for p in sources)).hexdigest()
    assert (NATIVE / "FLOAT_SOURCES.sha256").read_text().split() == [digest], \
        "device/native/float changed: run scripts/build_natmod.sh --float --ship armv6m " \
        "armv7m armv7emsp rv32imc"
    for arch in runtime.native_package_archs():
        head = (NATIVE / arch / "float_native.mpy").read_bytes()[:3]
        assert head == bytes([ord("M"), 6, ARCH_NUMBER[arch] << 2 | 3]), arch


def test_fit_check_counts_the_native_modules_heap(int8_artifacts):
    rp2040 = boards.load_board("rp2040-pico")
    with_native = boards.predict(int8_artifacts, rp2040, "romfs")
    without = boards.predict(int8_artifacts, rp2040, "romfs", native={})
    size = (NATIVE / "armv6m" / "qlinear_native.mpy").stat().st_size
    assert with_native.native_mpy == size
    assert with_native.native_code == int(boards.NATIVE_HEAP_PER_MPY_BYTE * size)
    # the module defines every qlinear kernel the blob keeps: the runtime leaves out
    # qlinear_viper (runtime._fast_paths), whose machine code the heap no longer holds
    assert with_native.machine_mpy < without.machine_mpy
    assert with_native.code - with_native.native_code < without.code
    for phase in ("code", "train", "load", "resume", "reload", "needed"):
        assert getattr(with_native, phase) - getattr(without, phase) == \
            with_native.code - without.code, phase


def test_the_runtime_builder_ships_the_native_module(int8_artifacts, tmp_path, capsys):
    # what deploy and the fit check carry to a board for a blob with int8 Gemm / Conv steps
    blob = int8_artifacts / "model.mtb"
    pico = boards.load_board("rp2040-pico")
    native = boards.native_for(blob, pico, "files")
    size = (NATIVE / "armv6m" / "qlinear_native.mpy").stat().st_size
    assert native == {"microtrain/kernels/qlinear_native.mpy":
                      NATIVE / "armv6m" / "qlinear_native.mpy"}
    plan = deploy.Plan(pico, "files", int8_artifacts, {}, None, None, None, 1)
    plan.native = native
    rt = deploy.write_runtime(plan, blob, tmp_path / "rt")
    assert (rt / "microtrain" / "kernels" / "qlinear_native.mpy").read_bytes() == \
        (NATIVE / "armv6m" / "qlinear_native.mpy").read_bytes()
    # the module defines all of the qlinear kernels the blob keeps: no qlinear_viper beside
    # it (fastpath.py would never import it); a family it does not cover keeps its viper
    assert not (rt / "microtrain" / "kernels" / "qlinear_viper.mpy").exists()
    assert (rt / "microtrain" / "kernels" / "fastpath.mpy").exists()
    without = runtime.minimal_sources(blob)
    assert "microtrain/kernels/qlinear_viper.py" in without
    assert "microtrain/kernels/qlinear_viper.py" not in runtime.minimal_sources(
        blob, native=native)
    assert boards.native_for(blob, boards.load_board("esp32"), "files") == {}
    assert boards.native_for(blob, pico, "frozen") == {}
    assert boards.native_heap(native) == int(boards.NATIVE_HEAP_PER_MPY_BYTE * size)
    # `microtrain deploy` ships it with the native module, and the samples quantized for
    # its uint8 input (tests/test_int8_tools.py checks the bytes)
    assert main(["deploy", str(int8_artifacts), "--board", "rp2040-pico", "--dry-run",
                 "--data", str(ROOT / "examples" / "digits" / "digits.npz")]) == 0
    out = capsys.readouterr().out
    assert "qlinear_native.mpy" in out and "x_train.u8" in out and "x_train.f32" not in out


def test_inspect_board_counts_the_native_module(int8_artifacts, capsys):
    blob = str(int8_artifacts / "model.mtb")
    assert main(["inspect", blob, "--no-steps", "--board", "rp2040-pico"]) == 0
    out = capsys.readouterr().out
    assert "the native kernels' machine code (" in out and "native int8 dense MACs" in out
    # an ESP32 gets no build: neither counted nor estimated
    assert main(["inspect", blob, "--no-steps", "--board", "esp32"]) == 0
    out = capsys.readouterr().out
    assert "native" not in out and "int8 dense MACs x 59.1" in out


def test_deploy_ships_the_float_module_unless_refused(tmp_path, capsys):
    """The digits MLP's deploy to the Pico carries the armv6m float module (listed with its
    bytes, its heap in the fit check, fastpath.py with it); --no-native ships neither."""
    assert main(["pack", str(ROOT / "examples" / "digits" / "mlp.onnx"), "-o",
                 str(tmp_path), "--batch-size", "8"]) == 0
    data = str(ROOT / "examples" / "digits" / "digits.npz")
    size = (NATIVE / "armv6m" / "float_native.mpy").stat().st_size
    assert main(["deploy", str(tmp_path), "--board", "rp2040-pico", "--steps", "1", "--data",
                 data, "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert out.split("microtrain/kernels/float_native.mpy")[1].split()[0] == f"{size:,d}"
    assert "microtrain/kernels/fastpath.mpy" in out
    assert f"the native kernels' machine code ({size:,d} B of .mpy" in out
    # counted at the armv6m build's cost (step_cost.NATIVE_FLOAT_BUILDS)
    assert "native armv6m float dense MACs" in out and "native armv6m AdamW updates" in out
    assert "left out" not in out
    assert main(["deploy", str(tmp_path), "--board", "rp2040-pico", "--steps", "1", "--data",
                 data, "--dry-run", "--no-native"]) == 0
    out = capsys.readouterr().out
    assert "float_native" not in out and "fastpath" not in out and "native" not in out


def test_deploy_and_inspect_leave_the_native_modules_out_where_they_cost_the_heap(
        tmp_path, capsys):
    # LeNet (AdamW) on the emulated Cortex-M3: with the float module the fit leaves under
    # NATIVE_SLACK of the heap free (a resumed run ran out of memory there), so deploy
    # ships none, its dry run and `inspect --board` say so, and both estimate the step
    # with the bytecode kernels (the digits MLP keeps it: the test above).
    from conftest import lenet_board_artifacts
    artifacts, _ = lenet_board_artifacts(tmp_path, "AdamW", 1)
    m3 = boards.load_board("qemu-mps2-an385")
    assert boards.native_for(artifacts / "model.mtb", m3, "files")   # a build exists
    native, left_out = boards.choose_native(artifacts, m3, "files")
    assert native == {} and left_out.native_code > 0
    assert left_out.needed > (1 - boards.NATIVE_SLACK) * left_out.heap
    plan = deploy.plan(artifacts, "qemu-mps2-an385", placement="files")
    assert plan.native == {} and plan.fit.native_code == 0
    assert plan.fit.needed == boards.predict(artifacts, m3, "files", native={}).needed
    for argv in (["deploy", str(artifacts), "--board", "qemu-mps2-an385", "--dry-run",
                  "--runtime", "files", "--data", str(tmp_path / "data.npz")],
                 ["inspect", str(artifacts / "model.mtb"), "--no-steps", "--board",
                  "qemu-mps2-an385", "--runtime", "files"]):
        assert main(argv) == 0
        out = capsys.readouterr().out
        assert "native kernels   left out (float_native)" in out, argv
        assert "float_native.mpy" not in out.split("fit check on")[0], argv
        assert "native armv" not in out, argv        # the estimate counts bytecode kernels
