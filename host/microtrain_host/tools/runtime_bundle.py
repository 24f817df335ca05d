"""The minimal runtime's modules bundled into a few, for a runtime imported from a board's
filesystem. Each imported .mpy carries its own qstr table (every name it uses, spelled out
again), its own module object and globals dict, and an import statement in its importers
for every name it gives; a run of the digits MLP imported 23 modules whose name tables alone
took 12 KB of the 42 KB of .mpy, 5 KB of them names another module spells too. Bundled, the
same code costs ~5 KB less .mpy and ~5 KB less heap (docs/design.md, "The minimal runtime's
size").

The repository keeps its small modules; deploy bundles the runtime it ships (the files
placement: ROMFS and frozen code run in place, where the names cost flash, not heap):

* microtrain/_core.py: the package's module-level import closure (errors, files, the
  blob loader and parser, checkpoint reader, Module, Optimizer...), in import order;
* microtrain/_save.py: what the checkpoint writer adds to it (imported at a run's first
  save, as the writer is: a run's load does not carry its objects).

Kernel families without a fast switch (FAST = use_fast(), which keeps the family's own
globals) and without viper code bundle into their package, microtrain/kernels/__init__.py
(imported before any of them), when two or more do, their names clash nowhere and no family's
name is a global of their code; the bundle registers them as its submodules, so
opcodes.kernel_module's `from microtrain.kernels import dense` finds it. The other kernel
families (imported by name through opcodes.kernel_module), viper and native modules,
the error messages (microtrain/_msg_*) and the modules only some models import stay modules
of their own; their imports of bundled modules are pointed at the bundle. An import between
two modules of one bundle becomes nothing (the name is the bundle's global already) or an
assignment (`import ... as`; `from microtrain import fbwriter`: the bundle module itself). The bundle then registers its modules' names in sys.modules
and on the package, so `from microtrain.checkpoint import CheckpointState` keeps working.

A name that two bundled modules define differently is refused (RuntimeBuildError): rename
it in one of them. Definitions spelled identically (the checkpoint layout's constants, which
reader and writer both carry) are kept once. Tracebacks on the board name the bundle and
its line; `runtime.minimal_sources(blob, bundled=True)` gives the same text on the host.

Each bundle's private names (`_read_steps`, `self._bind_state`, `_OPTIONS`) that no other
module of the runtime spells and no string holds are then shortened to two or three
characters (`_a`, `_b`...; shorten_private_names): each name is a qstr the .mpy spells out
and the board interns in its heap, and the digits runtime's ~100 such names took ~1 KB of
both. The bundle leaves out its docstrings, comment lines and blank lines
(without_blank_lines: fewer two-byte steps in the line-number tables), and
runtime.compile_runtime compiles the bundles without those tables (mpy-cross -O3) unless
deploy --line-numbers asks for them. A traceback from a bundle names the shortened
function and line 1, or with --line-numbers the bundle's line, both as
`runtime.minimal_sources(blob, bundled=True)` gives the text on the host."""
import ast
import io
import re
import symtable
import tokenize

from ..contract.generate import CONST_IMPORT
from .runtime_cuts import RuntimeBuildError
from .runtime_messages import _replace, is_message_module

BUNDLES = (("microtrain/_core.py", "microtrain"), ("microtrain/_save.py",
                                                   "microtrain.checkpoint_writer"))
NATIVE_DECORATORS = ("@micropython.viper", "@micropython.native")


def _path(name):
    """microtrain.files -> microtrain/files.py (the package: microtrain/__init__.py)."""
    return "microtrain/__init__.py" if name == "microtrain" else name.replace(".", "/") + ".py"


def _name(path):
    return path[:-3].replace("/", ".").replace(".__init__", "")


def _module_imports(text, sources):
    """The runtime modules (paths in sources) a module imports at module level, in order:
    `from microtrain.x import ...` and `from microtrain import x` (x a module), inside
    top-level try and if blocks too."""
    found = []

    def visit(statements):
        for node in statements:
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("microtrain"):
                targets = [_path(node.module)]
                if node.module == "microtrain":
                    targets = [_path("microtrain." + a.name) for a in node.names]
                found.extend(t for t in targets if t in sources)
            elif isinstance(node, (ast.Try, ast.If)):
                for block in (node.body, node.orelse, getattr(node, "finalbody", []),
                              *[h.body for h in getattr(node, "handlers", [])]):
                    visit(block)
    visit(ast.parse(text).body)
    return found


