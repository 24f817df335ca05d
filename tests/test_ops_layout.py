"""Layout ops (Transpose, Slice, Concat, Split, Pad, Gather with constant indices, Tile,
Expand, Squeeze / Unsqueeze), Reciprocal, N-D MatMul and the folding of torch's shape
arithmetic.

Per-op cases follow tests/test_ops.py: a tiny ONNX model, one device training step against
float64 torch autograd (and the training graph run by onnx.reference with the host's numpy
versions of our ops), the eval forward against onnxruntime. torch has no negative-step
slices nor an index-based edge / reflect pad, so those references pick elements with
index_select on indices numpy computes (`np.arange(d)[start:end:step]`, `np.pad(...,
mode)`); onnxruntime's forward pass checks that these are ONNX's semantics."""
import copy
import zlib

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
import torch.nn.functional as F
from onnx import TensorProto, numpy_helper

import microtrain_host as mh
from conftest import ROOT, run_micropython
from microtrain import CheckpointState, Module
from microtrain_host.reference import reference_evaluator
from test_ops import build_model, const, node, relative_error
from torch_reference import export, parse_run, run_device_cpython, torch_train, write_batches

M, K, N = 3, 5, 7
GRAD_TOLERANCE = 1e-4
FORWARD_TOLERANCE = 1e-5
INT64_MAX = np.iinfo(np.int64).max


def ints(name, values):
    return const(name, np.array(values, np.int64))


# -- torch references -------------------------------------------------------------------

def take(h, axis, index):
    return h.index_select(axis, torch.as_tensor(np.array(index, np.int64)))


def torch_slice(h, starts, ends, axes=None, steps=None):
    axes = range(len(starts)) if axes is None else axes
    steps = [1] * len(starts) if steps is None else steps
    for start, end, axis, step in zip(starts, ends, axes, steps):
        h = take(h, axis, np.arange(h.shape[axis])[start:end:step])
    return h


def torch_pad(h, pads, mode="constant", value=0.0):
    rank = h.dim()
    if mode == "constant":  # F.pad wants (last axis begin, end, ...); negative pads crop
        flat = [p for axis in reversed(range(rank)) for p in (pads[axis], pads[axis + rank])]
        return F.pad(h, flat, value=value)
    for axis in range(rank):
        index = np.pad(np.arange(h.shape[axis]), (pads[axis], pads[axis + rank]), mode=mode)
        h = take(h, axis, index)
    return h


# -- the table of cases -----------------------------------------------------------------

def unary_case(name, op_nodes, fn, shape=(M, K, N), opset=17):
    """Y = op(input * w), w trainable; op_nodes read "h" and write "output"."""
    return (name, shape, {"w": shape}, [node("Mul", ["input", "w"], "h")] + op_nodes,
            lambda x, p: fn(x * p["w"]), opset)


def transpose_case(perm, shape):
    attrs = {} if perm is None else {"perm": perm}
    return unary_case(f"Transpose_{perm}_{shape}", [node("Transpose", ["h"], "output", **attrs)],
                      lambda h: h.permute(*(perm or reversed(range(len(shape))))), shape)


def slice_case(starts, ends, axes=None, steps=None, shape=(M, K, N)):
    nodes = [ints("starts", starts), ints("ends", ends)]
    inputs = ["h", "starts", "ends"]
    if axes is not None or steps is not None:
        nodes.append(ints("axes", axes if axes is not None else list(range(len(starts)))))
        inputs.append("axes")
    if steps is not None:
        nodes.append(ints("steps", steps))
        inputs.append("steps")
    return unary_case(f"Slice_{starts}_{ends}_{axes}_{steps}",
                      nodes + [node("Slice", inputs, "output")],
                      lambda h: torch_slice(h, starts, ends, axes, steps), shape)


