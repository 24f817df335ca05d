"""Whole integer training runs with the native int8 module on the emulated boards, bit for
bit against CPython's pure-Python kernels: the KWS DS-CNN's personalisation steps at batch 1
("int8 last": the classifier; "int8 sparse": the biases, the last block and the classifier)
of examples/kws/personalise.py, from its calibrated backbone, on the first personalisation
sample. The boards run the blob in place from flash with the module deploy ships for their
architecture beside the kernels (fastpath picks its Gemm and Conv, inttrain's
int_gemm_update and intgrad's backward kernels; the other integer training kernels are
viper); CPython runs the same blob, checkpoint and sample with the pure-Python
kernels. The same int and byte arenas (CRC-32 of parameters, gradients, momenta) and
losses.
"int8 last" runs on the Cortex-M3 (armv6m build, every ARM core's); "int8 sparse", whose
arenas alone take 118 KiB, on the Cortex-M4F with its 256 KiB heap (the armv7m build, which
deploy ships for armv7emsp). Needs both ARM firmwares (skipped without them, failed when
MICROTRAIN_REQUIRE_QEMU / MICROTRAIN_REQUIRE_QEMU_M4=1)."""
import importlib.util
import pathlib
import tempfile
import zlib
from array import array

import pytest

from conftest import ROOT
from test_board_natmod import build_module

STEPS = 2
SCRIPT = ROOT / "tests" / "device_scripts" / "int8_steps_crc.py"


def load_board_cost():
    """bench/board_cost.py as a module: its board runner and Case."""
    spec = importlib.util.spec_from_file_location("board_cost", ROOT / "bench" / "board_cost.py")
    board_cost = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(board_cost)
    return board_cost


@pytest.fixture(scope="module")
def kws_cases(tmp_path_factory):
    """bench/board_cost.py (its board runner) and its KWS cases (the blobs, checkpoints and
    sample files) by name; the backbone's ranges calibrated on 2 batches of 4 (the example's
    20 of 16 take minutes on CPython, and any ranges do for bit identity)."""
    board_cost = load_board_cost()
    return board_cost, {case.name: case
                        for case in board_cost.kws_cases(tmp_path_factory.mktemp("kws"),
                                                         steps=2, batch=4)}


def cpython_run(case, state=None):
    """The losses and the arenas' CRC-32 after STEPS steps on CPython (pure-Python kernels);
    state: the int arena's spans to check instead of the whole (int8_steps_crc.py's STATE)."""
    from microtrain import CheckpointState, Module, Optimizer
    files = {name: pathlib.Path(path) for name, path in case.files.items()}
    blob = memoryview(files["model.mtb"].read_bytes())
    model = Module(blob, CheckpointState.load_checkpoint(str(files["checkpoint"])))
    opt = Optimizer(blob, model)
    typecode = "b" if "X_TYPE = 'b'" in case.settings else "B"     # int8 or uint8 input
    x = array(typecode, files["x.q8"].read_bytes())
    y = array("i", files["y.i32"].read_bytes()) if "y.i32" in files else None  # autoencoder
    losses = []
    for _ in range(STEPS):
        losses.append(repr(model(x) if y is None else model(x, y)))
        opt.step()
        model.lazy_reset_grad()
    ints = memoryview(model.I)
    crc = zlib.crc32(ints) if state is None else 0
    for at, n in state or ():
        crc = zlib.crc32(ints[at:at + n], crc)
    return losses, (crc, zlib.crc32(bytes(model.blob.Q)))


def board_run(board_cost, firmware, board, module, case):
    """The losses and arena CRCs on the board: the blob's minimal runtime (as deploy copies
    it) and the module in its ROM filesystem, beside the case's files."""
    from microtrain_host.tools import runtime
    sources = runtime.minimal_sources(case.blob)
    files = dict(case.files, **{"microtrain/kernels/qlinear_native.mpy": module})
    with tempfile.TemporaryDirectory(prefix="kws-native-") as tmp:
        out = board_cost.run_on_board(tmp, sources, files, case.settings + f"STEPS = {STEPS}\n"
                                      + SCRIPT.read_text(), firmware, board=board)
    lines = [line.split() for line in out.splitlines()]
    losses = [words[1] for words in lines if words[:1] == ["loss"]]
    native = [words[1:] for words in lines if words[:1] == ["native"]]
    crc = [tuple(int(w) for w in words[1:]) for words in lines if words[:1] == ["crc"]]
    assert len(native) == 1 and native[0] and set(native[0]) == {"True"}, out[-3000:]
    return losses, crc[0]


@pytest.mark.parametrize("config,board,arch", [
    ("int8 last", "qemu-mps2-an385", "armv6m"),
    ("int8 sparse", "qemu-mps2-an386", "armv7m")])
def test_kws_int8_steps_with_the_native_module_equal_cpython(kws_cases, firmware, m4_firmware,
                                                             config, board, arch):
    board_cost, cases = kws_cases
    case = cases[f"KWS DS-CNN {config}, batch 1"]
    expected = cpython_run(case)
    got = board_run(board_cost, m4_firmware if board.endswith("an386") else firmware, board,
                    build_module(arch), case)
    print(f"\n{config} on {board} ({arch} build): losses {got[0]}, arena CRCs {got[1]}")
    # the integer state bit for bit; the loss is a float read out of it (single precision
    # on the board, double on CPython)
    assert got[1] == expected[1]
    assert [float(v) for v in got[0]] == pytest.approx([float(v) for v in expected[0]],
                                                       rel=1e-6)
