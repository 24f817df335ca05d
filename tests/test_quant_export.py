"""Issue 10, scope 4: Module.export_model_for_inferencing of a quantization-aware training blob
writes the int8 inference blob, its int8 weights, int32 biases, scales, zero points and
requantization heads computed on the device from the current weights and the frozen
observer ranges (the blob's "export" program, kernels/quant.py). It equals, byte for byte,
the blob the host packs from the same checkpoint (`microtrain export --qdq --int8-blob`); the
device runs it with the int8 kernels within one output step of onnxruntime running the host's
QDQ model; MicroPython writes the same bytes, and so does single-precision arithmetic (what
microcontroller builds do: every float operation rounded to float32)."""
import numpy as np
import onnx
import pytest
import torch

import microtrain_host as mh
from conftest import ROOT, run_micropython
from microtrain import CheckpointState, InferenceSession, Module, Optimizer
from microtrain import parser as device_blob_parser
from microtrain_host.cli import main
from reference_models import ds_cnn, mobilenet_v2_block, resnet_block
from test_float32 import Float32Arena
from test_models import make_data
from test_quant_int8 import compare
from torch_reference import export

DIGITS = ROOT / "examples" / "digits"
QLINEAR = range(220, 229)


def digits_case():
    data = np.load(DIGITS / "digits.npz")
    xs = data["x_train"][:8 * 20].reshape(20, 8, 64).astype(np.float32)
    ys = data["y_train"][:8 * 20].reshape(20, 8)
    return str(DIGITS / "mlp.onnx"), 8, "AdamW", 0.01, xs, ys, data["x_val"][:8 * 4].reshape(
        4, 8, 64).astype(np.float32)


def reference_case(build, steps=8):
    ref = build()
    xs, ys = make_data(ref, steps)
    return (export(ref.module, torch.zeros((ref.batch,) + ref.inputs)), ref.batch, "SGD", 0.05,
            xs, ys, list(xs[:3]) + [np.random.default_rng(2).standard_normal(xs[0].shape)
                                    .astype(np.float32) * 2])


CASES = {"digits_mlp": digits_case, "ds_cnn": lambda: reference_case(ds_cnn),
         "mobilenet_v2_block": lambda: reference_case(mobilenet_v2_block),
         "resnet_block": lambda: reference_case(resnet_block)}


@pytest.fixture(scope="module", params=list(CASES))
def exported(request, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("qat_export_" + request.param)
    model, batch, optimizer, lr, xs, ys, inputs = CASES[request.param]()
    mh.generate_artifacts(model, artifact_directory=tmp, batch_size=batch, optimizer=optimizer,
                          quantization=True)
    state = CheckpointState.load_checkpoint(str(tmp / "checkpoint"))
    module = Module(str(tmp / "model.mtb"), state)
    opt = Optimizer(str(tmp / "model.mtb"), module)
    opt.set_learning_rate(lr)
    for x, y in zip(xs, ys):
        module(x.reshape(-1), [int(v) for v in y])
        opt.step()
        module.lazy_reset_grad()
    CheckpointState.save_checkpoint(state, str(tmp / "trained"))
    module.export_model_for_inferencing(str(tmp / "device_int8.mtb"), ["output"])
    # the host: the QDQ model and its int8 blob, through the command line
    assert main(["export", str(tmp), "--checkpoint", str(tmp / "trained"), "--qdq", "-o",
                 str(tmp / "qdq.onnx"), "--int8-blob", str(tmp / "host_int8.mtb")]) == 0
    return request.param, tmp, module, inputs


def test_device_export_equals_host_int8_blob(exported):
    name, tmp, module, inputs = exported
    device = (tmp / "device_int8.mtb").read_bytes()
    host = (tmp / "host_int8.mtb").read_bytes()
    b = device_blob_parser.load(str(tmp / "device_int8.mtb"), keep_steps=True)
    ops = [op for op, *_ in b.step_records["infer"]]
    print(f"{name}: device-exported int8 blob {len(device):,} B, host {len(host):,} B, "
          f"{sum(op in QLINEAR for op in ops)} of {len(ops)} steps int8")
    assert device == host
    assert b.byte_arena > 0 and ops.count(222) + ops.count(223) >= 2
    # the QAT training blob carries what the export computes: an export program, a byte arena
    training = device_blob_parser.load(str(tmp / "model.mtb"))
    assert "export" in training.programs and training.byte_arena > 0


def test_device_export_runs_within_one_step_of_onnxruntime(exported):
    name, tmp, module, inputs = exported
    worst, outs = compare(tmp / "qdq.onnx", tmp / "device_int8.mtb", inputs)
    print(f"{name}: device-exported int8 blob vs onnxruntime on the QDQ model: {worst:g} steps")
    assert worst <= 1.0 + 1e-6
    assert max(float(np.ptp(o)) for o in outs) > 0


def test_device_export_under_float32_arithmetic(exported, tmp_path):
    # The export program with every float operation rounded to float32 (the arena returns
    # numpy.float32 scalars), as on a microcontroller build: the same bytes.
    name, tmp, module, inputs = exported
    state = CheckpointState.load_checkpoint(str(tmp / "trained"))
    fresh = Module(str(tmp / "model.mtb"), state)
    program = fresh.blob.programs.pop("export")
    F32 = Float32Arena(fresh.F)
    for kernel, args in program.steps:
        kernel(F32, fresh.I, args)
    fresh.F[:] = F32.values
    fresh.export_model_for_inferencing(str(tmp_path / "f32.mtb"), ["output"])
    assert (tmp_path / "f32.mtb").read_bytes() == (tmp / "host_int8.mtb").read_bytes()


@pytest.mark.parametrize("exported", ["digits_mlp", "ds_cnn"], indirect=True)
def test_device_export_on_micropython(exported, micropython, tmp_path):
    name, tmp, module, inputs = exported
    script = tmp_path / "export.py"
    script.write_text(
        "import sys\nfrom microtrain import CheckpointState, Module\n"
        "state = CheckpointState.load_checkpoint(sys.argv[2])\n"
        "Module(sys.argv[1], state).export_model_for_inferencing(sys.argv[3], ['output'])\n"
        "print('exported')\n")
    out = run_micropython(micropython, script, tmp / "model.mtb", tmp / "trained",
                          tmp_path / "mp.mtb")
    assert out.split() == ["exported"]
    assert (tmp_path / "mp.mtb").read_bytes() == (tmp / "host_int8.mtb").read_bytes()
