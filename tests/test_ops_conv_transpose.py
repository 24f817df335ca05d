"""ConvTranspose (1-D and 2-D): ops/conv.py, kernels/conv.py (CONV_TRANSPOSE forward; its dX
is a Conv and its dW a ConvGradWeight with the roles of X and dY swapped).

Each case is a tiny model, [input * scale ->] ConvTranspose(W[, B]) -> output, MSELoss:
  * one device step (CPython) against torch autograd in float64: loss and the gradients of W,
    B and, when the input is scaled by a trainable tensor, of that scale (which checks every
    element of dX); a second step without lazy_reset_grad must double them;
  * the eval forward against onnxruntime running the original model, and against float64;
  * the host's training graph in the ONNX reference evaluator against torch (except where
    onnx.reference's own ConvTranspose fails: output_shape without auto_pad, group > 1).
torch has neither asymmetric pads nor auto_pad nor output_shape: the torch side transposes
without padding and crops the pads the ONNX spec gives (onnxruntime confirms them).
Inputs and parameters are multiples of 1/16, so the forward sums are exact in float32."""
import collections
import zlib

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

import microtrain_host as mh
from conftest import ROOT, run_micropython
from microtrain import parser as device_blob_parser
from microtrain_host import opcodes as op
from microtrain_host.reference import reference_evaluator
from test_ops import FORWARD_TOLERANCE, relative_error
from test_ops_conv import check_two_steps_and_eval, sixteenths
from torch_reference import export, parse_run, run_device_cpython, torch_train, write_batches

TOLERANCE = 1e-5   # issue 9's acceptance: gradients vs float64 torch, forward vs onnxruntime

# input_grad: a trainable op before the ConvTranspose, so that its input needs a gradient.
Spec = collections.namedtuple("Spec", "spatial channels out_channels kernel bias input_grad "
                                      "batch attrs")


def case(name, spatial, channels, out_channels, kernel, bias=True, input_grad=True, batch=2,
         **attrs):
    return pytest.param(Spec(tuple(spatial), channels, out_channels, tuple(kernel), bias,
                             input_grad, batch, attrs), id=name)


