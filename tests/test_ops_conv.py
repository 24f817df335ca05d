"""Conv (1-D, 2-D and 3-D) and its gradients.

Each case of CASES is a tiny model, [input * scale ->] Conv(W[, B]) -> output, MSELoss:
  * one device step (CPython) against torch autograd in float64: the loss and the gradients
    of W, B and, when the input is scaled by a trainable tensor, of that scale (which checks
    every element of the conv's input gradient); a second step without lazy_reset_grad must
    double them (the weight gradient is accumulated by the conv kernel itself);
  * the eval forward against onnxruntime running the original model;
  * the host's training graph, run by the ONNX reference evaluator with our numpy
    ConvGradInput / ConvGradWeight, against torch.
Torch has no auto_pad and only symmetric pads, so the torch side pads explicitly with the pads
the ONNX spec gives (onnxruntime, which resolves auto_pad itself, confirms them).

Inputs and parameters are multiples of 1/16 in [-1, 1], so every product and sum of the forward
pass is exact in float32 and the forward comparison measures the convolution, not the
summation order of two float32 implementations (with arbitrary floats onnxruntime itself is up
to 2.5e-5 away from the float64 result on outputs near 0, by this relative measure)."""
import collections
import copy
import zlib

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

import microtrain_host as mh
from conftest import ROOT, run_micropython
from microtrain import CheckpointState, Module
from microtrain import parser as device_blob_parser
from microtrain_host import opcodes as op
from microtrain_host.reference import reference_evaluator
from test_ops import FORWARD_TOLERANCE, GRAD_TOLERANCE, relative_error
from torch_reference import (export, make_batches, parse_run, run_device_cpython, torch_train,
                             write_batches)


# input_grad: a trainable op before the conv, so that the conv's input needs a gradient.
Spec = collections.namedtuple("Spec", "spatial channels out_channels kernel bias input_grad "
                                      "batch attrs")


def case(name, spatial, channels, out_channels, kernel, bias=True, input_grad=True, batch=2,
         **attrs):
    """A pytest param holding a Spec; attrs are the Conv node's attributes."""
    return pytest.param(Spec(tuple(spatial), channels, out_channels, tuple(kernel), bias,
                             input_grad, batch, attrs), id=name)


