"""Issue 22, lookup-table activations in integer training (ops/intlookup.py,
kernels/intlookup.py): a Relu / Clip the int8 conversion cannot fuse into the layer before it
(after a MaxPool, after a Flatten view) runs as a QLinearLookup; the integer backward
multiplies the gradient by the activation's slope at each input byte. One integer step
against torch float64 on the dequantized model (tests/test_intbackward.py's oracle, which
replays a QLinearLookup as the float activation followed by the output's fake quantizer),
the blobs on MicroPython under heap_lock equal to CPython, and what has no integer backward
refused naming the node."""
import numpy as np
import onnx
import pytest
import torch
from torch import nn

import test_intbackward as oracle
from microtrain import CheckpointState, Module
from microtrain_host.errors import UnsupportedOpError
from microtrain_host.int8pack import pack_int8
from microtrain_host.ops.intlookup import fixed_point_slopes, lookup_slopes
from microtrain_host.quant.int8 import int8_graph
from microtrain_host.quant.inttrain import quantize_input
from reference_models import ReferenceModel
from test_int8_pack import pack


def conv_net(activation, pool=False):
    # conv -> [max pool] -> activation (not fused into the conv: a Relu / Clip needs the pool
    # between) -> conv + ReLU -> GAP -> Linear
    torch.manual_seed(7)
    module = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.MaxPool2d(2) if pool else
                           nn.Identity(), activation, nn.Conv2d(4, 6, 3, padding=1), nn.ReLU(),
                           nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(6, 3))
    return ReferenceModel("conv_net", module, (1, 8, 8), "CrossEntropyLoss", 4, {"SGD": 0.05})


def gemm_stack(activation):
    # Linear -> activation -> Linear + ReLU -> Linear
    torch.manual_seed(8)
    module = nn.Sequential(nn.Linear(12, 16), activation, nn.Linear(16, 10), nn.ReLU(),
                           nn.Linear(10, 4))
    return ReferenceModel("gemm_stack", module, (12,), "CrossEntropyLoss", 4, {"SGD": 0.05})


def gap_net(activation):
    # conv + ReLU -> conv -> activation -> GAP -> Linear: the quantizer observes the
    # activation's output for the pool (quant/quantize.py LOOKUP_OPS)
    torch.manual_seed(6)
    module = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.ReLU(),
                           nn.Conv2d(4, 6, 3, padding=1), activation, nn.AdaptiveAvgPool2d(1),
                           nn.Flatten(), nn.Linear(6, 3))
    return ReferenceModel("gap_net", module, (1, 8, 8), "CrossEntropyLoss", 4, {"SGD": 0.05})


SMOOTH = {"sigmoid": nn.Sigmoid, "tanh": nn.Tanh, "leaky_relu": lambda: nn.LeakyReLU(0.1),
          "hard_sigmoid": nn.Hardsigmoid, "hard_swish": nn.Hardswish}
NETS = {"conv_relu6": lambda: conv_net(nn.ReLU6(), pool=True),
        "conv_relu": lambda: conv_net(nn.ReLU(), pool=True),
        **{f"conv_{k}": (lambda make: lambda: conv_net(make()))(v) for k, v in SMOOTH.items()},
        **{f"gemm_{k}": (lambda make: lambda: gemm_stack(make()))(v) for k, v in SMOOTH.items()},
        "gap_hard_swish": lambda: gap_net(nn.Hardswish())}


def _qdq(name, tmp_path_factory):
    from torch_reference import qat_qdq_model
    tmp = tmp_path_factory.mktemp(name)
    xs, ys = qat_qdq_model(NETS[name](), tmp, 8)
    fused = int8_graph(onnx.load(tmp / "qdq.onnx"))
    assert "QLinearLookup" in [n.op_type for n in fused.graph.node], name
    return name, tmp, xs, ys


@pytest.fixture(scope="module", params=list(NETS))
def qdq(request, tmp_path_factory):
    return _qdq(request.param, tmp_path_factory)


@pytest.fixture(scope="module")
def relu6(tmp_path_factory):
    return _qdq("conv_relu6", tmp_path_factory)


@pytest.mark.parametrize("config", ["biases", "last3"])
def test_lookup_backward_equals_torch_float64(qdq, config, tmp_path):
    # (of the device's own loss gradient: the backward alone; with the integer softmax's
    # cross-entropy below, for one net)
    oracle.test_integer_backward_equals_torch_float64(qdq, config, "device", tmp_path)


def test_lookup_backward_with_the_integer_cross_entropy_equals_torch(relu6, tmp_path):
    oracle.test_integer_backward_equals_torch_float64(relu6, "biases_last2", "cross_entropy",
                                                      tmp_path)


def test_lookup_backward_micropython_heap_lock_equals_cpython(qdq, micropython, tmp_path):
    oracle.test_integer_backward_micropython_heap_lock_equals_cpython(
        qdq, "biases_last2", micropython, tmp_path)


