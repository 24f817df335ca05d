"""Gather with indices fed as an int input (an embedding lookup; ops/gather.py,
kernels/gather.py GATHER_ROWS / GATHER_ROWS_GRAD): the table's gradient (repeated and
negative indices included) against float64 torch autograd within 1e-5, the training graph in
onnx.reference, the forward against onnxruntime; int32 on the device; an index out of range
is an InputError naming it, and int inputs are not taken for class labels."""
import zlib

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

import microtrain_host as mh
from microtrain import CheckpointState, InputError, Module
from microtrain_host.reference import reference_evaluator
from test_ops import relative_error

TOLERANCE = 1e-5


def gather_model(table_shape, indices_shape, axis, out_shape):
    """output = Gather(table, indices, axis) * scale: table and scale trainable."""
    graph = helper.make_graph(
        [helper.make_node("Gather", ["table", "indices"], ["rows"], name="lookup", axis=axis),
         helper.make_node("Mul", ["rows", "scale"], ["output"], name="scaled")],
        "gather", [helper.make_tensor_value_info("indices", TensorProto.INT64,
                                                 list(indices_shape))],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, list(out_shape))],
        [numpy_helper.from_array(np.zeros(table_shape, np.float32), "table"),
         numpy_helper.from_array(np.zeros(out_shape[-1:], np.float32), "scale")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


CASES = [((7, 5), (3, 4), 0),          # embedding: (vocabulary, dim), (batch, tokens)
         ((9, 3), (2, 6), 0),
         ((7, 5), (), 0),              # one index
         ((3, 7, 5), (4,), 1),         # axis 1
         ((3, 5, 7), (2, 2), -1),      # last axis
         ((11, 1), (5, 3), 0)]


@pytest.mark.parametrize("table_shape,indices_shape,axis", CASES,
                         ids=[f"{t}_{i}_axis{a}" for t, i, a in CASES])
def test_gather_from_int_input(tmp_path, table_shape, indices_shape, axis):
    rng = np.random.default_rng(zlib.crc32(repr((table_shape, indices_shape)).encode()))
    size = table_shape[axis]
    indices = rng.integers(-size, size, indices_shape).astype(np.int64)  # repeats, negatives
    table = rng.uniform(-1, 1, table_shape).astype(np.float32)
    t = torch.tensor(table, dtype=torch.float64, requires_grad=True)
    rows = torch.index_select(t, axis % len(table_shape),
                              torch.from_numpy(indices.reshape(-1) % size))
    out_shape = (table_shape[:axis % len(table_shape)] + indices_shape
                 + table_shape[axis % len(table_shape) + 1:])
    scale_value = rng.uniform(0.5, 1.5, out_shape[-1:]).astype(np.float32)
    s = torch.tensor(scale_value, dtype=torch.float64, requires_grad=True)
    out = rows.reshape(out_shape) * s
    target = rng.standard_normal(out_shape).astype(np.float32)
    loss = torch.nn.functional.mse_loss(out, torch.from_numpy(target).double())
    loss.backward()

    model = gather_model(table_shape, indices_shape, axis, out_shape)
    model.graph.initializer[0].CopyFrom(numpy_helper.from_array(table, "table"))
    model.graph.initializer[1].CopyFrom(numpy_helper.from_array(scale_value, "scale"))
    mh.generate_artifacts(model, loss="MSELoss", optimizer="SGD", artifact_directory=tmp_path)
    state = CheckpointState.load_checkpoint(str(tmp_path / "checkpoint"))
    device = Module(str(tmp_path / "model.mtb"), state)
    b = device.blob
    assert b.dtypes[b.programs["train"].inputs[0]] == 1  # int32 on the device
    idx, tgt = indices.reshape(-1).tolist(), target.reshape(-1).tolist()
    assert relative_error(device(idx, tgt), loss.item()) <= TOLERANCE
    for name, expected in (("table", t.grad), ("scale", s.grad)):
        actual = np.array(state.parameters[name].grad.tolist())
        assert relative_error(actual, expected.numpy()) <= TOLERANCE, name

    # the training graph in onnx.reference (GatherGrad's numpy version) agrees
    training = onnx.load(str(tmp_path / "training_model.onnx"))
    feeds = {"indices": indices, "target": target, "lazy_reset_grad": np.array([True]),
             "table": table, "scale": scale_value,
             "table_grad.accumulation.buffer": np.zeros_like(table),
             "scale_grad.accumulation.buffer": np.zeros_like(scale_value)}
    results = reference_evaluator(training).run(
        None, {i.name: feeds[i.name] for i in training.graph.input})
    grads = dict(zip([o.name for o in training.graph.output], results))
    assert relative_error(grads["table_grad.accumulation.out"], t.grad.numpy()) <= TOLERANCE

    device.eval()
    device_out = device(idx, tgt)[1].tolist()
    (ort_out,) = ort.InferenceSession(model.SerializeToString(),
                                      providers=["CPUExecutionProvider"]).run(
        None, {"indices": indices})
    assert relative_error(device_out, ort_out) <= TOLERANCE


def test_index_out_of_range_is_an_input_error(tmp_path):
    model = gather_model((7, 5), (3,), 0, (3, 5))
    mh.generate_artifacts(model, loss="MSELoss", optimizer="SGD", artifact_directory=tmp_path)
    device = Module(str(tmp_path / "model.mtb"),
                    CheckpointState.load_checkpoint(str(tmp_path / "checkpoint")))
    for bad in (7, -8):
        with pytest.raises(InputError, match=f"index {bad} at position 1 .* outside \\[-7, 7\\)"):
            device([0, bad, 2], [0.0] * 15)
    device([0, -7, 6], [0.0] * 15)  # the ends of the range are fine


def test_token_ids_are_not_class_labels(tmp_path):
    # CrossEntropyLoss with 3 classes: token ids up to 9 are inputs, not labels.
    graph = helper.make_graph(
        [helper.make_node("Gather", ["table", "input"], ["rows"], name="lookup"),
         helper.make_node("ReduceMean", ["rows"], ["output"], name="pool", axes=[1],
                          keepdims=0)],
        "tokens", [helper.make_tensor_value_info("input", TensorProto.INT64, [2, 4])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, [2, 3])],
        [numpy_helper.from_array(np.ones((10, 3), np.float32), "table")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    mh.generate_artifacts(model, loss="CrossEntropyLoss", optimizer="SGD",
                          artifact_directory=tmp_path)
    device = Module(str(tmp_path / "model.mtb"),
                    CheckpointState.load_checkpoint(str(tmp_path / "checkpoint")))
    device([9, 8, 7, 6, 0, 1, 2, 3], [2, 1])
    with pytest.raises(InputError, match="label 3"):
        device([9, 8, 7, 6, 0, 1, 2, 3], [2, 3])
