"""How small a model's minimal runtime could get by trimming alone: the runtime deploy ships
to a board's filesystem (bundled, as runtime.minimal_sources(blob, bundled=True) gives it)
runs a training session on CPython under a line tracer (load the checkpoint, Module,
Optimizer, STEPS train steps, save with the optimizer state; then resume from that save,
STEPS more, save again), and each imported module is compiled again with only what ran
(executed_only): every statement that never ran and every function never called dropped.
Three figures a module: `ran+errors` keeps the raise statements whole, and the functions
their messages call (the errors the standards ask for); `ran` drops the raises but keeps
each check's test (the validation); `no checks` drops the tests too. No trimming of rare
paths or unused APIs goes below the first while the errors and checks stay.

    python scripts/runtime_floor.py build/ --data examples/digits/digits.npz [--arch armv6m]

(build/: `microtrain pack` output, model.mtb and checkpoint; the .npz: x_train, y_train or
x, y, float inputs and int labels.) Prints, per imported module, its .mpy as deploy compiles
it and the three floors, and the totals. (CPython takes a few branches a board does not,
such as the os.fsync of a save, and skips a few a board takes.)"""
import argparse
import ast
import json
import pathlib
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "host"), str(ROOT / "device"), str(ROOT / "scripts")]

from microtrain_host.tools import runtime  # noqa: E402
from microtrain_host.tools.runtime_bundle import BUNDLE_PATHS  # noqa: E402
from microtrain_host.tools.runtime_messages import _error_call, is_message_module  # noqa: E402
from runtime_sizes import mpy_size  # noqa: E402

# The session, run by a fresh interpreter with only the shipped runtime on its path; prints
# the executed (file, line) pairs as JSON.
SESSION = r"""
import json, shutil, sys
from array import array
import numpy as np
runtime, build, data, steps, work = sys.argv[1:6]
sys.path.insert(0, runtime)
for name in ("model.mtb", "checkpoint"):
    shutil.copy(build + "/" + name, work + "/" + name)
d = np.load(data)
xs = np.ascontiguousarray(d["x_train" if "x_train" in d else "x"], dtype=np.float32)
ys = np.ascontiguousarray(d["y_train" if "y_train" in d else "y"], dtype=np.int32)
ran = set()
def tracer(frame, event, arg):
    if frame.f_code.co_filename.startswith(runtime):
        ran.add((frame.f_code.co_filename[len(runtime) + 1:], frame.f_lineno))
        return tracer
sys.settrace(tracer)
from microtrain import CheckpointState, Module, Optimizer
for _ in range(2):      # a first run, then one resumed from its save
    state = CheckpointState.load_checkpoint(work + "/checkpoint")
    model = Module(work + "/model.mtb", state)
    opt = Optimizer(work + "/model.mtb", model)
    b = model.blob
    ids = b.programs["train"].inputs
    nx, ny = b.sizes[ids[0]], b.sizes[ids[-1]]
    model.train()
    for s in range(int(steps)):
        x = array("f", xs.reshape(-1)[s * nx:(s + 1) * nx].tobytes())
        y = array("i", ys.reshape(-1)[s * ny:(s + 1) * ny].tobytes())
        model(x, y)
        opt.step()
        model.lazy_reset_grad()
    CheckpointState.save_checkpoint(state, work + "/checkpoint", include_optimizer_state=True)
sys.settrace(None)
print(json.dumps(sorted(ran)))
"""


