"""The native modules a minimal runtime carries (device/native, device/native/float: machine
code for the board's architecture, shipped prebuilt in the device package): which builds a
blob's runtime takes, copying them beside the compiled runtime, and cutting the runtime's
imports of the float module's helpers when it does not carry it. tools/runtime.py re-exports
these names."""
import ast
import pathlib

from ..contract.ops import BY_CODE
from .train import device_package_dir

# The native int8 kernels (device/native: a MicroPython 1.25 dynamic native module, machine
# code) as scripts/build_natmod.sh --ship puts them in the device package, one build per
# architecture, so that neither deploy nor mip needs a cross toolchain. Installed beside the
# kernels as NATIVE_MODULE, kernels/fastpath.py picks its kernels over the viper ones.
NATIVE_BUILDS = "microtrain/kernels/native"
NATIVE_MODULE = "microtrain/kernels/qlinear_native.mpy"
# Every kernel the int8 module defines (device/native: mpy_init's and inttrain_globals'
# mp_store_global; tests/test_natmod_ship.py reads them from the sources), by family. A
# runtime carries the module when its blob calls one of them (NATIVE_KERNELS). A family
# whose kept kernels it defines all never imports its viper module beside it
# (kernels/fastpath.py tries the native module first and stops there): the runtime then
# leaves that module out (runtime._fast_paths), its flash and the fit check's heap for it.
NATIVE_DEFINES = {
    "qlinear": {"qlinear_gemm", "qlinear_conv", "qlinear_global_average_pool"},
    "inttrain": {"int_gemm_update", "int_gemm_update_momentum", "int_gemm_grad_input",
                 "int_conv1x1_update"},
    "intgrad": {"int_pool_grad", "int_clamp_mask", "int_clamp_bias_grad",
                "int_conv_grad_input", "int_conv_update"},
}
NATIVE_KERNELS = tuple(sorted(set().union(*NATIVE_DEFINES.values())))
# A board's mpy_arch -> the int8 module's build it takes. MicroPython loads an ARM module on
# its own and every later ARM architecture (persistentcode.c's MPY_FEATURE_ARCH_TEST), so FPU
# boards (armv7emsp) take the armv7m build; an architecture not named here (xtensawin: no
# toolchain on Debian) gets none and runs the viper kernels.
NATIVE_BUILD_FOR = {"armv6m": "armv6m", "armv7m": "armv7m", "armv7emsp": "armv7m",
                    "rv32imc": "rv32imc"}


# The native float kernels (device/native/float, `build_natmod.sh --float --ship`): the
# Gemm kernels of kernels/dense.py, the float updates of kernels/optim.py, reduce_sum (a
# Gemm's bias gradient), relu / relu_grad, kernels/conv.py's 2-D Conv and its gradients and
# kernels/pool.py's max_pool and max_pool_grad, bit for bit, in one module beside them (and two
# functions of the runtime's own modules, NATIVE_FLOAT_HELPERS); its builds shipped as those of the
# int8 module, except that FPU boards (armv7emsp) take a build of their own: their firmware
# is built for the hard-float ABI, which passes floats in FPU registers, while the armv7m
# build passes them in core registers, so its float arguments and results would cross the
# firmware's functions garbled (on the emulated Cortex-M4F every digits loss came out ln 10;
# the module refuses to load there). The armv7emsp build computes with the FPU's
# instructions (tests/test_board_m4.py).
NATIVE_FLOAT_BUILD_FOR = dict(NATIVE_BUILD_FOR, armv7emsp="armv7emsp")
NATIVE_FLOAT_MODULE = "microtrain/kernels/float_native.mpy"
NATIVE_FLOAT_KERNELS = {"dense": ("gemm", "gemm_accumulate", "batched_gemm"),
                        "optim": ("sgd", "adamw", "sgd_general", "adamw_general", "accumulate"),
                        "reduce": ("reduce_sum",), "activation": ("relu", "relu_grad"),
                        "conv": ("conv", "conv_grad_input", "conv_grad_weight"),
                        "pool": ("max_pool", "max_pool_grad")}


def op_codes(blob_path):
    """The op codes the blob's programs use, sorted."""
    from microtrain import parser as device_blob_parser
    b = device_blob_parser.load(str(blob_path), keep_steps=True)
    return sorted({record[0] for records in b.step_records.values() for record in records})