def concat_case(axis):
    """Concat of the input, a parameter and the input again, along axis."""
    shape_w = list((M, K, N))
    shape_w[axis] = 2
    return (f"Concat_axis{axis}", (M, K, N), {"w": tuple(shape_w), "v": (M, K, N)},
            [node("Mul", ["input", "v"], "h"), node("Concat", ["h", "w", "h"], "output",
                                                     axis=axis)],
            lambda x, p: torch.cat([x * p["v"], p["w"], x * p["v"]], axis), 17)


def split_case(name, split, outputs, combine, fn, axis=1, shape=(M, 6, N), opset=17,
               **attrs):
    """Split(input * w) into `outputs`, then the `combine` nodes write "output"."""
    nodes = []
    inputs = ["h"]
    if split is not None:
        nodes.append(ints("split", split))
        inputs.append("split")
    nodes.append(node("Split", inputs, outputs, axis=axis, **attrs))
    return unary_case(name, nodes + combine, fn, shape, opset)


def pad_case(pads, mode="constant", value=None, axes=None, shape=(M, K, N), opset=17):
    nodes = [ints("pads", pads)]
    inputs = ["h", "pads"]
    if value is not None:
        nodes.append(const("value", np.array(value, np.float32)))
        inputs.append("value")
    if axes is not None:
        if value is None:
            inputs.append("")
        nodes.append(ints("axes", axes))
        inputs.append("axes")
    full = pads
    if axes is not None:
        rank, n = len(shape), len(axes)
        full = [0] * (2 * rank)
        for i, a in enumerate(axes):
            full[a], full[a + rank] = pads[i], pads[i + n]
    return unary_case(f"Pad_{mode}_{pads}_{value}_{axes}",
                      nodes + [node("Pad", inputs, "output", mode=mode)],
                      lambda h: torch_pad(h, full, mode, value or 0.0), shape, opset)


def matmul_case(shape_a, shape_b, a_is_input=False):
    """Y = A @ B (+ input, broadcast), A and B trainable; or input @ B."""
    out_shape = np.matmul(np.zeros(shape_a), np.zeros(shape_b)).shape
    name = f"MatMul_{shape_a}_{shape_b}" + ("_input" if a_is_input else "")
    if a_is_input:
        return (name, shape_a, {"B": shape_b}, [node("MatMul", ["input", "B"], "output")],
                lambda x, p: torch.matmul(x, p["B"]), 17)
    input_shape = out_shape if out_shape else (3,)
    return (name, input_shape, {"A": shape_a, "B": shape_b},
            [node("MatMul", ["A", "B"], "y"), node("Add", ["y", "input"], "output")],
            lambda x, p: torch.matmul(p["A"], p["B"]) + x, 17)