CASES = [
    # 1-D (N, C, L)
    case("1d_k3", [11], 3, 4, [3]),
    case("1d_k3_kernel_shape_attr", [11], 3, 4, [3], kernel_shape=[3]),
    case("1d_stride2_pads_symmetric", [11], 3, 4, [3], strides=[2], pads=[1, 1]),
    case("1d_pads_asymmetric_no_bias", [10], 2, 3, [4], bias=False, pads=[2, 0]),
    case("1d_stride2_pads_asymmetric", [13], 2, 3, [5], strides=[2], pads=[0, 3]),
    case("1d_valid", [9], 2, 3, [3], strides=[2], auto_pad="VALID"),
    case("1d_same_upper", [10], 2, 3, [4], strides=[3], auto_pad="SAME_UPPER"),
    case("1d_same_lower", [10], 2, 3, [4], strides=[3], auto_pad="SAME_LOWER"),
    case("1d_dilation2", [13], 2, 3, [3], dilations=[2], pads=[2, 1]),
    case("1d_dilation2_stride2", [12], 2, 2, [3], dilations=[2], strides=[2], pads=[1, 2]),
    case("1d_group2", [9], 4, 6, [3], group=2, pads=[1, 1]),
    case("1d_depthwise", [9], 3, 3, [5], group=3, pads=[2, 2]),
    case("1d_depthwise_multiplier2_no_bias", [9], 3, 6, [3], bias=False, group=3, strides=[2]),
    case("1d_first_layer_k1", [7], 3, 5, [1], input_grad=False, batch=3),
    case("1d_first_layer_k5_stride2", [16], 1, 4, [5], input_grad=False, strides=[2],
         pads=[2, 2]),
    # 2-D (N, C, H, W)
    case("2d_k3", [6, 7], 2, 3, [3, 3]),
    case("2d_k3x2_kernel_shape_attr", [6, 7], 2, 3, [3, 2], kernel_shape=[3, 2]),
    case("2d_stride2_pads_symmetric", [7, 9], 2, 3, [3, 3], strides=[2, 2], pads=[1, 1, 1, 1]),
    case("2d_pads_asymmetric_no_bias", [5, 7], 2, 3, [3, 3], bias=False, pads=[2, 0, 1, 3]),
    case("2d_strides_2x1_pads_asymmetric", [7, 6], 2, 2, [3, 2], strides=[2, 1],
         pads=[0, 1, 2, 0]),
    case("2d_valid", [7, 8], 2, 3, [3, 3], strides=[2, 2], auto_pad="VALID"),
    case("2d_same_upper", [7, 8], 2, 3, [3, 2], strides=[2, 3], auto_pad="SAME_UPPER"),
    case("2d_same_lower", [7, 8], 2, 3, [3, 2], strides=[2, 3], auto_pad="SAME_LOWER"),
    case("2d_same_upper_stride1_even_kernel", [5, 6], 2, 2, [2, 4], auto_pad="SAME_UPPER"),
    case("2d_dilation2", [9, 8], 2, 3, [3, 3], dilations=[2, 2], pads=[2, 2, 2, 2]),
    case("2d_dilation_1x2_stride2", [7, 9], 2, 2, [3, 3], dilations=[1, 2], strides=[2, 2],
         pads=[1, 0, 0, 1]),
    case("2d_group2", [5, 6], 4, 6, [3, 3], group=2, pads=[1, 1, 1, 1]),
    case("2d_depthwise", [6, 5], 3, 3, [3, 3], group=3, pads=[1, 1, 1, 1]),
    case("2d_depthwise_multiplier2_stride2_no_bias", [7, 7], 2, 4, [3, 3], bias=False,
         group=2, strides=[2, 2], pads=[1, 1, 1, 1]),
    case("2d_pointwise", [4, 5], 4, 3, [1, 1]),
    case("2d_first_layer", [6, 7], 1, 3, [3, 3], input_grad=False, batch=3, pads=[1, 1, 1, 1]),
    case("2d_first_layer_depthwise_same_lower", [6, 7], 2, 2, [3, 3], input_grad=False,
         group=2, strides=[2, 2], auto_pad="SAME_LOWER"),
    # 3-D (N, C, D, H, W): the CONV_3D kernels
    case("3d_k3", [4, 5, 4], 2, 3, [3, 3, 3]),
    case("3d_k2x3x2_strides_2x1x2_pads_asymmetric", [5, 4, 6], 2, 2, [2, 3, 2],
         strides=[2, 1, 2], pads=[1, 0, 2, 0, 1, 1]),
    case("3d_dilation_2x1x2_no_bias", [5, 4, 5], 2, 2, [2, 2, 2], bias=False,
         dilations=[2, 1, 2], pads=[1, 1, 0, 0, 1, 1]),
    case("3d_group2", [3, 4, 4], 4, 4, [3, 2, 3], group=2, pads=[1, 0, 1, 1, 1, 1]),
    case("3d_depthwise_multiplier2_stride2", [4, 5, 5], 2, 4, [3, 3, 3], group=2,
         strides=[2, 2, 2], pads=[1, 1, 1, 1, 1, 1]),
    case("3d_same_upper", [4, 5, 3], 2, 2, [2, 3, 2], strides=[2, 2, 1], auto_pad="SAME_UPPER"),
    case("3d_first_layer", [3, 4, 5], 1, 3, [2, 2, 3], input_grad=False, batch=3),
]


def spec_named(name):
    (spec,) = [c.values[0] for c in CASES if c.id == name]
    return spec


