"""Issue 22, Concat in integers (quant/int8.py QLinearConcat, kernels/qlinear.py
qlinear_concat; its backward quant/intbackward.py IntConcatGrad, kernels/intflow.py
int_concat_grad): the int8 forward against onnxruntime running the QDQ model and against the
host's numpy mirror, along every axis, with inputs of either type and one copied as it is;
a fire module (conv -> 1x1 and 3x3 convs side by side -> Concat on channels -> conv ->
GlobalAveragePool -> Linear) and its 1-D twin: one integer step against torch float64 on the
dequantized model (tests/test_intbackward.py's oracle), MicroPython (viper and pure kernels)
under heap_lock equal to CPython, `pack --int8` of the net trained 2 steps by the device."""
import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper
from torch import nn

from microtrain import CheckpointState, InferenceSession, Module
from microtrain import parser as device_blob_parser
from microtrain_host.errors import UnsupportedOpError
from microtrain_host.int8pack import pack_int8
from microtrain_host.ops.qlinear import concat_values
from microtrain_host.quant.int8 import int8_graph, pack_inference_model
from microtrain_host.quant.inttrain import int8_training_artifacts, quantize_input
from reference_models import ReferenceModel
from test_int_limits import _viper_pure_cpython
from test_intbackward import TOLERANCE, _forward, step_errors, torch_step
from test_inttrain import torch_step as classifier_step
from test_quant_int8 import compare


# -- the forward, on hand-made QDQ models ---------------------------------------------------
def _qdq_concat_model(shape, axis):
    """X -> three quantized tensors -> Concat(axis) -> QuantizeLinear -> DequantizeLinear:
    A uint8 of its own scale (wider than the output's), B int8 (a slice of Relu(X) along
    the axis: another size there), C with the output's own scale and zero point (copied
    as it is)."""
    f = np.float32
    inits, nodes = [], []

    def pair(src, name, scale, zero_point, dtype):
        inits.extend([numpy_helper.from_array(np.array(scale, f), name + ".s"),
                      numpy_helper.from_array(np.array(zero_point, dtype), name + ".z")])
        nodes.extend([helper.make_node("QuantizeLinear", [src, name + ".s", name + ".z"],
                                       [name + ".q"], name=name + ".quantize"),
                      helper.make_node("DequantizeLinear", [name + ".q", name + ".s",
                                                            name + ".z"], [name],
                                       name=name + ".dequantize")])

    inits += [numpy_helper.from_array(np.array(v, np.int64), n) for n, v in
              (("starts", [1]), ("ends", [3]), ("axes", [axis]))]
    nodes += [helper.make_node("Relu", ["x"], ["relu"], name="relu"),
              helper.make_node("Slice", ["relu", "starts", "ends", "axes"], ["sliced"],
                               name="slice")]
    pair("x", "a", 0.04, 37, np.uint8)
    pair("sliced", "b", 0.013, -5, np.int8)
    pair("x", "c", 0.03, 120, np.uint8)
    nodes.append(helper.make_node("Concat", ["a", "b", "c"], ["cat"], name="concat",
                                  axis=axis))
    pair("cat", "output", 0.03, 120, np.uint8)
    out_shape = list(shape)
    out_shape[axis] = 2 * shape[axis] + 2
    graph = helper.make_graph(nodes, "concat", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, list(shape))], [helper.make_tensor_value_info(
            "output", TensorProto.FLOAT, out_shape)], initializer=inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _quantize(x, scale, zero_point, lo, hi):
    # onnxruntime's QuantizeLinear: float32 x / scale, half to even, saturated
    return np.clip(np.rint(x.astype(np.float32) / np.float32(scale)) + zero_point, lo, hi)


@pytest.mark.parametrize("shape, axis", [((2, 4, 3, 5), 1), ((2, 4, 3, 5), 2),
                                         ((2, 4, 3, 5), -1), ((2, 3, 7), 1), ((3, 4), 0)])
