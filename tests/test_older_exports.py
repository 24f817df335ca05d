"""Older exports (issues 8 and 26): models at opsets 1-12 are upgraded on load with
onnx.version_converter and train as their opset-17 exports do, matching PyTorch; parameters
listed as graph inputs (IR < 4) load; the converter's gaps (axis broadcasts and per-channel
PRelu slopes of opsets 1-6) are repaired; what it cannot upgrade is refused naming the
node."""
import copy
import io

import numpy as np
import onnx
import pytest
import torch
from onnx import helper
from torch import nn

import microtrain_host as mh
from microtrain import CheckpointState, Module
from microtrain import parser as device_blob_parser
from microtrain_host.errors import ArtifactError, UnsupportedOpError
from microtrain_host.pipeline.upgrade import source_opset, upgrade
from reference_models import lenet
from test_models import make_data
from test_ops import relative_error as elementwise_error
from torch_reference import relative_error, run_device_cpython, torch_train, write_batches

STEPS = 20


def export_at(module, example, opset):
    """A training-mode torch export at an older opset; before opset 9 as the exporters of
    that time wrote it (IR version 3: every initializer also a graph input)."""
    buf = io.BytesIO()
    torch.onnx.export(module, example, buf, input_names=["input"], output_names=["output"],
                      dynamo=False, opset_version=opset, do_constant_folding=False,
                      training=torch.onnx.TrainingMode.TRAINING,
                      keep_initializers_as_inputs=opset < 9)
    return onnx.load_from_string(buf.getvalue())


def bn_cnn():
    torch.manual_seed(3)
    return nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(),
                         nn.MaxPool2d(2), nn.Flatten(), nn.Linear(4 * 4 * 4, 6))


@pytest.mark.parametrize("opset", [7, 9, 12])
@pytest.mark.parametrize("optimizer", ["SGD", "AdamW"])
@pytest.mark.parametrize("model", ["lenet", "bn_cnn"])
def test_older_export_trains_like_pytorch(tmp_path, opset, optimizer, model):
    ref = lenet()
    if model == "bn_cnn":
        ref.module, ref.inputs = bn_cnn(), (1, 8, 8)
    exported = export_at(copy.deepcopy(ref.module), torch.zeros((ref.batch,) + ref.inputs), opset)
    if opset < 9:
        assert exported.ir_version == 3 and len(exported.graph.input) > 1
    mh.generate_artifacts(exported, loss=ref.loss, optimizer=optimizer, artifact_directory=tmp_path)
    training = onnx.load(tmp_path / "training_model.onnx")
    assert source_opset(training) == opset
    assert device_blob_parser.load(str(tmp_path / "model.mtb"),
                                   keep_steps=True).source_opset == opset
    xs, ys = make_data(ref, STEPS)
    write_batches(tmp_path / "data.bin", xs, ys)
    lr = ref.lr[optimizer]
    torch_losses, _ = torch_train(copy.deepcopy(ref.module).train(), ref.loss, optimizer, xs, ys,
                                  lr)
    losses, _, _ = run_device_cpython(tmp_path, tmp_path / "data.bin", STEPS, lr)
    assert relative_error(losses, torch_losses) <= 1e-4, (losses[:3], torch_losses[:3])


def test_opset_17_exports_are_not_upgraded(tmp_path):
    ref = lenet()
    from torch_reference import export
    mh.generate_artifacts(export(ref.module, torch.zeros((ref.batch,) + ref.inputs)),
                          loss=ref.loss, optimizer="SGD", artifact_directory=tmp_path,
                          batch_size=ref.batch)
    assert source_opset(onnx.load(tmp_path / "training_model.onnx")) is None
    assert device_blob_parser.load(str(tmp_path / "model.mtb"),
                                   keep_steps=True).source_opset == 0