CASES = (
    [transpose_case(perm, shape) for perm, shape in (
        (None, (M, K, N)), ([2, 0, 1], (M, K, N)), ([1, 0, 2], (M, K, N)),
        ([0, 2, 3, 1], (2, M, K, N)), ([3, 1, 0, 2], (2, M, K, N)),
        ([4, 2, 0, 3, 1], (2, 3, 2, 5, 3)),     # 5 strided dimensions: several steps
        ([1, 0, 2], (M, 1, N)))]                # moves a unit dimension only: an alias
    + [slice_case([1], [4], [1]),
       slice_case([-4], [-1], [2]),
       slice_case([1, 2], [3, 4]),                                  # no axes input
       slice_case([-100], [100], [0]),                              # clamped
       slice_case([2], [INT64_MAX], [-1]),                          # torch's x[..., 2:]
       slice_case([0, 1], [3, 7], [0, 2], [2, 3]),                  # steps > 1
       slice_case([-1], [-INT64_MAX], [1], [-2]),                   # reversed, step -2
       slice_case([5, 0], [-100, 100], [2, 0], [-1, 1]),
       unary_case("Slice_empty_window_concat",
                  [ints("starts", [3]), ints("ends", [1]), ints("axes", [2]),
                   node("Slice", ["h", "starts", "ends", "axes"], "s"),
                   node("Concat", ["s", "h"], "output", axis=2)],
                  lambda h: torch.cat([h[..., 3:1], h], 2)),
       ("Slice_of_param", (2, N), {"w": (M, N)},
        [ints("starts", [1]), ints("ends", [3]), ints("axes", [0]),
         node("Slice", ["w", "starts", "ends", "axes"], "s"),
         node("Add", ["s", "input"], "output")],
        lambda x, p: p["w"][1:3] + x, 17)]
    + [concat_case(axis) for axis in (0, 1, 2)]
    + [("Concat_negative_axis_params", (M, 9), {"a": (M, 4), "b": (M, 5)},
        [node("Concat", ["a", "b"], "c", axis=-1), node("Mul", ["c", "input"], "output")],
        lambda x, p: torch.cat([p["a"], p["b"]], -1) * x, 17)]
    + [split_case("Split_equal", None, ["s0", "s1", "s2"],
                  [node("Mul", ["s0", "s1"], "t"), node("Add", ["t", "s2"], "output")],
                  lambda h: h[:, 0:2] * h[:, 2:4] + h[:, 4:6]),
       split_case("Split_sizes_swapped", [2, 4], ["s0", "s1"],
                  [node("Concat", ["s1", "s0"], "output", axis=1)],
                  lambda h: torch.cat([h[:, 2:], h[:, :2]], 1)),
       split_case("Split_last_axis_one_unused", [3, 4], ["s0", "s1"],
                  [node("Tanh", ["s0"], "output")],
                  lambda h: torch.tanh(h[..., :3]), axis=-1, shape=(M, K, N)),
       split_case("Split_num_outputs_opset18", None, ["s0", "s1", "s2"],
                  [node("Concat", ["s2", "s0", "s1"], "output", axis=1)],
                  lambda h: torch.cat([h[:, 6:], h[:, :3], h[:, 3:6]], 1),
                  shape=(M, N, K), opset=18, num_outputs=3)]
    + [pad_case([0, 1, 2, 1, 0, 3]),
       pad_case([1, 0, 2, 0, 1, 1], value=0.5),
       pad_case([0, -1, 2, 0, 2, -3]),                              # negative pads crop
       pad_case([1, 2, 0, 3], axes=[2, 0], opset=18),
       pad_case([1, 0, 2, 2, 1, 3], mode="edge"),
       pad_case([2, 4, 6, 1, 3, 5], mode="reflect"),                # up to dim - 1
       pad_case([0, 0, 1, 0, 0, 2], mode="reflect", shape=(2, 3, 3, 4)[:3])]
    + [unary_case(f"Gather_axis{axis}_{index}",
                  [ints("index", index), node("Gather", ["h", "index"], "output", axis=axis)],
                  lambda h, axis=axis, index=index: take(
                      h, axis % 3, np.arange(h.shape[axis])[np.array(index)].reshape(-1)
                  ).reshape(h.shape[:axis % 3] + np.shape(index) + h.shape[axis % 3 + 1:]))
       for axis, index in ((1, 0), (-1, -2), (0, [2, 0, 2]), (2, [[1, 6], [6, 0]]))]
    + [unary_case(f"Tile_{repeats}", [ints("repeats", repeats),
                                      node("Tile", ["h", "repeats"], "output")],
                  lambda h, repeats=repeats: h.repeat(*repeats))
       for repeats in ([1, 2, 1], [2, 1, 3], [3, 2, 2])]
    + [unary_case("Reciprocal", [node("Mul", ["h", "h"], "h2"),   # 1 / (h^2 + 1): no poles
                                 const("one", np.array(1.0, np.float32)),
                                 node("Add", ["h2", "one"], "d"),
                                 node("Reciprocal", ["d"], "output")],
                  lambda h: 1.0 / (h * h + 1.0), (K, N))]
    + [unary_case("Expand_row_to_full", [ints("shape", [M, K, N]),
                                         node("Expand", ["h", "shape"], "output")],
                  lambda h: h.expand(M, K, N), (1, K, 1)),
       unary_case("Expand_adds_dims", [ints("shape", [2, 1, K, N]),
                                       node("Expand", ["h", "shape"], "output")],
                  lambda h: h.expand(2, 1, K, N), (K, 1)),
       unary_case("Squeeze_all_unit_dims", [node("Squeeze", ["h"], "output")],
                  lambda h: h.squeeze(), (K, 1, N, 1)),
       unary_case("Squeeze_negative_axes", [ints("axes", [-1, 1]),
                                            node("Squeeze", ["h", "axes"], "output")],
                  lambda h: h.squeeze(-1).squeeze(1), (K, 1, N, 1)),
       unary_case("Unsqueeze_two_axes", [ints("axes", [0, -1]),
                                         node("Unsqueeze", ["h", "axes"], "output")],
                  lambda h: h.unsqueeze(0).unsqueeze(-1), (K, N))]
    + [matmul_case((2, 3, 4), (4, 5), a_is_input=True),   # batch folds into rows
       matmul_case((2, 3, 4), (4, 5)),
       matmul_case((3, 4), (2, 4, 5)),                     # A shared by the batch
       matmul_case((2, 3, 4), (2, 4, 5)),
       matmul_case((2, 1, 3, 4), (5, 4, 3)),               # both broadcast
       matmul_case((2, 3, 3, 4), (2, 3, 4, 5)),
       matmul_case((1, 3, 4), (2, 4, 5)),
       matmul_case((4,), (2, 4, 5)),                       # 1-D operands
       matmul_case((2, 3, 4), (4,)),
       matmul_case((4,), (4, 5)),
       matmul_case((3, 4), (4,)),
       matmul_case((4,), (4,))]
)