def explicit_pads(spatial, kernel, attrs):
    """(begins, ends) as the ONNX spec defines them, auto_pad included."""
    rank = len(spatial)
    strides = attrs.get("strides", [1] * rank)
    auto_pad = attrs.get("auto_pad", "NOTSET")
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        begins, ends = [], []
        for size, k, s in zip(spatial, kernel, strides):
            out = -(-size // s)
            total = max(0, (out - 1) * s + k - size)
            begin = total // 2 if auto_pad == "SAME_UPPER" else total - total // 2
            begins.append(begin)
            ends.append(total - begin)
        return begins, ends
    pads = attrs.get("pads", [0] * (2 * rank)) if auto_pad == "NOTSET" else [0] * (2 * rank)
    return list(pads[:rank]), list(pads[rank:])


def torch_conv(h, w, b, spatial, kernel, attrs):
    rank = len(spatial)
    begins, ends = explicit_pads(spatial, kernel, attrs)
    pad = []
    for begin, end in zip(reversed(begins), reversed(ends)):  # torch pads the last dim first
        pad += [begin, end]
    conv = {1: torch.nn.functional.conv1d, 2: torch.nn.functional.conv2d,
            3: torch.nn.functional.conv3d}[rank]
    return conv(torch.nn.functional.pad(h, pad), w, b, stride=attrs.get("strides", 1),
                dilation=attrs.get("dilations", 1), groups=attrs.get("group", 1))


def sixteenths(rng, shape):
    return (rng.integers(-16, 17, shape) / 16).astype(np.float32)


def case_data(name, spec):
    """Inputs, parameters, torch's float64 loss, output and gradients, and the target."""
    spatial, channels, out_channels, kernel, bias, input_grad, batch, attrs = spec
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    x_shape = (batch, channels) + spatial
    params = {"w": (out_channels, channels // attrs.get("group", 1)) + kernel}
    if bias:
        params["b"] = (out_channels,)
    if input_grad:
        params["scale"] = x_shape
    x = sixteenths(rng, x_shape)
    params = {k: sixteenths(rng, s) for k, s in params.items()}
    p = {k: torch.tensor(v, dtype=torch.float64, requires_grad=True) for k, v in params.items()}
    h = torch.tensor(x, dtype=torch.float64)
    if input_grad:
        h = h * p["scale"]
    out = torch_conv(h, p["w"], p.get("b"), spatial, kernel, attrs)
    target = rng.standard_normal(tuple(out.shape)).astype(np.float32)
    loss = torch.nn.functional.mse_loss(out, torch.tensor(target, dtype=torch.float64))
    loss.backward()
    grads = {k: v.grad.numpy() for k, v in p.items()}
    return x, params, target, loss.item(), out.detach().numpy(), grads


def conv_model(spec, params, out_shape):
    spatial, channels, _, _, bias, input_grad, batch, attrs = spec
    nodes = []
    conv_input = "input"
    if input_grad:
        nodes.append(helper.make_node("Mul", ["input", "scale"], ["h"], name="scale_input"))
        conv_input = "h"
    nodes.append(helper.make_node("Conv", [conv_input, "w"] + (["b"] if bias else []),
                                  ["output"], name="conv", **attrs))
    graph = helper.make_graph(
        nodes, "conv_test",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, [batch, channels, *spatial])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, list(out_shape))],
        initializer=[numpy_helper.from_array(v, k) for k, v in params.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    onnx.checker.check_model(model)
    return model


@pytest.mark.parametrize("spec", CASES)
def test_conv_gradient(tmp_path, request, spec):
    run_conv_case(tmp_path, request.node.callspec.id, spec)


def run_conv_case(tmp_path, name, spec):
    """Pack the case, train two device steps and run eval: against torch and onnxruntime."""
    x, params, target, loss, out, grads = case_data(name, spec)
    model = conv_model(spec, params, out.shape)
    mh.generate_artifacts(model, loss="MSELoss", optimizer="SGD", artifact_directory=tmp_path)
    training_ops = [n.op_type for n in onnx.load(tmp_path / "training_model.onnx").graph.node]
    assert ("ConvGradInput" in training_ops) == spec.input_grad  # dX only when needed

    check_two_steps_and_eval(tmp_path, model, x, target, loss, out, grads, GRAD_TOLERANCE)


def check_two_steps_and_eval(tmp_path, model, x, target, loss, out, grads, grad_tolerance):
    """The packed case in tmp_path on the device: the loss and gradients of a step against
    torch's, a second step without lazy_reset_grad (they add up), then eval against
    onnxruntime (and torch against onnxruntime). Returns the device's eval output."""
    state = CheckpointState.load_checkpoint(str(tmp_path / "checkpoint"))
    device = Module(str(tmp_path / "model.mtb"), state)
    x_flat, target_flat = x.reshape(-1).tolist(), target.reshape(-1).tolist()
    assert relative_error(device(x_flat, target_flat), loss) <= grad_tolerance
    for param, expected in grads.items():
        actual = np.array(state.parameters[param].grad.tolist())
        assert relative_error(actual, expected) <= grad_tolerance, param
    device(x_flat, target_flat)  # no lazy_reset_grad in between: gradients add up
    for param, expected in grads.items():
        actual = np.array(state.parameters[param].grad.tolist())
        assert relative_error(actual, 2 * expected) <= grad_tolerance, param

    device.eval()
    device_out = np.array(device(x_flat, target_flat)[1].tolist())
    (ort_out,) = ort.InferenceSession(model.SerializeToString(),
                                      providers=["CPUExecutionProvider"]).run(None, {"input": x})
    assert ort_out.shape == out.shape
    assert relative_error(out, ort_out) <= FORWARD_TOLERANCE  # the torch side's pads are ONNX's
    assert relative_error(device_out, ort_out) <= FORWARD_TOLERANCE
    return device_out


def random_conv_specs(count, seed, ranks=(1, 2), reach=7):
    """count random valid geometries: of a rank in `ranks` (1-D or 2-D by default), batch
    1-3, group 1-3 with 1-2 input and output channels per group (grouped, depthwise,
    depthwise with a multiplier), kernel 1-4, stride 1-3, and either explicit pads 0-3
    (asymmetric) with dilations 1-3 or an auto_pad; sizes odd or even, from the smallest the
    window fits on, up to `reach` more. Big ones are skipped to keep the pure-Python kernels
    quick."""
    rng = np.random.default_rng(seed)

    def draw(low, high, n):
        return [int(v) for v in rng.integers(low, high + 1, n)]

    specs = []
    while len(specs) < count:
        rank = int(rng.choice(ranks))
        group = int(rng.integers(1, 4))
        channels, out_channels = group * int(rng.integers(1, 3)), group * int(rng.integers(1, 3))
        kernel = draw(1, 4, rank)
        attrs = {"strides": draw(1, 3, rank)}
        if group > 1 or rng.random() < 0.3:
            attrs["group"] = group
        if rng.random() < 0.3:
            attrs["kernel_shape"] = kernel
        auto_pad = str(rng.choice(["NOTSET"] * 4 + ["SAME_UPPER", "SAME_LOWER", "VALID"]))
        begins, ends, dilations = [0] * rank, [0] * rank, [1] * rank
        if auto_pad == "NOTSET":
            dilations = draw(1, 3, rank)
            pads = draw(0, 3, 2 * rank)
            begins, ends = pads[:rank], pads[rank:]
            attrs.update(dilations=dilations, pads=pads)
        else:
            attrs["auto_pad"] = auto_pad
        spatial = []
        for k, d, b, e in zip(kernel, dilations, begins, ends):
            smallest = max(1, (k - 1) * d + 1 - b - e) if auto_pad != "SAME_UPPER" \
                and auto_pad != "SAME_LOWER" else 1
            spatial.append(int(rng.integers(smallest, smallest + reach)))
        spec = Spec(tuple(spatial), channels, out_channels, tuple(kernel),
                    bool(rng.random() < 0.7), bool(rng.random() < 0.8), int(rng.integers(1, 4)),
                    attrs)
        work = spec.batch * out_channels * channels // group * np.prod(kernel) * np.prod(
            [s + b + e for s, b, e in zip(spatial, begins, ends)])
        if work <= 6000:
            specs.append(spec)
    return specs


def test_conv_gradient_on_random_geometries(tmp_path):
    # Issue 3's acceptance: random shapes, odd sizes and stride / padding / dilation /
    # group combinations, each through the same checks as a CASES row.
    specs = random_conv_specs(25, seed=3)
    seen = {(len(s.spatial), s.attrs.get("group", 1) > 1, s.attrs.get("auto_pad", "NOTSET"),
             max(s.attrs.get("dilations", [1])) > 1) for s in specs}
    assert len(seen) >= 8, seen   # the draw covers the combinations, not one corner
    for i, spec in enumerate(specs):
        name = f"random{i}"
        try:
            run_conv_case(tmp_path / name, name, spec)
        except AssertionError as e:
            raise AssertionError(f"{name}: {spec}") from e


def test_3d_conv_gradient_on_random_geometries(tmp_path):
    # The 3-D kernels on random geometries: the depth walk's clipping at every pad, stride
    # and dilation (torch's conv3d and onnxruntime as oracles).
    specs = random_conv_specs(10, seed=26, ranks=(3,), reach=4)
    assert any(max(s.attrs.get("dilations", [1])) > 1 for s in specs)
    for i, spec in enumerate(specs):
        name = f"random3d{i}"
        try:
            run_conv_case(tmp_path / name, name, spec)
        except AssertionError as e:
            raise AssertionError(f"{name}: {spec}") from e


@pytest.mark.parametrize("spec", CASES)
def test_conv_reference_training_graph(tmp_path, request, spec):
    """The host's training graph, run by onnx.reference with our numpy ConvGradInput and
    ConvGradWeight, gives torch's loss and gradients."""
    name = request.node.callspec.id
    x, params, target, loss, out, grads = case_data(name, spec)
    mh.generate_artifacts(conv_model(spec, params, out.shape), loss="MSELoss", optimizer="SGD",
                          artifact_directory=tmp_path)
    session = reference_evaluator(tmp_path / "training_model.onnx")
    feeds = {"input": x, "target": target, "lazy_reset_grad": np.array([True])}
    for param, value in params.items():
        feeds[param] = value
        feeds[f"{param}_grad.accumulation.buffer"] = np.zeros_like(value)
    results = dict(zip(session.output_names, session.run(None, feeds)))
    assert relative_error(results[session.output_names[0]], loss) <= GRAD_TOLERANCE
    for param, expected in grads.items():
        assert relative_error(results[f"{param}_grad.accumulation.out"], expected) \
            <= GRAD_TOLERANCE, param


@pytest.mark.parametrize("name,code", [("1d_k3", op.CONV_GRAD_WEIGHT),
                                       ("3d_k3", op.CONV_3D_GRAD_WEIGHT)])
def test_weight_gradient_is_computed_into_its_accumulation_buffer(tmp_path, name, code):
    spec = spec_named(name)
    x, params, target, loss, out, grads = case_data("fused", spec)
    mh.generate_artifacts(conv_model(spec, params, out.shape), loss="MSELoss", optimizer="SGD",
                          artifact_directory=tmp_path)
    blob = device_blob_parser.load(str(tmp_path / "model.mtb"), keep_steps=True)
    steps = blob.step_records["train"]
    (grad_weight,) = [tensors for step_code, tensors, _, _ in steps if step_code == code]
    dw, _, _, reset = grad_weight
    assert (blob.names[dw], blob.names[reset]) == ("w_grad.accumulation.buffer",
                                                   "lazy_reset_grad")
    accumulated = [blob.names[s[1][0]] for s in steps if s[0] == op.ACCUMULATE]
    assert sorted(accumulated) == ["b_grad.accumulation.buffer", "scale_grad.accumulation.buffer"]


def test_frozen_weight_still_passes_the_input_gradient(tmp_path):
    """W frozen: no weight gradient is computed, but the input gradient still flows."""
    spec = spec_named("2d_group2")
    x, params, target, loss, out, grads = case_data("frozen", spec)
    mh.generate_artifacts(conv_model(spec, params, out.shape), frozen_params=["w"],
                          loss="MSELoss", optimizer="SGD", artifact_directory=tmp_path)
    training_ops = [n.op_type for n in onnx.load(tmp_path / "training_model.onnx").graph.node]
    assert "ConvGradInput" in training_ops and "ConvGradWeight" not in training_ops
    state = CheckpointState.load_checkpoint(str(tmp_path / "checkpoint"))
    device = Module(str(tmp_path / "model.mtb"), state)
    assert relative_error(device(x.reshape(-1).tolist(), target.reshape(-1).tolist()), loss) \
        <= GRAD_TOLERANCE
    for param in ("scale", "b"):
        actual = np.array(state.parameters[param].grad.tolist())
        assert relative_error(actual, grads[param]) <= GRAD_TOLERANCE, param


# -- what is not supported fails at pack time, naming the node and the attribute ---------

def _single_conv(x_shape, w_shape, out_shape, **attrs):
    params = {"w": np.ones(w_shape, np.float32)}
    graph = helper.make_graph(
        [helper.make_node("Conv", ["input", "w"], ["output"], name="the_conv", **attrs)], "bad",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, list(x_shape))],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, list(out_shape))],
        initializer=[numpy_helper.from_array(v, k) for k, v in params.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


@pytest.mark.parametrize("x_shape,w_shape,out_shape,attrs,words", [
    ((1, 2, 3, 3, 3, 3), (3, 2, 2, 2, 2, 2), (1, 3, 2, 2, 2, 2), {},
     ["input shape [1, 2, 3, 3, 3, 3]", "3-D"]),
    ((1, 2, 8), (3, 2, 3), (1, 3, 6), {"kernel_shape": [5]}, ["kernel_shape=[5]", "[3]"]),
    ((1, 2, 8), (3, 2, 3), (1, 3, 6), {"auto_pad": "SAME"}, ["auto_pad='SAME'"]),
    ((1, 3, 8), (4, 1, 3), (1, 4, 6), {"group": 2}, ["group=2"]),
    ((1, 2, 8), (3, 2, 3), (1, 3, 8), {"auto_pad": "SAME_UPPER", "dilations": [2]},
     ["auto_pad=SAME_UPPER", "dilations=[2]"]),
], ids=["4d", "kernel_shape_disagrees_with_weight", "auto_pad_unknown", "group_does_not_divide",
        "same_with_dilation"])
def test_unsupported_conv_names_node_and_attribute(tmp_path, x_shape, w_shape, out_shape, attrs,
                                                     words):
    model = _single_conv(x_shape, w_shape, out_shape, **attrs)
    with pytest.raises(mh.UnsupportedOpError) as error:
        mh.generate_artifacts(model, loss="MSELoss", optimizer="SGD", artifact_directory=tmp_path)
    assert "the_conv" in str(error.value)
    for word in words:
        assert word in str(error.value)


# -- whole conv models, trained for several steps: CPython against torch, MicroPython
# against CPython -------------------------------------------------------------------------

STEPS = 12
BATCH = 4


def cnn_2d():
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Conv2d(2, 4, 3, stride=2, padding=1), torch.nn.ReLU(),       # 8x8 -> 4x4
        torch.nn.Conv2d(4, 8, 3, padding=1, groups=4), torch.nn.Tanh(),       # depthwise x2
        torch.nn.Flatten(), torch.nn.Linear(8 * 4 * 4, 5))