def _onnxruntime_table(node):
    # Y's byte for each byte of X by onnxruntime: DequantizeLinear -> the activation ->
    # QuantizeLinear, of the node's scales and zero points
    import onnxruntime
    from onnx import TensorProto, helper
    from microtrain_host.graph import attr
    kind = attr(node, "activation")
    x_type, y_type = attr(node, "x_type"), attr(node, "y_type")
    np_type = {TensorProto.UINT8: np.uint8, TensorProto.INT8: np.int8}
    inits = [onnx.numpy_helper.from_array(np.array(v, t), n) for n, v, t in (
        ("sx", attr(node, "x_scale"), np.float32), ("zx", attr(node, "x_zero_point"),
                                                     np_type[x_type]),
        ("sy", attr(node, "y_scale"), np.float32), ("zy", attr(node, "y_zero_point"),
                                                     np_type[y_type]))]
    extra = [n for n in ("clamp_min", "clamp_max") if attr(node, n, None) is not None]
    inits += [onnx.numpy_helper.from_array(np.array(attr(node, n), np.float32), n)
              for n in extra]
    kwargs = {k: attr(node, k) for k in ("alpha", "beta") if kind in (
        "LeakyRelu", "HardSigmoid") and (k == "alpha" or kind == "HardSigmoid")}
    act_inputs = ["x"] + ((["clamp_min"] if "clamp_min" in extra else [""]) +
                          (["clamp_max"] if "clamp_max" in extra else [])
                          if kind == "Clip" else [])
    graph = helper.make_graph(
        [helper.make_node("DequantizeLinear", ["q", "sx", "zx"], ["x"]),
         helper.make_node(kind, act_inputs, ["y"], **kwargs),
         helper.make_node("QuantizeLinear", ["y", "sy", "zy"], ["out"])], "lookup",
        [helper.make_tensor_value_info("q", x_type, [256])],
        [helper.make_tensor_value_info("out", y_type, [256])], initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    options = onnxruntime.SessionOptions()
    options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = onnxruntime.InferenceSession(model.SerializeToString(), options,
                                           providers=["CPUExecutionProvider"])
    q = np.arange(256).astype(np.uint8).view(np_type[x_type])
    return session.run(None, {"q": q})[0].astype(np.int64)


def test_lookup_tables_equal_onnxruntime_and_slopes_fit_fixed_point(qdq):
    # the forward: each table byte as onnxruntime's DequantizeLinear -> op -> QuantizeLinear;
    # the backward's slopes in fixed point within half a step of 2**-15 of the largest
    from microtrain_host.graph import attr
    name, tmp, _, _ = qdq
    fused = int8_graph(onnx.load(tmp / "qdq.onnx"))
    for node in (n for n in fused.graph.node if n.op_type == "QLinearLookup"):
        table = np.array(attr(node, "table"), np.int64)
        assert np.array_equal(table, _onnxruntime_table(node)), name
        slopes = lookup_slopes(node)
        ints, unit = fixed_point_slopes(slopes)
        assert np.abs(ints * unit - slopes).max() <= unit / 2 * (1 + 1e-6)
        if name in ("conv_relu", "conv_relu6"):
            # a Relu / Clip passes the gradient unchanged inside the clamp and the output
            # range, nothing outside: slopes 0 or 1, in fixed point 0 or 2**15
            assert set(np.unique(slopes)) <= {0.0, 1.0}
            assert unit == 2.0 ** -13 and set(np.unique(ints)) <= {0, 1 << 13}


def test_a_lookup_without_its_activation_is_refused_naming_the_node():
    node = onnx.helper.make_node("QLinearLookup", ["x"], ["y"], name="act",
                                 table=list(range(256)))
    with pytest.raises(UnsupportedOpError, match="node 'act' .*does not say which activation"):
        lookup_slopes(node)
    node = onnx.helper.make_node("QLinearLookup", ["x"], ["y"], name="act2",
                                 table=list(range(256)), activation="Softsign", x_scale=0.1)
    with pytest.raises(UnsupportedOpError, match="node 'act2' .*Softsign.* no integer backward"):
        lookup_slopes(node)


# -- named parameter sets (--requires-grad / --frozen with --int8) -------------------------
# conv_net's parameters: 0 (conv), 3 (conv after the lookup), 7 (the classifier); a named set
# whose gradient passes layer 3 without training its bias (IntClampGrad: masked and folded)
NAMED = {"named": dict(requires_grad=["0.bias", "3.weight", "7.weight", "7.bias"]),
         "frozen": dict(frozen_params=["3.bias", "0.weight"])}


@pytest.mark.parametrize("config", list(NAMED))
def test_named_set_backward_equals_torch_float64(relu6, config, monkeypatch, tmp_path):
    monkeypatch.setitem(oracle.CONFIGS, config, NAMED[config])
    oracle.test_integer_backward_equals_torch_float64(relu6, config, "device", tmp_path)


def test_named_set_micropython_heap_lock_equals_cpython(relu6, micropython, monkeypatch,
                                                        tmp_path):
    monkeypatch.setitem(oracle.CONFIGS, "named", NAMED["named"])
    oracle.test_integer_backward_micropython_heap_lock_equals_cpython(
        relu6, "named", micropython, tmp_path)


class BatchNormNet(nn.Module):
    # conv (no bias) + BatchNorm + ReLU, max pool, ReLU6 (a lookup), conv + ReLU, GAP, Linear
    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 4, 3, padding=1, bias=False), nn.BatchNorm2d(4), nn.ReLU(),
            nn.MaxPool2d(2), nn.ReLU6(), nn.Conv2d(4, 6, 3, padding=1), nn.ReLU(),
            nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.classifier = nn.Linear(6, 3)

    def forward(self, x):
        return self.classifier(self.features(x))


