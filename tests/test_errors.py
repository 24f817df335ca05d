"""Bad input gets a clear error that names the thing (host side; the device side is in
device_scripts/device_checks.py, run under both interpreters)."""
import struct
import zlib

import numpy as np
import onnx
import pytest
import torch
from onnx import helper, numpy_helper

import microtrain_host as mh
from microtrain import BlobError, CheckpointState, Module, ParameterError
from microtrain import blob as blobfile
from microtrain.flatbuf import Reader
from torch_reference import export, mlp


def test_dynamic_dimension_without_batch_size(tmp_path):
    model = export(mlp(6, 3), torch.zeros(1, 6))
    with pytest.raises(mh.DynamicShapeError, match=r"input 'input' has a dynamic dimension "
                                                   r"'batch' \(axis 0\).*batch_size"):
        mh.generate_artifacts(model, artifact_directory=tmp_path)


def test_parameter_in_both_lists(tmp_path):
    model = export(mlp(6, 3), torch.zeros(1, 6))
    with pytest.raises(mh.ArtifactError, match=r"0\.weight.*both requires_grad and frozen_params"):
        mh.generate_artifacts(model, requires_grad=["0.weight", "0.bias"],
                              frozen_params=["0.weight"], artifact_directory=tmp_path,
                              batch_size=4)


def test_unknown_parameter_name(tmp_path):
    model = export(mlp(6, 3), torch.zeros(1, 6))
    with pytest.raises(mh.ArtifactError, match=r"'nope' is not a float initializer"):
        mh.generate_artifacts(model, frozen_params=["nope"], artifact_directory=tmp_path,
                              batch_size=4)


def test_empty_tensor_names_the_node(tmp_path):
    # Slice [2:2] of an axis: shape inference gives an output with no elements.
    starts, ends, axes = (numpy_helper.from_array(np.array([v], np.int64), n)
                          for v, n in ((2, "starts"), (2, "ends"), (1, "axes")))
    nodes = [helper.make_node("Mul", ["input", "w"], ["h"], name="scale"),
             helper.make_node("Slice", ["h", "starts", "ends", "axes"], ["output"],
                              name="empty_slice")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("input", 1, [2, 4])],
                              [helper.make_tensor_value_info("output", 1, [2, 0])],
                              [numpy_helper.from_array(np.ones((2, 4), np.float32), "w"),
                               starts, ends, axes])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    with pytest.raises(mh.ArtifactError, match=r"node 'empty_slice' \(Slice\).*no elements"):
        mh.generate_artifacts(model, loss="MSELoss", artifact_directory=tmp_path)


def _model_with(op_type, tmp_path):
    w = numpy_helper.from_array(np.ones((4, 3), np.float32), "w")
    nodes = [helper.make_node("MatMul", ["input", "w"], ["h"], name="dense"),
             helper.make_node(op_type, ["h"], ["output"], name="my_odd_node")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("input", 1, [2, 4])],
                              [helper.make_tensor_value_info("output", 1, [2, 3])], [w])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_unsupported_op_names_op_and_node(tmp_path):
    with pytest.raises(mh.UnsupportedOpError, match=r"'Cos'.*'my_odd_node'"):
        mh.generate_artifacts(_model_with("Cos", tmp_path), loss="MSELoss",
                              artifact_directory=tmp_path)


def test_unknown_loss_and_optimizer_names(tmp_path):
    model = export(mlp(6, 3), torch.zeros(1, 6))
    with pytest.raises(mh.ArtifactError, match="unknown loss 'Hinge'"):
        mh.generate_artifacts(model, loss="Hinge", artifact_directory=tmp_path, batch_size=2)
    with pytest.raises(mh.ArtifactError, match="unknown optimizer 'Lion'"):
        mh.generate_artifacts(model, optimizer="Lion", artifact_directory=tmp_path, batch_size=2)


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("errors")
    mh.generate_artifacts(export(mlp(6, 3), torch.zeros(1, 6)), artifact_directory=tmp,
                          batch_size=4)
    return tmp