def test_int8_concat_equals_onnxruntime_and_the_numpy_mirror(shape, axis, tmp_path):
    model = _qdq_concat_model(shape, axis)
    onnx.save(model, tmp_path / "qdq.onnx")
    fused = int8_graph(model)
    assert [n.op_type for n in fused.graph.node if n.op_type.startswith("QLinear")] == [
        "QLinearConcat"]
    pack_inference_model(tmp_path / "qdq.onnx", tmp_path / "int8.mtb")
    rng = np.random.default_rng(len(shape) + axis)
    xs = [rng.standard_normal(shape).astype(np.float32) * 3 for _ in range(3)]
    worst, outs = compare(tmp_path / "qdq.onnx", tmp_path / "int8.mtb", xs)
    # one step where the float32 chain and the integer multiplier round apart (measured
    # as 1 + 7e-6: the float32 rounding of the dequantized outputs compared)
    assert worst <= 1.0 + 1e-4, worst
    # the numpy mirror: bit for bit (A's values beyond the output's range saturate)
    saturated = 0
    for x, got in zip(xs, outs):
        relu = np.maximum(x, 0).take(range(1, 3), axis)
        parts = [(_quantize(x, 0.04, 37, 0, 255), 0.04, 37),
                 (_quantize(relu, 0.013, -5, -128, 127), 0.013, -5),
                 (_quantize(x, 0.03, 120, 0, 255), 0.03, 120)]
        q = concat_values(parts, 0.03, 120, TensorProto.UINT8, axis)
        np.testing.assert_array_equal(got, ((q - 120) * np.float32(0.03)).astype(np.float32))
        saturated += int(np.sum(q == 255))
    assert saturated
    # one step per input, the multipliers derived at load: C's is 1 (m0 2**23, shift 23),
    # the plain copy
    session = InferenceSession(str(tmp_path / "int8.mtb"))
    pairs = [(session.I[args[3] + 4], session.I[args[3] + 5])
             for kernel, args in session._program.steps if kernel.__name__ == "qlinear_concat"]
    assert len(pairs) == 3 and pairs[2] == (1 << 23, 23) != pairs[0], pairs
    print(f"Concat of {list(shape)} along {axis}: within {worst:g} output steps of "
          f"onnxruntime")


# -- a fire module and its 1-D twin ---------------------------------------------------------
class FireNet(nn.Module):
    # conv -> (1x1 conv, 3x3 conv) side by side -> Concat on channels -> 1x1 conv ->
    # GlobalAveragePool -> Linear; `rank` 2 (images) or 1 (sequences); axis 2: the two
    # branches' rows one above the other instead (left == right channels)
    def __init__(self, rank, left, right, axis=1):
        super().__init__()
        conv = nn.Conv2d if rank == 2 else nn.Conv1d
        self.axis = axis
        self.stem = nn.Sequential(conv(2, 6, 3, padding=1), nn.ReLU())
        self.expand1 = nn.Sequential(conv(6, left, 1), nn.ReLU())
        self.expand3 = nn.Sequential(conv(6, right, 3, padding=1), nn.ReLU())
        self.mix = nn.Sequential(conv(left + right if axis == 1 else left, 8, 1), nn.ReLU())
        self.pool = nn.AdaptiveAvgPool2d(1) if rank == 2 else nn.AdaptiveAvgPool1d(1)
        self.head = nn.Linear(8, 4)

    def forward(self, x):
        h = self.stem(x)
        h = torch.cat([self.expand1(h), self.expand3(h)], self.axis)
        return self.head(self.pool(self.mix(h)).flatten(1))


def fire_net():
    torch.manual_seed(21)
    return ReferenceModel("fire_net", FireNet(2, 4, 5), (2, 6, 6), "CrossEntropyLoss", 4,
                          {"SGD": 0.05})


