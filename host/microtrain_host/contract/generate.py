"""Write the device's and the host's copies of the contract (and check them).

    python -m microtrain_host.contract.generate          # rewrite what is stale
    python -m microtrain_host.contract.generate --check  # exit 1 and name what is stale

Whole files: device/microtrain/opcodes.py (a row per op code, signature(), kernel_module)
and host/microtrain_host/opcodes.py (the same codes as plain ints), from contract/ops.py;
and the op table of docs/design.md (between its "<!-- contract: op table" and
"<!-- end of contract -->" lines).

Blocks inside device modules: a module that needs schema field numbers, dtypes, roles,
control names or the optimizer table carries a block (holding, of a table's fields, those
the module names)

    # contract: blob Model Tensor; dtypes
    ... generated lines ...
    # end of contract

whose first line says what it holds, and this script fills in the lines: the device has no
flatbuffers package and must not pay RAM for tables it can have as const()s, which
MicroPython folds into the bytecode (names starting with "_" cost nothing at run time).
Items of the first line, separated by ";":
    blob T1 T2 ...        _T_FIELD = const(n) for each field of those microtrain.fbs tables
    checkpoint T1 T2 ...  _CK_T_FIELD = const(n) for checkpoint.fbs tables
    dtypes                FLOAT, INT32, INT8, UINT8 as const()s and ITEM_BYTES
    roles                 ROLE_NAMES and ROLE_<NAME> const()s
    controls              _LAZY_RESET_GRAD, _LEARNING_RATE, _STEP, _STEP_SIZE (tensor names)
    optimizer_options     _OPTIONS (name, field, format, default, low, high of each option)
    optimizer_kinds       _OPTIMIZERS (kind -> (writes step_size, non-negative state index))
    checkpoint_facts      identifier, version, trailer, ONNX tensor types (_TENSOR_TYPES)
    format                IDENTIFIER, FORMAT_VERSION, NO_TENSOR of the blob
    private               _FLOAT, _ROLE_LABEL, _NO_TENSOR, ... (the const()s of dtypes, roles
                          and format, private): those the module names
"""
import pathlib
import re
import struct
import sys

from . import facts, ops, schema

HOST = pathlib.Path(__file__).resolve().parents[1]             # host/microtrain_host
ROOT = HOST.parents[1]
DEVICE = ROOT / "device" / "microtrain"
MARK = "# contract: "
END = "# end of contract"
NOTE = ("# (generated from host/microtrain_host/contract/ by "
        "`python -m microtrain_host.contract.generate`; do not edit)")


def snake(name):
    """OptimizerConfig -> OPTIMIZER_CONFIG"""
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", name).upper()


# -- whole files ----------------------------------------------------------------------------

def device_opcodes():
    lines = ["# Device op codes: the kernel each op code names, as the host's lowering targets them.",
             NOTE,
             "",
             "# One row per op code: \"<code> <kernel family module> <function> <tensor kinds> <int",
             "# count> <float count>\". Tensor kinds: \"f\" float arena, \"i\" int arena, \"?\" float",
             "# arena or no tensor, \"b\" byte arena (int8 / uint8; the kernel's args then start with the",
             "# byte arena), \"k\" int arena or no tensor, \"w\" an int8 weight (byte arena, or in place",
             "# where the blob is: the buffer it is in then ends the kernel's args). A count of -1: as many",
             "# as the step carries (tables that come with the geometry); the kernel's checker checks the",
             "# exact counts (StepCheck.counts). One string constant, not a dict: it stays in the .mpy",
             "# (in flash when frozen or in a ROM filesystem) where a dict of tuples took ~11 KB of heap;",
             "# it is read only while a blob loads. The op names are the host's (opcodes.py there).",
             "_ROWS = (",
             "    \"\"  # a runtime trimmed to a model keeps the rows of its op codes only"]
    for o in ops.OPS:
        lines.append(f"    \"\\n{o.code} {o.family} {o.kernel} {o.kinds} {o.int_count} "
                     f"{o.float_count}\"  # {o.name}")
    lines += ["    \"\\n\")",
              "",
              "",
              "def signature(op):",
              "    # (family, function, tensor kinds, int count, float count) of op code op, or None",
              "    at = _ROWS.find(\"\\n%d \" % op)",
              "    if at < 0:",
              "        return None",
              "    row = _ROWS[at + 1:_ROWS.find(\"\\n\", at + 1)].split()",
              "    return row[1], row[2], row[3], int(row[4]), int(row[5])",
              "",
              "",
              "def kernel_module(family):",
              "    # Import only the kernel families a model uses, so a board can carry only those files."]
    for i, family in enumerate(ops.FAMILIES):
        keyword = "if" if i == 0 else "elif"
        lines += [f"    {keyword} family == \"{family}\":",
                  f"        from microtrain.kernels import {family} as module"]
    lines += ["    else:",
              "        raise ImportError(\"no kernel family \" + family)",
              "    return module"]
    return "\n".join(lines) + "\n"