def crops(nodes):
    return any(op == "Constant" and out == "pads" and
               numpy_helper.to_array(attrs["value"]).min() < 0 for op, _, out, attrs in nodes)


@pytest.mark.parametrize("name,input_shape,params,nodes,fn,opset", CASES,
                         ids=[c[0] for c in CASES])
def test_layout_op_gradient(tmp_path, name, input_shape, params, nodes, fn, opset):
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    x = rng.uniform(-1.0, 1.0, input_shape).astype(np.float32)
    values = {k: rng.uniform(-1.0, 1.0, s).astype(np.float32) for k, s in params.items()}
    p = {k: torch.tensor(v, dtype=torch.float64, requires_grad=True) for k, v in values.items()}
    out = fn(torch.tensor(x, dtype=torch.float64), p)
    target = torch.tensor(rng.standard_normal(tuple(out.shape)), dtype=torch.float64)
    loss = torch.nn.functional.mse_loss(out, target)
    loss.backward()
    model = build_model(input_shape, values, nodes, tuple(out.shape), opset)

    mh.generate_artifacts(model, loss="MSELoss", optimizer="SGD", artifact_directory=tmp_path)
    state = CheckpointState.load_checkpoint(str(tmp_path / "checkpoint"))
    device = Module(str(tmp_path / "model.mtb"), state)
    x_flat = x.reshape(-1).tolist()
    target_flat = target.numpy().astype(np.float32).reshape(-1).tolist()
    device_loss = device(x_flat, target_flat)
    assert relative_error(device_loss, loss.item()) <= GRAD_TOLERANCE, (device_loss, loss)
    for name, tensor in p.items():
        actual = np.array(state.parameters[name].grad.tolist())
        assert relative_error(actual, tensor.grad.numpy()) <= GRAD_TOLERANCE, name
    if not crops(nodes):  # onnx.reference's Pad (np.pad) takes no negative pads
        _, reference_grads = reference_training_step(tmp_path, x,
                                                     target.numpy().astype(np.float32))
        for name, tensor in p.items():
            assert relative_error(reference_grads[name], tensor.grad.numpy()) <= GRAD_TOLERANCE

    device.eval()
    device_out = device(x_flat, target_flat)
    (ort_out,) = ort.InferenceSession(model.SerializeToString(),
                                      providers=["CPUExecutionProvider"]).run(None, {"input": x})
    assert ort_out.shape == tuple(out.shape)
    # onnxruntime sums float32 products in float32 (the device in double): its own distance
    # from the float64 result is allowed on top (2e-5 in one MatMul case, ~1e-7 elsewhere).
    ort_rounding = relative_error(ort_out, out.detach().numpy())
    assert relative_error(device_out[1].tolist(), ort_out) <= FORWARD_TOLERANCE + ort_rounding
    assert relative_error(device_out[1].tolist(), out.detach().numpy()) <= FORWARD_TOLERANCE


