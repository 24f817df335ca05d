"""Board profiles, the per-model minimal runtime, the fit check and `microtrain deploy
--dry-run`, on the host (the emulated board itself: test_board_qemu.py)."""
import json
import shutil
import subprocess
import sys

import pytest
import torch
from torch import nn

import microtrain_host as mh

from conftest import DEVICE, ROOT
from torch_reference import export
from microtrain_host.cli import main
from microtrain_host.tools import boards, runtime

EXAMPLE = ROOT / "examples" / "digits"
BOARDS = ("rp2040-pico", "rp2350-pico2", "esp32", "esp32s3", "esp32s3-psram", "pyboard",
          "stm32f746-disco", "nrf52840", "qemu-mps2-an385")


@pytest.fixture(scope="module")
def digits(tmp_path_factory):
    out = tmp_path_factory.mktemp("digits") / "build"
    assert main(["pack", str(EXAMPLE / "mlp.onnx"), "-o", str(out), "--batch-size", "8"]) == 0
    return out


def test_every_issue_board_has_a_complete_profile():
    assert set(BOARDS) <= set(boards.board_names())
    for name in boards.board_names():
        profile = boards.load_board(name)
        assert profile["name"] == name
        assert profile["heap"] <= profile["sram"] + profile["psram"]
        assert profile["mpy_arch"] in ("armv6m", "armv7m", "armv7emsp", "xtensawin", "rv32imc")


def test_unknown_board_is_named_with_the_known_ones(digits, capsys):
    assert main(["inspect", str(digits / "model.mtb"), "--no-steps", "--board", "esp8266"]) == 2
    err = capsys.readouterr().err
    assert "no board profile 'esp8266'" in err and "rp2040-pico" in err


def test_digits_runtime_is_the_families_it_uses(digits):
    modules = runtime.runtime_modules(digits / "model.mtb")
    kernels = {m.split("/")[-1][:-3] for m in modules if m.startswith("microtrain/kernels/")}
    assert kernels == {"__init__", "activation", "dense", "loss", "optim", "reduce"}
    assert "microtrain/fit.py" not in modules and "microtrain/export.py" not in modules


@pytest.mark.parametrize("quantization", [False, True], ids=["float", "qat"])
def test_minimal_runtime_alone_trains_under_micropython(digits, micropython, quantization,
                                                        tmp_path):
    # only the trimmed sources on the path: a missing module, kernel or checker would fail;
    # the QAT blob's observers are state a forward pass keeps (kept.py, whose check is
    # kernels/norm.py's: shipped with it)
    build = digits
    if quantization:
        build = tmp_path / "qat"
        mh.generate_artifacts(str(EXAMPLE / "mlp.onnx"), artifact_directory=str(build),
                              batch_size=8, optimizer="SGD", quantization=True)
    runtime.write_sources(runtime.minimal_sources(build / "model.mtb"), tmp_path / "rt")
    script = tmp_path / "step.py"
    script.write_text(
        "from microtrain import CheckpointState, Module, Optimizer\n"
        f"s = CheckpointState.load_checkpoint({str(build / 'checkpoint')!r})\n"
        f"m = Module({str(build / 'model.mtb')!r}, s)\n"
        f"o = Optimizer({str(build / 'model.mtb')!r}, m)\n"
        "print(m([0.5] * 512, [3] * 8)); o.step()\n")
    proc = subprocess.run([micropython, str(script)], capture_output=True, text=True,
                          env={"MICROPYPATH": str(tmp_path / "rt")})
    assert proc.returncode == 0, proc.stderr
    assert float(proc.stdout) > 0


def test_minimal_runtime_keeps_only_the_kernels_the_blob_uses(digits, tmp_path):
    sources = runtime.minimal_sources(digits / "model.mtb")
    assert "microtrain/inference.py" not in sources
    assert "microtrain/lr_scheduler.py" not in sources
    activation = sources["microtrain/kernels/activation.py"]
    original = (DEVICE / "microtrain" / "kernels" / "activation.py").read_text()
    assert "def relu_grad(" in activation and "def sigmoid(" not in activation
    assert "def largest(" in activation  # loss.py imports it
    # lines are blanked, not removed: a board's traceback points at the repository's lines
    kept, full = activation.split("\n"), original.split("\n")
    assert len(kept) == len(full)
    assert all(line == "" or line == full[i] for i, line in enumerate(kept))
    opcodes = sources["microtrain/opcodes.py"]
    assert "# GEMM\n" in opcodes and "# CONV\n" not in opcodes
    # a blob with an op outside the trimmed table is refused at load, not mid-training
    runtime.write_sources(sources, tmp_path / "rt")
    conv = tmp_path / "conv"
    mh.generate_artifacts(export(nn.Sequential(nn.Conv2d(1, 2, 3), nn.Flatten()),
                                 torch.zeros(1, 1, 5, 5)), loss="MSELoss", optimizer="SGD",
                          artifact_directory=conv, batch_size=1)
    saved = {k: v for k, v in sys.modules.items() if k.startswith("microtrain.") or k == "microtrain"}
    for k in saved:
        del sys.modules[k]
    sys.path.insert(0, str(tmp_path / "rt"))
    try:
        from microtrain import blob as trimmed_blob
        from microtrain import parser as trimmed_blob_parser
        from microtrain import errors as trimmed_errors
        assert trimmed_blob.__file__.startswith(str(tmp_path / "rt"))
        with pytest.raises(trimmed_errors.BlobError, match="unknown op code; this runtime is "
                           "older than the blob or was trimmed for another model"):
            trimmed_blob_parser.load(str(conv / "model.mtb"))
    finally:
        sys.path.remove(str(tmp_path / "rt"))
        for k in [k for k in sys.modules if k.startswith("microtrain.") or k == "microtrain"]:
            del sys.modules[k]
        sys.modules.update(saved)


