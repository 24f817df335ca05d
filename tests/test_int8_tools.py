"""Issue 22 scope 4 (second half): an integer training blob's directory works with the tools
like any other. `microtrain train` (CPython and the MicroPython Unix port) and `microtrain
deploy` quantize the float samples on the host with the blob's own input scale / zero point
and feed int8 / uint8 bytes; the device API quantizes float inputs itself; `inspect` and the
fit check count an integer blob's arenas as the device runtime allocates them. Oracles:
onnxruntime's QuantizeLinear for the quantized bytes, the arenas the device loader really
allocates, the heap measured on the emulated Cortex-M3 and its checkpoint against the same
run on CPython's device runtime."""
import re
import shutil

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from conftest import ROOT, run_micropython
from microtrain import CheckpointState, Module, Optimizer
from microtrain import parser as device_blob_parser
from microtrain.errors import InputError
from microtrain_host.cli import main
from microtrain_host.quant.inttrain import int8_training_artifacts
from microtrain_host.tools import boards, deploy
from microtrain_host.tools.inspect import describe
from microtrain_host.tools.train import train

DIGITS = ROOT / "examples" / "digits"


def standard_names(info, directory):
    """The export's int8_train.mtb / .ckpt copied under the names every pack writes."""
    directory.mkdir()
    shutil.copyfile(info["blob"], directory / "model.mtb")
    shutil.copyfile(info["checkpoint"], directory / "checkpoint")
    return directory


@pytest.fixture(scope="module")
def digits_dirs(digits_int8, tmp_path_factory):
    """(directory with model.mtb + checkpoint, directory with the export's names, info) of
    the digits classifier trained in integers (uint8 input)."""
    tmp = tmp_path_factory.mktemp("int8_tools_digits")
    info = int8_training_artifacts(digits_int8 / "qdq.onnx", tmp / "exported", 0.05)
    return standard_names(info, tmp / "std"), tmp / "exported", info


@pytest.fixture(scope="module")
def ds_cnn_dir(tmp_path_factory):
    """A DS-CNN trained sparsely in integers (every conv's bias, the last block's depthwise
    and pointwise weights, the classifier; batch 4) and synthetic data for it."""
    from reference_models import ds_cnn
    from torch_reference import qat_qdq_model
    tmp = tmp_path_factory.mktemp("int8_tools_ds_cnn")
    qat_qdq_model(ds_cnn(), tmp, 8)
    info = int8_training_artifacts(tmp / "qdq.onnx", tmp / "exported", 0.05,
                                   train_biases=True, train_depthwise=True)
    rng = np.random.default_rng(3)
    x = rng.standard_normal((24, 1, 49, 10)).astype(np.float32)
    y = rng.integers(0, 12, 24)
    np.savez(tmp / "data.npz", x_train=x[:16], y_train=y[:16], x_val=x[16:], y_val=y[16:])
    return standard_names(info, tmp / "std"), tmp / "data.npz", info


def parameter_bytes(directory, checkpoint):
    """{name: bytes} of the parameters of `checkpoint`, loaded by the device runtime."""
    state = CheckpointState.load_checkpoint(str(checkpoint))
    Module(str(directory / "model.mtb"), state)
    return {name: bytes(p.data) for name, p in state.parameters.items()}


