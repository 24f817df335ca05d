"""The minimal runtime bundled as deploy ships it to a board's filesystem
(host/microtrain_host/tools/runtime_bundle.py): the package's modules joined into
microtrain/_core.py and _save.py behave as the modules they join. The error-message script of
tests/test_runtime_messages.py (every 7th byte of the blob and every 5th of the checkpoint
altered, CRC-32 fixed; bad inputs, optimizer and file errors; a training run, a save and a
reload) prints the same lines over the bundled runtime as over the package's modules, on
CPython and on the MicroPython Unix port; and digits trained and resumed on the emulated M3
through deploy gives the same losses and checkpoint bytes with the runtime bundled in files
as with its modules in ROMFS."""
import ast
import re
import sys

import pytest

from conftest import ROOT
from test_runtime_messages import _lines     # error_messages.py's lines under a runtime
from microtrain_host.cli import main
from microtrain_host.tools import deploy, runtime
from microtrain_host.tools.runtime_bundle import (BUNDLE_PATHS, bundle_members,
                                                  bundle_sources, without_blank_lines)
from microtrain_host.tools.runtime_cuts import RuntimeBuildError

DIGITS = ROOT / "examples" / "digits"


@pytest.fixture(scope="module")
def digits(tmp_path_factory):
    out = tmp_path_factory.mktemp("digits") / "build"
    assert main(["pack", str(ROOT / "examples" / "digits" / "mlp.onnx"), "-o", str(out),
                 "--batch-size", "8", "--optimizer", "adamw"]) == 0
    return out


@pytest.fixture(scope="module")
def runtimes(digits, tmp_path_factory):
    """(the bundled runtime, the same unbundled), with flatparams.py (a module outside the
    bundle that imports from it, as the script calls the flat-buffer parameter API)."""
    base = tmp_path_factory.mktemp("runtimes")
    extra = ("microtrain.flatparams",)
    bundled = runtime.minimal_sources(digits / "model.mtb", extra, bundled=True)
    assert {"microtrain/_core.py", "microtrain/_save.py"} <= set(bundled)
    assert "microtrain/parser.py" not in bundled and "microtrain/flatparams.py" in bundled
    assert "from microtrain._core import" in bundled["microtrain/flatparams.py"]
    return (runtime.write_sources(bundled, base / "bundled"),
            runtime.write_sources(runtime.minimal_sources(digits / "model.mtb", extra),
                                  base / "modules"))


def _check(bundled, modules):
    assert bundled == modules
    assert len([line for line in modules if not line.endswith(": ok")]) > 150


def test_bundled_runtime_behaves_the_same_on_cpython(runtimes, digits, tmp_path):
    _check(*(_lines([sys.executable], "PYTHONPATH", path, digits, tmp_path)
             for path in runtimes))


def test_bundled_runtime_behaves_the_same_on_micropython(runtimes, digits, micropython,
                                                         tmp_path):
    _check(*(_lines([micropython], "MICROPYPATH", path, digits, tmp_path)
             for path in runtimes))


def test_the_bundles_and_their_order(digits):
    members, order = bundle_members(runtime.minimal_sources(digits / "model.mtb"))
    core = order["microtrain/_core.py"]
    # each module after those it imports at module level
    assert core.index("microtrain/errors.py") < core.index("microtrain/blob.py") \
        < core.index("microtrain/parser.py") < core.index("microtrain/module.py") \
        < core.index("microtrain/optimizer.py")
    assert order["microtrain/_save.py"] == ["microtrain/fbwriter.py",
                                            "microtrain/checkpoint_writer.py"]
    # kernel families (imported by name) and the package itself stay out of these bundles
    assert not any(path.startswith("microtrain/kernels/") for path in members)
    assert "microtrain/__init__.py" not in members
    # the families bundle into their package when none has a fast switch; with the native
    # float kernels' module dense, optim and reduce keep theirs (FAST) and stay modules
    bundled = runtime.minimal_sources(digits / "model.mtb", bundled=True)
    assert not [p for p in bundled if p.startswith("microtrain/kernels/")
                and p != "microtrain/kernels/__init__.py"]
    assert "def softmax_cross_entropy(" in bundled["microtrain/kernels/__init__.py"]
    native = runtime.minimal_sources(digits / "model.mtb", bundled=True,
                                     native=(runtime.NATIVE_FLOAT_MODULE,))
    assert "microtrain/kernels/dense.py" in native and "microtrain/kernels/loss.py" in native


