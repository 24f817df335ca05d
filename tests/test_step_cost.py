"""The step cost estimate (tools/step_cost.py): a step's work counted from the packed
programs, the estimate `microtrain inspect --board` and `deploy --dry-run` print from it and
the board profile's clock_hz; and the instruction counter it was measured with, the emulated
board under qemu -icount (needs the firmware of scripts/build_qemu_board.sh: skipped without
it, failed when MICROTRAIN_REQUIRE_QEMU=1)."""
import json
import re
import subprocess
import sys

import pytest

from conftest import ROOT
from microtrain_host import generate_artifacts
from microtrain_host.cli import main
from microtrain_host.tools import boards, deploy, step_cost

DIGITS = ROOT / "examples" / "digits"


@pytest.fixture(scope="module")
def digits_adamw(tmp_path_factory):
    out = tmp_path_factory.mktemp("digits") / "build"
    generate_artifacts(str(DIGITS / "mlp.onnx"), loss="CrossEntropyLoss", optimizer="AdamW",
                       artifact_directory=str(out), batch_size=8)
    return out


def test_digits_step_work_is_its_layers_products_and_parameters(digits_adamw):
    work = step_cost.step_work(digits_adamw / "model.mtb")
    b, i, h, o = 8, 64, 32, 10
    forward = b * i * h + b * h * o
    # backward: the hidden layer's gradient, both weight gradients; the input needs none
    backward = b * o * h + o * b * h + h * b * i
    assert work.what == "training step"
    assert work.macs == {"float dense": forward + backward}
    assert work.updates == {"AdamW": i * h + h + h * o + o}


def test_conv_step_macs_are_the_taps_inside_the_input(tmp_path):
    """Two convs (stride, padding, groups, dilation), trained: the first's forward and weight
    gradient, the second's forward, input and weight gradients, each as many MACs as a conv
    of ones over ones sums to (the kernels skip the taps on padding)."""
    import numpy as np
    import onnx
    import torch
    import torch.nn.functional as F
    from onnx import TensorProto, helper, numpy_helper
    rng = np.random.default_rng(0)
    weights = [numpy_helper.from_array(rng.standard_normal((4, 2, 3, 3)).astype(np.float32), n)
               for n in ("w1", "w2")]
    graph = helper.make_graph(
        [helper.make_node("Conv", ["input", "w1"], ["a"], pads=[1, 1, 1, 1], strides=[2, 2]),
         helper.make_node("Relu", ["a"], ["r"]),
         helper.make_node("Conv", ["r", "w2"], ["output"], pads=[0, 1, 0, 1], group=2,
                          dilations=[1, 2])], "convs",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, [2, 2, 9, 7])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, None)], weights)
    model = onnx.shape_inference.infer_shapes(
        helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    onnx.save(model, tmp_path / "convs.onnx")
    generate_artifacts(str(tmp_path / "convs.onnx"), loss="MSELoss", optimizer="SGD",
                       artifact_directory=str(tmp_path / "build"))
    a = F.conv2d(torch.ones(2, 2, 9, 7), torch.ones(4, 2, 3, 3), stride=2, padding=1)
    b = F.conv2d(torch.ones_like(a), torch.ones(4, 2, 3, 3), padding=(0, 1), groups=2,
                 dilation=(1, 2))
    work = step_cost.step_work(tmp_path / "build" / "model.mtb")
    assert work.macs == {"float conv": int(2 * a.sum() + 3 * b.sum())}
    assert work.updates == {"SGD": 2 * 4 * 2 * 3 * 3}


def test_transposed_conv_macs_are_the_products_that_land_inside(tmp_path):
    import numpy as np
    import torch
    import torch.nn.functional as F
    from onnx import TensorProto, helper, numpy_helper
    w = numpy_helper.from_array(np.full((2, 3, 3, 3), 0.1, np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("ConvTranspose", ["input", "w"], ["output"], strides=[2, 2],
                          pads=[1, 1, 1, 1])], "up",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, 2, 4, 5])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, [1, 3, 7, 9])], [w])
    path = tmp_path / "up.onnx"
    path.write_bytes(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
                     .SerializeToString())
    generate_artifacts(str(path), loss="MSELoss", optimizer="SGD",
                       artifact_directory=str(tmp_path / "build"))
    y = F.conv_transpose2d(torch.ones(1, 2, 4, 5), torch.ones(2, 3, 3, 3), stride=2, padding=1)
    # its forward and its weight gradient (the input needs none)
    work = step_cost.step_work(tmp_path / "build" / "model.mtb")
    assert work.macs == {"float conv": int(2 * y.sum())}


