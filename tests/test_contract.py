"""The host and the device share no code, only the contract (host/microtrain_host/contract/):
these tests keep the device's generated copies current, the readers true to the schemas,
and the code layered (no import cycle, no oversized module)."""
import ast
import re

import pytest

from conftest import ROOT
from microtrain import blob as device_blob
from microtrain import opcodes as device_ops
from microtrain_host import opcodes as host_ops
from microtrain_host.contract import facts, generate, ops, schema
from microtrain_host.ir import ROLES
from microtrain_host.registry import LOWERINGS

HOST = ROOT / "host" / "microtrain_host"
DEVICE = ROOT / "device" / "microtrain"


def test_generated_files_are_current():
    # the device's op-code table and const() blocks, the host's op codes: regenerate with
    # python -m microtrain_host.contract.generate
    assert generate.stale() == []


def device_signatures():
    """{op code: (family, function, tensor kinds, int count, float count)} of the device's
    table, read through its own lookup."""
    codes = [int(c) for c in re.findall(r'^    "\\n(\d+) ', (DEVICE / "opcodes.py").read_text(),
                                         re.M)]
    return {code: device_ops.signature(code) for code in codes}


def test_op_codes_agree():
    host = {name: value for name, value in vars(host_ops).items()
            if name.isupper() and isinstance(value, int)}
    assert host == {o.name: o.code for o in ops.OPS}
    assert device_signatures() == {o.code: (o.family, o.kernel, o.kinds, o.int_count,
                                            o.float_count) for o in ops.OPS}
    assert device_ops.signature(0) is None and device_ops.signature(2**16 - 1) is None


def test_every_kernel_exists_with_its_load_time_checker():
    # "Validate once at load, kernels trust their inputs": parser._read_steps calls
    # <kernel>_check(args, c) for every step.
    for code, (family, function, *_rest) in device_signatures().items():
        module = device_ops.kernel_module(family)
        assert callable(getattr(module, function)), (code, function)
        assert callable(getattr(module, function + "_check", None)), (code, function + "_check")


# Families whose checkers read a step's arguments by the contract's names (`n, = c.ints`, `y,
# x = c.offsets`), never by their place in args, where the byte arena comes first and a
# weight's buffer last for some kernels and not for others (issue 20).
NAMED_FIELD_FAMILIES = ("quant", "qlinear", "inttrain", "intgrad")


def test_checkers_read_named_fields():
    for family in NAMED_FIELD_FAMILIES:
        tree = ast.parse((DEVICE / "kernels" / f"{family}.py").read_text())
        for function in tree.body:
            if not (isinstance(function, ast.FunctionDef) and function.name.endswith("_check")):
                continue
            for node in ast.walk(function):
                # args may be passed on to another checker, not indexed or unpacked
                positional = (isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name)
                              and node.value.id == "args"
                              or isinstance(node, (ast.Assign, ast.Starred))
                              and isinstance(node.value, ast.Name) and node.value.id == "args")
                assert not positional, f"{family}.py line {node.lineno}: {function.name} reads args"


def test_roles_and_dtypes_are_the_schemas_enums():
    assert tuple(ROLES) == tuple(device_blob.ROLE_NAMES) == facts.ROLES
    enums = schema.blob_schema().enums
    assert [name.lower() for name in enums["Role"][1]] == list(ROLES)
    assert {n: getattr(device_blob, n) for n in enums["DType"][1]} == dict(enums["DType"][1])


def _reads(path):
    """Every r.<read>(table, FIELD, ...) call of a device module: (method, field argument
    node, format, default)."""
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr in ("scalar", "scalars", "string", "vector", "table",
                                       "tables", "field") and len(node.args) >= 2
                and isinstance(node.func.value, ast.Name) and node.func.value.id == "r"):
            yield node