def _package(**modules):
    sources = {"microtrain/__init__.py": "from microtrain.a import f\n"}
    sources.update({f"microtrain/{name}.py": text for name, text in modules.items()})
    return sources


def test_a_name_two_modules_define_differently_is_refused():
    sources = _package(a="from microtrain.b import g\nX = 1\ndef f():\n    return g() + X\n",
                       b="X = 2\ndef g():\n    return X\n")
    with pytest.raises(RuntimeBuildError, match="X is defined by microtrain/b.py"):
        bundle_sources(sources)


def test_imports_between_bundled_modules_become_globals():
    sources = _package(a="from microtrain.b import g, K as _K\nK = 3\nY = 5\n"
                         "def f():\n    from microtrain.b import g as h\n    return h() + _K\n",
                       b="K = 3\ndef g():\n    return 2\n",
                       c="from microtrain.a import f\nfrom microtrain import b\n")
    out = bundle_sources(sources)
    assert set(out) == {"microtrain/__init__.py", "microtrain/_core.py", "microtrain/c.py"}
    assert "from microtrain._core import f" in out["microtrain/__init__.py"]
    # (c.py is imported by no bundled module: a module of its own, pointed at the bundle)
    assert out["microtrain/c.py"] == ("from microtrain._core import f\n"
                                      "import microtrain._core as b\n")
    core = {}
    exec(out["microtrain/_core.py"].split("\nimport sys\n")[0], core)
    assert core["f"]() == 5 and core["K"] == 3


def _board_runs(firmware, artifacts, placement, tmp_path, native=True):
    """(losses, checkpoint bytes) of 4 digits AdamW steps deployed to the emulated M3 with
    the runtime in that placement, then of 3 steps more resumed from its checkpoint."""
    tag = placement + ("" if native else "-pure")
    first = deploy.run(deploy.plan(artifacts, "qemu-mps2-an385", steps=4, placement=placement,
                                   native=native),
                       DIGITS / "digits.npz", output=tmp_path / f"{tag}.ckpt",
                       with_optimizer_state=True, firmware=firmware)
    plan = deploy.plan(artifacts, "qemu-mps2-an385", steps=3, placement=placement,
                       resume=first.checkpoint, native=native)
    then = deploy.run(plan, DIGITS / "digits.npz", output=tmp_path / f"{tag}2.ckpt",
                      firmware=firmware)
    return (first.losses, then.losses, first.checkpoint.read_bytes(),
            then.checkpoint.read_bytes())


def test_bundled_runtime_trains_and_resumes_on_the_emulated_board(firmware, digits, tmp_path):
    # files: the bundled runtime (bytecode in the heap); romfs: the package's modules
    bundled = _board_runs(firmware, digits, "files", tmp_path)
    modules = _board_runs(firmware, digits, "romfs", tmp_path)
    # without the native float kernels: the kernel families bundled too (kernels/__init__)
    assert bundled == _board_runs(firmware, digits, "files", tmp_path, native=False)
    assert len(bundled[0]) == 4 and len(bundled[1]) == 3
    assert bundled == modules


def test_a_const_reaching_another_modules_local_or_keyword_is_refused():
    # MicroPython folds a const() wherever its name follows in the file
    for use in ("def f(_N):\n    return _N\n", "def f():\n    _N = 1\n    return _N\n",
                "def f():\n    return dict(_N=1)\n"):
        sources = _package(a="from microtrain.b import g\n" + use, b="_N = const(2)\ng = 1\n")
        with pytest.raises(RuntimeBuildError, match="binds _N, a const"):
            bundle_sources(sources)


