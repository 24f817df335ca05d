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
from microtrain import parser as blobfile_parser
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


def _unnamed(nodes, inputs, outputs, opsets=(("", 17),)):
    graph = helper.make_graph(nodes, "g",
                              [helper.make_tensor_value_info(n, 1, s) for n, s in inputs],
                              [helper.make_tensor_value_info(n, 1, s) for n, s in outputs],
                              [numpy_helper.from_array(np.ones((4, 3), np.float32), "w")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid(d, v) for d, v in opsets],
                             ir_version=8)


def test_unnamed_nodes_are_named_by_index_and_op(tmp_path):
    # Exporters other than torch leave node names empty: messages give the node's index in
    # the graph as loaded and its op, not node ''.
    sequence = _unnamed([helper.make_node("MatMul", ["input", "w"], ["h"]),
                         helper.make_node("SequenceConstruct", ["h", "h"], ["s"]),
                         helper.make_node("ConcatFromSequence", ["s"], ["output"], axis=0)],
                        [("input", [2, 4])], [("output", [4, 3])])
    with pytest.raises(mh.UnsupportedOpError, match=r"^node #1 \(SequenceConstruct\): sequence "
                                                    r"ops are not supported"):
        mh.generate_artifacts(sequence, loss="MSELoss", artifact_directory=tmp_path)
    cosine = _unnamed([helper.make_node("MatMul", ["input", "w"], ["h"]),
                       helper.make_node("Cos", ["h"], ["output"])],
                      [("input", [2, 4])], [("output", [2, 3])])
    with pytest.raises(mh.UnsupportedOpError, match=r"^no gradient rule for op 'Cos' \(node #1\)"):
        mh.generate_artifacts(cosine, loss="MSELoss", artifact_directory=tmp_path)


def test_op_of_another_domain_is_unsupported_not_a_shape_error(tmp_path):
    # onnx infers no shape for ai.onnx.preview.training's Gradient: the op is what to name.
    model = _unnamed([helper.make_node("MatMul", ["input", "w"], ["output"]),
                      helper.make_node("Gradient", ["input"], ["d_input"], xs=["input"],
                                       y="output", domain="ai.onnx.preview.training")],
                     [("input", [2, 4])], [("output", [2, 3]), ("d_input", [2, 4])],
                     (("", 17), ("ai.onnx.preview.training", 1)))
    with pytest.raises(mh.UnsupportedOpError, match=r"^node #1 \(Gradient of domain "
                                                    r"'ai.onnx.preview.training'\): microtrain "
                                                    r"runs the standard ONNX ops"):
        mh.generate_artifacts(model, loss=None, optimizer="SGD", artifact_directory=tmp_path)


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
            blobfile_parser.parse(data[:n])


def test_blob_wrong_identifier(packed):
    data = bytearray((packed / "model.mtb").read_bytes())
    data[8:12] = b"ORTM"
    with pytest.raises(BlobError, match="identifier"):
        blobfile_parser.parse(bytes(data))


def test_blob_newer_version_is_refused(packed):
    data = (packed / "model.mtb").read_bytes()
    body = bytearray(data[4:-4])
    r = Reader(memoryview(body), BlobError)
    at = r.field(r.root(), 0)  # format_version
    struct.pack_into("<H", body, at, blobfile.FORMAT_VERSION + 1)
    with pytest.raises(BlobError, match=r"format version 2 is not supported.*reads 1"):
        blobfile_parser.parse(_reframe(bytes(body)))


def test_blob_corruption_is_detected(packed):
    data = (packed / "model.mtb").read_bytes()
    rng = np.random.default_rng(0)
    for i in rng.integers(0, len(data), 300):
        bad = bytearray(data)
        bad[i] ^= 1 << int(rng.integers(0, 8))
        with pytest.raises(BlobError):
            blobfile_parser.parse(bytes(bad))


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


# -- pack-time refusals: every one names the node and the attribute or input at fault -----

def _tensor(name, value):
    return numpy_helper.from_array(np.asarray(value), name)


def _graph(nodes, params, input_shape, opset=17):
    """A model of nodes (name, op_type, inputs, outputs, attrs) reading "input" (float, of
    input_shape), the initializers params and earlier outputs; the last writes "output"
    (its shape left to shape inference)."""
    graph = helper.make_graph(
        [helper.make_node(op, ins, outs, name=name, **attrs)
         for name, op, ins, outs, attrs in nodes], "refusal",
        [helper.make_tensor_value_info("input", onnx.TensorProto.FLOAT, list(input_shape))],
        [helper.make_tensor_value_info("output", onnx.TensorProto.FLOAT, [])],
        [_tensor(k, v) for k, v in params.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)],
                             ir_version=8)


def _n(name, op_type, inputs, outputs, **attrs):
    return (name, op_type, list(inputs), [outputs] if isinstance(outputs, str) else outputs,
            attrs)


def _const(name, value):
    return _n(name, "Constant", [], name, value=_tensor(name, value))


def _ones(*shape):
    return np.ones(shape, np.float32)