def test_old_dropout_becomes_training_dropout():
    # Before opset 12 Dropout had no training_mode input: exporters only wrote it for
    # training, so the upgrade keeps it dropping (the converter alone would make it the
    # identity) with the ratio it had.
    torch.manual_seed(0)
    module = nn.Sequential(nn.Linear(6, 5), nn.Dropout(0.3), nn.Linear(5, 2))
    upgraded = upgrade(export_at(module, torch.zeros(2, 6), 11), 11)
    dropout = next(n for n in upgraded.graph.node if n.op_type == "Dropout")
    values = {i.name: onnx.numpy_helper.to_array(i) for i in upgraded.graph.initializer}
    for n in upgraded.graph.node:
        if n.op_type == "Constant":
            values[n.output[0]] = onnx.numpy_helper.to_array(n.attribute[0].t)
    assert np.isclose(values[dropout.input[1]], 0.3) and values[dropout.input[2]] == True  # noqa: E712


def test_unconvertible_node_is_named():
    # ImageScaler (an experimental op of opsets 1-9, in old model-zoo vision models) has no
    # schema in the converter's target opset.
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["r"], name="first"),
         helper.make_node("ImageScaler", ["r"], ["y"], name="scale", scale=2.0)],
        "g", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 1, 2, 2])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 1, 2, 2])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 7)])
    with pytest.raises(UnsupportedOpError, match=r"^cannot upgrade node 'scale' \(ImageScaler\) from "
                                                 r"opset 7 to 17 with onnx.version_converter: "):
        mh.generate_artifacts(model, loss="MSELoss", optimizer="SGD")


def forward_and_gradients(model, x, d_output, tmp_path):
    """Pack `model` with the loss outside the graph; the device's forward output for x and
    the parameter gradients of sum(output * d_output)."""
    artifacts = mh.generate_artifacts(model, loss=None, optimizer="SGD",
                                      artifact_directory=tmp_path)
    state = CheckpointState.load_checkpoint(artifacts.checkpoint)
    module = Module(artifacts.blob, state).train()
    output = np.array(module.forward(x.reshape(-1)), np.float64)
    module.backward(d_output.astype(np.float32).reshape(-1))
    grads = {name: np.array(p.grad, np.float64).reshape(p.shape)
             for name, p in state.parameters.items()}
    return artifacts, output, grads


def old_model(nodes, inputs, output, params, opset):
    """An opset-`opset` model as exporters of that time wrote it (IR 3: the parameters
    listed as graph inputs too)."""
    graph = helper.make_graph(
        nodes, "old",
        [helper.make_tensor_value_info(n, onnx.TensorProto.FLOAT, s) for n, s in inputs]
        + [helper.make_tensor_value_info(n, onnx.TensorProto.FLOAT, v.shape)
           for n, v in params.items()],
        [helper.make_tensor_value_info(output[0], onnx.TensorProto.FLOAT, output[1])],
        [onnx.numpy_helper.from_array(v, n) for n, v in params.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)],
                             ir_version=3)


@pytest.mark.parametrize("opset", [1, 3, 5, 6])
def test_opsets_1_to_6_upgrade_with_their_axis_broadcasts(tmp_path, opset):
    # Before opset 7, B broadcast only with broadcast=1, its first dimension on A's `axis`:
    # a per-channel bias of shape [C] at axis 1, as Caffe2-era exports wrote it (the
    # converter alone asserts on it). Oracle: torch float64 on the same arithmetic.
    rng = np.random.default_rng(6)
    bias = rng.standard_normal(3).astype(np.float32)
    scale = rng.standard_normal((3, 4)).astype(np.float32)
    model = old_model([helper.make_node("Add", ["x", "bias"], ["h"], broadcast=1, axis=1),
                       helper.make_node("Tanh", ["h"], ["t"]),
                       helper.make_node("Mul", ["t", "scale"], ["y"], broadcast=1, axis=1)],
                      [("x", [2, 3, 4, 5])], ("y", [2, 3, 4, 5]),
                      {"bias": bias, "scale": scale}, opset)
    x = rng.standard_normal((2, 3, 4, 5)).astype(np.float32)
    d_output = rng.standard_normal((2, 3, 4, 5))
    artifacts, output, grads = forward_and_gradients(model, x, d_output, tmp_path)
    assert artifacts.source_opset == opset
    params = {"bias": torch.tensor(bias, dtype=torch.float64, requires_grad=True),
              "scale": torch.tensor(scale, dtype=torch.float64, requires_grad=True)}
    expected = torch.tanh(torch.tensor(x, dtype=torch.float64)
                          + params["bias"][:, None, None]) * params["scale"][:, :, None]
    (expected * torch.tensor(d_output)).sum().backward()
    assert elementwise_error(output, expected.detach().numpy()) <= 1e-5
    for name, p in params.items():
        assert elementwise_error(grads[name], p.grad.numpy()) <= 1e-5, name


