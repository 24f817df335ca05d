"""Resize / Upsample (ops/resize.py, kernels/resize.py): nearest and linear, 1-D and 2-D.

Each case is a tiny model, Resize(input * w) -> output with w trainable (so dw = input * dX
checks every element of the input gradient), MSELoss, packed and stepped once on the device:
  * gradients against two oracles: the adjoint of onnxruntime's own forward (its Jacobian
    taken column by column on unit inputs, then dX = J^T dY in float64) for every case, and
    torch autograd in float64 where torch has the mode (F.interpolate's nearest, nearest-exact,
    linear / bilinear with and without align_corners), all within 1e-5;
  * the eval forward against onnxruntime and (where it has the mode) float64 torch;
  * the host's training graph in onnx.reference (our numpy ResizeGrad) against the same.
Then torch's own exports (nn.Upsample, F.interpolate at opsets 9-17, 9 and 10 through the
upgrader), what is refused at pack time, and MicroPython against CPython."""
import zlib

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
import torch.nn.functional as F
from onnx import TensorProto, helper, numpy_helper

import microtrain_host as mh
from microtrain import CheckpointState, Module
from microtrain_host.reference import reference_evaluator
from test_ops import check_exported_module, check_micropython_training, relative_error
from torch_reference import export

TOLERANCE = 1e-5


def case(name, x_shape, scales=None, sizes=None, torch_fn=None, opset=17, **attrs):
    """A Resize case: scales or sizes (for every axis, or for opset 18's axes), the node's
    attributes, and torch_fn(h) giving the same result in torch when torch has the mode."""
    return pytest.param((tuple(x_shape), scales, sizes, torch_fn, opset, attrs), id=name)


def interp(**kwargs):
    return lambda h: F.interpolate(h, **kwargs)


def over_last_axis(**kwargs):
    """torch's interpolate of a 2-D (N, L) tensor along L."""
    return lambda h: F.interpolate(h[None], **kwargs)[0]


NEAREST = {"mode": "nearest", "coordinate_transformation_mode": "asymmetric",
           "nearest_mode": "floor"}                     # torch's nearest (nn.Upsample's export)
LINEAR = {"mode": "linear", "coordinate_transformation_mode": "half_pixel"}  # torch's export
CORNERS = {"mode": "linear", "coordinate_transformation_mode": "align_corners"}