CASES = [
    # 1-D (N, C, L)
    case("1d_k3", [5], 3, 4, [3]),
    case("1d_k3_kernel_shape_attr", [5], 3, 4, [3], kernel_shape=[3]),
    case("1d_stride2_pads", [5], 3, 2, [3], strides=[2], pads=[1, 1]),
    case("1d_stride2_output_padding", [5], 2, 3, [3], strides=[2], pads=[1, 1],
         output_padding=[1]),
    case("1d_stride3_output_padding2_asymmetric_pads", [4], 2, 3, [4], strides=[3],
         pads=[2, 0], output_padding=[2]),
    case("1d_stride2_pads_exceed_output_padding", [6], 2, 2, [5], strides=[2], pads=[0, 3],
         output_padding=[1]),
    case("1d_k4_stride2_no_bias", [7], 2, 3, [4], bias=False, strides=[2], pads=[1, 1]),
    case("1d_dilation2", [6], 2, 3, [3], dilations=[2], pads=[1, 2]),
    case("1d_dilation3_stride2_output_padding", [5], 2, 2, [3], dilations=[3], strides=[2],
         output_padding=[1]),
    case("1d_group2", [5], 4, 6, [3], group=2, strides=[2]),
    case("1d_depthwise", [6], 3, 3, [4], group=3, strides=[2], pads=[1, 1]),
    case("1d_depthwise_multiplier2", [5], 3, 6, [3], group=3, strides=[2], output_padding=[1]),
    case("1d_valid", [5], 2, 3, [3], strides=[2], auto_pad="VALID"),
    case("1d_same_upper", [5], 2, 3, [4], strides=[3], auto_pad="SAME_UPPER"),
    case("1d_same_lower", [5], 2, 3, [4], strides=[3], auto_pad="SAME_LOWER"),
    case("1d_same_upper_dilation2", [5], 2, 2, [3], strides=[2], dilations=[2],
         auto_pad="SAME_UPPER"),
    case("1d_output_shape", [5], 2, 3, [4], strides=[2], output_shape=[9]),
    case("1d_output_shape_same_upper", [5], 2, 3, [4], strides=[2], output_shape=[11],
         auto_pad="SAME_UPPER"),
    case("1d_output_shape_output_padding", [5], 2, 3, [4], strides=[2], output_shape=[11],
         output_padding=[1]),
    case("1d_first_layer", [7], 3, 2, [3], input_grad=False, batch=3, strides=[2]),
    # 2-D (N, C, H, W)
    case("2d_k3", [4, 5], 2, 3, [3, 3]),
    case("2d_k4_stride2_pad1", [3, 4], 3, 2, [4, 4], strides=[2, 2], pads=[1, 1, 1, 1]),
    case("2d_k3_stride2_pad1_output_padding1", [4, 3], 2, 3, [3, 3], strides=[2, 2],
         pads=[1, 1, 1, 1], output_padding=[1, 1]),
    case("2d_k2_stride2_no_bias", [3, 5], 3, 2, [2, 2], bias=False, strides=[2, 2]),
    case("2d_k3x2_kernel_shape_attr", [4, 5], 2, 3, [3, 2], kernel_shape=[3, 2]),
    case("2d_strides_3x1_asymmetric_pads", [3, 5], 2, 2, [3, 2], strides=[3, 1],
         pads=[0, 1, 2, 0], output_padding=[2, 0]),
    case("2d_dilation_2x1", [4, 4], 2, 2, [3, 3], dilations=[2, 1], strides=[1, 2],
         pads=[1, 0, 2, 1], output_padding=[0, 1]),
    case("2d_group2", [3, 4], 4, 6, [3, 3], group=2, strides=[2, 2], pads=[1, 1, 1, 1]),
    case("2d_depthwise", [4, 3], 3, 3, [3, 3], group=3, strides=[2, 2], pads=[1, 1, 1, 1],
         output_padding=[1, 1]),
    case("2d_depthwise_multiplier2_no_bias", [3, 3], 2, 4, [2, 3], bias=False, group=2,
         strides=[2, 1]),
    case("2d_valid", [3, 4], 2, 3, [3, 3], strides=[2, 2], auto_pad="VALID"),
    case("2d_same_upper", [3, 4], 2, 3, [3, 2], strides=[2, 3], auto_pad="SAME_UPPER"),
    case("2d_same_lower", [3, 4], 2, 3, [3, 2], strides=[2, 3], auto_pad="SAME_LOWER"),
    case("2d_output_shape", [3, 4], 2, 2, [3, 3], strides=[2, 2], output_shape=[6, 8]),
    case("2d_pointwise", [4, 5], 4, 3, [1, 1]),
    case("2d_first_layer_stride2", [3, 4], 2, 3, [4, 4], input_grad=False, batch=3,
         strides=[2, 2], pads=[1, 1, 1, 1]),
]