def cnn_1d():
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Conv1d(3, 6, 5, stride=2, padding=2, bias=False), torch.nn.ReLU(),  # 16 -> 8
        torch.nn.Conv1d(6, 6, 3, dilation=2, padding=2, groups=3), torch.nn.Tanh(),
        torch.nn.Flatten(), torch.nn.Linear(6 * 8, 4))


def cnn_3d():
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Conv3d(1, 3, 3, padding=1), torch.nn.ReLU(),                # 4x6x6
        torch.nn.MaxPool3d(2),                                                 # -> 2x3x3
        torch.nn.Conv3d(3, 4, (2, 3, 3), groups=1, padding=(0, 1, 1)), torch.nn.Tanh(),
        torch.nn.AvgPool3d((1, 3, 3)),                                         # -> 1x1x1
        torch.nn.Flatten(), torch.nn.Linear(4, 3))


# name: (model, input shape without batch, loss, outputs, optimizer, learning rate)
CONV_MODELS = {"cnn_2d": (cnn_2d, (2, 8, 8), "CrossEntropyLoss", 5, "SGD", 0.1),
               "cnn_1d": (cnn_1d, (3, 16), "MSELoss", 4, "AdamW", 0.01),
               "cnn_3d": (cnn_3d, (1, 4, 6, 6), "CrossEntropyLoss", 3, "SGD", 0.1)}