def test_private_names_only_the_bundle_spells_are_shortened():
    sources = _package(a="from microtrain.b import g\n_KEEP = 'see _named'\n"
                         "class _Thing:\n    def _helper(self, _arg=2):\n        return _arg\n"
                         "def f():\n    return _Thing()._helper(_arg=3) + g()\n"
                         "def _named():\n    return 1\n"
                         "def _shared():\n    return 2\n_FOLDED = const(4)\n",
                       c="from microtrain.a import f\n\ndef h(x):\n    return x._shared\n")
    sources["microtrain/b.py"] = "def g():\n    return 2\n"
    out = bundle_sources(sources)
    core = out["microtrain/_core.py"]
    # renamed: a global, the class, its method and the argument (only the bundle spells them)
    for name in ("_KEEP", "_Thing", "_helper", "_arg"):
        assert name not in core
    # kept: a name a string holds, one another shipped module spells, a const(), public ones
    for name in ("_named", "_shared", "_FOLDED", "def f(", "def g("):
        assert name in core
    namespace = {"const": lambda x: x}
    exec(core.split("\nimport sys\n")[0], namespace)
    assert namespace["f"]() == 5


def test_a_bundle_without_docstrings_comments_and_blank_lines():
    text = ('"""module"""\n# a comment\nclass E(Exception):\n    """only a docstring"""\n\n\n'
            'def f(x):\n    """doc"""\n    y = (x +  # why\n         # more\n         1)\n\n'
            '    return """a\n\n  b""" + str(y)\n')
    out = without_blank_lines(text)
    assert out == ('class E(Exception):\n    pass\ndef f(x):\n    y = (x +  # why\n'
                   '         1)\n    return """a\n\n  b""" + str(y)\n')
    namespace = {}
    exec(out, namespace)
    assert namespace["f"](1) == "a\n\n  b2"


def test_the_bundles_compile_without_line_numbers_unless_asked(digits, tmp_path):
    # runtime.compile_runtime: -O3 for the bundles (no line-number tables), the other modules
    # as they are; bundle_lines (deploy --line-numbers) keeps the tables
    sources = runtime.minimal_sources(digits / "model.mtb", bundled=True)
    lean = runtime.compile_runtime(sources, "armv6m", "6.3", tmp_path / "lean")
    lined = runtime.compile_runtime(sources, "armv6m", "6.3", tmp_path / "lined",
                                    bundle_lines=True)
    bundles = {path[:-3] + ".mpy" for path in BUNDLE_PATHS if path in sources}
    assert bundles == {"microtrain/_core.mpy", "microtrain/_save.mpy",
                       "microtrain/kernels/__init__.mpy"}
    for path in lean:
        if path in bundles:
            assert lean[path] < lined[path], path
        else:
            assert (tmp_path / "lean" / path).read_bytes() == (tmp_path / "lined" / path
                                                               ).read_bytes(), path
    assert sum(lined.values()) - sum(lean.values()) > 2000


def test_the_device_package_has_nothing_that_minus_O3_drops():
    # mpy-cross -O3 leaves out assert statements and makes __debug__ False: the bundles'
    # code must not depend on either
    for path in sorted((ROOT / "device" / "microtrain").rglob("*.py")):
        tree = ast.parse(path.read_text())
        found = [n.lineno for n in ast.walk(tree) if isinstance(n, ast.Assert)
                 or (isinstance(n, ast.Name) and n.id == "__debug__")]
        assert not found, f"{path}: lines {found}"


def test_deploy_line_numbers_keeps_the_tables(digits, capsys):
    # deploy --dry-run prints the runtime deploy would ship: --line-numbers compiles the
    # bundles with their line-number tables, ~2.5 KB of .mpy more for the digits MLP
    def imported(*extra):
        assert main(["deploy", str(digits), "--board", "rp2040-pico", "--steps", "1", "--data",
                     str(DIGITS / "digits.npz"), "--dry-run", "--no-native", *extra]) == 0
        out = capsys.readouterr().out
        return int(re.search(r"runtime +([\d,]+) B .* of \.mpy imported", out).group(1)
                   .replace(",", ""))
    assert imported("--line-numbers") - imported() > 2000