def native_build(arch, module="qlinear_native"):
    """The shipped build of the native module (qlinear_native, float_native) for a board of
    mpy_arch `arch` (a path), or None."""
    build = (NATIVE_FLOAT_BUILD_FOR if module == "float_native" else NATIVE_BUILD_FOR).get(arch)
    if build is None:
        return None
    path = device_package_dir() / NATIVE_BUILDS / build / f"{module}.mpy"
    return path if path.exists() else None


def native_modules(blob_path, arch):
    """{name on the board: path of the build} of the native modules with a kernel the blob's
    programs call, for the board's architecture: NATIVE_MODULE (int8), NATIVE_FLOAT_MODULE
    (float); {} when there is none or no build (the viper / pure-Python kernels run)."""
    kernels = {BY_CODE[op].kernel for op in op_codes(blob_path)}
    modules = {}
    for name, wanted in ((NATIVE_MODULE, NATIVE_KERNELS),
                         (NATIVE_FLOAT_MODULE, [k for family in NATIVE_FLOAT_KERNELS.values()
                                                for k in family])):
        build = native_build(arch, name.rsplit("/", 1)[1][:-4])
        if build is not None and kernels & set(wanted):
            modules[name] = build
    return modules


def add_native_modules(modules, out_dir):
    """Copy native_modules()' {name: path} into a compiled runtime's out_dir (compile_runtime)
    and return {name: bytes}, as compile_runtime does for the .mpy it compiles."""
    sizes = {}
    for name, path in modules.items():
        target = pathlib.Path(out_dir) / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(pathlib.Path(path).read_bytes())
        sizes[name] = target.stat().st_size
    return sizes




def native_package_archs():
    """The architectures with a shipped native build, each with its device/package-<arch>.json."""
    return sorted(set(NATIVE_BUILD_FOR.values()) | set(NATIVE_FLOAT_BUILD_FOR.values()))


# Two functions of the runtime's own modules that the float module has in machine code: the
# train call's gradient check (module.py's largest_abs) and the copy of a float input
# (feed.py's _LOAD). feed.py looks for the module with `FLOAT_NATIVE = __import__(float
# module)` in a try block, None when it is missing, and both take their function from it
# with `NAME = FLOAT_NATIVE and FLOAT_NATIVE.function`. A runtime that does not carry the
# module gets `FLOAT_NATIVE = None` in place of that block and `NAME = None` in place of
# those lines: the lookup's bytecode shipped for nothing.
NATIVE_FLOAT_HELPERS = ("microtrain/feed.py", "microtrain/module.py")
NATIVE_FLOAT_NAME = "FLOAT_NATIVE"


def cut_float_helpers(sources, native):
    """sources ({path: text}) with NATIVE_FLOAT_HELPERS' lookups of the float module and of
    its functions set to None when the runtime does not carry it (native: the native
    modules' names). The lines stay where they were (blanked), so that a traceback's line
    numbers are the source's."""
    if NATIVE_FLOAT_MODULE in native:
        return sources
    module = NATIVE_FLOAT_MODULE[:-4].replace("/", ".")
    for path in NATIVE_FLOAT_HELPERS:
        if path not in sources:
            continue
        lines = sources[path].split("\n")
        for node in ast.parse(sources[path]).body:
            if _takes_from_float_module(node):
                lines[node.lineno - 1] = f"{node.targets[0].id} = None"
            if not (isinstance(node, ast.Try) and len(node.body) == 1
                    and isinstance(node.body[0], ast.Assign)):
                continue
            call = node.body[0].value
            if (isinstance(call, ast.Call) and getattr(call.func, "id", None) == "__import__"
                    and isinstance(call.args[0], ast.Constant) and call.args[0].value == module):
                name = node.body[0].targets[0].id
                for i in range(node.lineno - 1, node.end_lineno):
                    lines[i] = ""
                lines[node.lineno - 1] = f"{name} = None"
        sources[path] = "\n".join(lines)
    return sources


def _takes_from_float_module(node):
    """True for a one-line `NAME = FLOAT_NATIVE and FLOAT_NATIVE.function`."""
    value = getattr(node, "value", None)
    return (isinstance(node, ast.Assign) and node.lineno == node.end_lineno
            and isinstance(value, ast.BoolOp) and isinstance(value.op, ast.And)
            and len(value.values) == 2 and ast.unparse(value.values[0]) == NATIVE_FLOAT_NAME
            and isinstance(value.values[1], ast.Attribute)
            and ast.unparse(value.values[1].value) == NATIVE_FLOAT_NAME)