def _bundleable(path, text):
    return not (path.startswith("microtrain/kernels/") or is_message_module(path)
                or path == "microtrain/__init__.py"
                or any(d in text for d in NATIVE_DECORATORS))


def bundle_members(sources):
    """{module path: bundle path} of the modules bundled, and {bundle path: [module paths in
    import order]} (each module after those it imports at module level)."""
    members, order = {}, {}
    for bundle, entry in BUNDLES:
        listed = order[bundle] = []

        def visit(path, seen):
            if path in members or path in seen or path not in sources:
                return
            seen.add(path)
            for dep in _module_imports(sources[path], sources):
                visit(dep, seen)
            if _bundleable(path, sources[path]):
                members[path] = bundle
                listed.append(path)
        visit(_path(entry), set())
    return members, {b: paths for b, paths in order.items() if paths}


def _rewrite_imports(path, text, members):
    """The module's text with its imports of bundled modules rewritten (see the top)."""
    tree = ast.parse(text)
    lines = text.split("\n")
    own = members.get(path)
    edits = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            bundled = [a.name for a in node.names if _path(a.name) in members]
            if bundled:
                raise RuntimeBuildError(f"{path}: `import {bundled[0]}` of a bundled module; "
                                        f"import its names (from ... import ...)")
        if not isinstance(node, ast.ImportFrom) or not (node.module or "").startswith(
                "microtrain"):
            continue
        parts = []
        if any(_path(f"{node.module}.{a.name}") in members for a in node.names):
            for a in node.names:   # modules: `from microtrain import files`
                target = members.get(_path(f"{node.module}.{a.name}"))
                if target is None:
                    parts.append(f"from {node.module} import {a.name}"
                                 + (f" as {a.asname}" if a.asname else ""))
                elif target == own:
                    # the bundle itself, which is in sys.modules while it runs
                    parts.append(f"{a.asname or a.name} = __import__({_name(target)!r}, "
                                 f"None, None, ('_',))")
                else:
                    parts.append(f"import {_name(target)} as {a.asname or a.name}")
        else:
            target = members.get(_path(node.module))
            if target is None or (target != own
                                  and ast.get_source_segment(text, node) == CONST_IMPORT):
                continue    # (the contract blocks' const import: compile_runtime blanks it)
            if target == own:   # the names are this bundle's globals already
                parts += [f"{a.asname} = {a.name}" for a in node.names
                          if a.asname and a.asname != a.name] or ["pass"]
            else:
                parts.append(f"from {_name(target)} import " + ", ".join(
                    a.name + (f" as {a.asname}" if a.asname else "") for a in node.names))
        edits.append((node, "; ".join(parts)))
    for node, replacement in sorted(edits, key=lambda e: (e[0].lineno, e[0].col_offset),
                                    reverse=True):
        _replace(lines, node, replacement)
    return "\n".join(lines)


def _definitions(tree, lines):
    """[(name, its defining statement's source, statement)] of a module's top level, inside
    top-level try and if blocks too (`nested` True there)."""
    out = []

    def visit(statements, nested):
        for node in statements:
            if isinstance(node, (ast.Try, ast.If)):
                for block in (node.body, node.orelse, getattr(node, "finalbody", []),
                              *[h.body for h in getattr(node, "handlers", [])]):
                    visit(block, True)
                continue
            names = []
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                names = [node.name]
            elif isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                names = [n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)]
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                names = [(a.asname or a.name).split(".")[0] for a in node.names]
            if names:
                source = ast.get_source_segment("\n".join(lines), node)
                out.extend((name, source, node, nested) for name in names)
    visit(tree.body, False)
    return out