@pytest.mark.parametrize("input_shape", [(2, 3), (2, 3, 4), (2, 3, 4, 5), (2, 3, 2, 3, 4)])
def test_opset_6_prelu_slope_is_per_channel(tmp_path, input_shape):
    # PRelu's slope of shape [C] scaled channel c before opset 7; numpy broadcasting would
    # put it on the last axis (and the converter leaves it so). Oracle: torch's PReLU(C).
    rng = np.random.default_rng(7)
    slope = rng.uniform(0.1, 0.5, 3).astype(np.float32)
    model = old_model([helper.make_node("PRelu", ["x", "slope"], ["y"])],
                      [("x", list(input_shape))], ("y", list(input_shape)),
                      {"slope": slope}, 6)
    x = rng.standard_normal(input_shape).astype(np.float32)
    d_output = rng.standard_normal(input_shape)
    artifacts, output, grads = forward_and_gradients(model, x, d_output, tmp_path)
    assert grads["slope"].shape == (3,)  # the checkpoint keeps torch's weight shape
    weight = torch.tensor(slope, dtype=torch.float64, requires_grad=True)
    expected = torch.nn.functional.prelu(torch.tensor(x, dtype=torch.float64), weight)
    (expected * torch.tensor(d_output)).sum().backward()
    assert elementwise_error(output, expected.detach().numpy()) <= 1e-5
    assert elementwise_error(grads["slope"], weight.grad.numpy()) <= 1e-5


def test_prelu_slope_that_does_not_broadcast_is_refused():
    # At opset 7 and later the slope broadcasts from the last axis: [3] against (2, 3, 4)
    # does not, whatever the old opsets meant. Refused by name, not a numpy ValueError.
    graph = helper.make_graph(
        [helper.make_node("PRelu", ["x", "slope"], ["y"])], "g",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2, 3, 4])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [2, 3, 4])],
        [onnx.numpy_helper.from_array(np.ones(3, np.float32), "slope")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(UnsupportedOpError, match=r"^PRelu node #0: slope \[3\] does not "
                                                 r"broadcast to X \[2, 3, 4\]"):
        mh.generate_artifacts(model, loss=None, optimizer="SGD")


def test_unconvertible_node_of_opset_1_is_named():
    # The converter cannot carry an ImageScaler (experimental since opset 1) forward either.
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["r"]),
         helper.make_node("ImageScaler", ["r"], ["y"], scale=2.0)],
        "g", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 1, 2, 2])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 1, 2, 2])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 1)], ir_version=3)
    with pytest.raises(UnsupportedOpError, match=r"^cannot upgrade node #1 \(ImageScaler\) from "
                                                 r"opset 1 to 17 with onnx.version_converter: "):
        mh.generate_artifacts(model, loss="MSELoss", optimizer="SGD")


def test_pack_and_inspect_say_the_model_was_upgraded(tmp_path):
    import subprocess
    import sys
    torch.manual_seed(0)
    module = nn.Sequential(nn.Linear(6, 5), nn.ReLU(), nn.Linear(5, 3))
    onnx.save(export_at(module, torch.zeros(4, 6), 9), tmp_path / "old.onnx")
    line = "  exported at opset 9, upgraded on load to opset 17 with onnx.version_converter"
    packed = subprocess.run([sys.executable, "-m", "microtrain_host.cli", "pack",
                             str(tmp_path / "old.onnx"), "-o", str(tmp_path / "build")],
                            capture_output=True, text=True, check=True).stdout
    assert packed.splitlines()[1] == line
    inspected = subprocess.run([sys.executable, "-m", "microtrain_host.cli", "inspect",
                                str(tmp_path / "build" / "model.mtb")],
                               capture_output=True, text=True, check=True).stdout
    assert inspected.splitlines()[1] == line