# -- torch exports: shape arithmetic folds on the host, the layout ops train like torch ---

class LayoutNet(torch.nn.Module):
    """view / flatten / reshape / cat / mean / permute / pad (constant and reflect) / split /
    strided slicing / integer indexing / batched matmul, as torch.onnx writes them (Shape ->
    Gather -> Concat for x.size(0), ConstantOfShape and Cast for F.pad)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.scale = torch.nn.Parameter(torch.randn(1, 2, 1, 1))
        self.mix = torch.nn.Parameter(torch.randn(6, 3) * 0.5)
        self.fc = torch.nn.Linear(36 + 2 + 9, 3)

    def forward(self, x):                                  # x: (B, 2, 3, 5)
        h = x * (self.scale * 2.0)                         # a float Mul on a parameter
        h = F.pad(h, (1, 2, 0, 1))                         # (B, 2, 4, 8)
        h = h[:, :, 1:, ::2]                               # (B, 2, 3, 4)
        h = h.permute(0, 2, 1, 3)                          # (B, 3, 2, 4)
        a, c = torch.split(h, 1, dim=2)                    # (B, 3, 1, 4) each
        h = torch.cat([c, torch.tanh(a), h], 2)            # (B, 3, 4, 4)
        h = F.pad(h, (2, 0, 0, 0), mode="reflect")         # (B, 3, 4, 6)
        h = torch.tanh(h @ self.mix)                       # (B, 3, 4, 3)
        g = h @ h.transpose(-1, -2)                        # (B, 3, 4, 4)
        pooled = x.mean((2, 3))                            # (B, 2)
        flat = torch.cat([h.reshape(-1, 36), pooled, g[:, 0, :3, :3].flatten(1)], 1)
        return self.fc(flat.view(x.size(0), -1))


EXPORT_SHAPE = (2, 3, 5)
EXPORT_BATCH, EXPORT_STEPS, EXPORT_LR = 4, 6, 0.05
SHAPE_OPS = {"Shape", "Size", "Cast", "ConstantOfShape", "Range"}


@pytest.fixture(scope="module")
def layout_net(tmp_path_factory):
    """LayoutNet exported with a dynamic batch, packed for batch 4, trained by torch and by
    the device runtime (CPython) for a few SGD steps."""
    tmp = tmp_path_factory.mktemp("layout_net")
    model = LayoutNet()
    exported = export(model, torch.zeros((1,) + EXPORT_SHAPE))
    mh.generate_artifacts(exported, loss="MSELoss", optimizer="SGD", artifact_directory=tmp,
                          batch_size=EXPORT_BATCH)
    rng = np.random.default_rng(7)
    xs = rng.standard_normal((EXPORT_STEPS, EXPORT_BATCH) + EXPORT_SHAPE).astype(np.float32)
    ys = rng.standard_normal((EXPORT_STEPS, EXPORT_BATCH, 3)).astype(np.float32)
    write_batches(tmp / "data.bin", xs, ys)
    expected = torch_train(copy.deepcopy(model), "MSELoss", "SGD", xs, ys, EXPORT_LR)
    device = run_device_cpython(tmp, tmp / "data.bin", EXPORT_STEPS, EXPORT_LR)
    return tmp, exported, expected, device


def test_export_shape_arithmetic_folds_away(layout_net):
    tmp, exported, _, _ = layout_net
    assert {"Shape", "Gather", "ConstantOfShape", "Cast"} <= {n.op_type for n in
                                                               exported.graph.node}
    for name in ("training_model.onnx", "eval_model.onnx"):
        graph = onnx.load(str(tmp / name)).graph
        ops = {n.op_type for n in graph.node}
        assert not ops & SHAPE_OPS, (name, ops & SHAPE_OPS)
        assert {"Pad", "Slice", "Transpose", "Split", "Concat", "MatMul", "Gather"} <= ops
        # every integer tensor left is a constant: no integer arithmetic reaches the device
        types = {v.name: v.type.tensor_type.elem_type
                 for v in list(graph.value_info) + list(graph.output)}
        computed = [o for n in graph.node if n.op_type != "Constant" for o in n.output]
        assert all(types[o] == TensorProto.FLOAT for o in computed)
    # the float Mul on the parameter stays a node: its value changes with training
    training = onnx.load(str(tmp / "training_model.onnx")).graph
    assert any(n.op_type == "Mul" and "scale" in n.input for n in training.node)


def test_export_trains_like_torch(layout_net):
    _, _, (torch_losses, torch_params), (losses, params, _) = layout_net
    assert relative_error(losses, torch_losses) <= GRAD_TOLERANCE
    assert np.max(np.abs(params - torch_params)) <= GRAD_TOLERANCE * max(
        1.0, np.max(np.abs(torch_params)))


def test_export_micropython_matches_cpython(layout_net, micropython):
    tmp, _, _, (losses, params, eval_loss) = layout_net
    out = run_micropython(micropython, ROOT / "tests" / "device_scripts" / "train_steps.py",
                          tmp, tmp / "data.bin", EXPORT_STEPS, repr(EXPORT_LR))
    mp_losses, mp_params, mp_eval = parse_run(out)
    assert relative_error(mp_losses, losses) <= 1e-5
    assert relative_error(mp_params, params) <= 1e-5
    assert relative_error(mp_eval, eval_loss) <= 1e-5


def reference_training_step(directory, x, target):
    """(loss, {param: gradient}) of one step of training_model.onnx in onnx.reference, with
    the host's numpy versions of the ai.microtrain ops."""
    training = onnx.load(str(directory / "training_model.onnx"))
    state = CheckpointState.load_checkpoint(str(directory / "checkpoint"))
    feeds = {"input": x, "target": target, "lazy_reset_grad": np.array([True])}
    names = []
    for name, value in state.parameters.items():
        data = np.array(value.data.tolist(), np.float32).reshape(value.shape)
        feeds[name] = data
        feeds[f"{name}_grad.accumulation.buffer"] = np.zeros_like(data)
        names.append(name)
    inputs = [i.name for i in training.graph.input]
    outputs = reference_evaluator(training).run(None, {k: feeds[k] for k in inputs})
    grads = dict(zip([o.name for o in training.graph.output[1:]], outputs[1:]))
    return outputs[0], {n: grads[f"{n}_grad.accumulation.out"] for n in names}