def _const_clashes(bundle, paths, texts):
    """Refuse a bundle where a module's `NAME = const(...)` would reach a name another module
    binds locally or passes as a keyword: MicroPython folds a const wherever the name appears
    after it in the file (a parameter or local becomes a number; `f(NAME=1)` does not
    compile)."""
    consts = {}
    for path in paths:
        for node in ast.parse(texts[path]).body:
            if (isinstance(node, ast.Assign) and isinstance(node.value, ast.Call)
                    and getattr(node.value.func, "id", None) == "const"):
                consts.setdefault(node.targets[0].id, path)
    for path in paths:
        tree = ast.parse(texts[path])
        inner = [n for top in tree.body if isinstance(top, (ast.FunctionDef, ast.ClassDef))
                 for n in ast.walk(top)]   # (top-level definitions: _join's check)
        for node in inner + list(ast.walk(tree)):
            name = (node.arg if isinstance(node, (ast.arg, ast.keyword)) else
                    node.id if node in inner and isinstance(node, ast.Name)
                    and isinstance(node.ctx, ast.Store) else None)
            if name in consts and consts[name] != path:
                raise RuntimeBuildError(f"bundling {bundle}: {path} binds {name}, a const() of "
                                        f"{consts[name]}; rename one of them")


def _join(bundle, paths, texts):
    """One bundle's text: its modules in order, each name defined once."""
    _const_clashes(bundle, paths, texts)
    defined = {}   # name -> (module, source of its definition)
    parts = []
    for path in paths:
        text = texts[path]
        lines = text.split("\n")
        dropped = []
        for name, source, node, nested in _definitions(ast.parse(text), lines):
            first, before = defined.setdefault(name, (path, source))
            if first == path:
                continue    # (a module may define a name twice: try/except alternatives)
            if source != before or nested:
                raise RuntimeBuildError(
                    f"bundling {bundle}: {name} is defined by {first} and again by {path}; "
                    f"rename one of them")
            if not isinstance(node, (ast.Import, ast.ImportFrom)) and node not in dropped:
                dropped.append(node)   # the same definition again (a constant): once
        for node in sorted(dropped, key=lambda n: (n.lineno, n.col_offset), reverse=True):
            _replace(lines, node, "pass")
        parts.append(f"# ---- {path}\n" + "\n".join(lines))
    # (the kernel families' bundle is their package: its modules are its own submodules)
    package = _name(bundle) if bundle == KERNELS else "microtrain"
    names = [_name(p)[len(package) + 1:] for p in paths if p != bundle]
    parts.append(
        "# ---- the bundled modules' names, for `from microtrain.<module> import ...`\n"
        "import sys\n"
        f"_B = sys.modules[{_name(bundle)!r}]\n"
        "for _n in (" + "".join(f"{n!r}, " for n in names) + "):\n"
        f"    sys.modules[{package + '.'!r} + _n] = _B\n"
        f"    setattr(sys.modules[{package!r}], _n, _B)\n"
        "del _B, _n\n")
    return "\n".join(parts)


# The kernel families a model uses, bundled into their package's __init__.py (imported
# before any of them): those without a fast switch (FAST = use_fast(): each switch keeps
# the family's own globals) and without viper or native code.
KERNELS = "microtrain/kernels/__init__.py"
# what runtime.compile_runtime compiles without line numbers (the kernels' package is 3
# lines where the families stay apart)
BUNDLE_PATHS = tuple(bundle for bundle, _ in BUNDLES) + (KERNELS,)


def _kernel_members(sources):
    """[KERNELS, then the families to bundle into it, each after those it imports]."""
    families = {path for path, text in sources.items()
                if path.startswith("microtrain/kernels/") and path != KERNELS
                and not {"FAST", "use_fast", "fastpath"} & set(re.findall(
                    r"\w+", without_blank_lines(text)))
                and not any(d in text for d in NATIVE_DECORATORS)}
    ordered = []

    def visit(path):
        if path in families and path not in ordered:
            families.discard(path)
            for dep in _module_imports(sources[path], sources):
                visit(dep)
            ordered.append(path)
    for path in sorted(families):
        visit(path)
    return [KERNELS] + ordered if KERNELS in sources and len(ordered) > 1 else []


def _family_names_free(text, paths):
    """True when no bundled family's name (the package's attribute the bundle sets: dense,
    loss...) is a global its code reads or binds."""
    names = {_name(p).rsplit(".", 1)[1] for p in paths if p != KERNELS}
    tables = [symtable.symtable(text, KERNELS, "exec")]
    while tables:
        table = tables.pop()
        tables.extend(table.get_children())
        for symbol in table.get_symbols():
            if symbol.get_name() in names and (symbol.is_global()
                                               or table.get_type() == "module"):
                return False
    return True