def _reframe(body):
    """Size prefix + FlatBuffer + CRC, as the host writes them."""
    return struct.pack("<I", len(body)) + body + struct.pack("<I", zlib.crc32(body))


def test_blob_truncated_at_every_byte(packed):
    data = (packed / "model.mtb").read_bytes()
    for n in range(len(data)):
        with pytest.raises(BlobError):
            blobfile.parse(data[:n])


def test_blob_wrong_identifier(packed):
    data = bytearray((packed / "model.mtb").read_bytes())
    data[8:12] = b"ORTM"
    with pytest.raises(BlobError, match="identifier"):
        blobfile.parse(bytes(data))


def test_blob_newer_version_is_refused(packed):
    data = (packed / "model.mtb").read_bytes()
    body = bytearray(data[4:-4])
    r = Reader(memoryview(body), BlobError)
    at = r.field(r.root(), 0)  # format_version
    struct.pack_into("<H", body, at, blobfile.FORMAT_VERSION + 1)
    with pytest.raises(BlobError, match=r"format version 2 is not supported.*reads 1"):
        blobfile.parse(_reframe(bytes(body)))


def test_blob_corruption_is_detected(packed):
    data = (packed / "model.mtb").read_bytes()
    rng = np.random.default_rng(0)
    for i in rng.integers(0, len(data), 300):
        bad = bytearray(data)
        bad[i] ^= 1 << int(rng.integers(0, 8))
        with pytest.raises(BlobError):
            blobfile.parse(bytes(bad))


def test_checkpoint_missing_a_parameter(packed, tmp_path):
    state = CheckpointState.load_checkpoint(str(packed / "checkpoint"))
    del state.parameters["2.bias"]
    with pytest.raises(ParameterError, match=r"lacks parameters 2\.bias"):
        Module(str(packed / "model.mtb"), state)


def test_checkpoint_parameter_of_wrong_shape(packed):
    state = CheckpointState.load_checkpoint(str(packed / "checkpoint"))
    p = state.parameters["2.bias"]
    p.shape = (4,)
    with pytest.raises(ParameterError, match=r"'2\.bias' has shape"):
        Module(str(packed / "model.mtb"), state)


def test_cli_reports_errors_without_traceback(tmp_path, capsys):
    from microtrain_host.cli import main
    model = tmp_path / "m.onnx"
    onnx.save(export(mlp(6, 3), torch.zeros(1, 6)), model)
    assert main(["pack", str(model), "-o", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "error:" in err and "dynamic dimension" in err and "Traceback" not in err
    bad = tmp_path / "bad.mtb"
    bad.write_bytes(b"\x00" * 20)
    assert main(["inspect", str(bad)]) == 2
    assert "BlobError" in capsys.readouterr().err


def test_programs_from_another_blob(packed, tmp_path):
    """Module's eval_model_uri and Optimizer's uri may name another blob of the same model;
    a blob of another model, or one without an optimizer, is refused."""
    import shutil
    from microtrain import Optimizer
    copy = tmp_path / "copy.mtb"
    shutil.copy(packed / "model.mtb", copy)
    state = CheckpointState.load_checkpoint(str(packed / "checkpoint"))
    model = Module(str(packed / "model.mtb"), state, str(copy))
    Optimizer(str(copy), model).step()
    other = tmp_path / "other"
    mh.generate_artifacts(export(mlp(7, 3), torch.zeros(1, 7)), optimizer=None,
                          artifact_directory=other, batch_size=4)
    with pytest.raises(BlobError, match="not packed from the same model"):
        Module(str(packed / "model.mtb"), state, str(other / "model.mtb"))
    other_model = Module(str(other / "model.mtb"),
                         CheckpointState.load_checkpoint(str(other / "checkpoint")))
    with pytest.raises(BlobError, match="no optimizer program"):
        Optimizer(str(other / "model.mtb"), other_model)
