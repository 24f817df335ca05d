"""Where a model's minimal runtime spends its .mpy bytes: each module's .mpy (mpy-cross for
the board's architecture, as deploy compiles it) and, with --functions, what each function's
body costs (the module compiled again with that body replaced by `pass`: its bytecode,
line-number table and the constants and names only it uses). Error-message modules
(microtrain/_msg_*) are left out: a run imports them only when one is raised; so are the
modules of an API a training loop does not call (runtime.LAZY_MODULES).

    python scripts/runtime_sizes.py build/model.mtb [--arch armv6m] [--bundled]
        [--functions N]

(the digits MLP: `microtrain pack examples/digits/mlp.onnx -o build --batch-size 8
--optimizer adamw` first; --bundled: as deploy ships a runtime to a board's filesystem)
"""
import argparse
import ast
import pathlib
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "host"), str(ROOT / "device")]

from microtrain_host.tools import runtime  # noqa: E402
from microtrain_host.tools.runtime_messages import is_message_module  # noqa: E402


def mpy_size(text, arch, name="m.py", level=()):
    """Bytes of the .mpy mpy-cross makes of text (the const import blanked, as deploy does;
    level: ["-O3"] for a bundle, as runtime.compile_runtime compiles it)."""
    with tempfile.TemporaryDirectory() as tmp:
        source = pathlib.Path(tmp) / name
        source.parent.mkdir(parents=True, exist_ok=True)     # name: microtrain/_core.py
        source.write_text(runtime.without_const_import(text))
        target = source.with_suffix(".mpy")
        proc = subprocess.run([runtime.mpy_cross_tool(arch), f"-march={arch}", *level, "-s",
                               name, "-o", str(target), str(source)], capture_output=True,
                              text=True)
        if proc.returncode != 0:
            raise SystemExit(f"mpy-cross failed on {name}: {proc.stderr.strip()}")
        return target.stat().st_size


def function_costs(text, arch, whole, level=()):
    """[(bytes, qualified name, lines)] of the module's top-level functions and methods."""
    lines = text.split("\n")
    costs = []
    for node in ast.parse(text).body:
        members = [node] if isinstance(node, ast.FunctionDef) else (
            [n for n in node.body if isinstance(n, ast.FunctionDef)]
            if isinstance(node, ast.ClassDef) else [])
        for f in members:
            first, last = f.body[0].lineno - 1, f.end_lineno
            cut = list(lines)
            indent = cut[first][:len(cut[first]) - len(cut[first].lstrip())]
            cut[first:last] = [indent + "pass"] + [""] * (last - first - 1)
            name = f.name if f is node else f"{node.name}.{f.name}"
            costs.append((whole - mpy_size("\n".join(cut), arch, level=level), name,
                          last - first))
    return costs


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("blob")
    parser.add_argument("--arch", default="armv6m")
    parser.add_argument("--bundled", action="store_true")
    parser.add_argument("--functions", type=int, default=0, metavar="N",
                        help="list the N costliest function bodies")
    parser.add_argument("--line-numbers", action="store_true",
                        help="the bundles with their line-number tables (deploy --line-numbers)")
    args = parser.parse_args(argv)
    sources = runtime.minimal_sources(args.blob, bundled=args.bundled)
    total = 0
    costs = []
    for module, text in sorted(sources.items()):
        if is_message_module(module) or runtime.is_lazy_module(module):
            continue
        level = ["-O3"] if module in runtime.BUNDLE_PATHS and not args.line_numbers else []
        size = mpy_size(text, args.arch, module.replace("/", "_"), level)
        total += size
        print(f"{module:44} {size:7,}")
        if args.functions:
            costs += [(c, module, name, n)
                      for c, name, n in function_costs(text, args.arch, size, level)]
    print(f"{'imported':44} {total:7,}")
    for cost, module, name, n in sorted(costs, reverse=True)[:args.functions]:
        print(f"{cost:6,}  {module}  {name} ({n} lines)")


if __name__ == "__main__":
    main()