def test_inspect_and_dry_run_print_the_estimate_from_the_macs_and_the_clock(digits_adamw,
                                                                            capsys):
    blob = digits_adamw / "model.mtb"
    work = step_cost.step_work(blob)
    bytecode = (work.macs["float dense"] * step_cost.INSTRUCTIONS_PER_MAC["float dense"]
                + work.updates["AdamW"] * step_cost.INSTRUCTIONS_PER_UPDATE["AdamW"])
    assert bytecode > 0
    for board in ("rp2040-pico", "qemu-mps2-an385", "stm32f746-disco", "esp32"):
        profile = boards.load_board(board)
        clock = profile["clock_hz"]
        # the ARM boards' runtimes carry the native float module, its Gemm and AdamW counted
        # at the cost of the build they get (the M3's armv7m, the RP2040's armv6m, the FPU
        # boards' armv7emsp, counted on the emulated Cortex-M4F); the ESP32 none (bytecode)
        native = boards.native_for(blob, profile, boards.default_placement(profile))
        instructions = step_cost.step_work(blob, native).instructions()
        if board == "esp32":
            assert not native and instructions == bytecode
        else:
            build = {"rp2040-pico": "armv6m", "stm32f746-disco": "armv7emsp"}.get(board)
            armv7m = {"float dense": step_cost.NATIVE_INSTRUCTIONS_PER_MAC["float dense"],
                      "AdamW": step_cost.NATIVE_INSTRUCTIONS_PER_UPDATE["AdamW"]}
            prefix, costs = ((f"native {build} ", step_cost.NATIVE_FLOAT_BUILDS[build]) if build
                             else ("native ", armv7m))
            native_work = step_cost.step_work(blob, native)
            assert native_work.macs == {prefix + "float dense": work.macs["float dense"]}
            assert native_work.updates == {prefix + "AdamW": work.updates["AdamW"]}
            assert instructions == (work.macs["float dense"] * costs["float dense"]
                                    + work.updates["AdamW"] * costs["AdamW"]) < bytecode / 10
        assert main(["inspect", str(digits_adamw / "model.mtb"), "--no-steps", "--board",
                     board]) == 0
        inspected = capsys.readouterr().out
        assert main(["deploy", str(digits_adamw), "--board", board, "--steps", "2", "--data",
                     str(DIGITS / "digits.npz"), "--dry-run"]) == 0
        for out in (inspected, capsys.readouterr().out):
            found = re.search(rf"estimated time per training step on {board} at "
                              rf"{clock / 1e6:g} MHz: ([\d,]+\.\d) ms \(([\d,]+\.\d)-", out)
            assert found, out
            assert float(found.group(1).replace(",", "")) == round(1000 * instructions / clock, 1)
            low = 1000 * instructions / clock * step_cost.CYCLES_PER_INSTRUCTION[0]
            assert float(found.group(2).replace(",", "")) == round(low, 1)
            assert "an estimate, not a measurement" in out


def test_every_profile_has_a_sourced_clock():
    for name in boards.board_names():
        profile = boards.load_board(name)
        assert 1_000_000 <= profile["clock_hz"] <= 1_000_000_000, name
        assert len(profile["clock_source"]) > 20, name


@pytest.mark.parametrize("clock,error", [(None, "lacks clock_hz"),
                                         ("125 MHz", "clock_hz must be a positive integer"),
                                         (0, "clock_hz must be a positive integer")])
def test_a_profile_without_a_clock_is_refused(tmp_path, monkeypatch, clock, error):
    profile = json.loads((ROOT / "boards" / "rp2040-pico.json").read_text())
    if clock is None:
        del profile["clock_hz"]
    else:
        profile["clock_hz"] = clock
    (tmp_path / "made-up.json").write_text(json.dumps(profile))
    monkeypatch.setenv("MICROTRAIN_BOARDS_DIR", str(tmp_path))
    with pytest.raises(boards.BoardError, match=error):
        boards.load_board("made-up")


COUNT_LOOP = """
import machine
def loop(n):
    s = 0
    for i in range(n):
        s += i
    return s
loop(10)
for n in (2000, 4000):
    t0 = machine.mem32[ADDRESS]
    loop(n)
    print('ticks', n, (machine.mem32[ADDRESS] - t0) & 0xFFFFFFFF)
"""


def test_icount_counts_the_same_instructions_on_every_run(firmware, tmp_path):
    """Two boots of the emulated board under -icount shift=0 count a fixed loop in the same
    FPGAIO ticks (within one: where the counter's edge falls), and twice the loop in about
    twice the ticks: it counts instructions, not host time."""
    script = tmp_path / "loop.py"
    script.write_text(f"ADDRESS = {deploy.QemuBoard.COUNTER_ADDRESS}\n" + COUNT_LOOP)
    runs = []
    for _ in range(2):
        with deploy.QemuBoard(firmware, icount=True) as qemu:
            proc = subprocess.run([sys.executable, "-m", "mpremote", "connect", qemu.port,
                                   "run", str(script)], capture_output=True, text=True,
                                  timeout=120)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        runs.append({int(n): int(t) for _, n, t in re.findall(r"(ticks) (\d+) (\d+)",
                                                              proc.stdout)})
    assert sorted(runs[0]) == [2000, 4000], runs
    for n in (2000, 4000):
        assert runs[0][n] > 0 and abs(runs[0][n] - runs[1][n]) <= 1, runs
    assert 1.9 < runs[0][4000] / runs[0][2000] < 2.1, runs
    print(f"\nicount: loop of 2000 in {runs[0][2000]} and {runs[1][2000]} ticks "
          f"(~{runs[0][2000] * deploy.QemuBoard.INSTRUCTIONS_PER_TICK / 2000:.0f} instructions "
          f"per iteration)")