def _scaled(nodes, shape, params=None, **kwargs):
    """h = input * w (w trainable, so the nodes after it are differentiated), then nodes."""
    params = dict(params or {}, w=_ones(*shape))
    return _graph([_n("scale", "Mul", ["input", "w"], "h")] + nodes, params, shape, **kwargs)


def _pool(op_type, shape, outputs="output", opset=17, **attrs):
    # A pool of input + b: b's gradient is the pool's input gradient.
    return _graph([_n("shift", "Add", ["input", "b"], "h"),
                   _n("the_pool", op_type, ["h"], outputs, **attrs)], {"b": np.float32(0.5)},
                  shape, opset=opset)


BN_PARAMS = {"bn.weight": _ones(3), "bn.bias": np.zeros(3, np.float32),
             "bn.running_mean": np.zeros(3, np.float32), "bn.running_var": _ones(3)}
BN_INPUTS = ["h", "bn.weight", "bn.bias", "bn.running_mean", "bn.running_var"]


def _dropout(ratio_nodes, ratio="ratio"):
    return _scaled(ratio_nodes + [_const("training", np.array(True)),
                                  _n("the_dropout", "Dropout", ["h", ratio, "training"],
                                     ["output", "mask"])], (4, 3))


def _slice(steps):
    return _scaled([_const("starts", [0]), _const("ends", [3]), _const("axes", [1]),
                    _const("steps", steps),
                    _n("the_slice", "Slice", ["h", "starts", "ends", "axes", "steps"],
                       "output")], (4, 3))


def _gather(indices):
    return _scaled([_const("indices", np.array(indices, np.int64)),
                    _n("the_gather", "Gather", ["h", "indices"], "output", axis=1)], (4, 3))