def bundle_sources(sources):
    """{relative path: source text} of a runtime (runtime.minimal_sources) -> the same with
    the bundled modules (bundle_members) replaced by their bundles and every other module's
    imports of them pointed there."""
    members, order = bundle_members(sources)
    families = _kernel_members(sources)
    if families:
        # bundled when the families' names and definitions allow it, else left modules
        trial = dict(members, **{path: KERNELS for path in families})
        texts = {path: _rewrite_imports(path, text, trial) for path, text in sources.items()}
        try:
            if _family_names_free(_join(KERNELS, families, texts), families):
                members, order = trial, dict(order, **{KERNELS: families})
        except RuntimeBuildError:
            pass
    texts = {path: _rewrite_imports(path, text, members) for path, text in sources.items()}
    out = {path: text for path, text in texts.items() if path not in members}
    for bundle, paths in order.items():
        out[bundle] = _join(bundle, paths, texts)
    out = shorten_private_names(out, list(order))
    return {path: without_blank_lines(text) if path in order else text
            for path, text in out.items()}


def without_blank_lines(text):
    """A bundle's text without its docstrings (MicroPython's compiler drops them; a body of
    only a docstring becomes `pass`), comment lines and blank lines: the bytecode's
    line-number table spends a second byte on each step of more than a few lines, and a
    bundle's lines are its own anyway (a traceback names them; minimal_sources(blob,
    bundled=True) gives this text). ~260 B of the digits runtime's .mpy."""
    lines = text.split("\n")
    for node in ast.walk(ast.parse(text)):
        body = getattr(node, "body", None)
        if (isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef)) and body
                and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)
                and isinstance(body[0].value.value, str)):
            doc = body[0]
            lines[doc.lineno - 1:doc.end_lineno] = (
                [" " * doc.col_offset + "pass" if len(body) == 1 else ""]
                + [""] * (doc.end_lineno - doc.lineno))
    text = "\n".join(lines)
    code = set()   # the lines a token other than a comment, newline or indent lies on
    for t in tokenize.generate_tokens(io.StringIO(text).readline):
        if t.type not in (tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT,
                          tokenize.DEDENT, tokenize.ENDMARKER):
            code.update(range(t.start[0], t.end[0] + 1))
    return "\n".join(line for i, line in enumerate(text.split("\n"), 1) if i in code) + "\n"


# names for shorten_private_names, in order: _a ... _Z, then _a0 ... _Z0, _a1 ...
_LETTERS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"


def _short_names(taken):
    i = 0
    while True:
        name = "_" + _LETTERS[i % 52] + ("" if i < 52 else str(i // 52 - 1))
        i += 1
        if name not in taken:
            yield name


def shorten_private_names(sources, bundles):
    """sources ({relative path: text}) with each bundle's private names shortened: a name
    (NAME token) of one leading underscore, longer than two characters, that is not a
    const() (MicroPython folds those: they cost no qstr), is spelled by no other module of
    sources (which may import it or read it as an attribute) and appears in no string of any
    of them (getattr, an f-string) is renamed wherever the bundle spells it: a module-level
    name, an attribute, a method, an argument, a local alike, as only this text spells it."""
    words = {path: set(re.findall(r"\w+", text)) for path, text in sources.items()}
    strings = " ".join(t.string for text in sources.values()
                       for t in tokenize.generate_tokens(io.StringIO(text).readline)
                       if t.type == tokenize.STRING)
    taken = set().union(*words.values())
    out = dict(sources)
    for bundle in bundles:
        if bundle not in sources:
            continue
        text = sources[bundle]
        elsewhere = set().union(*(w for path, w in words.items() if path != bundle))
        consts = set(re.findall(r"^(\w+) = const\(", text, re.M))
        tokens = list(tokenize.generate_tokens(io.StringIO(text).readline))
        private = sorted(name for name in {t.string for t in tokens if t.type == tokenize.NAME}
                         if len(name) > 2 and name[0] == "_" and name[1] != "_"
                         and name not in elsewhere and name not in consts
                         and not re.search(r"\b%s\b" % name, strings))
        new = dict(zip(private, _short_names(taken)))
        lines = text.split("\n")
        for t in reversed(tokens):    # (right to left: earlier columns stay valid)
            if t.type == tokenize.NAME and t.string in new:
                row, col = t.start
                line = lines[row - 1]
                lines[row - 1] = line[:col] + new[t.string] + line[col + len(t.string):]
        out[bundle] = "\n".join(lines)
    return out