CASES = [
    # 1-D (N, C, L)
    case("1d_nearest_x2", (2, 3, 5), [1, 1, 2], torch_fn=interp(scale_factor=2), **NEAREST),
    case("1d_nearest_x3", (2, 2, 4), [1, 1, 3], torch_fn=interp(scale_factor=3), **NEAREST),
    case("1d_nearest_sizes_5_to_7", (2, 3, 5), sizes=[2, 3, 7], torch_fn=interp(size=7),
         **NEAREST),
    case("1d_nearest_down_x0.5", (2, 2, 9), [1, 1, 0.5], torch_fn=interp(scale_factor=0.5),
         **NEAREST),
    case("1d_nearest_exact", (2, 2, 5), [1, 1, 2],
         torch_fn=interp(scale_factor=2, mode="nearest-exact"), mode="nearest",
         coordinate_transformation_mode="half_pixel", nearest_mode="round_prefer_ceil"),
    case("1d_nearest_half_pixel_round_prefer_floor", (2, 2, 4), sizes=[2, 2, 7],
         mode="nearest", coordinate_transformation_mode="half_pixel"),
    case("1d_nearest_tf_half_pixel_ceil", (2, 2, 5), [1, 1, 1.5], mode="nearest",
         coordinate_transformation_mode="tf_half_pixel_for_nn", nearest_mode="ceil"),
    case("1d_nearest_align_corners_round_prefer_floor", (2, 2, 4), sizes=[2, 2, 7],
         mode="nearest", coordinate_transformation_mode="align_corners"),
    case("1d_linear_x2", (2, 3, 5), [1, 1, 2],
         torch_fn=interp(scale_factor=2, mode="linear"), **LINEAR),
    case("1d_linear_x1.5_pytorch_half_pixel", (2, 2, 6), [1, 1, 1.5],
         torch_fn=interp(scale_factor=1.5, mode="linear"), mode="linear",
         coordinate_transformation_mode="pytorch_half_pixel"),
    case("1d_linear_align_corners_sizes_5_to_9", (2, 2, 5), sizes=[2, 2, 9],
         torch_fn=interp(size=9, mode="linear", align_corners=True), **CORNERS),
    case("1d_linear_down_sizes_9_to_4", (2, 2, 9), sizes=[2, 2, 4],
         torch_fn=interp(size=4, mode="linear"), **LINEAR),
    case("1d_linear_asymmetric_x2.5", (2, 2, 4), [1, 1, 2.5], mode="linear",
         coordinate_transformation_mode="asymmetric"),
    case("1d_linear_half_pixel_symmetric_opset19", (2, 2, 5), [1, 1, 1.7], opset=19,
         mode="linear", coordinate_transformation_mode="half_pixel_symmetric"),
    case("1d_nearest_axes_opset18", (2, 3, 5), [2.0], torch_fn=interp(scale_factor=2),
         opset=18, axes=[2], **NEAREST),
    case("1d_linear_pytorch_half_pixel_to_length_1", (2, 2, 5), sizes=[2, 2, 1],
         mode="linear", coordinate_transformation_mode="pytorch_half_pixel"),
    # 2-D (N, C, H, W)
    case("2d_nearest_x2", (2, 2, 3, 4), [1, 1, 2, 2], torch_fn=interp(scale_factor=2),
         **NEAREST),
    case("2d_nearest_x2x3", (1, 3, 3, 3), [1, 1, 2, 3], torch_fn=interp(scale_factor=(2, 3)),
         **NEAREST),
    case("2d_nearest_sizes", (2, 2, 3, 4), sizes=[2, 2, 7, 5], torch_fn=interp(size=(7, 5)),
         **NEAREST),
    case("2d_nearest_exact_x1.5", (1, 2, 4, 3), [1, 1, 1.5, 2],
         torch_fn=interp(scale_factor=(1.5, 2), mode="nearest-exact"), mode="nearest",
         coordinate_transformation_mode="half_pixel", nearest_mode="round_prefer_ceil"),
    case("2d_nearest_round_prefer_floor_x1.5x2.5", (1, 2, 4, 3), [1, 1, 1.5, 2.5],
         mode="nearest", coordinate_transformation_mode="half_pixel"),
    case("2d_bilinear_x2", (2, 2, 3, 4), [1, 1, 2, 2],
         torch_fn=interp(scale_factor=2, mode="bilinear"), **LINEAR),
    case("2d_bilinear_align_corners_sizes", (2, 2, 3, 4), sizes=[2, 2, 5, 7],
         torch_fn=interp(size=(5, 7), mode="bilinear", align_corners=True), **CORNERS),
    case("2d_bilinear_down_x0.5", (1, 2, 7, 9), [1, 1, 0.5, 0.5],
         torch_fn=interp(scale_factor=0.5, mode="bilinear"), **LINEAR),
    case("2d_bilinear_x2x1_rows_only", (2, 2, 3, 4), [1, 1, 2, 1],
         torch_fn=interp(scale_factor=(2, 1), mode="bilinear"), **LINEAR),
    case("2d_bilinear_pytorch_half_pixel_to_height_1", (1, 2, 4, 3), sizes=[1, 2, 1, 6],
         mode="linear", coordinate_transformation_mode="pytorch_half_pixel"),
    case("2d_linear_asymmetric_x1.5", (1, 2, 3, 4), [1, 1, 1.5, 1.5], mode="linear",
         coordinate_transformation_mode="asymmetric"),
    case("4d_last_axis_only", (2, 2, 3, 4), [1, 1, 1, 2],
         torch_fn=interp(scale_factor=(1, 2), mode="bilinear"), **LINEAR),
    case("rank2_linear_last_axis", (3, 5), sizes=[3, 8],
         torch_fn=over_last_axis(size=8, mode="linear"), **LINEAR),
]


def resize_model(x_shape, scales, sizes, opset, attrs, out_shape, w=None):
    """[input * w ->] Resize(scales or sizes as Constant nodes, as torch exports them)."""
    nodes, initializers = [], []
    source = "input"
    if w is not None:
        nodes.append(helper.make_node("Mul", ["input", "w"], ["h"], name="scale_input"))
        initializers.append(numpy_helper.from_array(w, "w"))
        source = "h"
    inputs = [source, ""]
    if scales is not None:
        nodes.append(helper.make_node("Constant", [], ["scales"], value=numpy_helper.from_array(
            np.array(scales, np.float32), "scales")))
        inputs.append("scales")
    else:
        nodes.append(helper.make_node("Constant", [], ["sizes"], value=numpy_helper.from_array(
            np.array(sizes, np.int64), "sizes")))
        inputs += ["", "sizes"]
    nodes.append(helper.make_node("Resize", inputs, ["output"], name="resize", **attrs))
    graph = helper.make_graph(
        nodes, "resize_test",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, list(x_shape))],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, list(out_shape))],
        initializer=initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)],
                              ir_version=8 if opset <= 17 else 9)
    onnx.checker.check_model(model)
    return model


