"""The native module's integer training kernels of kernels/inttrain.py besides
int_gemm_update (device/native/inttrain_native.c: int_gemm_grad_input, int_conv1x1_update,
int_gemm_update_momentum) on the emulated boards, with tests/test_board_natmod.py's
method: the board runs only the native kernels on random cases
(tests/device_scripts/inttrain_native_train.py) and prints a CRC-32 per case; CPython runs
the same script with the pure-Python kernels on the same cases (cpython_cases),
and the two are compared case by case. Then kernels/fastpath.py's choice of them, and a
whole integer training run that uses them (the packager's SGD-momentum head over a 1x1
convolution) on the emulated Cortex-M4F (its arenas leave the M3's heap short) with the
native module, bit for bit CPython's."""
import pytest

from test_board_natmod import (HEAP_PROBE, RV32, build_module, check_against_cpython,
                               check_native_heap, native_script, run_on_board)

KERNELS = ("int_gemm_grad_input", "int_conv1x1_update", "int_gemm_update_momentum")
CASES = 200


def train_script(cases=CASES):
    return native_script("inttrain_native_train.py", cases)


@pytest.mark.parametrize("board,arch", [("qemu-mps2-an385", "armv6m"),
                                        ("qemu-mps2-an385", "armv7m"), (RV32, "rv32imc")])
def test_native_inttrain_kernels_equal_pure_on_the_emulated_boards(firmware, rv32_firmware,
                                                                   board, arch, tmp_path):
    # 200 random cases per kernel against CPython's pure kernels (the input gradients whose
    # sums wrap the int32 arena against the board's own pure kernel); the heap the module
    # takes at import is what the fit check predicts, within 10 %: measured in a run of its
    # own, since the import's qstrs can take a new qstr pool whose size depends on how many
    # the script compiled before them (this script before the probe: 25,616 B on the
    # RISC-V core, 21,104 B alone)
    rv32 = board == RV32
    module = build_module(arch)
    script = train_script()
    out = run_on_board(rv32_firmware if rv32 else firmware, tmp_path, module, script,
                       board=board)
    pure_out = check_against_cpython(out, script, CASES * len(KERNELS))
    for name in KERNELS:
        fallback = int(pure_out.split(name + " cases %d fallback" % CASES)[1].split()[0])
        assert f"{name} cases {CASES} fallback {fallback} different 0" in out, out[-3000:]
        assert fallback > 0, out[-3000:]     # the pure kernels' fallback exercised
    probe = tmp_path / "heap"
    probe.mkdir()
    heap = run_on_board(rv32_firmware if rv32 else firmware, probe, module, HEAP_PROBE,
                        board=board)
    print(f"{arch}: {check_native_heap(heap, module):,d} B of heap at import")


def test_fastpath_picks_the_native_training_kernels(firmware, tmp_path):
    """native > viper > pure: inttrain's update kernels are the module's (the logits stay
    viper), the module's _pure holds the family's pure kernels, use_fast(False) puts them
    back."""
    out = run_on_board(firmware, tmp_path, build_module("armv6m"), """
from microtrain.kernels import inttrain, inttrain_viper, qlinear_native
for name in %r:
    print(name, getattr(inttrain, name) is getattr(qlinear_native, name),
          qlinear_native._pure[name] is inttrain._pure[name])
print('logits', inttrain.int_gemm_logits is inttrain_viper.int_gemm_logits)
inttrain.use_fast(False)
print('pure', all(getattr(inttrain, n) is inttrain._pure[n] for n in %r))
""" % (KERNELS, KERNELS))
    for line in [f"{name} True True" for name in KERNELS] + ["logits True", "pure True"]:
        assert line in out, out[-2000:]