@pytest.fixture(scope="module")
def batch_norm_net(tmp_path_factory):
    from torch_reference import export
    tmp = tmp_path_factory.mktemp("named_pack")
    torch.manual_seed(9)
    net = BatchNormNet().eval()
    onnx.save(export(net, torch.zeros(2, 1, 8, 8)), tmp / "net.onnx")
    rng = np.random.default_rng(2)
    x = rng.standard_normal((16, 1, 8, 8)).astype(np.float32)
    np.savez(tmp / "data.npz", x_train=x)
    return tmp, x, rng.integers(0, 3, 16)


# the folded BatchNormalization's bias is named for the convolution ("features.0.bias")
PACKED = {"requires_grad": ["--requires-grad", "features.0.bias,classifier.weight,"
                            "classifier.bias"],
          "frozen": ["--frozen", "features.5.bias"],
          "last2_frozen": ["--train-last", "2", "--frozen", "features.5.bias"],
          "biases_frozen": ["--train-biases", "--frozen", "features.0.bias"],
          "classifier_only": ["--requires-grad", "classifier.weight,classifier.bias"]}
TRAINED = {"requires_grad": {"features.0.bias", "classifier.weight", "classifier.bias"},
           "frozen": {"features.0.weight", "features.0.bias", "features.5.weight",
                      "classifier.weight", "classifier.bias"},
           "last2_frozen": {"features.5.weight", "classifier.weight", "classifier.bias"},
           "biases_frozen": {"features.5.bias", "classifier.weight", "classifier.bias"},
           "classifier_only": {"classifier.weight", "classifier.bias"}}


@pytest.mark.parametrize("config", list(PACKED))
def test_pack_int8_named_sets_train_exactly_those_on_the_device(batch_norm_net, config,
                                                                 tmp_path):
    tmp, x, y = batch_norm_net
    info = pack(tmp / "net.onnx", tmp_path / "out", tmp / "data.npz", "--batch-size", 2,
                "--lr", 0.5, *PACKED[config])
    assert set(info["parameters"]) == TRAINED[config]
    state = CheckpointState.load_checkpoint(info["checkpoint"])
    start = {name: bytes(p.data) for name, p in state.parameters.items()}
    model = Module(info["blob"], state)      # two integer steps (updates fused: in place)
    xq = quantize_input(x[:2], info).reshape(-1).tolist()
    losses = [model(xq, [int(v) for v in y[:2]]) for _ in range(2)]
    assert all(np.isfinite(losses)), losses
    moved = {name for name, p in state.parameters.items() if bytes(p.data) != start[name]}
    assert moved == TRAINED[config], (moved, config)


def test_named_sets_refused_naming_what_to_change(batch_norm_net, tmp_path):
    tmp, _, _ = batch_norm_net
    for kwargs, message in (
            (dict(frozen=["classifier.bias"]), "always trains the classifier: classifier.bias "
                                               "must train"),
            (dict(requires_grad=["features.1.weight"]), "features.1.weight name.s. no "
                                                        "parameter.*features.0.bias"),
            (dict(requires_grad=["features.0.bias"], train_biases=True), "give one or the"),
            (dict(frozen=["features.0.bias"], loss="mse"),
             r"the loss 'mse' .*: --requires-grad / --frozen need\(s\) the cross_entropy")):
        with pytest.raises(Exception, match=message):
            pack_int8(tmp / "net.onnx", tmp_path / "out", calibration=tmp / "data.npz",
                      batch_size=2, **kwargs)
        assert not (tmp_path / "out").exists()


def test_a_qat_blob_with_a_smooth_activation_keeps_its_device_export(tmp_path_factory):
    # the device's int8 export (quant/qat_export.py) has no lookup tables: its template
    # keeps a Sigmoid between int8 layers float, as before the host tabulated it
    from microtrain_host.quant.qat_export import skeleton
    _, tmp, _, _ = _qdq("conv_sigmoid", tmp_path_factory)
    parts = skeleton(onnx.load(tmp / "eval_model.onnx"))
    assert parts is not None
    assert "Sigmoid" in [n.op_type for n in parts[1].graph.node]