def ort_run(model, x):
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {"input": x})[0]


def ort_jacobian(x_shape, scales, sizes, opset, attrs):
    """onnxruntime's Resize as a matrix: column i is its output for the i-th unit input."""
    size = int(np.prod(x_shape))
    probe = np.zeros(x_shape, np.float32)
    out_shape = ort_run(resize_model(x_shape, scales, sizes, opset, attrs, [0] * len(x_shape)),
                        probe).shape
    model = resize_model(x_shape, scales, sizes, opset, attrs, out_shape)
    columns = []
    for i in range(size):
        probe.reshape(-1)[:] = 0
        probe.reshape(-1)[i] = 1
        columns.append(ort_run(model, probe).reshape(-1).astype(np.float64))
    return np.stack(columns, axis=1), out_shape


def case_data(name, spec):
    """Input, w, target; the oracles' loss, output and dw: from onnxruntime's Jacobian, and
    from torch autograd in float64 when the case has a torch_fn."""
    x_shape, scales, sizes, torch_fn, opset, attrs = spec
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    x = rng.uniform(-1, 1, x_shape).astype(np.float32)
    w = rng.uniform(-1, 1, x_shape).astype(np.float32)
    jacobian, out_shape = ort_jacobian(x_shape, scales, sizes, opset, attrs)
    target = rng.standard_normal(out_shape).astype(np.float32)
    h = (x.astype(np.float64) * w).reshape(-1)
    out = jacobian @ h
    residual = 2 * (out - target.reshape(-1)) / out.size
    ort_oracle = (float(np.mean((out - target.reshape(-1)) ** 2)), out.reshape(out_shape),
                  (jacobian.T @ residual).reshape(x_shape) * x)
    torch_oracle = None
    if torch_fn is not None:
        tw = torch.tensor(w, dtype=torch.float64, requires_grad=True)
        t_out = torch_fn(torch.tensor(x, dtype=torch.float64) * tw)
        loss = F.mse_loss(t_out, torch.tensor(target, dtype=torch.float64))
        loss.backward()
        torch_oracle = (loss.item(), t_out.detach().numpy(), tw.grad.numpy())
    return x, w, target, out_shape, ort_oracle, torch_oracle


def assert_close_to_scale(actual, expected):
    """Forward outputs: error against the output's scale (an interpolated value near 0 is a
    cancellation of O(1) terms, with ~1e-7 absolute rounding in any float32 implementation)."""
    expected = np.asarray(expected, np.float64).reshape(-1)
    scale = max(1.0, float(np.max(np.abs(expected))))
    error = float(np.max(np.abs(np.asarray(actual, np.float64).reshape(-1) - expected)))
    assert error <= TOLERANCE * scale, (error, scale)


@pytest.mark.parametrize("spec", CASES)
def test_resize_gradient(tmp_path, request, spec):
    run_case(tmp_path, request.node.callspec.id, spec)


def random_resize_specs(count, seed):
    """count random cases: rank 2, 3 or 4 (the last one or two axes resized), odd and even
    sizes 1-7, nearest or linear, any supported coordinate mode and nearest_mode, scales
    (0.5-3, upsampling and downsampling) or sizes; checked against onnxruntime's adjoint."""
    rng = np.random.default_rng(seed)
    modes = ["half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric",
             "tf_half_pixel_for_nn", "half_pixel_symmetric"]
    specs = []
    while len(specs) < count:
        rank = int(rng.integers(2, 5))
        x_shape = tuple(int(v) for v in rng.integers(1, 8, rank))
        resized = [rank - 1] if rank == 2 or rng.random() < 0.4 else [rank - 2, rank - 1]
        attrs = {"mode": str(rng.choice(["nearest", "linear"])),
                 "coordinate_transformation_mode": str(rng.choice(modes))}
        if attrs["mode"] == "nearest":
            attrs["nearest_mode"] = str(rng.choice(["round_prefer_floor", "round_prefer_ceil",
                                                    "floor", "ceil"]))
        opset = 19 if attrs["coordinate_transformation_mode"] == "half_pixel_symmetric" else 17
        scales = sizes = None
        if rng.random() < 0.5:
            scales = [1.0] * rank
            for a in resized:
                scales[a] = float(rng.choice([0.5, 0.6, 0.75, 1.5, 1.7, 2.0, 2.5, 3.0]))
            if min(int(np.floor(np.float32(n) * np.float32(f)))
                   for n, f in zip(x_shape, scales)) < 1:
                continue
        else:
            sizes = list(x_shape)
            for a in resized:
                sizes[a] = int(rng.integers(1, 10))
        specs.append((x_shape, scales, sizes, None, opset, attrs))
    return specs