ERROR_CASES = [
    # id, model builder, generate_artifacts keyword arguments, error type, words of the message
    # (the first is always the node's name, quoted)
    ("conv_kernel_larger_than_padded_input",
     lambda: _graph([_n("the_conv", "Conv", ["input", "w"], "output", pads=[1, 0])],
                    {"w": _ones(3, 2, 6)}, (1, 2, 3)),
     {}, mh.UnsupportedOpError, ["kernel_shape=[6]", "pads=[1, 0]", "larger than the input"]),
    # One larger: an output of length 0, which the loss's mean must not divide by first.
    ("conv_kernel_one_larger_than_padded_input",
     lambda: _graph([_n("the_conv", "Conv", ["input", "w"], "output", pads=[1, 0])],
                    {"w": _ones(3, 2, 5)}, (1, 2, 3)),
     {}, mh.UnsupportedOpError, ["kernel_shape=[5]", "pads=[1, 0]", "larger than the input"]),
    ("conv_4d_input",
     lambda: _graph([_n("the_conv", "Conv", ["input", "w"], "output")],
                    {"w": _ones(3, 2, 2, 2, 2, 2)}, (1, 2, 3, 3, 3, 3)),
     {}, mh.UnsupportedOpError, ["only 1-D (N, C, L), 2-D (N, C, H, W) and 3-D (N, C, D, H, W)",
                                 "input shape [1, 2, 3, 3, 3, 3]"]),
    ("conv_kernel_shape_disagrees_with_weight",
     lambda: _graph([_n("the_conv", "Conv", ["input", "w"], "output", kernel_shape=[5])],
                    {"w": _ones(3, 2, 3)}, (1, 2, 8)),
     {}, mh.UnsupportedOpError, ["attribute kernel_shape=[5]", "spatial shape [3]"]),
    ("max_pool_window_of_padding_only",
     lambda: _pool("MaxPool", (1, 2, 5), kernel_shape=[2], pads=[2, 0]),
     {}, mh.UnsupportedOpError, ["attribute pads=[2, 0]", "only padding"]),
    ("max_pool_kernel_larger_than_input",
     lambda: _pool("MaxPool", (1, 2, 3), kernel_shape=[4]),
     {}, mh.UnsupportedOpError, ["attribute kernel_shape=[4]", "larger than the padded input"]),
    ("max_pool_indices_output",
     lambda: _pool("MaxPool", (1, 2, 5), ["output", "indices"], kernel_shape=[2]),
     {}, mh.UnsupportedOpError, ["Indices output"]),
    ("max_pool_storage_order",
     lambda: _pool("MaxPool", (1, 2, 5, 5), kernel_shape=[2, 2], storage_order=1),
     {}, mh.UnsupportedOpError, ["attribute storage_order=1", "only 0"]),
    ("average_pool_dilations",
     lambda: _pool("AveragePool", (1, 2, 6), opset=19, kernel_shape=[2], dilations=[2]),
     {}, mh.UnsupportedOpError, ["attribute dilations=[2]", "AveragePool"]),
    ("batch_norm_saved_mean_and_var_outputs_opset_13",
     lambda: _scaled([_n("the_bn", "BatchNormalization", BN_INPUTS,
                         ["output", "mean_out", "var_out", "saved_mean", "saved_var"])],
                     (4, 3), BN_PARAMS, opset=13),
     {}, mh.UnsupportedOpError, ["saved_mean", "saved_var", "opset 9-13",
                                 "export with opset >= 15"]),
    ("batch_norm_statistics_output_feeds_a_node",
     lambda: _scaled([_n("the_bn", "BatchNormalization", BN_INPUTS, ["y", "mean_out", "var_out"],
                         training_mode=1),
                      _n("add", "Add", ["y", "mean_out"], "output")], (4, 3), BN_PARAMS),
     {}, mh.UnsupportedOpError, ["running statistics outputs mean_out", "feed other nodes"]),
    ("dropout_ratio_not_constant",
     lambda: _dropout([_n("mean", "ReduceMean", ["input"], "ratio", keepdims=0)]),
     {}, mh.UnsupportedOpError, ["ratio must be a constant"]),
    ("dropout_ratio_one",
     lambda: _dropout([_const("ratio", np.float32(1.0))]),
     {}, mh.UnsupportedOpError, ["ratio 1.0 is outside [0, 1)"]),
    ("clip_min_trainable_parameter",
     lambda: _scaled([_n("the_clip", "Clip", ["h", "low"], "output")], (4, 3),
                     {"low": np.float32(-1.0)}),
     {}, mh.UnsupportedOpError, ["min and max get no gradient"]),
    ("clip_min_frozen_parameter",
     lambda: _scaled([_n("the_clip", "Clip", ["h", "low"], "output")], (4, 3),
                     {"low": np.float32(-1.0)}),
     {"frozen_params": ["low"]}, mh.UnsupportedOpError, ["input 'min' must be a constant"]),
    # onnx shape inference already refuses a zero step, naming the node and 'step'.
    ("slice_zero_step", lambda: _slice([0]),
     {}, mh.ArtifactError, ["shape inference failed", "'step' cannot be 0"]),
    ("transpose_perm_repeats_an_axis",
     lambda: _scaled([_n("the_transpose", "Transpose", ["h"], "output", perm=[0, 0])], (4, 3)),
     {}, mh.ArtifactError, ["shape inference failed", "perm", "repeated value"]),
    # ... but not a perm shorter than the rank.
    ("transpose_perm_misses_an_axis",
     lambda: _scaled([_n("the_transpose", "Transpose", ["h"], "output", perm=[1])], (4, 3)),
     {}, mh.UnsupportedOpError, ["perm [1] is not a permutation of the 2 axes"]),
    ("gather_index_out_of_range", lambda: _gather([0, 5]),
     {}, mh.UnsupportedOpError, ["index 5 out of range for an axis of 3"]),
    ("gather_negative_index_out_of_range", lambda: _gather([-4]),
     {}, mh.UnsupportedOpError, ["index -4 out of range for an axis of 3"]),
    # onnx shape inference refuses differing inner dimensions, naming the node.
    ("matmul_inner_dimensions_differ",
     lambda: _graph([_n("the_matmul", "MatMul", ["input", "w"], "output")],
                    {"w": _ones(5, 2)}, (4, 3)),
     {}, mh.ArtifactError, ["shape inference failed", "MatMul",
                            "Incompatible dimensions for matrix multiplication"]),
    ("mean_over_no_elements",  # an empty slice is valid, its mean is not
     lambda: _scaled([_const("starts", [2]), _const("ends", [2]), _const("axes", [1]),
                      _n("empty", "Slice", ["h", "starts", "ends", "axes"], "nothing"),
                      _n("the_mean", "ReduceMean", ["nothing"], "output", axes=[1])], (4, 3)),
     {}, mh.UnsupportedOpError, ["mean of 'nothing' (shape [4, 0])", "no elements"]),
    ("pad_wrap_mode",
     lambda: _scaled([_const("pads", [0, 1, 0, 1]),
                      _n("the_pad", "Pad", ["h", "pads"], "output", mode="wrap")], (4, 3),
                     opset=19),
     {}, mh.UnsupportedOpError, ["mode 'wrap' is not supported"]),
]


@pytest.mark.parametrize("build,kwargs,error,words", [c[1:] for c in ERROR_CASES],
                         ids=[c[0] for c in ERROR_CASES])
def test_refused_at_pack_time_naming_node_and_attribute(tmp_path, build, kwargs, error, words):
    model = build()
    onnx.checker.check_model(model)  # a valid ONNX model: the refusal is microtrain's
    with pytest.raises(mh.ArtifactError) as raised:
        mh.generate_artifacts(model, loss="MSELoss", optimizer="SGD",
                              artifact_directory=tmp_path, **kwargs)
    assert type(raised.value) is error, (type(raised.value), str(raised.value))
    message = str(raised.value)
    node_name = next(n.name for n in model.graph.node if n.name.startswith("the_"))
    # ours quote it; onnx shape inference's say "node name: ..."
    assert f"'{node_name}'" in message or f"node name: {node_name})" in message, message
    for word in words:
        assert word in message, (word, message)
