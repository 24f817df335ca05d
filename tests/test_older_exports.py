"""Older exports (issue 8): models at opsets 7-12 are upgraded on load with
onnx.version_converter and train as their opset-17 exports do, matching PyTorch; parameters
listed as graph inputs (IR < 4) load; what the converter cannot upgrade is refused naming
the node."""
import copy
import io

import numpy as np
import onnx
import pytest
import torch
from onnx import helper
from torch import nn

import microtrain_host as mh
from microtrain import blob as device_blob
from microtrain import parser as device_blob_parser
from microtrain_host.errors import ArtifactError, UnsupportedOpError
from microtrain_host.pipeline.upgrade import source_opset, upgrade
from reference_models import lenet
from test_models import make_data
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
    assert device_blob_parser.load(str(tmp_path / "model.mtb")).source_opset == opset
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
    assert device_blob_parser.load(str(tmp_path / "model.mtb")).source_opset == 0


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


def test_too_old_opset_is_refused():
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 2])],
                              [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 2])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 6)])
    with pytest.raises(ArtifactError, match=r"^the model uses opset 6; microtrain upgrades models "
                                            r"from opset 7 on \(re-export with opset_version=17\)$"):
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
