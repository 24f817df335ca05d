"""Export for inference: on the device, Module.export_model_for_inferencing writes an
inference-only blob that microtrain.InferenceSession runs; on the host,
export_inference_model / `microtrain export` write a standard ONNX model with a
checkpoint's weights. Oracle: onnxruntime running the exported ONNX model; the device's
inference blob must agree with it (within 1e-5), under CPython and MicroPython."""
import os

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

import microtrain_host as mh
from conftest import ROOT, run_micropython
from microtrain import (BlobError, CheckpointState, InferenceSession, InputError, Module,
                        Optimizer, ParameterError)
from microtrain import blob as device_blob
from microtrain import parser as device_blob_parser
from microtrain_host.cli import main as cli
from reference_models import ds_cnn
from test_forward_backward import run_cpython
from test_ops import relative_error
from torch_reference import export, mlp

TOLERANCE = 1e-5


def batch_norm_dropout_net():
    torch.manual_seed(5)
    return torch.nn.Sequential(torch.nn.Linear(12, 16), torch.nn.BatchNorm1d(16),
                               torch.nn.ReLU(), torch.nn.Dropout(0.25), torch.nn.Linear(16, 5))


MODELS = {  # name -> (torch module, one sample's shape, batch)
    "mlp": (lambda: mlp(12, 5), (12,), 8),
    "batch_norm_dropout": (batch_norm_dropout_net, (12,), 8),
    "ds_cnn": (lambda: ds_cnn().module, (1, 49, 10), 4),
}


def train_and_export(directory, name, steps=2):
    """Pack a model (MSELoss, SGD), train it on the device, save its checkpoint and export
    its inference blob. Returns (inputs, artifacts, module)."""
    make, sample, batch = MODELS[name]
    net = make()
    artifacts = mh.generate_artifacts(export(net, torch.zeros((2,) + sample)), loss="MSELoss",
                                      optimizer="SGD", artifact_directory=directory,
                                      batch_size=batch)
    rng = np.random.default_rng(1)
    x = rng.standard_normal((batch,) + sample).astype(np.float32)
    target = rng.standard_normal(net(torch.from_numpy(x)).shape).astype(np.float32)
    state = CheckpointState.load_checkpoint(artifacts.checkpoint)
    module = Module(artifacts.blob, state)
    opt = Optimizer(artifacts.blob, module)
    opt.set_learning_rate(0.1)
    for _ in range(steps):
        module(x.reshape(-1), target.reshape(-1))
        opt.step()
        module.lazy_reset_grad()
    CheckpointState.save_checkpoint(state, os.path.join(directory, "trained"))
    module.export_model_for_inferencing(os.path.join(directory, "inference.mtb"), ["output"])
    return x, artifacts, module


def onnxruntime_outputs(path, x):
    return ort.InferenceSession(str(path)).run(None, {"input": x})


@pytest.mark.parametrize("name", sorted(MODELS))
def test_device_blob_and_exported_onnx_agree(tmp_path, name):
    x, artifacts, _ = train_and_export(tmp_path, name)
    session = InferenceSession(str(tmp_path / "inference.mtb"))
    assert session.input_names() == ["input"] and session.output_names() == ["output"]
    on_device = session.run(x.reshape(-1))
    mh.export_inference_model(tmp_path, tmp_path / "trained", tmp_path / "model.onnx")
    (expected,) = onnxruntime_outputs(tmp_path / "model.onnx", x)
    assert relative_error(on_device, expected) <= TOLERANCE
    # The values are the trained ones, not those the model was packed with.
    mh.export_inference_model(tmp_path, artifacts.checkpoint, tmp_path / "initial.onnx")
    (initial,) = onnxruntime_outputs(tmp_path / "initial.onnx", x)
    assert relative_error(on_device, initial) > 1e-3
    # Inference only: no gradients, optimizer state, labels, loss or microtrain ops.
    model = onnx.load(str(tmp_path / "model.onnx"))
    assert [i.name for i in model.graph.input] == ["input"]
    assert [o.name for o in model.graph.output] == ["output"]
    assert {n.domain for n in model.graph.node} <= {""}
    assert "Dropout" not in [n.op_type for n in model.graph.node]
    for n in model.graph.node:
        if n.op_type == "BatchNormalization":
            assert len(n.output) == 1 and "training_mode" not in [a.name for a in n.attribute]
    b = device_blob_parser.load(str(tmp_path / "inference.mtb"))
    assert list(b.programs) == ["infer"] and not b.parameters and not b.loss
    assert {device_blob.ROLE_NAMES[r] for r in b.roles} <= {"input", "constant", "activation"}


@pytest.mark.parametrize("name", sorted(MODELS))
def test_inference_arena_is_smaller(tmp_path, name):
    train_and_export(tmp_path, name, steps=0)
    training = device_blob_parser.load(str(tmp_path / "model.mtb"))
    inference = device_blob_parser.load(str(tmp_path / "inference.mtb"))
    print(f"\n{name}: float arena training {training.float_arena} / inference "
          f"{inference.float_arena} elements; blob training "
          f"{os.path.getsize(tmp_path / 'model.mtb')} B / inference "
          f"{os.path.getsize(tmp_path / 'inference.mtb')} B; ONNX eval_model "
          f"{os.path.getsize(tmp_path / 'eval_model.onnx')} B")
    assert inference.float_arena < training.float_arena