def test_frozen_dry_run_writes_the_trimmed_sources_and_their_manifest(digits, capsys):
    assert main(["deploy", str(digits), "--board", "pyboard", "--runtime", "frozen", "--steps",
                 "2", "--data", str(EXAMPLE / "digits.npz"), "--dry-run"]) == 0
    manifest = digits / "frozen_runtime" / "manifest.py"
    assert f"FROZEN_MANIFEST={manifest}" in capsys.readouterr().out
    text = manifest.read_text()
    assert "'microtrain/kernels/dense.py'" in text and "conv.py" not in text
    assert (digits / "frozen_runtime" / "microtrain" / "kernels" / "dense.py").exists()


def test_package_json_lists_the_device_package():
    assert json.loads((DEVICE / "package.json").read_text()) == json.loads(runtime.package_json())


@pytest.mark.parametrize("board", BOARDS)
def test_dry_run_for_every_board(digits, board, capsys):
    assert main(["deploy", str(digits), "--board", board, "--steps", "20", "--data",
                 str(EXAMPLE / "digits.npz"), "--dry-run"]) == 0
    out = capsys.readouterr().out
    profile = boards.load_board(board)
    assert f"-march={profile['mpy_arch']}" in out
    # the Gemm's family shipped (a module of its own with the float kernels' module, else in
    # the kernel families' bundle, kernels/__init__.py), the Conv's not
    assert "microtrain/kernels/dense.mpy" in out or "microtrain/kernels/__init__.mpy" in out
    assert "conv.mpy" not in out
    shipped = runtime.minimal_sources(digits / "model.mtb", bundled=True)
    texts = "\n".join(text for path, text in shipped.items() if "/kernels/" in path)
    assert "def gemm(" in texts and "def conv(" not in texts
    assert "x_train.f32" in out and "160 training samples" in out
    assert "dry run: nothing copied" in out


def test_fit_check_says_when_a_model_does_not_fit(tmp_path, capsys):
    # MLP 784-128-10 (101,770 parameters, AdamW): 1.6 MB of arena against pyboard's 100 KB
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal(s).astype(np.float32) * 0.05, n)
             for n, s in (("w1", (784, 128)), ("b1", (128,)), ("w2", (128, 10)), ("b2", (10,)))]
    graph = helper.make_graph(
        [helper.make_node("Gemm", ["input", "w1", "b1"], ["h"]),
         helper.make_node("Relu", ["h"], ["r"]),
         helper.make_node("Gemm", ["r", "w2", "b2"], ["output"])], "mlp",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, [4, 784])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, [4, 10])], inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]),
              tmp_path / "big.onnx")
    build = tmp_path / "build"
    assert main(["pack", str(tmp_path / "big.onnx"), "-o", str(build)]) == 0
    capsys.readouterr()
    assert main(["inspect", str(build / "model.mtb"), "--no-steps", "--board", "pyboard"]) == 0
    assert "does NOT fit" in capsys.readouterr().out
    fit = boards.predict(build, boards.load_board("pyboard"))
    assert not fit.fits and fit.arena > 4 * 4 * 101_770
    # deploy refuses before touching any port
    assert main(["deploy", str(build), "--board", "pyboard", "--port", "/dev/null", "--data",
                 str(EXAMPLE / "digits.npz")]) == 1
    assert "predicted not to fit" in capsys.readouterr().err


def test_deploy_help_says_what_it_needs(capsys):
    with pytest.raises(SystemExit):
        main(["deploy", "--help"])
    out = capsys.readouterr().out
    assert "build_qemu_board.sh" in out and "mpremote" in out and "mpy-cross" in out