@pytest.fixture(scope="module")
def conv_runs(tmp_path_factory):
    """Each model trained by torch and by the device runtime under CPython."""
    runs = {}
    for name, (make, shape, loss, n_out, optimizer, lr) in CONV_MODELS.items():
        tmp = tmp_path_factory.mktemp(name)
        model = make()
        mh.generate_artifacts(export(model, torch.zeros((1,) + shape)), loss=loss,
                              optimizer=optimizer, artifact_directory=tmp, batch_size=BATCH)
        xs, ys = make_batches(loss, STEPS, BATCH, int(np.prod(shape)), n_out)
        xs = xs.reshape((STEPS, BATCH) + shape)
        write_batches(tmp / "data.bin", xs, ys)
        reference = torch_train(copy.deepcopy(model), loss, optimizer, xs, ys, lr)
        runs[name] = (tmp, lr, reference, run_device_cpython(tmp, tmp / "data.bin", STEPS, lr))
    return runs


@pytest.mark.parametrize("name", CONV_MODELS)
def test_conv_model_trains_like_torch(conv_runs, name):
    _, _, (torch_losses, torch_params), (losses, params, _) = conv_runs[name]
    assert relative_error(losses, torch_losses) <= GRAD_TOLERANCE
    assert np.max(np.abs(params - torch_params)) <= GRAD_TOLERANCE * max(
        1.0, np.max(np.abs(torch_params)))
    assert losses[-3:].mean() < losses[:3].mean()  # it learned something


@pytest.mark.parametrize("name", CONV_MODELS)
def test_conv_model_micropython_matches_cpython(conv_runs, micropython, name):
    tmp, lr, _, (losses, params, eval_loss) = conv_runs[name]
    out = run_micropython(micropython, ROOT / "tests" / "device_scripts" / "train_steps.py", tmp,
                          tmp / "data.bin", STEPS, repr(lr))
    mp_losses, mp_params, mp_eval = parse_run(out)
    assert relative_error(mp_losses, losses) <= 1e-5
    assert np.max(np.abs(mp_params - params)) <= 1e-5 * max(1.0, np.max(np.abs(params)))
    assert abs(mp_eval - eval_loss) <= 1e-5 * max(1.0, abs(eval_loss))