def two_output_model():
    """input -> (hidden = relu(input W1 + b1), output = hidden W2 + b2)."""
    class TwoOutputs(torch.nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(7)
            self.fc1, self.fc2 = torch.nn.Linear(6, 4), torch.nn.Linear(4, 3)

        def forward(self, x):
            hidden = torch.relu(self.fc1(x))
            return self.fc2(hidden), hidden

    import io
    buf = io.BytesIO()
    torch.onnx.export(TwoOutputs(), torch.zeros(5, 6), buf, input_names=["input"],
                      output_names=["output", "hidden"], dynamo=False, opset_version=17,
                      training=torch.onnx.TrainingMode.TRAINING, do_constant_folding=False)
    return onnx.load_from_string(buf.getvalue())


def test_outputs_chosen_at_export(tmp_path):
    artifacts = mh.generate_artifacts(two_output_model(), loss="MSELoss", optimizer="SGD",
                                      artifact_directory=tmp_path)
    state = CheckpointState.load_checkpoint(artifacts.checkpoint)
    module = Module(artifacts.blob, state)
    x = np.random.default_rng(2).standard_normal((5, 6)).astype(np.float32)
    mh.export_inference_model(tmp_path, artifacts.checkpoint, tmp_path / "model.onnx")
    output, hidden = onnxruntime_outputs(tmp_path / "model.onnx", x)
    for names, expected in ((["hidden", "output"], [hidden, output]), (["hidden"], [hidden]),
                            (["output"], [output])):
        module.export_model_for_inferencing(str(tmp_path / "inference.mtb"), names)
        session = InferenceSession(str(tmp_path / "inference.mtb"))
        assert session.output_names() == names
        assert session.output_shapes() == [e.shape for e in expected]
        result = session.run(x.reshape(-1))
        assert relative_error(result, np.concatenate([e.reshape(-1) for e in expected])) \
            <= TOLERANCE
    mh.export_inference_model(tmp_path, artifacts.checkpoint, tmp_path / "hidden.onnx",
                              output_names=["hidden"])
    model = onnx.load(str(tmp_path / "hidden.onnx"))
    assert [o.name for o in model.graph.output] == ["hidden"]
    assert "fc2.weight" not in {i.name for i in model.graph.initializer}


def test_export_errors(tmp_path):
    x, artifacts, module = train_and_export(tmp_path, "mlp", steps=0)
    target = str(tmp_path / "other.mtb")
    with pytest.raises(InputError, match="'logits' is not an output of the model; its "
                                         "outputs are: output"):
        module.export_model_for_inferencing(target, ["logits"])
    with pytest.raises(InputError, match="at least one"):
        module.export_model_for_inferencing(target, [])
    assert not os.path.exists(target)
    with pytest.raises(BlobError, match="not an inference blob"):
        InferenceSession(artifacts.blob)
    session = InferenceSession(str(tmp_path / "inference.mtb"))
    with pytest.raises(InputError, match="needs 96 values"):
        session.run([0.0] * 5)
    with pytest.raises(InputError, match="takes 1 inputs"):
        session.run(x.reshape(-1), x.reshape(-1))
    for names, message in ((["nope"], r"\['nope'\] are not outputs"), ([], "at least one")):
        with pytest.raises(mh.ArtifactError, match=message + ".*outputs are: output"):
            mh.export_inference_model(tmp_path, artifacts.checkpoint, tmp_path / "m.onnx",
                                      output_names=names)
    # The template is streamed from the blob file: a file repacked since is noticed.
    mh.generate_artifacts(export(mlp(12, 5, hidden=(16, 4)), torch.zeros(2, 12)), loss="MSELoss",
                          optimizer="SGD", artifact_directory=tmp_path, batch_size=8)
    with pytest.raises(BlobError, match="changed since the Module loaded it"):
        module.export_model_for_inferencing(target, ["output"])
    nominal = tmp_path / "nominal"
    mh.generate_artifacts(export(mlp(12, 5), torch.zeros(2, 12)), loss="MSELoss", optimizer="SGD",
                          artifact_directory=nominal, batch_size=8, nominal_checkpoint=True)
    state = CheckpointState.load_checkpoint(str(nominal / "nominal_checkpoint"))
    with pytest.raises(ParameterError, match="nominal"):
        Module(str(nominal / "model.mtb"), state).export_model_for_inferencing(target,
                                                                                ["output"])
    with pytest.raises(mh.ArtifactError, match="nominal"):
        mh.export_inference_model(nominal, nominal / "nominal_checkpoint", tmp_path / "m.onnx")


def test_interrupted_export_leaves_the_previous_blob(tmp_path, monkeypatch):
    from microtrain import export as device_export
    x, _, module = train_and_export(tmp_path, "mlp")
    path = str(tmp_path / "inference.mtb")
    before = InferenceSession(path).run(x.reshape(-1))[:]

    def power_cut(*args):
        raise OSError("power cut")

    monkeypatch.setattr(device_export, "_write_raw", power_cut)
    with pytest.raises(BlobError, match="power cut"):
        module.export_model_for_inferencing(path, ["output"])
    assert list(InferenceSession(path).run(x.reshape(-1))) == list(before)


def test_cli_export(tmp_path, capsys):
    x, _, _ = train_and_export(tmp_path, "mlp")
    assert cli(["export", str(tmp_path), "--checkpoint", str(tmp_path / "trained"), "-o",
                str(tmp_path / "cli.onnx")]) == 0
    assert "inputs input; outputs output" in capsys.readouterr().out
    (expected,) = onnxruntime_outputs(tmp_path / "cli.onnx", x)
    on_device = InferenceSession(str(tmp_path / "inference.mtb")).run(x.reshape(-1))
    assert relative_error(on_device, expected) <= TOLERANCE
    assert cli(["export", str(tmp_path), "--checkpoint", str(tmp_path / "trained"), "-o",
                str(tmp_path / "x.onnx"), "--outputs", "nope"]) == 2
    assert "not outputs of the model" in capsys.readouterr().err


@pytest.mark.parametrize("name", sorted(MODELS))
def test_cli_export_in_ort_format(tmp_path, capsys, name):
    # The .ort form (onnxruntime's own converter, optimized as for ORT Mobile) loads in
    # onnxruntime and computes what the .onnx computes.
    x, _, _ = train_and_export(tmp_path, name)
    assert cli(["export", str(tmp_path), "--checkpoint", str(tmp_path / "trained"), "-o",
                str(tmp_path / "model.onnx"), "--ort"]) == 0
    out = capsys.readouterr().out
    assert f"ORT format {tmp_path / 'model.ort'} (" in out and "required_operators" in out
    session = ort.InferenceSession(str(tmp_path / "model.ort"),
                                   providers=["CPUExecutionProvider"])
    (from_ort,) = session.run(None, {"input": x})
    (from_onnx,) = onnxruntime_outputs(tmp_path / "model.onnx", x)
    np.testing.assert_allclose(from_ort, from_onnx, rtol=1e-6, atol=1e-7)
    config = (tmp_path / "model.required_operators.config").read_text()
    assert "ai.onnx;" in config  # the operator list a minimal build is configured with
    assert not [f for f in os.listdir(tmp_path) if f.startswith("tmp")]  # no work directory left


def test_ort_format_without_onnxruntime_tools_is_a_clear_error(tmp_path, capsys, monkeypatch):
    train_and_export(tmp_path, "mlp", steps=0)
    monkeypatch.setitem(__import__("sys").modules,
                        "onnxruntime.tools.convert_onnx_models_to_ort", None)
    assert cli(["export", str(tmp_path), "--checkpoint", str(tmp_path / "trained"), "-o",
                str(tmp_path / "model.onnx"), "--ort"]) == 2
    assert "the ORT format needs onnxruntime's converter" in capsys.readouterr().err
    assert not os.path.exists(tmp_path / "model.ort")


def test_export_under_micropython(tmp_path, micropython):
    """Train, save, export and run the inference blob under MicroPython and CPython: the same
    outputs, which onnxruntime computes from each run's saved checkpoint."""
    _, sample, batch = MODELS["batch_norm_dropout"]
    net = batch_norm_dropout_net()
    mh.generate_artifacts(export(net, torch.zeros((2,) + sample)), loss="MSELoss",
                          optimizer="SGD", artifact_directory=tmp_path, batch_size=batch)
    rng = np.random.default_rng(3)
    x = rng.standard_normal((batch,) + sample).astype(np.float32)
    target = rng.standard_normal((batch, 5)).astype(np.float32)
    (tmp_path / "data.bin").write_bytes(x.astype("<f4").tobytes() + target.astype("<f4").tobytes())
    script = ROOT / "tests" / "device_scripts" / "export_inference.py"
    outputs = {}
    for runtime in ("micropython", "cpython"):
        out_dir = tmp_path / runtime
        out_dir.mkdir()
        args = (tmp_path, tmp_path / "data.bin", out_dir)
        text = (run_micropython(micropython, script, *args) if runtime == "micropython"
                else run_cpython(script, *args))
        outputs[runtime] = np.array(text.split(), np.float64)
        mh.export_inference_model(tmp_path, out_dir / "checkpoint", out_dir / "model.onnx")
        (expected,) = onnxruntime_outputs(out_dir / "model.onnx", x)
        assert relative_error(outputs[runtime], expected) <= TOLERANCE, runtime
        assert relative_error(InferenceSession(str(out_dir / "inference.mtb")).run(
            x.reshape(-1)), expected) <= TOLERANCE, runtime
    assert outputs["micropython"].size == batch * 5
    assert relative_error(outputs["micropython"], outputs["cpython"]) <= TOLERANCE