def host_opcodes():
    lines = ['"""Device op codes (the kernel table), as plain ints for the lowering.',
             "",
             "Generated from contract/ops.py by `python -m microtrain_host.contract.generate`: do not",
             'edit; the op table (named arguments, families, flags) is contract.ops."""', ""]
    lines += [f"{o.name} = {o.code}" for o in ops.OPS]
    return "\n".join(lines) + "\n"


FILES = {DEVICE / "opcodes.py": device_opcodes, HOST / "opcodes.py": host_opcodes}
DOCS = ROOT / "docs" / "design.md"
DOC_MARK = "<!-- contract: op table"
DOC_END = "<!-- end of contract -->"


def _ranges(codes):
    out, start = [], None
    for code in sorted(codes) + [None]:
        if start is None:
            start = prev = code
        elif code is None or code != prev + 1:
            out.append(str(start) if start == prev else f"{start}-{prev}")
            start = prev = code
        else:
            prev = code
    return ", ".join(out)


def doc_table():
    """The op table of docs/design.md: codes, family, ops."""
    lines = ["| codes | family (`kernels/<family>.py`) | ops |", "|---|---|---|"]
    families = sorted(ops.FAMILIES, key=lambda f: min(o.code for o in ops.OPS if o.family == f))
    for family in families:
        members = [o for o in ops.OPS if o.family == family]
        names = ", ".join(o.name for o in members)
        lines.append(f"| {_ranges([o.code for o in members])} | `{family}` | {names}: "
                     f"{ops.FAMILY_NOTES[family]} |")
    return lines


def fill_docs(text):
    lines = text.split("\n")
    start = next(i for i, line in enumerate(lines) if line.startswith(DOC_MARK))
    end = lines.index(DOC_END, start)
    return "\n".join(lines[:start + 1] + doc_table() + lines[end:])


# -- blocks inside device modules -----------------------------------------------------------

def _fields(which, tables, prefix, used):
    # only the fields the module names (used: its text outside the block)
    s = schema.load(which)
    out = []
    for table in tables:
        for f in s[table].fields:
            name = f"_{prefix}{snake(table)}_{f.name.upper()}"
            if re.search(r"\b%s\b" % name, used):
                out.append(f"{name} = const({f.number})")
    return out


def _dtypes():
    names = list(facts.DTYPES)
    out = [f"{name} = const({facts.DTYPES[name]})" for name in names]
    out.append("ITEM_BYTES = (%s)  # by dtype" % ", ".join(str(facts.ITEM_BYTES[n]) for n in names))
    return out


def _roles():
    out = ["ROLE_NAMES = (%s)" % ", ".join(f'"{r}"' for r in facts.ROLES)]
    out += [f"ROLE_{r.upper()} = const({i})" for i, r in enumerate(facts.ROLES)]
    return out


def _controls(used):
    return [f'_{name.upper()} = "{name}"' for name in facts.CONTROLS
            if re.search(r"\b_%s\b" % name.upper(), used)]


def _optimizer_options():
    config = schema.blob_schema()["OptimizerConfig"]
    out = ["# (name, OptimizerConfig field, struct format, default, lowest, highest) of each",
           "# option, as float32 values (a range open at the top ends at the float32 below it);",
           "# a flag is 0 or 1",
           "_OPTIONS = ("]
    for name, option in facts.OPTIONS.items():
        f = config[name]
        if option.flag:
            default, low, high = int(f.default), 0, 1
        else:
            default, low, high = f.default, option.low, option.high
            if option.high_open:
                high = _float32_below(high)
        out.append(f'    ("{name}", {f.number}, "{f.scalar}", {default!r}, {low!r}, {high!r}),')
    out.append(")")
    return out


def _optimizer_kinds():
    return ["# kind -> (writes the bias-corrected step_size, index of a state that must not be "
            "negative or -1)",
            "_OPTIMIZERS = {%s}" % ", ".join(f'"{k.name}": ({int(k.step_size)}, '
                                            f'{k.nonnegative_state})'
                                            for k in facts.OPTIMIZERS.values())]


def _private(used):
    # The dtype, role and format numbers a module names as _NAME (FLOAT -> _FLOAT): folded
    # into its bytecode by const(), where a name imported from blob.py would be a global of
    # the module (a dictionary slot in RAM, a LOAD_GLOBAL per use, the name's qstr).
    out = []
    for line in _dtypes() + _roles() + _format():
        name, _, value = line.partition(" = ")
        if value.startswith("const(") and re.search(r"\b_%s\b" % name, used):
            out.append(f"_{name} = {value}")
    return out