def last_block_case(board_cost, tmp, momentum=0.9):
    """bench/board_cost.py's Case of the KWS DS-CNN's "int8 last block" personalisation step
    (examples/kws/personalise.py: the last 1x1 convolution and the classifier in integers)
    with SGD momentum on the classifier, batch 1, as board_cost.kws_cases makes its cases
    (the backbone calibrated on 2 batches of 4: any ranges do for bit identity): its step
    calls all three kernels (int_gemm_grad_input, int_conv1x1_update,
    int_gemm_update_momentum)."""
    import numpy as np

    import make_data
    import quantize
    from microtrain_host.formats.checkpoint import write_checkpoint
    from microtrain_host.quant.inttrain import (int8_training_artifacts, int8_training_model,
                                                quantize_input)
    qdq, _ = quantize.calibrate(tmp / "kws_backbone", steps=2, batch=4)
    sample = make_data.personalisation_set()
    x, y = sample["x_train"][:1], sample["y_train"][:1]
    trained = {"train_conv": True, "momentum": momentum}
    out = tmp / "last_block"
    info = int8_training_artifacts(qdq, out, 0.003, **trained)
    params = int8_training_model(qdq, True, **trained)[4]
    for name in (info["weight"], info["bias"]):     # the new classifier at zero
        params[name] = np.zeros_like(params[name])
    write_checkpoint(out / "checkpoint", params, {}, keep_integers=True)
    q = np.asarray(quantize_input(x, info))
    (out / "x.q8").write_bytes(q.tobytes())
    (tmp / "kws_y.i32").write_bytes(y.astype("<i4").tobytes())
    return board_cost.Case("KWS DS-CNN int8 last block + momentum, batch 1", "train",
                           info["blob"], {"checkpoint": out / "checkpoint", "x.q8": out / "x.q8",
                                          "y.i32": tmp / "kws_y.i32"}, "x.q8",
                           "b" if q.dtype == np.int8 else "B", "y.i32")


# appended to tests/device_scripts/int8_steps_crc.py: the step's kernels are the module's
PICKED = """
from microtrain.kernels import inttrain
print("inttrain_native", *[getattr(inttrain, k) is getattr(qlinear_native, k) for k in %r])
""" % (KERNELS,)


def test_kws_last_block_momentum_steps_with_the_native_module_equal_cpython(m4_firmware,
                                                                           tmp_path):
    """A whole integer training run on the three kernels: two steps of the KWS "int8 last
    block" with momentum on the emulated Cortex-M4F (armv7m build, which deploy ships for
    armv7emsp, beside the blob's minimal runtime; its arenas and blob leave the Cortex-M3's
    140 KiB heap 3.6 KB short) give CPython's pure-Python arenas bit for bit (parameters,
    velocities, gradients: CRC-32) and its losses (to float32)."""
    import tempfile

    from microtrain_host.tools import runtime
    from test_board_kws_native import SCRIPT, STEPS, cpython_run, load_board_cost
    board_cost = load_board_cost()
    case = last_block_case(board_cost, tmp_path)
    ops = set(runtime.op_codes(case.blob))
    from microtrain_host.contract.ops import BY_CODE
    assert {BY_CODE[o].kernel for o in ops} >= set(KERNELS)
    expected = cpython_run(case)
    files = dict(case.files, **{"microtrain/kernels/qlinear_native.mpy": build_module("armv7m")})
    with tempfile.TemporaryDirectory(prefix="kws-native-") as tmp:
        out = board_cost.run_on_board(tmp, runtime.minimal_sources(case.blob), files,
                                      case.settings + f"STEPS = {STEPS}\n" + SCRIPT.read_text()
                                      + PICKED, m4_firmware, board="qemu-mps2-an386")
    lines = [line.split() for line in out.splitlines()]
    assert ["inttrain_native"] + ["True"] * len(KERNELS) in lines, out[-3000:]
    losses = [words[1] for words in lines if words[:1] == ["loss"]]
    crc = [tuple(int(w) for w in words[1:]) for words in lines if words[:1] == ["crc"]]
    print(f"\nlast block + momentum: losses {losses}, arena CRCs {crc}")
    assert crc == [expected[1]], out[-3000:]
    assert [float(v) for v in losses] == pytest.approx([float(v) for v in expected[0]],
                                                       rel=1e-6)