def spec_pads(spec):
    """(begins, ends, output spatial shape) as the ONNX spec and onnxruntime define them."""
    spatial, kernel, attrs = spec.spatial, spec.kernel, spec.attrs
    rank = len(spatial)
    strides = attrs.get("strides", [1] * rank)
    dilations = attrs.get("dilations", [1] * rank)
    output_padding = attrs.get("output_padding", [0] * rank)
    natural = [s * (n - 1) + p + (k - 1) * d + 1 for n, s, p, k, d in
               zip(spatial, strides, output_padding, kernel, dilations)]
    auto_pad = attrs.get("auto_pad", "NOTSET")
    if "output_shape" in attrs or auto_pad.startswith("SAME"):
        wanted = attrs.get("output_shape", [n * s for n, s in zip(spatial, strides)])
        totals = [n - w for n, w in zip(natural, wanted)]
        if "output_shape" not in attrs:   # SAME, stride beyond the kernel: onnxruntime pads 0
            totals = [max(0, t) for t in totals]
        begins = [t // 2 if auto_pad == "SAME_UPPER" else t - t // 2 for t in totals]
        ends = [t - b for t, b in zip(totals, begins)]
    elif auto_pad == "VALID":
        begins = ends = [0] * rank
    else:
        pads = attrs.get("pads", [0] * (2 * rank))
        begins, ends = pads[:rank], pads[rank:]
    return begins, ends, [n - b - e for n, b, e in zip(natural, begins, ends)]


def torch_conv_transpose(h, w, b, spec):
    """ConvTranspose with the spec's pads: transposed without padding, then cropped."""
    rank = len(spec.spatial)
    attrs = spec.attrs
    begins, ends, out = spec_pads(spec)
    transpose = torch.nn.functional.conv_transpose1d if rank == 1 else \
        torch.nn.functional.conv_transpose2d
    full = transpose(h, w, b, stride=attrs.get("strides", 1),
                     output_padding=attrs.get("output_padding", 0),
                     groups=attrs.get("group", 1), dilation=attrs.get("dilations", 1))
    crop = tuple(slice(bg, bg + o) for bg, o in zip(begins, out))
    return full[(slice(None), slice(None)) + crop]


def case_data(name, spec):
    """Input, parameters, target and torch's float64 loss, output and gradients."""
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    group = spec.attrs.get("group", 1)
    x_shape = (spec.batch, spec.channels) + spec.spatial
    shapes = {"w": (spec.channels, spec.out_channels // group) + spec.kernel}
    if spec.bias:
        shapes["b"] = (spec.out_channels,)
    if spec.input_grad:
        shapes["scale"] = x_shape
    x = sixteenths(rng, x_shape)
    params = {k: sixteenths(rng, s) for k, s in shapes.items()}
    p = {k: torch.tensor(v, dtype=torch.float64, requires_grad=True) for k, v in params.items()}
    h = torch.tensor(x, dtype=torch.float64)
    if spec.input_grad:
        h = h * p["scale"]
    out = torch_conv_transpose(h, p["w"], p.get("b"), spec)
    target = rng.standard_normal(tuple(out.shape)).astype(np.float32)
    loss = torch.nn.functional.mse_loss(out, torch.tensor(target, dtype=torch.float64))
    loss.backward()
    return x, params, target, loss.item(), out.detach().numpy(), \
        {k: v.grad.numpy() for k, v in p.items()}


def transpose_model(spec, params, out_shape):
    nodes = []
    first = "input"
    if spec.input_grad:
        nodes.append(helper.make_node("Mul", ["input", "scale"], ["h"], name="scale_input"))
        first = "h"
    nodes.append(helper.make_node("ConvTranspose", [first, "w"] + (["b"] if spec.bias else []),
                                  ["output"], name="deconv", **spec.attrs))
    graph = helper.make_graph(
        nodes, "conv_transpose_test",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT,
                                       [spec.batch, spec.channels, *spec.spatial])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, list(out_shape))],
        initializer=[numpy_helper.from_array(v, k) for k, v in params.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    onnx.checker.check_model(model)
    return model


def run_case(tmp_path, name, spec):
    """Pack the case, two device steps and eval: against torch and onnxruntime."""
    x, params, target, loss, out, grads = case_data(name, spec)
    model = transpose_model(spec, params, out.shape)
    mh.generate_artifacts(model, loss="MSELoss", optimizer="SGD", artifact_directory=tmp_path)
    training_ops = [n.op_type for n in onnx.load(tmp_path / "training_model.onnx").graph.node]
    assert ("Conv" in training_ops) == spec.input_grad  # dX only when needed

    device_out = check_two_steps_and_eval(tmp_path, model, x, target, loss, out, grads,
                                          TOLERANCE)
    assert relative_error(device_out, out) <= FORWARD_TOLERANCE


@pytest.mark.parametrize("spec", CASES)
def test_conv_transpose_gradient(tmp_path, request, spec):
    run_case(tmp_path, request.node.callspec.id, spec)


def random_transpose_specs(count, seed):
    """count random valid geometries: 1-D or 2-D, batch 1-3, group 1-3 with 1-2 channels per
    group in and out (grouped, depthwise, depthwise with a multiplier), kernel 1-4, stride
    1-3, output_padding below the stride, dilations 1-3 with explicit pads 0-3 (asymmetric),
    or auto_pad, or output_shape; input sizes 1-6, odd and even."""
    rng = np.random.default_rng(seed)

    def draw(low, high, n):
        return [int(v) for v in rng.integers(low, high + 1, n)]

    specs = []
    while len(specs) < count:
        rank = int(rng.integers(1, 3))
        group = int(rng.integers(1, 4))
        channels, out_channels = group * int(rng.integers(1, 3)), group * int(rng.integers(1, 3))
        kernel = draw(1, 4, rank)
        strides = draw(1, 3, rank)
        attrs = {"strides": strides}
        if group > 1 or rng.random() < 0.3:
            attrs["group"] = group
        form = str(rng.choice(["pads"] * 4 + ["SAME_UPPER", "SAME_LOWER", "VALID",
                                              "output_shape"]))
        if rng.random() < 0.5 and not form.startswith("SAME"):  # refused with SAME
            attrs["output_padding"] = [int(rng.integers(0, s)) for s in strides]
        spatial = draw(1, 6, rank)
        if form == "pads":
            attrs["dilations"] = draw(1, 3, rank)
            attrs["pads"] = draw(0, 3, 2 * rank)
        elif form == "output_shape":
            attrs["dilations"] = draw(1, 2, rank)
        else:
            attrs["auto_pad"] = form
        spec = Spec(tuple(spatial), channels, out_channels, tuple(kernel),
                    bool(rng.random() < 0.7), bool(rng.random() < 0.8), int(rng.integers(1, 4)),
                    attrs)
        _, _, natural = spec_pads(spec._replace(attrs={k: v for k, v in attrs.items()
                                                       if k not in ("pads", "auto_pad")}))
        if form == "output_shape":
            attrs["output_shape"] = [max(1, n - int(rng.integers(0, 3))) for n in natural]
        _, _, out = spec_pads(spec)
        if min(out) < 1:
            continue   # the padding eats the output
        work = spec.batch * channels * out_channels // group * np.prod(kernel) * np.prod(spatial)
        if work <= 3000:
            specs.append(spec)
    return specs


def test_conv_transpose_gradient_on_random_geometries(tmp_path):
    specs = random_transpose_specs(25, seed=9)
    seen = {(len(s.spatial), s.attrs.get("group", 1) > 1, "output_padding" in s.attrs,
             s.attrs.get("auto_pad", "output_shape" if "output_shape" in s.attrs else "pads"))
            for s in specs}
    assert len(seen) >= 10, seen   # the draw covers the combinations, not one corner
    for i, spec in enumerate(specs):
        name = f"random{i}"
        try:
            run_case(tmp_path / name, name, spec)
        except AssertionError as e:
            raise AssertionError(f"{name}: {spec}") from e


def onnx_reference_runs(spec):
    """onnx.reference's ConvTranspose (onnx 1.23) refuses output_shape without auto_pad; for
    group > 1 it splits W along its output-channel axis instead of its first (input-channel)
    one; with SAME and a stride beyond the kernel its output is in * stride where onnx's
    shape inference and onnxruntime pad nothing. onnxruntime and torch agree with each other
    on those cases (test above)."""
    attrs = spec.attrs
    same = attrs.get("auto_pad", "").startswith("SAME")
    strides = attrs.get("strides", [1] * len(spec.spatial))
    return (attrs.get("group", 1) == 1 and ("output_shape" not in attrs or same)
            and not (same and spec_pads(spec)[2] != [n * s for n, s in
                                                    zip(spec.spatial, strides)]))


REFERENCE_CASES = [c for c in CASES if onnx_reference_runs(c.values[0])]


@pytest.mark.parametrize("spec", REFERENCE_CASES)
def test_conv_transpose_reference_training_graph(tmp_path, request, spec):
    """The host's training graph (ConvTranspose, its Conv and ConvGradWeight gradients) run by
    onnx.reference gives torch's loss and gradients."""
    x, params, target, loss, out, grads = case_data(request.node.callspec.id, spec)
    mh.generate_artifacts(transpose_model(spec, params, out.shape), loss="MSELoss",
                          optimizer="SGD", artifact_directory=tmp_path)
    session = reference_evaluator(tmp_path / "training_model.onnx")
    feeds = {"input": x, "target": target, "lazy_reset_grad": np.array([True])}
    for param, value in params.items():
        feeds[param] = value
        feeds[f"{param}_grad.accumulation.buffer"] = np.zeros_like(value)
    results = dict(zip(session.output_names, session.run(None, feeds)))
    assert relative_error(results[session.output_names[0]], loss) <= TOLERANCE
    for param, expected in grads.items():
        assert relative_error(results[f"{param}_grad.accumulation.out"], expected) \
            <= TOLERANCE, param


def test_weight_gradient_goes_straight_into_its_accumulation_buffer(tmp_path):
    (spec,) = [c.values[0] for c in CASES if c.id == "2d_k4_stride2_pad1"]
    x, params, target, loss, out, grads = case_data("fused", spec)
    mh.generate_artifacts(transpose_model(spec, params, out.shape), loss="MSELoss",
                          optimizer="SGD", artifact_directory=tmp_path)
    blob = device_blob_parser.load(str(tmp_path / "model.mtb"), keep_steps=True)
    steps = blob.step_records["train"]
    codes = [code for code, _, _, _ in steps]
    assert codes.count(op.CONV_TRANSPOSE) == 1 and codes.count(op.CONV) == 1
    (grad_weight,) = [tensors for code, tensors, _, _ in steps if code == op.CONV_GRAD_WEIGHT]
    dw, _, _, reset = grad_weight
    assert (blob.names[dw], blob.names[reset]) == ("w_grad.accumulation.buffer",
                                                   "lazy_reset_grad")


# -- what is not supported fails at pack time, naming the node and the attribute ---------

def _single(x_shape, w_shape, out_shape, **attrs):
    graph = helper.make_graph(
        [helper.make_node("ConvTranspose", ["input", "w"], ["output"], name="the_deconv",
                          **attrs)], "bad",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, list(x_shape))],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, list(out_shape))],
        initializer=[numpy_helper.from_array(np.ones(w_shape, np.float32), "w")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


REFUSALS = [
    ("3d", (1, 2, 3, 3, 3), (2, 3, 2, 2, 2), (1, 3, 4, 4, 4), {},
     "ConvTranspose node 'the_deconv': only 1-D (N, C, L) and 2-D (N, C, H, W) transposed "
     "convolution is supported, got input shape [1, 2, 3, 3, 3]"),
    ("output_padding_not_below_stride", (1, 2, 5), (2, 3, 3), (1, 3, 9), 
     {"strides": [1], "dilations": [3], "output_padding": [2]},
     "ConvTranspose node 'the_deconv': attribute output_padding=[2] must hold 1 values, each "
     "at least 0 and below its stride (strides=[1])"),
    ("output_shape_too_large", (1, 2, 5), (2, 3, 4), (1, 3, 15),
     {"strides": [2], "output_shape": [15]},
     "ConvTranspose node 'the_deconv': attribute output_shape asks for output size [15], "
     "larger than the [12] the input, kernel, strides and output_padding give (onnxruntime "
     "refuses it too)"),
    ("same_with_output_padding", (1, 2, 5), (2, 3, 4), (1, 3, 17),
     {"strides": [3], "auto_pad": "SAME_UPPER", "output_padding": [2]},
     "ConvTranspose node 'the_deconv': attribute auto_pad=SAME_UPPER with output_padding=[2] "
     "is not supported (onnx's shape inference adds the output_padding to in * stride, "
     "onnxruntime does not)"),
    ("kernel_shape_disagrees", (1, 2, 5), (2, 3, 4), (1, 3, 8), {"kernel_shape": [3]},
     "ConvTranspose node 'the_deconv': attribute kernel_shape=[3] does not match the weight's "
     "spatial shape [4]"),
    ("weight_disagrees_with_channels", (1, 4, 5), (2, 1, 3), (1, 2, 7), {"group": 2},
     "ConvTranspose node 'the_deconv': the weight has shape [2, 1, 3] and attribute group=2; "
     "for input [1, 4, 5] the weight must be (C, M / group, *kernel_shape) with group "
     "dividing C"),
    ("auto_pad_unknown", (1, 2, 5), (2, 3, 3), (1, 3, 7), {"auto_pad": "SAME"},
     "ConvTranspose node 'the_deconv': attribute auto_pad='SAME' is not valid"),
]


@pytest.mark.parametrize("x_shape,w_shape,out_shape,attrs,message",
                         [r[1:] for r in REFUSALS], ids=[r[0] for r in REFUSALS])
def test_refused_at_pack_time_naming_node_and_attribute(tmp_path, x_shape, w_shape, out_shape,
                                                        attrs, message):
    with pytest.raises(mh.UnsupportedOpError) as error:
        mh.generate_artifacts(_single(x_shape, w_shape, out_shape, **attrs), loss="MSELoss",
                              optimizer="SGD", artifact_directory=tmp_path)
    assert str(error.value) == message


# -- torch's ConvTranspose modules, exported; MicroPython against CPython -----------------

class Decoder(torch.nn.Module):
    """The decoder half of a conv autoencoder: 1-D and 2-D transposed convolutions with
    stride, padding, output_padding, groups and dilation, as torch exports them."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(3)
        self.up1 = torch.nn.ConvTranspose2d(4, 4, 3, stride=2, padding=1, output_padding=1,
                                            groups=2)
        self.up2 = torch.nn.ConvTranspose2d(4, 2, 4, stride=2, padding=1, bias=False)
        self.line = torch.nn.ConvTranspose1d(2, 3, 3, stride=2, dilation=2, output_padding=1)

    def forward(self, x):
        h = self.up2(torch.tanh(self.up1(x)))               # 3x3 -> 6x6 -> 12x12
        return self.line(h.reshape(h.shape[0], 2, -1))     # 144 -> 292


def test_exported_modules_train_like_torch_and_micropython_like_cpython(tmp_path, micropython):
    steps, batch, lr = 6, 2, 0.05
    module = Decoder()
    mh.generate_artifacts(export(module, torch.zeros(batch, 4, 3, 3)), loss="MSELoss",
                          optimizer="SGD", artifact_directory=tmp_path, batch_size=batch)
    rng = np.random.default_rng(4)
    xs = rng.standard_normal((steps, batch, 4, 3, 3)).astype(np.float32)
    ys = rng.standard_normal((steps, batch, 3, 292)).astype(np.float32)
    write_batches(tmp_path / "data.bin", xs, ys)
    torch_losses, torch_params = torch_train(module, "MSELoss", "SGD", xs, ys, lr)
    losses, params, eval_loss = run_device_cpython(tmp_path, tmp_path / "data.bin", steps, lr)
    assert relative_error(losses, torch_losses) <= TOLERANCE
    assert np.max(np.abs(params - torch_params)) <= TOLERANCE
    out = run_micropython(micropython, ROOT / "tests" / "device_scripts" / "train_steps.py",
                          tmp_path, tmp_path / "data.bin", steps, repr(lr))
    mp_losses, mp_params, mp_eval = parse_run(out)
    assert relative_error(mp_losses, losses) <= 1e-5
    assert np.max(np.abs(mp_params - params)) <= 1e-5
    assert abs(mp_eval - eval_loss) <= 1e-5 * max(1.0, abs(eval_loss))