def fire_net_1d():
    torch.manual_seed(22)
    return ReferenceModel("fire_net_1d", FireNet(1, 4, 4), (2, 16), "CrossEntropyLoss", 4,
                          {"SGD": 0.05})


def fire_net_rows():
    torch.manual_seed(23)
    return ReferenceModel("fire_net_rows", FireNet(2, 4, 4, axis=2), (2, 5, 6),
                          "CrossEntropyLoss", 4, {"SGD": 0.05})


MODELS = {"fire_net": fire_net, "fire_net_1d": fire_net_1d, "fire_net_rows": fire_net_rows}
CONFIGS = {"classifier": {}, "last3": dict(train_last=3), "biases": dict(train_biases=True),
           "biases_saturating": dict(train_biases=True)}


def _model(tmp, config):
    """The QDQ model of a config: for "..._saturating" the Concat's output scale halved, so
    that its inputs' larger values saturate there (their gradient masked)."""
    if not config.endswith("_saturating"):
        return tmp / "qdq.onnx"
    model = onnx.load(tmp / "qdq.onnx")
    concat = next(n for n in model.graph.node if n.op_type == "Concat")
    quantize = next(n for n in model.graph.node if n.input[:1] == concat.output[:1])
    scale = next(i for i in model.graph.initializer if i.name == quantize.input[1])
    scale.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(scale) * np.float32(0.5),
                                           scale.name))
    onnx.save(model, tmp / "saturating.onnx")
    return tmp / "saturating.onnx"


def _saturated(fused, values, quant_of):
    # how many inputs' values the Concat saturates (what the masks drop)
    concat = next(n for n in fused.graph.node if n.op_type == "QLinearConcat")
    sy, zy = quant_of(concat.output[0])
    return sum(int(np.sum((np.rint((values[i] - quant_of(i)[1]) * quant_of(i)[0] / sy) + zy)
                          > 255)) for i in concat.input)


@pytest.fixture(scope="module", params=list(MODELS))
def qdq(request, tmp_path_factory):
    from torch_reference import qat_qdq_model
    tmp = tmp_path_factory.mktemp(request.param)
    xs, ys = qat_qdq_model(MODELS[request.param](), tmp, 8)
    return request.param, tmp, xs, ys


def test_fire_net_int8_forward_equals_onnxruntime(qdq, tmp_path):
    name, tmp, xs, _ = qdq
    fused = [n.op_type for n in int8_graph(onnx.load(tmp / "qdq.onnx")).graph.node]
    assert fused.count("QLinearConcat") == 1 and fused.count("QLinearConv") == 4
    assert fused.count("Dequantize") == 1          # no float island left
    pack_inference_model(tmp / "qdq.onnx", tmp_path / "int8.mtb")
    rng = np.random.default_rng(5)
    inputs = list(xs[:3]) + [rng.standard_normal(xs[0].shape).astype(np.float32) * 2]
    worst, _ = compare(tmp / "qdq.onnx", tmp_path / "int8.mtb", inputs)
    print(f"{name}: device int8 vs onnxruntime, largest difference {worst:g} output steps")
    assert worst <= 1.0 + 1e-6


