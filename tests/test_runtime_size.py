"""The size of the digits MLP's minimal training runtime (what `microtrain deploy` ships for
it: AdamW, batch 8): its .mpy bytes for rp2040-pico (armv6m) and the fit check's heap for
them as `deploy --dry-run` prints them, and the heap a real import of those modules takes
from the emulated board's littlefs (bytecode copied into the heap; needs the firmware of
scripts/build_qemu_board.sh).

The ceilings are the figures measured when issue 20's scope 5 work stopped, plus a little
room; lower them as the runtime shrinks. The issue's targets are 24 KiB of .mpy and 36 KiB
of imported heap; docs/design.md ("The minimal runtime's size") says where the bytes go."""
import re
import sys

import pytest

from conftest import ROOT
from microtrain_host.cli import main
from microtrain_host.tools import boards, runtime
from microtrain_host.tools.runtime_messages import is_message_module

sys.path.insert(0, str(ROOT / "scripts"))
import measure_code_heap  # noqa: E402

DIGITS = ROOT / "examples" / "digits"
# measured 2026-11-29 (third session): the bundles compiled at mpy-cross -O3, without their
# line-number tables (runtime.compile_runtime; deploy --line-numbers keeps them): 44,185 B of
# .mpy shipped, 34,155 B imported, 50,890 B predicted (1.49 heap bytes per .mpy byte: see
# boards.CODE_HEAP_PER_MPY_BYTE), 50,272 B measured. Before, six functions folded into their only caller or aliased
# (flatbuf Reader.need = check; parser _check_frame, module _check_state and
# _check_nonnegative, fbwriter _children, CheckpointState._refs, loader _file_size
# inline): 46,682 B of .mpy shipped, 36,652 B imported, 53,951 B predicted, 52,256 B
# measured. Before (2026-11-28), Module.load_checkpoint's reload and input_names / output_names moved
# into microtrain/moduleextra.py (shipped, imported on first use: runtime.LAZY_MODULES):
# 46,944 B of .mpy shipped (20 modules, +446 B of flash for the module's own 571 B),
# 36,914 B imported, 52,688 B measured. Before, the bundles' private names shortened, their docstrings, comment and
# blank lines dropped (runtime_bundle.py shorten_private_names, without_blank_lines) and
# the five kernel families bundled into microtrain/kernels/__init__.py: 46,498 B of .mpy
# shipped (19 modules), 37,039 B imported, 54,521 B of heap predicted, 52,880 B measured
# (without the kernel bundle: 46,873, 37,414, 55,073, 53,680 B; names only: 47,137,
# 37,678, 55,462, 53,888 B). Before, the runtime bundled (tools/runtime_bundle.py:
# microtrain/_core.py and _save.py for the package's 16 modules) and the errno words in
# microtrain/_msg_oserrors.py: 47,871 B of .mpy shipped (24 modules), of which 9,459 B error messages (microtrain/_msg_*,
# imported only when one is raised) and 38,412 B imported by a training run; 56,542 B of
# heap predicted for them (files), 54,592 B measured importing them on the emulated board.
# Unbundled: 51,204 B shipped (37 modules), 42,150 B imported, 62,044 B predicted, 57,088 B
# measured. Before issue 20's scope 5 work: 53,455 B shipped, 44,085 B imported, 64,893 B
# predicted, 58,960 B measured; before the message move (issue 20 filed 40,296 B): 51,467 B
# shipped and imported, 75,759 B predicted, 69,376 B measured.
IMPORTED_MPY_CEILING = 34400
SHIPPED_MPY_CEILING = 44400
PREDICTED_HEAP_CEILING = 51000
IMPORTED_HEAP_CEILING = 50600


@pytest.fixture(scope="module")
def digits(tmp_path_factory):
    out = tmp_path_factory.mktemp("digits") / "build"
    assert main(["pack", str(DIGITS / "mlp.onnx"), "-o", str(out), "--batch-size", "8",
                 "--optimizer", "adamw"]) == 0
    return out


def test_digits_runtime_for_the_pico_within_its_ceilings(digits, capsys):
    # the Python runtime (--no-native: without the native float kernels' machine code and
    # their switch, which tests/test_natmod_ship.py counts)
    assert main(["deploy", str(digits), "--board", "rp2040-pico", "--steps", "1", "--data",
                 str(DIGITS / "digits.npz"), "--dry-run", "--no-native"]) == 0
    out = capsys.readouterr().out
    listed = re.search(r"minimal runtime: (\d+) modules, ([\d,]+) B of \.mpy, of which "
                       r"([\d,]+) B error messages", out)
    assert listed, out
    shipped, messages = (int(listed.group(i).replace(",", "")) for i in (2, 3))
    # the listing's rows add up to the totals it prints
    rows = dict(re.findall(r"^  (microtrain/\S+\.mpy)\s+([\d,]+)$", out, re.M))
    rows = {name: int(n.replace(",", "")) for name, n in rows.items()}
    assert len(rows) == int(listed.group(1)) and sum(rows.values()) == shipped
    assert sum(n for name, n in rows.items() if "/_msg_" in name) == messages
    imported = int(re.search(r"runtime +([\d,]+) B .* of \.mpy imported", out).group(1)
                   .replace(",", ""))
    # the modules imported only on first use of an API a training loop does not call
    # (runtime.LAZY_MODULES: moduleextra.py) are shipped, not imported
    lazy = sum(n for name, n in rows.items() if runtime.is_lazy_module(name))
    assert lazy > 0
    assert imported == shipped - messages - lazy
    heap = int(re.search(r"imported code +([\d,]+) B", out).group(1).replace(",", ""))
    assert heap == int(boards.CODE_HEAP_PER_MPY_BYTE["files"] * imported)  # no machine code
    assert imported <= IMPORTED_MPY_CEILING, f"the digits runtime grew to {imported} B of .mpy"
    assert shipped <= SHIPPED_MPY_CEILING, f"the digits runtime grew to {shipped} B shipped"
    assert heap <= PREDICTED_HEAP_CEILING, f"the digits runtime's predicted heap grew to {heap} B"