def test_resize_gradient_on_random_geometries(tmp_path):
    specs = random_resize_specs(30, seed=11)
    seen = {(len(s[0]), s[5]["mode"], s[5]["coordinate_transformation_mode"]) for s in specs}
    assert len(seen) >= 15, seen   # the draw covers the combinations, not one corner
    for i, spec in enumerate(specs):
        try:
            run_case(tmp_path / f"random{i}", f"random{i}", spec)
        except AssertionError as e:
            raise AssertionError(f"random{i}: {spec}") from e


def run_case(tmp_path, name, spec):
    """One case: a device step against the oracles, the eval forward against onnxruntime
    (and torch), the training graph in onnx.reference."""
    x_shape, scales, sizes, torch_fn, opset, attrs = spec
    x, w, target, out_shape, ort_oracle, torch_oracle = case_data(name, spec)
    model = resize_model(x_shape, scales, sizes, opset, attrs, out_shape, w)
    mh.generate_artifacts(model, loss="MSELoss", optimizer="SGD", artifact_directory=tmp_path)
    state = CheckpointState.load_checkpoint(str(tmp_path / "checkpoint"))
    device = Module(str(tmp_path / "model.mtb"), state)
    x_flat, target_flat = x.reshape(-1).tolist(), target.reshape(-1).tolist()
    loss = device(x_flat, target_flat)
    dw = np.array(state.parameters["w"].grad.tolist())
    for oracle in (ort_oracle, torch_oracle):
        if oracle is not None:
            assert relative_error(loss, oracle[0]) <= TOLERANCE, (loss, oracle[0])
            assert relative_error(dw, oracle[2]) <= TOLERANCE

    device.eval()
    device_out = device(x_flat, target_flat)[1].tolist()
    h = x * w
    assert_close_to_scale(device_out, ort_run(resize_model(x_shape, scales, sizes, opset, attrs,
                                                           out_shape), h))
    if torch_oracle is not None:
        assert_close_to_scale(device_out, torch_oracle[1])
        assert_close_to_scale(ort_oracle[1], torch_oracle[1])  # the attributes are torch's

    # The training graph in onnx.reference (its Resize, our numpy ResizeGrad); onnx.reference
    # has no tf_half_pixel_for_nn (deprecated since opset 13).
    if attrs.get("coordinate_transformation_mode") == "tf_half_pixel_for_nn":
        return
    session = reference_evaluator(tmp_path / "training_model.onnx")
    feeds = {"input": x, "target": target, "lazy_reset_grad": np.array([True]), "w": w,
             "w_grad.accumulation.buffer": np.zeros_like(w)}
    results = dict(zip(session.output_names, session.run(None, feeds)))
    assert relative_error(results["w_grad.accumulation.out"], ort_oracle[2]) <= TOLERANCE


# -- torch's exports ---------------------------------------------------------------------

class Upsampler(torch.nn.Module):
    """A conv, then an upsampling layer (nn.Upsample or F.interpolate), then a 1x1 conv."""

    def __init__(self, layer, rank=2):
        super().__init__()
        torch.manual_seed(8)
        conv = torch.nn.Conv2d if rank == 2 else torch.nn.Conv1d
        self.inner = conv(2, 3, 3, padding=1)
        self.layer = layer
        self.outer = conv(3, 2, 1)

    def forward(self, x):
        return self.outer(self.layer(torch.tanh(self.inner(x))))


class Interpolate(torch.nn.Module):
    def __init__(self, **kwargs):
        super().__init__()
        self.kwargs = kwargs

    def forward(self, x):
        return F.interpolate(x, **self.kwargs)