@pytest.mark.parametrize("config", list(CONFIGS))
def test_integer_step_through_concat_equals_torch_float64(qdq, config, tmp_path):
    name, tmp, xs, ys = qdq
    lr = 4.0        # steps of several quanta
    info = int8_training_artifacts(_model(tmp, config), tmp_path, lr, stochastic=False,
                                   **CONFIGS[config])
    fused = int8_graph(onnx.load(_model(tmp, config)))
    b = device_blob_parser.load(info["blob"])
    ops = [op for op, *_ in device_blob_parser.load(info["blob"], keep_steps=True)
           .step_records["train"]]
    assert 196 in ops and (197 in ops) == (config != "classifier")

    def quant_of(tensor):
        scales, zps, _ = b.quant[b.tensor_id(tensor)]
        return scales[0], zps[0]

    rng = np.random.default_rng(3)
    checked, worst, saturated = set(), 0.0, 0
    for trial in range(2):
        model = Module(info["blob"], CheckpointState.load_checkpoint(info["checkpoint"]))
        x = quantize_input(xs[trial] + rng.standard_normal(xs[trial].shape).astype(np.float32)
                           * 0.1, info).reshape(-1).tolist()
        y = [int(v) for v in ys[trial]]
        values, before = _forward(model, info, x, y)
        saturated += _saturated(fused, values, quant_of)
        expected = torch_step(fused, quant_of, values, before, info, y, lr, "device")
        # the classifier: its own float64 step on its int8 input (the Concat's way)
        sf, zf = quant_of(info["feature_tensor"])
        sw = np.array(info["weight_scales"], np.float32)
        dw, db, _, _ = classifier_step(values[info["feature_tensor"]].reshape(len(y), -1), zf,
                                       before[info["weight"]].reshape(len(sw), -1),
                                       before[info["bias"]], sf, sw, np.array(y), lr)
        expected[info["weight"]], expected[info["bias"]] = dw, db
        model = Module(info["blob"], CheckpointState.load_checkpoint(info["checkpoint"]))
        model(x, y)
        for param, (err, largest) in step_errors(model, expected, before).items():
            # the classifier against the float softmax: the integer softmax's bound
            tolerance = TOLERANCE["cross_entropy" if param in (info["weight"], info["bias"])
                                  else "device"]
            assert np.all(err <= 0.5 + tolerance * largest + 1e-9), (param, err.max(), largest)
            worst = max(worst, float((err.max() - 0.5) / largest) if largest else 0.0)
            if largest > 1:
                checked.add(param)
    assert checked == set(info["parameters"]), (sorted(set(info["parameters"]) - checked))
    assert (saturated > 0) == config.endswith("_saturating"), saturated
    print(f"{name} {config}: {len(checked)} parameters vs torch float64, beyond half a "
          f"quantum at most {worst:.1e} of the layer's largest step; {saturated} values "
          f"saturated by the Concat")


@pytest.mark.parametrize("config", ["last3", "biases_saturating"])
def test_concat_steps_micropython_heap_lock_equal_cpython(qdq, config, micropython, tmp_path):
    name, tmp, xs, ys = qdq
    info = int8_training_artifacts(_model(tmp, config), tmp_path / "int", 0.5,
                                   **CONFIGS[config])
    rng = np.random.default_rng(6)
    (tmp_path / "data.bin").write_bytes(b"".join(
        quantize_input(x + rng.standard_normal(x.shape).astype(np.float32) * 0.1,
                       info).tobytes() + np.asarray(y, "<i4").tobytes()
        for x, y in zip(xs[:3], ys[:3])))
    moved = _viper_pure_cpython(micropython, info, tmp_path / "data.bin", 3, tmp_path)
    assert all(moved.values()), moved


def test_pack_int8_of_the_fire_net_trains_on_the_device(tmp_path):
    from torch_reference import export
    ref = fire_net()
    onnx_path = tmp_path / "fire.onnx"
    onnx.save(export(ref.module, torch.zeros((ref.batch,) + ref.inputs)), onnx_path)
    rng = np.random.default_rng(8)
    x = rng.standard_normal((16,) + ref.inputs).astype(np.float32)
    y = rng.integers(0, 4, 16)
    np.savez(tmp_path / "data.npz", x_train=x, y_train=y)
    out = tmp_path / "build"
    pack_int8(str(onnx_path), str(out), calibration=str(tmp_path / "data.npz"),
              batch_size=4, train_biases=True, train_last=2)
    state = CheckpointState.load_checkpoint(str(out / "checkpoint"))
    start = {k: bytes(v.data) for k, v in state.parameters.items()}
    model = Module(str(out / "model.mtb"), state)
    losses = [model(x[i:i + 4].reshape(-1).tolist(), [int(v) for v in y[i:i + 4]])
              for i in (0, 4)]
    assert all(np.isfinite(losses)), losses
    changed = [k for k, v in state.parameters.items() if bytes(v.data) != start[k]]
    assert len(changed) == len(start), (sorted(set(start) - set(changed)))