def test_training_graph_runs_in_the_reference_evaluator(layout_net, tmp_path):
    # FusedMatMul, SliceGrad, PadGrad and GatherGrad in numpy against the device kernels.
    tmp = layout_net[0]
    ops = {n.op_type for n in onnx.load(str(tmp / "training_model.onnx")).graph.node}
    assert {"FusedMatMul", "SliceGrad", "PadGrad", "GatherGrad"} <= ops
    rng = np.random.default_rng(3)
    x = rng.standard_normal((EXPORT_BATCH,) + EXPORT_SHAPE).astype(np.float32)
    y = rng.standard_normal((EXPORT_BATCH, 3)).astype(np.float32)
    loss, grads = reference_training_step(tmp, x, y)
    state = CheckpointState.load_checkpoint(str(tmp / "checkpoint"))
    device_loss = Module(str(tmp / "model.mtb"), state)(x.reshape(-1).tolist(),
                                                         y.reshape(-1).tolist())
    assert relative_error(device_loss, loss) <= GRAD_TOLERANCE
    for name, expected in grads.items():
        actual = np.array(state.parameters[name].grad.tolist())
        assert relative_error(actual, expected) <= GRAD_TOLERANCE, name


# -- folding never touches parameters; what cannot train fails loudly -------------------

def test_folding_keeps_parameters_and_randomness(tmp_path):
    # Constant-only arithmetic and Shape fold; a Mul reading a parameter and RandomNormalLike
    # (a fresh value every run) stay nodes.
    params = {"w": np.full((M, K), 0.5, np.float32)}
    nodes = [const("two", np.array(2.0, np.float32)), const("three", np.array(3.0, np.float32)),
             node("Mul", ["two", "three"], "six"),
             node("Shape", ["input"], "shape"),
             node("ConstantOfShape", ["shape"], "ones",
                  value=numpy_helper.from_array(np.array([1.0], np.float32))),
             node("Mul", ["w", "six"], "w6"),
             node("RandomNormalLike", ["w"], "noise", scale=0.0),
             node("Add", ["w6", "noise"], "w6n"),
             node("Mul", ["w6n", "ones"], "y"), node("Mul", ["y", "input"], "output")]
    model = build_model((M, K), params, nodes, (M, K))
    folded, _ = mh.pipeline.load.load_model(model)
    kinds = {n.output[0]: n.op_type for n in folded.graph.node}
    assert kinds["six"] == kinds["ones"] == "Constant"
    for name in ("two", "three", "shape"):                   # nothing reads them any more
        assert name not in kinds
    assert kinds["w6"] == "Mul" and kinds["noise"] == "RandomNormalLike"
    six = next(n for n in folded.graph.node if n.output[0] == "six")
    assert numpy_helper.to_array(six.attribute[0].t) == np.float32(6.0)