def _float32_below(value):
    """The largest float32 below value, written as float32 prints it (0.99999994 below 1)."""
    bits = struct.unpack("<I", struct.pack("<f", value))[0]
    below = struct.unpack("<f", struct.pack("<I", bits - 1))[0]
    for digits in range(1, 18):
        text = f"{below:.{digits}g}"
        if struct.unpack("<f", struct.pack("<f", float(text)))[0] == below:
            return float(text)
    return below


def _checkpoint_facts():
    types = ", ".join(f"{code}: ({size}, \"{typecode}\")"
                      for code, (size, typecode) in facts.CHECKPOINT_TENSOR_TYPES.items())
    return [f'CHECKPOINT_IDENTIFIER = b"{facts.CHECKPOINT_IDENTIFIER}"',
            f'_OBSERVER_RANGE = "{facts.OBSERVER_RANGE_SUFFIX}"  # may hold inf (not observed yet)',
            f'RNG_PREFIX = "{facts.RNG_PREFIX}"  # int properties: generator states',
            f"VERSION = const({facts.CHECKPOINT_VERSION})",
            f'TRAILER_MAGIC = b"{facts.CHECKPOINT_TRAILER}"',
            "# ONNX data type -> (bytes per element, array typecode)",
            "_TENSOR_TYPES = {%s}" % types]


def _format():
    return [f'IDENTIFIER = b"{facts.BLOB_IDENTIFIER}"',
            f"FORMAT_VERSION = const({facts.FORMAT_VERSION})",
            f"NO_TENSOR = const(0x{facts.NO_TENSOR:X})  # the id of an absent optional tensor"]


CONST_IMPORT = "from microtrain.errors import const"


def block_lines(spec, used=""):
    """The generated lines for the items of one block's first line (and the import of
    const() when they use it: errors.py has MicroPython's, or an identity on CPython).
    used: the module's text outside its blocks (a block holds only the fields it names)."""
    out = []
    items = {"dtypes": _dtypes, "roles": _roles, "optimizer_options": _optimizer_options,
             "optimizer_kinds": _optimizer_kinds, "checkpoint_facts": _checkpoint_facts,
             "format": _format}
    for item in filter(None, (i.strip() for i in spec.split(";"))):
        words = item.split()
        if words[0] == "blob":
            out += _fields("microtrain.fbs", words[1:], "", used)
        elif words[0] == "checkpoint":
            out += _fields("checkpoint.fbs", words[1:], "CK_", used)
        elif words[0] in ("controls", "private"):
            out += (_controls if words[0] == "controls" else _private)(used)
        elif words[0] in items:
            out += items[words[0]]()
        else:
            raise ValueError(f"unknown contract item '{item}'")
    return ([CONST_IMPORT] if any("const(" in line for line in out) else []) + out


def _outside_blocks(lines):
    out, inside = [], False
    for line in lines:
        if line.startswith(MARK):
            inside = True
        elif line == END:
            inside = False
        elif not inside:
            out.append(line)
    return "\n".join(out)


def fill_blocks(text, path):
    """text with every contract block regenerated."""
    lines = text.split("\n")
    used = _outside_blocks(lines)
    out = []
    i = 0
    while i < len(lines):
        line = lines[i]
        out.append(line)
        i += 1
        if not line.startswith(MARK):
            continue
        try:
            end = lines.index(END, i)
        except ValueError:
            raise ValueError(f"{path}: a contract block without '{END}'") from None
        out.append(NOTE)
        out += block_lines(line[len(MARK):], used)
        out.append(END)
        i = end + 1
    return "\n".join(out)


def expected():
    """{path: text} of everything generated, as it should be now."""
    result = {path: make() for path, make in FILES.items()}
    if DOCS.exists():
        result[DOCS] = fill_docs(DOCS.read_text())
    for path in sorted(DEVICE.rglob("*.py")):
        if path in result:
            continue
        text = path.read_text()
        if MARK in text:
            result[path] = fill_blocks(text, path)
    return result


def stale():
    return [path for path, text in expected().items()
            if not path.exists() or path.read_text() != text]


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    outdated = stale()
    if "--check" in argv:
        for path in outdated:
            print(f"stale: {path.relative_to(ROOT)} (run python -m microtrain_host.contract.generate)")
        return 1 if outdated else 0
    texts = expected()
    for path in outdated:
        path.write_text(texts[path])
        print(f"wrote {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