def test_a_tensor_concatenated_with_itself_is_refused_naming_the_node(tmp_path):
    from torch_reference import qat_qdq_model
    qat_qdq_model(fire_net_1d(), tmp_path, 2)
    model = onnx.load(tmp_path / "qdq.onnx")
    concat = next(n for n in model.graph.node if n.op_type == "Concat")
    concat.input[1] = concat.input[0]
    onnx.save(model, tmp_path / "self.onnx")
    with pytest.raises(UnsupportedOpError, match=f"node '{concat.name}' \\(QLinearConcat\\) "
                                                 f"concatenates a tensor with itself"):
        int8_training_artifacts(tmp_path / "self.onnx", tmp_path / "int", 0.05,
                                train_biases=True)
    # its forward is fine: the classifier alone trains
    int8_training_artifacts(tmp_path / "self.onnx", tmp_path / "int", 0.05)


def test_device_export_of_a_qat_blob_with_concat_equals_the_host_int8_blob(tmp_path):
    # quant/qat_export.py: the device computes a requantization head per Concat input
    import microtrain_host as mh
    from microtrain import Optimizer
    from microtrain_host.cli import main
    from test_quant_export import reference_case
    model, batch, _, lr, xs, ys, inputs = reference_case(fire_net, 4)
    mh.generate_artifacts(model, artifact_directory=tmp_path, batch_size=batch, optimizer="SGD",
                          quantization=True)
    state = CheckpointState.load_checkpoint(str(tmp_path / "checkpoint"))
    module = Module(str(tmp_path / "model.mtb"), state)
    opt = Optimizer(str(tmp_path / "model.mtb"), module)
    opt.set_learning_rate(lr)
    for x, y in zip(xs, ys):
        module(x.reshape(-1), [int(v) for v in y])
        opt.step()
        module.lazy_reset_grad()
    CheckpointState.save_checkpoint(state, str(tmp_path / "trained"))
    module.export_model_for_inferencing(str(tmp_path / "device_int8.mtb"), ["output"])
    assert main(["export", str(tmp_path), "--checkpoint", str(tmp_path / "trained"), "--qdq",
                 "-o", str(tmp_path / "qdq.onnx"), "--int8-blob",
                 str(tmp_path / "host_int8.mtb")]) == 0
    device = (tmp_path / "device_int8.mtb").read_bytes()
    assert device == (tmp_path / "host_int8.mtb").read_bytes()
    ops = [op for op, *_ in device_blob_parser.load(str(tmp_path / "device_int8.mtb"),
                                                    keep_steps=True).step_records["infer"]]
    assert ops.count(196) == 2 and 221 in ops
    worst, _ = compare(tmp_path / "qdq.onnx", tmp_path / "device_int8.mtb", inputs)
    assert worst <= 1.0 + 1e-6, worst


def test_a_concat_step_outside_its_output_is_refused_at_load(tmp_path, monkeypatch):
    # a crafted step (its input's runs placed past the output's: offset = stride) is
    # refused by the checker when the blob loads, naming the step and the value
    from microtrain.errors import BlobError
    from microtrain_host.ops import qlinear
    geometry = qlinear.concat_geometry
    monkeypatch.setattr(qlinear, "concat_geometry",
                        lambda *a: geometry(*a)[:3] + (geometry(*a)[2],))
    onnx.save(_qdq_concat_model((2, 4, 3, 5), 1), tmp_path / "qdq.onnx")
    pack_inference_model(tmp_path / "qdq.onnx", tmp_path / "int8.mtb")
    with pytest.raises(BlobError, match="qlinear_concat.*offset"):
        InferenceSession(str(tmp_path / "int8.mtb"))