EXPORTS = [
    ("upsample_nearest", lambda: torch.nn.Upsample(scale_factor=2), 2, (17, 13, 11, 10, 9)),
    ("upsample_bilinear", lambda: torch.nn.Upsample(scale_factor=2, mode="bilinear"), 2,
     (17, 13, 11)),
    ("upsample_bilinear_align_corners",
     lambda: torch.nn.Upsample(scale_factor=2, mode="bilinear", align_corners=True), 2,
     (17, 11)),
    ("interpolate_nearest_size", lambda: Interpolate(size=(7, 9)), 2, (17, 11)),
    ("interpolate_bilinear_size", lambda: Interpolate(size=(7, 9), mode="bilinear"), 2,
     (17, 11)),
    ("interpolate_bilinear_recomputed_scale",
     lambda: Interpolate(scale_factor=1.5, mode="bilinear", recompute_scale_factor=True), 2,
     (17,)),
    ("upsample_linear_1d", lambda: torch.nn.Upsample(scale_factor=3, mode="linear"), 1,
     (17, 11)),
    ("upsample_nearest_1d", lambda: torch.nn.Upsample(scale_factor=2), 1, (17, 9)),
]


@pytest.mark.parametrize("name,layer,rank,opset",
                         [pytest.param(n, l, r, o, id=f"{n}-opset{o}")
                          for n, l, r, opsets in EXPORTS for o in opsets])
def test_torch_exports(tmp_path, name, layer, rank, opset):
    module = Upsampler(layer(), rank)
    shape = (2, 2, 4, 5) if rank == 2 else (2, 2, 6)
    x = np.random.default_rng(3).standard_normal(shape).astype(np.float32)
    model = check_exported_module(tmp_path, module, x, opset=opset, grad_tolerance=TOLERANCE)
    ops = {n.op_type for n in model.graph.node}
    assert ("Upsample" if opset < 10 else "Resize") in ops, ops


@pytest.mark.parametrize("opset,mode,scales", [
    (9, "linear", [1, 1, 2, 2.5]), (9, "nearest", [1, 1, 2, 3]),
    (10, "linear", [1, 1, 2, 2.5]), (10, "nearest", [1, 1, 2, 3]),
    (10, "nearest", [1, 1, 0.6, 0.5])],   # Upsample (opset 9) cannot downsample
    ids=["upsample9_linear", "upsample9_nearest", "resize10_linear", "resize10_nearest_up",
         "resize10_nearest_down"])
