"""How small a model's minimal runtime could get by trimming alone: the runtime deploy ships
to a board's filesystem (bundled, as runtime.minimal_sources(blob, bundled=True) gives it)
runs a training session on CPython under a line tracer (load the checkpoint, Module,
Optimizer, STEPS train steps, save with the optimizer state; then resume from that save,
STEPS more, save again), and each imported module is compiled again with only what ran:
every statement that never ran is dropped (so every error message and the check's raise
with it), every function never called is dropped. What is left is the code a successful
run executes, which no trimming of error paths, rare paths or unused APIs can go below.

    python scripts/runtime_floor.py build/ --data examples/digits/digits.npz [--arch armv6m]

(build/: `microtrain pack` output, model.mtb and checkpoint; the .npz: x_train, y_train or
x, y, float inputs and int labels.) Prints, per imported module, its .mpy as deploy compiles
it and the floor's, and the totals."""
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
from microtrain_host.tools.runtime_messages import is_message_module  # noqa: E402
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


def executed_only(text, ran):
    """The module's text with every statement that never ran dropped (an emptied block gets
    `pass`) and every function none of whose statements ran dropped; a module-level statement
    that ran keeps its line (imports, constants, class and function definitions)."""
    tree = ast.parse(text)
    dead = {id(f) for f in ast.walk(tree) if isinstance(f, ast.FunctionDef) and not any(
        s.lineno in ran for s in ast.walk(f) if isinstance(s, ast.stmt) and s is not f)}

    class Trim(ast.NodeTransformer):
        def generic_visit(self, node):
            super().generic_visit(node)
            for field in ("body", "orelse", "finalbody"):
                block = getattr(node, field, None)
                if not (isinstance(block, list) and block and isinstance(block[0], ast.stmt)):
                    continue
                kept = [s for s in block if id(s) not in dead and (
                    isinstance(s, (ast.FunctionDef, ast.ClassDef))
                    or getattr(s, "lineno", 0) in ran)]
                setattr(node, field, kept or [ast.Pass()])
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
        out = subprocess.run([sys.executable, "-c", SESSION, str(shipped), str(args.build.resolve()),
                              str(args.data.resolve()), str(args.steps), str(work)],
                             capture_output=True, text=True, cwd=tmp)
        if out.returncode != 0:
            raise SystemExit(f"the training session failed:\n{out.stderr}")
        ran = {}
        for path, line in json.loads(out.stdout):
            ran.setdefault(path, set()).add(line)
    totals = [0, 0]
    print(f"{'module':40} {'.mpy':>8} {'floor':>8}")
    for path in imported:
        level = ["-O3"] if path in BUNDLE_PATHS else []
        now = mpy_size(sources[path], args.arch, level=level)
        floor = mpy_size(executed_only(sources[path], ran.get(path, set())), args.arch,
                         level=level)
        totals[0] += now
        totals[1] += floor
        print(f"{path:40} {now:8,} {floor:8,}")
    print(f"{'imported':40} {totals[0]:8,} {totals[1]:8,}")


if __name__ == "__main__":
    main()