def unsupported(tmp_path, nodes, input_shape=(M, K, N), params=None, opset=17):
    params = params if params is not None else {"w": np.ones(input_shape, np.float32)}
    model = build_model(input_shape, params, [node("Mul", ["input", "w"], "h")] + nodes, [],
                        opset)
    with pytest.raises(mh.UnsupportedOpError) as error:
        mh.generate_artifacts(model, loss="MSELoss", optimizer="SGD", artifact_directory=tmp_path)
    return str(error.value)


@pytest.mark.parametrize("case", ["wrap", "reflect_too_far", "edge_negative"])
def test_pad_modes_that_cannot_train(tmp_path, case):
    pads, mode, opset = {"wrap": ([0, 1, 1, 0, 1, 1], "wrap", 19),
                         "reflect_too_far": ([0, 5, 0, 0, 0, 0], "reflect", 17),
                         "edge_negative": ([0, -1, 0, 0, 0, 0], "edge", 17)}[case]
    message = unsupported(tmp_path, [ints("pads", pads),
                                     node("Pad", ["h", "pads"], "output", mode=mode)],
                          opset=opset)
    assert "Pad" in message and "pad_2" in message and "mode" in message and mode in message


def test_trainable_pad_value_is_refused(tmp_path):
    params = {"w": np.ones((M, K, N), np.float32), "value": np.array(0.5, np.float32)}
    message = unsupported(tmp_path, [ints("pads", [0, 0, 1, 0, 0, 1]),
                                     node("Pad", ["h", "pads", "value"], "output")],
                          params=params)
    assert "Pad" in message and "pad_2" in message and "constant_value" in message


def test_matmul_broadcast_beyond_the_kernel_is_refused(tmp_path):
    # batch (2, 2, 2, 2) with A and B broadcast on alternate dimensions: four strided batch
    # dimensions, the kernel walks three
    params = {"w": np.ones((2, 1, 2, 1, 3, 4), np.float32),
              "b": np.ones((1, 2, 1, 2, 4, 5), np.float32)}
    message = unsupported(tmp_path, [node("MatMul", ["h", "b"], "output")],
                          input_shape=(2, 1, 2, 1, 3, 4), params=params)
    assert "MatMul" in message and "matmul_1" in message