def ort_quantize(x, scale, zero_point, dtype):
    """onnxruntime's QuantizeLinear of float32 x (the oracle of every quantized byte)."""
    elem = TensorProto.UINT8 if dtype == np.uint8 else TensorProto.INT8
    graph = helper.make_graph(
        [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"])], "q",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [len(x)])],
        [helper.make_tensor_value_info("q", elem, [len(x)])],
        [helper.make_tensor("s", TensorProto.FLOAT, [], [float(scale)]),
         helper.make_tensor("z", elem, [], [int(zero_point)])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {"x": np.asarray(x, np.float32)})[0]


def input_quantization(blob_path):
    b = device_blob_parser.load(str(blob_path))
    x_id = b.programs["train"].inputs[0]
    scales, zero_points, _ = b.quant[x_id]
    return float(scales[0]), int(zero_points[0]), np.int8 if b.dtypes[x_id] == 2 else np.uint8


def hard_values(scale, zero_point, dtype, n):
    """n float32 inputs a quantizer gets wrong easily: exact ties x / scale = k + 0.5 (both
    parities, both signs), values just beside them, beyond the type's range and infinite."""
    low = -128 if dtype == np.int8 else 0
    ks = np.arange(low - zero_point - 4, low - zero_point + 260, dtype=np.float64)
    ties = (ks + 0.5) * scale
    values = np.concatenate([ties, np.nextafter(ties.astype(np.float32), np.float32(np.inf)),
                             [1e30, -1e30, np.inf, -np.inf, 0.0, -0.0, 300 * scale]])
    return np.resize(values.astype(np.float32), n)


# -- microtrain train ---------------------------------------------------------------------
def test_train_digits_integer_directory_both_names_and_runtimes(digits_dirs, tmp_path, capsys,
                                                                micropython):
    std, exported, info = digits_dirs
    data = np.load(DIGITS / "digits.npz")
    np.savez(tmp_path / "data.npz", x_train=data["x_train"][:400], y_train=data["y_train"][:400],
             x_val=data["x_val"][:100], y_val=data["y_val"][:100])
    records = train(std, tmp_path / "data.npz", 3, 0.05, tmp_path / "cp.ckpt")
    losses = [r[1] for r in records]
    assert all(np.isfinite(losses)) and losses[-1] < losses[0], losses
    assert records[-1][3] is not None and records[-1][3] > 0.5     # val accuracy
    # the trained checkpoint loads back and differs from the packed one
    trained = parameter_bytes(std, tmp_path / "cp.ckpt")
    assert trained[info["weight"]] != parameter_bytes(std, std / "checkpoint")[info["weight"]]
    # the export's names, the CLI, the MicroPython Unix port: the same run, byte for byte
    assert main(["train", str(exported), "--data", str(tmp_path / "data.npz"), "--epochs", "3",
                 "--lr", "0.05", "--runtime", "micropython", "--micropython", micropython,
                 "--output", str(tmp_path / "mp.ckpt")]) == 0
    out = capsys.readouterr().out
    assert "epoch 3/3" in out and "val accuracy" in out
    assert (tmp_path / "mp.ckpt").read_bytes() == (tmp_path / "cp.ckpt").read_bytes()


def test_train_sparse_ds_cnn_integer_directory(ds_cnn_dir, tmp_path):
    std, data, info = ds_cnn_dir
    records = train(std, data, 4, 0.5, tmp_path / "trained")
    losses = [r[1] for r in records]
    print("DS-CNN sparse integer training, train loss per epoch:", losses)
    assert all(np.isfinite(losses)) and losses[-1] < losses[0], losses
    trained = parameter_bytes(std, tmp_path / "trained")
    packed = parameter_bytes(std, std / "checkpoint")
    moved = [name for name in info["parameters"] if trained[name] != packed[name]]
    assert len(moved) >= len(info["parameters"]) - 1, moved


def test_train_refuses_a_directory_without_a_model(tmp_path, capsys):
    np.savez(tmp_path / "d.npz", x=np.zeros((4, 64), np.float32), y=np.zeros(4, np.int64))
    assert main(["train", str(tmp_path), "--data", str(tmp_path / "d.npz")]) != 0
    err = capsys.readouterr().err
    assert "model.mtb and checkpoint" in err and "int8_train.mtb" in err


# -- quantization: host, device API (CPython and MicroPython), onnxruntime -----------------
def test_host_quantization_of_the_data_equals_onnxruntime(digits_dirs, tmp_path):
    std, _, _ = digits_dirs
    scale, zero_point, dtype = input_quantization(std / "model.mtb")
    data = np.load(DIGITS / "digits.npz")
    plan = deploy.plan(std, "rp2040-pico", steps=5)
    deploy.prepare(plan, DIGITS / "digits.npz", tmp_path)
    sent = np.fromfile(tmp_path / "x_train.u8", np.uint8)
    assert sent.size == 5 * 64
    assert np.array_equal(sent, ort_quantize(data["x_train"][:5].reshape(-1), scale, zero_point,
                                             dtype))
    # hard values through the host's quantizer
    from microtrain_host.tools.train import quantize
    values = hard_values(scale, zero_point, dtype, 400)
    assert np.array_equal(quantize(values, (np.float32(scale), zero_point, dtype)),
                          ort_quantize(values, scale, zero_point, dtype))
    for int8_zero_point in (-3, 0, 7):     # an int8 input as well
        assert np.array_equal(
            quantize(values, (np.float32(0.25), int8_zero_point, np.int8)),
            ort_quantize(values, 0.25, int8_zero_point, np.int8))


FEED_SCRIPT = """
import sys
from array import array
from binascii import hexlify
from microtrain import CheckpointState, Module
model = Module(sys.argv[1], CheckpointState.load_checkpoint(sys.argv[2]))
model.eval()
b = model.blob
x_id = b.programs['eval'].inputs[0]
values = [float(v) for v in open(sys.argv[3]).read().split()]
n = b.sizes[x_id]
for at in range(0, len(values), n):
    out = model(array('f', values[at:at + n]), [at // n % 10])
    print('q', hexlify(bytes(model.output(x_id))).decode())
    print('loss', repr(out[0]), ' '.join(str(v) for v in out[1]))
"""


def test_float_inputs_through_the_module_api_equal_quantized_ints(digits_dirs, tmp_path,
                                                                  micropython):
    std, _, _ = digits_dirs
    scale, zero_point, dtype = input_quantization(std / "model.mtb")
    data = np.load(DIGITS / "digits.npz")
    xs = np.concatenate([data["x_val"][:6].reshape(-1), hard_values(scale, zero_point, dtype,
                                                                    4 * 64)]).astype(np.float32)
    expected = ort_quantize(xs, scale, zero_point, dtype).reshape(-1, 64)
    model = Module(str(std / "model.mtb"), CheckpointState.load_checkpoint(str(std / "checkpoint")))
    model.eval()
    x_id = model.blob.programs["eval"].inputs[0]
    cpython = []
    for i, row in enumerate(xs.reshape(-1, 64)):
        by_floats = model(row.tolist(), [i % 10])       # Python floats (doubles)
        floats_out = (by_floats[0], list(by_floats[1]))
        assert bytes(model.output(x_id)) == expected[i].tobytes(), i
        by_ints = model(expected[i].tolist(), [i % 10])
        assert (by_ints[0], list(by_ints[1])) == floats_out
        cpython.append(("q " + expected[i].tobytes().hex(),
                        "loss " + repr(floats_out[0]) + " " + " ".join(map(str, floats_out[1]))))
    # the MicroPython Unix port: the same bytes, loss and logits from array('f') inputs
    (tmp_path / "x.txt").write_text(" ".join(repr(float(v)) for v in xs))
    script = tmp_path / "feed.py"
    script.write_text(FEED_SCRIPT)
    out = run_micropython(micropython, script, std / "model.mtb", std / "checkpoint",
                          tmp_path / "x.txt").splitlines()
    assert [line for line in out if line.startswith("q ")] == [q for q, _ in cpython]
    mp_losses = [line.split() for line in out if line.startswith("loss ")]
    for got, (_, want) in zip(mp_losses, cpython):
        want = want.split()
        assert got[2:] == want[2:] and float(got[1]) == pytest.approx(float(want[1]), rel=1e-12)


INT8_SCRIPT = """
import sys
from array import array
from binascii import hexlify
from microtrain.feedq import copy_quantized


class Blob:     # what copy_quantized reads of a parsed blob with one int8 input
    pass


values = array('f', [float(v) for v in open(sys.argv[1]).read().split()])
for zero_point in (-3, 0, 7):
    b = Blob()
    b.dtypes, b.names, b.Q = [2], ['x'], bytearray(len(values))
    b.input_quant = {0: (array('f', [float(sys.argv[2])]), (zero_point,))}
    copy_quantized(b, 0, values, 0, len(values))
    print(hexlify(b.Q).decode())
"""


def test_float_inputs_of_an_int8_input_equal_onnxruntime(tmp_path, micropython):
    # the blobs above take uint8; an int8 input with zero points of both signs, through
    # the device's quantizer on CPython and on the Unix port, against onnxruntime
    values = hard_values(0.25, 0, np.int8, 600)
    (tmp_path / "x.txt").write_text(" ".join(repr(float(v)) for v in values))
    (tmp_path / "int8.py").write_text(INT8_SCRIPT)
    expected = [ort_quantize(values, 0.25, z, np.int8).tobytes().hex() for z in (-3, 0, 7)]
    out = run_micropython(micropython, tmp_path / "int8.py", tmp_path / "x.txt", 0.25)
    assert out.split() == expected
    import subprocess
    import sys
    from conftest import DEVICE
    cpython = subprocess.run([sys.executable, str(tmp_path / "int8.py"), str(tmp_path / "x.txt"),
                              "0.25"], capture_output=True, text=True, check=True,
                             env={"PYTHONPATH": str(DEVICE)}).stdout
    assert cpython.split() == expected


def test_float_inputs_of_a_blob_without_a_scale_or_not_numbers_are_refused(digits_dirs):
    std, _, _ = digits_dirs
    model = Module(str(std / "model.mtb"), CheckpointState.load_checkpoint(str(std / "checkpoint")))
    with pytest.raises(InputError, match="position 3 .* is not a number"):
        model([0.5, 0.5, 0.5, "x"] + [0.5] * 60, [1])
    with pytest.raises(InputError, match="position 2 .* is not a number"):
        model([0.5, 0.5, float("nan")] + [0.5] * 61, [1])
    with pytest.raises(InputError, match="outside the uint8 range"):
        model([0, 1, 256] + [0] * 61, [1])
    x_id = model.blob.programs["train"].inputs[0]
    del model.blob.input_quant[x_id]
    with pytest.raises(InputError, match="no quantization scale: give integers"):
        model([0.5] * 64, [1])


# -- deploy ---------------------------------------------------------------------------------
def test_deploy_dry_run_plans_quantized_data(digits_dirs, capsys):
    std, exported, _ = digits_dirs
    for directory in (std, exported):
        assert main(["deploy", str(directory), "--board", "rp2040-pico", "--steps", "20",
                     "--data", str(DIGITS / "digits.npz"), "--dry-run"]) == 0
        out = capsys.readouterr().out
        sizes = dict(re.findall(r"^  (\S+)\s+([\d,]+)$", out, re.M))
        assert sizes["x_train.u8"] == "1,280" and "x_train.f32" not in out   # 20 x 64 bytes
        assert sizes["y_train.i32"] == "80" and sizes["checkpoint"] and sizes["model.mtb"]
        assert "microtrain/feedq.mpy" in out and "fits, margin" in out
        assert "inputs quantized on the host for the blob's uint8 input" in out
        assert "dry run: nothing copied" in out


def test_integer_training_on_the_emulated_board_equals_cpython(digits_dirs, firmware, tmp_path):
    std, _, info = digits_dirs
    steps, lr = 12, 0.05
    data = np.load(DIGITS / "digits.npz")
    plan = deploy.plan(std, "qemu-mps2-an385", steps=steps)
    assert plan.placement == "romfs" and plan.blob_in_rom   # int8 weights stay in flash
    assert plan.fit.fits, (plan.fit.needed, plan.fit.heap)  # and it trains on the board
    result = deploy.run(plan, DIGITS / "digits.npz", lr=lr, firmware=firmware,
                        output=tmp_path / "board.ckpt")
    # the same steps on CPython's device runtime, from float inputs (the device quantizes)
    state = CheckpointState.load_checkpoint(str(std / "checkpoint"))
    model = Module(str(std / "model.mtb"), state)
    optimizer = Optimizer(str(std / "model.mtb"), model)
    optimizer.set_learning_rate(lr)
    losses = []
    for x, y in zip(data["x_train"][:steps], data["y_train"][:steps]):
        losses.append(model(x.reshape(-1).tolist(), [int(y)]))
        optimizer.step()
        model.lazy_reset_grad()
    CheckpointState.save_checkpoint(state, str(tmp_path / "cpython.ckpt"))
    print(f"\ndigits int8 on the board: losses {result.losses[0]:.4f} .. {result.losses[-1]:.4f};"
          f" peak heap predicted {plan.fit.train}, measured {result.peak}; {result.heap}")
    assert result.losses == pytest.approx(losses, rel=1e-6)
    assert (tmp_path / "board.ckpt").read_bytes() == (tmp_path / "cpython.ckpt").read_bytes()
    assert bytes(state.parameters[info["weight"]].data) != \
        parameter_bytes(std, std / "checkpoint")[info["weight"]]
    # the fit check against the heap the board measured between phases
    assert abs(plan.fit.train - result.peak) <= 0.10 * result.peak, (plan.fit.train, result.peak)


def test_the_one_commands_directory_trains_deploys_and_inspects(tmp_path, capsys):
    # `pack --int8` writes model.mtb / checkpoint (and int8.json, model_qdq.onnx): train,
    # deploy --dry-run and inspect --board take the directory as any other
    out = tmp_path / "build"
    assert main(["pack", str(DIGITS / "mlp.onnx"), "-o", str(out), "--int8", "--calibrate",
                 str(DIGITS / "digits.npz"), "--batch-size", "1"]) == 0
    capsys.readouterr()
    records = train(out, DIGITS / "digits.npz", 2, 0.01, tmp_path / "trained")
    assert records[-1][1] < records[0][1] and records[-1][3] > records[0][3], records
    assert main(["deploy", str(out), "--board", "qemu-mps2-an385", "--steps", "3", "--data",
                 str(DIGITS / "digits.npz"), "--dry-run"]) == 0
    text = capsys.readouterr().out
    assert "x_train.u8" in text and "192" in text and "model.mtb goes into the ROMFS" in text
    assert main(["inspect", str(out / "model.mtb"), "--no-steps", "--board", "rp2040-pico"]) == 0
    text = capsys.readouterr().out
    assert "trainable, in integers" in text and "fits, margin" in text
    assert not re.search(r"\s-\d", text[text.index("memory ("):text.index("blob bytes")])


def test_an_autoencoders_directory_trains_on_its_own_input(tmp_path, capsys, micropython,
                                                         firmware):
    """`pack --int8 --loss mse --target-is-input`: the train program takes the input alone.
    `microtrain train` takes data without labels (x_train, x_val) on CPython and MicroPython
    (with the latent cache, which keeps the input too: its own target) and deploy trains it
    on the emulated board (no labels file); the three end byte for byte where the device
    API's own loop does."""
    import onnx
    import torch
    from torch_reference import export
    torch.manual_seed(5)
    model = torch.nn.Sequential(torch.nn.Linear(16, 8), torch.nn.ReLU(), torch.nn.Linear(8, 8),
                                torch.nn.ReLU(), torch.nn.Linear(8, 16))
    onnx.save(export(model, torch.zeros(2, 16)), tmp_path / "ae.onnx")
    x = np.random.default_rng(5).standard_normal((20, 16)).astype(np.float32)
    np.savez(tmp_path / "data.npz", x_train=x[:16], x_val=x[16:])
    out = tmp_path / "build"
    assert main(["pack", str(tmp_path / "ae.onnx"), "-o", str(out), "--int8", "--calibrate",
                 str(tmp_path / "data.npz"), "--loss", "mse", "--target-is-input",
                 "--batch-size", "2", "--lr", "0.05"]) == 0
    capsys.readouterr()
    b = device_blob_parser.load(str(out / "model.mtb"))
    assert len(b.programs["train"].inputs) == 1 and b.programs["train"].latent_from > 0
    # the device API's loop: 3 epochs over the 8 batches in the order microtrain.fit draws
    from microtrain.fit import XorShift
    from microtrain_host.quant.inttrain import quantize_input
    import json
    info = json.loads((out / "int8.json").read_text())
    codes = quantize_input(x[:16], info)
    state = CheckpointState.load_checkpoint(str(out / "checkpoint"))
    module = Module(str(out / "model.mtb"), state)
    order, rng = list(range(16)), XorShift(1)
    for _ in range(3):
        for i in range(15, 0, -1):
            j = rng.below(i + 1)
            order[i], order[j] = order[j], order[i]
        for k in range(8):
            module(codes[order[2 * k:2 * k + 2]].reshape(-1).tolist())
    CheckpointState.save_checkpoint(state, str(tmp_path / "api.ckpt"))
    expected = (tmp_path / "api.ckpt").read_bytes()
    for runtime in ("cpython", "micropython"):
        records = train(out, tmp_path / "data.npz", 3, 0.05, tmp_path / runtime,
                        runtime=runtime, micropython=micropython)
        assert len(records) == 3 and records[-1][1] < records[0][1], records
        assert (tmp_path / runtime).read_bytes() == expected, runtime
    # deploy: the first 4 batches in order, on the board and through the API
    plan = deploy.plan(out, "qemu-mps2-an385", steps=4)
    result = deploy.run(plan, tmp_path / "data.npz", lr=0.05, firmware=firmware,
                        output=tmp_path / "board.ckpt")
    state = CheckpointState.load_checkpoint(str(out / "checkpoint"))
    module = Module(str(out / "model.mtb"), state)
    losses = [module(codes[2 * k:2 * k + 2].reshape(-1).tolist()) for k in range(4)]
    CheckpointState.save_checkpoint(state, str(tmp_path / "api4.ckpt"))
    assert result.losses == pytest.approx(losses, rel=1e-6)
    assert (tmp_path / "board.ckpt").read_bytes() == (tmp_path / "api4.ckpt").read_bytes()


# -- inspect and the fit check --------------------------------------------------------------
def _figure(text, label):
    return int(re.search(rf"^  {label}\s+(-?\d+)", text, re.M).group(1))


@pytest.mark.parametrize("which", ["digits", "ds_cnn"])
def test_inspect_figures_are_what_the_loader_allocates(which, digits_dirs, ds_cnn_dir):
    std, _, info = digits_dirs if which == "digits" else ds_cnn_dir
    text = describe(std / "model.mtb", steps=False)
    memory = text[text.index("memory ("):text.index("blob bytes")]
    assert not re.search(r"\s-\d", memory), memory
    state = CheckpointState.load_checkpoint(str(std / "checkpoint"))
    model = Module(str(std / "model.mtb"), state)
    b = model.blob
    assert _figure(text, "int32 arena") == len(model.I)
    assert _figure(text, "int8 arena") == len(b.Q)
    assert _figure(text, "int8 weights") == len(b.weights)
    assert _figure(text, "all arenas") == 4 * (len(model.F) + len(model.I)) + len(b.Q)
    trained_bytes = sum(len(bytes(state.parameters[name].data)) for name in info["parameters"])
    assert _figure(text, "  trainable parameters") == trained_bytes
    for name in info["parameters"]:
        assert re.search(rf"^  {re.escape(name)}\s.*trainable, in integers", text, re.M), name
    assert "frozen" not in text[text.index("\nparameters:"):text.index("\ntensors")]


def test_fit_check_keeps_a_blob_in_romfs_out_of_the_heap(ds_cnn_dir):
    std, _, _ = ds_cnn_dir
    board = boards.load_board("qemu-mps2-an385")
    in_files = boards.predict(std, board, "files")
    in_rom = boards.predict(std, board, "romfs")
    model = Module(str(std / "model.mtb"), CheckpointState.load_checkpoint(str(std / "checkpoint")))
    b = model.blob
    weights = len(b.weights)
    # beside the code: the weights' buffer no longer in the heap while training; while
    # loading, the arenas the in-place loader allocates first and the blob parsed beside
    # them (no file buffer; the byte arena, the DS-CNN's activations, the largest block)
    assert (in_files.train - in_files.code) - (in_rom.train - in_rom.code) >= weights
    assert in_rom.arena >= len(b.Q) > 4 * len(model.F)
    assert in_rom.load - in_rom.code > 4 * (len(model.F) + len(model.I)) + len(b.Q)
    assert in_rom.reserve >= 4 * (len(model.F) + len(model.I)) + len(b.Q)