def executed_only(text, ran, errors=False, checks=True):
    """The module's text with only what ran: every statement that never ran dropped (an
    emptied block gets `pass`), every function none of whose statements ran dropped (its
    def ran at import), every except clause that never ran dropped (a try left with no
    clause becomes its body); class and function definitions otherwise stay, and so do
    global / nonlocal statements (they run no line). A check's test stays, its raise gone
    (`if bad: pass`): the validation the issue keeps. errors=True keeps the raises too,
    whole (message and operands: the errors the standards ask for), and the functions they
    call (errors.message, through its `_m` alias, files.reason...), whole. checks=False
    drops the tests as well (an `if` left with nothing but `pass`): what the checks cost."""
    tree = ast.parse(text)

    def has_run(node):
        return any(getattr(s, "lineno", 0) in ran for s in ast.walk(node)
                   if isinstance(s, ast.stmt) and s is not node)
    raises = [n for n in ast.walk(tree) if errors and _error_call(n)]
    kept_raises = {id(r) for r in raises}
    named = {getattr(n, "id", getattr(n, "attr", None)) for r in raises for n in ast.walk(r)}
    named |= {"message"} if "_m" in named else set()
    whole = {id(f) for f in ast.walk(tree) if isinstance(f, ast.FunctionDef) and f.name in named}
    dead = {id(n) for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.ExceptHandler))
            and not has_run(n) and id(n) not in whole
            and not any(id(r) in kept_raises for r in ast.walk(n))}

    def empty(block):
        return all(isinstance(s, ast.Pass) for s in block)

    def kept(block):
        out = []
        for s in block:
            if isinstance(s, (ast.FunctionDef, ast.ClassDef, ast.Global, ast.Nonlocal)):
                if id(s) not in dead:
                    out.append(s)
            elif getattr(s, "lineno", 0) not in ran and id(s) not in kept_raises:
                continue
            elif isinstance(s, ast.Try) and not s.handlers and not s.finalbody:
                out.extend(s.body + s.orelse)       # every clause gone: the body alone
            elif checks or not (isinstance(s, ast.If) and empty(s.body) and empty(s.orelse)):
                out.append(s)
        return out or [ast.Pass()]

    class Trim(ast.NodeTransformer):
        def visit_FunctionDef(self, node):
            return node if id(node) in whole else self.generic_visit(node)

        def generic_visit(self, node):
            super().generic_visit(node)
            if isinstance(node, ast.Try):
                node.handlers = [h for h in node.handlers if id(h) not in dead]
            for field in ("body", "orelse", "finalbody"):
                block = getattr(node, field, None)
                if isinstance(block, list) and block and isinstance(block[0], ast.stmt):
                    setattr(node, field, kept(block))
            return node
    return ast.unparse(ast.fix_missing_locations(Trim().visit(tree)))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("build", type=pathlib.Path)
    parser.add_argument("--data", required=True, type=pathlib.Path)
    parser.add_argument("--arch", default="armv6m")
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args(argv)
    sources = runtime.minimal_sources(args.build / "model.mtb", bundled=True)
    imported = sorted(p for p in sources
                      if not (is_message_module(p) or runtime.is_lazy_module(p)))
    with tempfile.TemporaryDirectory() as tmp:
        shipped, work = pathlib.Path(tmp) / "runtime", pathlib.Path(tmp) / "work"
        work.mkdir()
        runtime.write_sources(sources, shipped)
        out = subprocess.run([sys.executable, "-c", SESSION, str(shipped),
                              str(args.build.resolve()), str(args.data.resolve()),
                              str(args.steps), str(work)],
                             capture_output=True, text=True, cwd=tmp)
        if out.returncode != 0:
            raise SystemExit(f"the training session failed:\n{out.stderr}")
        ran = {}
        for path, line in json.loads(out.stdout):
            ran.setdefault(path, set()).add(line)
    # the files compiled as deploy compiles them (the name tracebacks show: -s), -O3 for the
    # bundles (runtime.compile_runtime)
    totals = [0, 0, 0, 0]
    print(f"{'module':32} {'.mpy':>7} {'ran+errors':>10} {'ran':>7} {'no checks':>9}")
    for path in imported:
        level = ["-O3"] if path in BUNDLE_PATHS else []
        lines = ran.get(path, set())
        sizes = [mpy_size(text, args.arch, name=path, level=level) for text in (
            sources[path], executed_only(sources[path], lines, errors=True),
            executed_only(sources[path], lines),
            executed_only(sources[path], lines, checks=False))]
        totals = [t + n for t, n in zip(totals, sizes)]
        print(f"{path:32} {sizes[0]:7,} {sizes[1]:10,} {sizes[2]:7,} {sizes[3]:9,}")
    print(f"{'imported':32} {totals[0]:7,} {totals[1]:10,} {totals[2]:7,} {totals[3]:9,}")


if __name__ == "__main__":
    main()