def test_resize_before_opset_11_samples_as_onnxruntime(tmp_path, opset, mode, scales):
    """Upsample (opset 9) and Resize (opset 10) sample at x / scale, and nearest rounds down
    when upsampling and up when downsampling; after the upgrade to opset 17 the device's
    forward equals onnxruntime running the original model (torch's opset-9 bilinear export
    does not match torch itself, so the original's semantics are the oracle)."""
    x_shape = (1, 2, 5, 6)
    x = np.random.default_rng(5).uniform(-1, 1, x_shape).astype(np.float32)
    op_type = "Upsample" if opset == 9 else "Resize"
    graph = helper.make_graph(
        [helper.make_node("Constant", [], ["scales"], value=numpy_helper.from_array(
            np.array(scales, np.float32), "scales")),
         helper.make_node("Mul", ["input", "w"], ["h"], name="scale_input"),
         helper.make_node(op_type, ["h", "scales"], ["output"], name="old_resize", mode=mode)],
        "old", [helper.make_tensor_value_info("input", TensorProto.FLOAT, list(x_shape))],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, [
            int(np.floor(n * np.float32(s))) for n, s in zip(x_shape, scales)])],
        initializer=[numpy_helper.from_array(np.ones(x_shape, np.float32), "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)],
                              ir_version=5)
    expected = ort_run(model, x)
    mh.generate_artifacts(model, loss="MSELoss", optimizer="SGD", artifact_directory=tmp_path)
    device = Module(str(tmp_path / "model.mtb"),
                    CheckpointState.load_checkpoint(str(tmp_path / "checkpoint")))
    device.eval()
    out = device(x.reshape(-1).tolist(), [0.0] * expected.size)[1].tolist()
    assert_close_to_scale(out, expected)


# -- refused at pack time, naming node and attribute --------------------------------------

REFUSALS = [
    ("cubic", (1, 2, 3, 3), [1, 1, 2, 2], None, 17, {"mode": "cubic"},
     "Resize node 'resize': attribute mode='cubic' is not supported (supported: 'nearest', "
     "'linear')"),
    ("tf_crop_and_resize", (1, 2, 3, 3), [1, 1, 2, 2], None, 17,
     {"mode": "linear", "coordinate_transformation_mode": "tf_crop_and_resize"},
     "Resize node 'resize': attribute coordinate_transformation_mode='tf_crop_and_resize' is "
     "not supported (supported: 'half_pixel', 'half_pixel_symmetric', 'pytorch_half_pixel', "
     "'align_corners', 'asymmetric', 'tf_half_pixel_for_nn')"),
    ("antialias", (1, 2, 6, 6), [1, 1, 0.5, 0.5], None, 18, {"mode": "linear", "antialias": 1},
     "Resize node 'resize': attribute antialias=1 is not supported (supported: 0)"),
    ("exclude_outside", (1, 2, 3, 3), [1, 1, 2, 2], None, 17,
     {"mode": "linear", "exclude_outside": 1},
     "Resize node 'resize': attribute exclude_outside=1 is not supported (supported: 0)"),
    ("keep_aspect_ratio_policy", (1, 2, 3, 4), None, [6, 6], 18,
     {"axes": [2, 3], "keep_aspect_ratio_policy": "not_larger"},
     "Resize node 'resize': attribute keep_aspect_ratio_policy='not_larger' is not supported "
     "(supported: 'stretch')"),
    ("channel_axis_resized", (1, 2, 3, 3), [1, 2, 2, 2], None, 17, {},
     "Resize node 'resize': axis 1 of [1, 2, 3, 3] is resized (scale 2.0); only the last two "
     "axes can be (1-D and 2-D resizing)"),
]


@pytest.mark.parametrize("x_shape,scales,sizes,opset,attrs,message",
                         [r[1:] for r in REFUSALS], ids=[r[0] for r in REFUSALS])
def test_refused_at_pack_time_naming_node_and_attribute(tmp_path, x_shape, scales, sizes, opset,
                                                        attrs, message):
    model = resize_model(x_shape, scales, sizes, opset, attrs, [0] * len(x_shape),
                         w=np.ones(x_shape, np.float32))
    with pytest.raises(mh.UnsupportedOpError) as error:
        mh.generate_artifacts(model, loss="MSELoss", optimizer="SGD", artifact_directory=tmp_path)
    assert str(error.value) == message


def test_opset_10_nearest_with_mixed_scales_is_refused_by_name(tmp_path):
    x_shape = (1, 2, 4, 4)
    graph = helper.make_graph(
        [helper.make_node("Constant", [], ["scales"], value=numpy_helper.from_array(
            np.array([1, 1, 2, 0.5], np.float32), "scales")),
         helper.make_node("Mul", ["input", "w"], ["h"], name="scale_input"),
         helper.make_node("Resize", ["h", "scales"], ["output"], name="mixed", mode="nearest")],
        "old", [helper.make_tensor_value_info("input", TensorProto.FLOAT, list(x_shape))],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, [1, 2, 8, 2])],
        initializer=[numpy_helper.from_array(np.ones(x_shape, np.float32), "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 10)], ir_version=5)
    with pytest.raises(mh.UnsupportedOpError, match="Resize node 'mixed' \\(opset 10, "
                                                    "nearest\\): its scales must be a constant, "
                                                    "all at least 1 or all at most 1"):
        mh.generate_artifacts(model, loss="MSELoss", optimizer="SGD", artifact_directory=tmp_path)


# -- MicroPython ---------------------------------------------------------------------------

class ResizeNet(torch.nn.Module):
    """Every resize kernel path: nearest and bilinear upsampling, a bilinear downsampling
    with align_corners, and a 1-D linear one."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(9)
        self.conv = torch.nn.Conv2d(2, 3, 3, padding=1)
        self.mix = torch.nn.Conv2d(3, 2, 1)

    def forward(self, x):
        h = torch.tanh(self.conv(x))
        up = F.interpolate(h, scale_factor=2) + F.interpolate(h, scale_factor=2, mode="bilinear")
        down = F.interpolate(self.mix(up), size=(5, 3), mode="bilinear", align_corners=True)
        return F.interpolate(down.flatten(2), scale_factor=1.5, mode="linear")


def test_resize_net_micropython_matches_cpython_and_torch(tmp_path, micropython):
    check_micropython_training(tmp_path, micropython, ResizeNet(), (3, 2, 4, 3), (3, 2, 22))