def test_device_readers_name_every_field_and_agree_with_the_schemas():
    # No literal field numbers: each read names its field by a generated const(), and a
    # scalar's format and default are the schema's.
    tables = {}
    for which, prefix in (("microtrain.fbs", ""), ("checkpoint.fbs", "CK_")):
        for table in schema.load(which).tables.values():
            for f in table.fields:
                tables[f"_{prefix}{generate.snake(table.name)}_{f.name.upper()}"] = f
    formats = {"bool": "B", "ubyte": "B", "DType": "B", "Role": "B", "uint16": "H",
               "uint32": "I", "int32": "i", "int64": "q", "float": "f"}
    checked = 0
    for path in sorted(DEVICE.rglob("*.py")):
        for call in _reads(path):
            field = call.args[1]
            where = f"{path.relative_to(ROOT)}:{call.lineno}"
            assert not isinstance(field, ast.Constant), \
                f"{where}: field number {field.value} written out: name it (a generated const)"
            if not (isinstance(field, ast.Name) and field.id in tables):
                continue        # a loop's variable over generated names
            f = tables[field.id]
            if call.func.attr == "scalar" and all(isinstance(a, ast.Constant) or (
                    isinstance(a, ast.UnaryOp) and isinstance(a.operand, ast.Constant))
                    for a in call.args[2:4]):
                fmt, default = ast.literal_eval(call.args[2]), ast.literal_eval(call.args[3])
                assert fmt == formats[f.type], f"{where}: {f.name} is {f.type}, read as {fmt}"
                if f.type == "uint32" and field.id == "_PARAMETER_TENSOR":
                    continue    # read with NO_TENSOR as the default: a missing one is refused
                assert default == f.default or (f.type == "bool" and default == int(f.default)), \
                    f"{where}: {f.name}'s default is {f.default!r}, read with {default!r}"
            checked += 1
    assert checked > 80


def test_lowered_steps_carry_what_the_op_table_names():
    # ir.check_step runs on every step the blob writer writes; a wrong count is a bug caught
    # before the device would refuse the blob
    from microtrain_host.ir import check_step
    check_step(host_ops.GEMM, [0, 1, 2, 3], range(9), [1.0, 1.0], "n")
    with pytest.raises(RuntimeError, match="GEMM has 4 tensors, 8 ints"):
        check_step(host_ops.GEMM, [0, 1, 2, 3], range(8), [1.0, 1.0], "n")
    check_step(host_ops.RESIZE_LINEAR, [0, 1], range(40), [0.5] * 30, "n")   # tables: any
    assert LOWERINGS


def _imports(path, module, known):
    tree = ast.parse(path.read_text())
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(tree):     # imports inside functions count: a cycle is a cycle
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name in known)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([node.module] if node.module else []))
            subs = [f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in known]
            found.update(subs)
            if base in known and len(subs) < len(node.names):
                found.add(base)
    found.discard(module)
    return found


def _modules(root, package):
    out = {}
    for path in sorted((root / package).rglob("*.py")):
        name = ".".join(path.relative_to(root).with_suffix("").parts)
        out[name[:-len(".__init__")] if name.endswith(".__init__") else name] = path
    return out


@pytest.mark.parametrize("root,package", [(ROOT / "host", "microtrain_host"),
                                          (ROOT / "device", "microtrain")])
def test_no_import_cycles(root, package):
    modules = _modules(root, package)
    graph = {m: _imports(p, m, modules) for m, p in modules.items()}
    # a package's __init__ importing its own submodules is not a dependency of theirs
    for m in graph:
        graph[m] = {d for d in graph[m] if not (d == package and m.startswith(package + "."))}
    cycles = []
    state = {}

    def visit(m, trail):
        state[m] = 1
        for d in sorted(graph[m]):
            if state.get(d) == 1:
                cycles.append(trail[trail.index(d):] + [d])
            elif d not in state:
                visit(d, trail + [d])
        state[m] = 2
    for m in sorted(graph):
        if m not in state:
            visit(m, [m])
    assert cycles == []


def test_the_host_is_layered():
    # ops/ and formats/ build on ir.py and the contract, never on the pipeline's stages;
    # the pipeline never on quant/ or the drivers above it
    modules = _modules(ROOT / "host", "microtrain_host")
    for name, path in modules.items():
        deps = _imports(path, name, modules)
        if name.startswith(("microtrain_host.ops", "microtrain_host.formats",
                            "microtrain_host.contract")) or name in (
                "microtrain_host.ir", "microtrain_host.graph"):
            assert not {d for d in deps if d.startswith(("microtrain_host.pipeline",
                                                         "microtrain_host.quant"))}, name
        if name.startswith("microtrain_host.pipeline"):
            assert not {d for d in deps if d.startswith("microtrain_host.quant") or d in (
                "microtrain_host.artifacts", "microtrain_host.export")}, name


def test_no_module_is_oversized():
    long = {}
    for root in (HOST, DEVICE):
        for path in root.rglob("*.py"):
            lines = len(path.read_text().splitlines())
            limit = 600 if path.name.endswith("_viper.py") else 500
            if lines > limit:
                long[str(path.relative_to(ROOT))] = lines
    assert long == {}
