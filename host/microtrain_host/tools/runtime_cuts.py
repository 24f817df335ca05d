"""The cuts that make the minimal runtime (tools/runtime.py) one model's: a kernel family
cut to the kernels the blob's op codes name and what they reference, opcodes.py cut to
those op codes and kernel_module to their families, and the runtime's internal classes cut
to the methods its modules call. Cut lines are blanked, not removed, so that a traceback on
the board gives the line numbers of the repository's source."""
import ast
import re

from ..contract.ops import BY_CODE
from ..errors import MicrotrainHostError


class RuntimeBuildError(MicrotrainHostError):
    """The minimal runtime cannot be selected, compiled or packed."""


def _blank(lines, node):
    """Blank the source lines of a top-level statement (decorators included)."""
    first = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
    for i in range(first - 1, node.end_lineno):
        lines[i] = ""


def _names_used(node):
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}


def _cut_module(text, wanted):
    """Keep the top-level functions, classes and single-name assignments reachable from the
    names in `wanted` and from every other top-level statement (imports, try blocks...);
    blank the rest."""
    tree = ast.parse(text)
    definitions = {}  # name -> [statements defining it]
    roots = set(wanted)
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            definitions.setdefault(node.name, []).append(node)
        elif (isinstance(node, ast.Assign) and len(node.targets) == 1
              and isinstance(node.targets[0], ast.Name)):
            definitions.setdefault(node.targets[0].id, []).append(node)
        else:
            roots |= _names_used(node)
    imported = {(a.asname or a.name).split(".")[0] for node in tree.body
                if isinstance(node, (ast.Import, ast.ImportFrom)) for a in node.names}
    missing = set(wanted) - set(definitions) - imported   # imports are kept: a family may
    if missing:                                            # pass on another's names
        raise RuntimeBuildError(f"the kernel module defines no {', '.join(sorted(missing))}")
    keep, todo = set(), list(roots)
    while todo:
        name = todo.pop()
        if name in keep or name not in definitions:
            continue
        keep.add(name)
        for node in definitions[name]:
            todo.extend(_names_used(node))
    lines = text.split("\n")
    for name, nodes in definitions.items():
        if name not in keep:
            for node in nodes:
                _blank(lines, node)
    return "\n".join(lines)


# Classes only the runtime's own code calls (not the training API): a minimal runtime keeps
# of their methods those its modules call. StepCheck's assertions, which the kernels'
# checkers ask for, and the Blob's helpers for the int8 checkers.
INTERNAL_CLASSES = (("microtrain/stepcheck.py", "StepCheck"), ("microtrain/blob.py", "Blob"))


def _cut_methods(text, class_name, others):
    """text with class `class_name` cut to the methods the other modules' texts call
    (`c.holds(...)`, `b.tensor_id(...)`) and those these call (`self._extent(...)`); its
    special methods stay. A method no shipped module calls can never run: a check no
    shipped checker asks for, a helper of the int8 checkers in a float model's runtime."""
    tree = ast.parse(text)
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == class_name)
    methods = {n.name: n for n in cls.body if isinstance(n, ast.FunctionDef)}
    todo = [name for name in methods if name.startswith("__") or any(
        re.search(r"\.%s\(" % name, other) for other in others)]
    keep = set()
    while todo:
        name = todo.pop()
        if name in keep:
            continue
        keep.add(name)
        todo.extend(n.func.attr for n in ast.walk(methods[name]) if isinstance(n, ast.Call)
                    and isinstance(n.func, ast.Attribute) and n.func.attr in methods)
    lines = text.split("\n")
    for name, node in methods.items():
        if name not in keep:
            _blank(lines, node)
    return "\n".join(lines)


def _cut_opcodes(text, used):
    """opcodes.py with only the rows of the used op codes (one string literal per line:
    blanking a line drops the row) and kernel_module's import branches cut to their
    families: a blob naming another family's op is refused at its unknown op code first."""
    lines = text.split("\n")
    for i, line in enumerate(lines):
        row = re.match(r'\s*"\\n(\d+) ', line)
        if row and int(row.group(1)) not in used:
            lines[i] = ""
    _cut_families(lines, {BY_CODE[op].family for op in used})
    return _cut_module("\n".join(lines), {"signature", "kernel_module"})


def _cut_families(lines, families):
    """Blank kernel_module's `if/elif family == "name":` branches (a test and its import,
    two lines each, as contract/generate.py writes them) of the families not used; the
    first kept branch becomes the `if`. The `else: raise ImportError` stays."""
    first = True
    for i, line in enumerate(lines):
        branch = re.fullmatch(r'(\s*)(?:el)?if family == "(\w+)":', line)
        if branch is None:
            continue
        if branch.group(2) not in families:
            lines[i] = lines[i + 1] = ""
        else:
            lines[i] = f'{branch.group(1)}{"if" if first else "elif"} family == "{branch.group(2)}":'
            first = False