def test_digits_runtime_imported_from_files_on_the_emulated_board(digits, firmware):
    # every module of the runtime but its error messages and its LAZY_MODULES imported, bundled as deploy ships
    # it to files (runtime_bundle.py), the checkpoint writer too (a run imports it at its
    # first save): what the board's heap holds of the code once
    # training has saved
    board = boards.load_board("qemu-mps2-an385")
    sources = {path: text for path, text in runtime.minimal_sources(
        digits / "model.mtb", bundled=True).items()
        if not (is_message_module(path) or runtime.is_lazy_module(path))}
    mpy, heap = measure_code_heap.measure(board, sorted(sources), "files", sources)
    print(f"\ndigits runtime: {len(sources)} modules, {mpy} B of .mpy, {heap} B of heap "
          f"imported from littlefs")
    assert mpy <= IMPORTED_MPY_CEILING, mpy
    assert heap <= IMPORTED_HEAP_CEILING, heap
    # the fit check's prediction (files: CODE_HEAP_PER_MPY_BYTE) does not undercount it
    assert heap <= boards.CODE_HEAP_PER_MPY_BYTE["files"] * mpy, (heap, mpy)


def test_the_fit_checks_figure_covers_a_bundled_runtime_without_line_numbers(tmp_path,
                                                                              firmware):
    # the SGD runtime's heap per .mpy byte was the largest measured (1.481, 2026-11-29):
    # CODE_HEAP_PER_MPY_BYTE["files"] must not undercount it
    out = tmp_path / "sgd"
    assert main(["pack", str(DIGITS / "mlp.onnx"), "-o", str(out), "--batch-size", "4",
                 "--optimizer", "sgd"]) == 0
    sources = {path: text for path, text in runtime.minimal_sources(
        out / "model.mtb", bundled=True).items()
        if not (is_message_module(path) or runtime.is_lazy_module(path))}
    mpy, heap = measure_code_heap.measure(boards.load_board("qemu-mps2-an385"),
                                          sorted(sources), "files", sources)
    assert heap <= boards.CODE_HEAP_PER_MPY_BYTE["files"] * mpy, (heap, mpy)


def test_the_floor_script_compiles_what_a_session_ran(digits, capsys):
    # scripts/runtime_floor.py (the figures docs/design.md gives for what trimming could
    # reach): a session of the shipped runtime runs, and each module's floor is its text
    # without what never ran
    import runtime_floor
    text = ("def used(x):\n    if x < 0:\n        raise ValueError(why(x))\n"
            "    try:\n        x += 1\n    except KeyError:\n        x = 0\n    return x\n\n"
            "def why(x):\n    return 'negative %d' % x\n\ndef unused():\n    return 1\n\n"
            "used(1)\n")
    ran = {1, 2, 4, 5, 8, 10, 13, 16}   # the defs, the test, the try, the return, the call
    assert runtime_floor.executed_only(text, ran) == (
        "def used(x):\n    if x < 0:\n        pass\n    x += 1\n    return x\nused(1)")
    assert runtime_floor.executed_only(text, ran, checks=False) == (
        "def used(x):\n    x += 1\n    return x\nused(1)")
    # errors=True: the raise and the function its message calls stay whole
    assert runtime_floor.executed_only(text, ran, errors=True) == (
        "def used(x):\n    if x < 0:\n        raise ValueError(why(x))\n    x += 1\n"
        "    return x\n\ndef why(x):\n    return 'negative %d' % x\nused(1)")
    runtime_floor.main([str(digits), "--data", str(DIGITS / "digits.npz"), "--steps", "2"])
    rows = re.findall(r"^(microtrain/\S+)\s+([\d,]+)\s+([\d,]+)\s+([\d,]+)\s+([\d,]+)$",
                      capsys.readouterr().out, re.M)
    sizes = {row[0]: [int(n.replace(",", "")) for n in row[1:]] for row in rows}
    assert "microtrain/_core.py" in sizes and "microtrain/_save.py" in sizes
    for path, (now, with_errors, ran_only, no_checks) in sizes.items():
        assert 0 < no_checks <= ran_only <= with_errors <= now, path
    # the bundle's floor keeps its errors' raises and the run's own code: most of it
    now, with_errors, ran_only, no_checks = sizes["microtrain/_core.py"]
    assert no_checks < ran_only < with_errors < now and with_errors > now // 2
