"""Pooling (MaxPool, AveragePool, GlobalMaxPool, GlobalAveragePool) and the piecewise-linear
activations (LeakyRelu, Clip, HardSigmoid, HardSwish, Shrink).

Each case is output = op(input + b) with b trainable, so b's gradient is the op's input
gradient itself. One device training step is checked against torch autograd in float64
(loss and gradient), the eval forward against onnxruntime, and the training graph run by
the ONNX reference evaluator (our numpy references of the gradient ops) against torch.
Ties and kinks are hit exactly: b = 0 and the input holds the tie or kink values."""
import copy
import zlib

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
import torch.nn.functional as F
from array import array
from onnx import helper

import microtrain_host as mh
from conftest import ROOT, run_micropython
from microtrain import CheckpointState, Module
from microtrain.kernels import pool as pool_kernels
from microtrain_host.ops.pool import pool_kernel_ints
from microtrain_host.reference import reference_evaluator
from test_ops import build_model, const, node, relative_error
from torch_reference import export, parse_run, run_device_cpython, torch_train, write_batches

GRAD_TOLERANCE = 1e-4
FORWARD_TOLERANCE = 1e-5
INF = float("inf")


# -- the harness -------------------------------------------------------------------------

def run_case(tmp_path, x, b, nodes, fn, opset=17):
    """Train one step on the device and check it against torch, onnxruntime and the numpy
    reference of the gradient op. nodes read "h" = input + b and write "output"."""
    rng = np.random.default_rng(zlib.crc32(x.tobytes()))
    p = torch.tensor(b, dtype=torch.float64, requires_grad=True)
    h = torch.tensor(x, dtype=torch.float64) + p
    out = fn(h)
    out.retain_grad()
    target = rng.standard_normal(tuple(out.shape)).astype(np.float32)
    loss = F.mse_loss(out, torch.tensor(target, dtype=torch.float64))
    loss.backward()
    expected_grad = p.grad.numpy()

    model = build_model(x.shape, {"b": b}, [node("Add", ["input", "b"], "h")] + nodes,
                        out.shape)
    if opset != 17:
        model.opset_import[0].version = opset
        onnx.checker.check_model(model)
    mh.generate_artifacts(model, loss="MSELoss", optimizer="SGD", artifact_directory=tmp_path)
    state = CheckpointState.load_checkpoint(str(tmp_path / "checkpoint"))
    device = Module(str(tmp_path / "model.mtb"), state)
    x_flat, target_flat = x.reshape(-1).tolist(), target.reshape(-1).tolist()
    device_loss = device(x_flat, target_flat)
    device_grad = np.array(state.parameters["b"].grad.tolist())
    assert relative_error(device_loss, loss.item()) <= GRAD_TOLERANCE
    assert relative_error(device_grad, expected_grad) <= GRAD_TOLERANCE, (device_grad,
                                                                          expected_grad)

    device.eval()
    device_out = np.array(device(x_flat, target_flat)[1].tolist())
    (ort_out,) = ort.InferenceSession(model.SerializeToString(),
                                      providers=["CPUExecutionProvider"]).run(None, {"input": x})
    assert ort_out.shape == tuple(out.shape)
    assert relative_error(device_out, ort_out) <= FORWARD_TOLERANCE

    dx = reference_gradient(onnx.load(tmp_path / "training_model.onnx"),
                            out.grad.numpy().astype(np.float32), h.detach().numpy())
    assert relative_error(dx, expected_grad) <= GRAD_TOLERANCE


def reference_gradient(training, dy, x):
    """Run the training graph's gradient node of the op under test (the ai.microtrain
    node reading h) alone in the ONNX reference evaluator, fed torch's dY and X."""
    (grad,) = [n for n in training.graph.node if n.domain == "ai.microtrain"
               and n.input[1:2] == ["h"]]
    graph = helper.make_graph(
        [grad], "gradient",
        [helper.make_tensor_value_info(grad.input[0], onnx.TensorProto.FLOAT, dy.shape),
         helper.make_tensor_value_info("h", onnx.TensorProto.FLOAT, x.shape)],
        [helper.make_tensor_value_info(grad.output[0], onnx.TensorProto.FLOAT, x.shape)])
    model = helper.make_model(graph, opset_imports=list(training.opset_import))
    (dx,) = reference_evaluator(model).run(None, {grad.input[0]: dy,
                                                  "h": x.astype(np.float32)})
    return dx


def values(name, shape, low, high):
    """Input in [low, high] and b in [-0.25, 0.25], seeded by the case name."""
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    return (rng.uniform(low, high, shape).astype(np.float32),
            rng.uniform(-0.25, 0.25, shape).astype(np.float32))


# -- pooling: torch equivalents ---------------------------------------------------------

def torch_max(kernel, stride, pad=0, dilation=1, ceil=False):
    def fn(h):
        pool = {3: F.max_pool1d, 4: F.max_pool2d, 5: F.max_pool3d}[h.dim()]
        return pool(h, kernel, stride, pad, dilation, ceil_mode=ceil)
    return fn


def torch_average(kernel, stride, pad=0, ceil=False, count_include_pad=False):
    def fn(h):
        pool = {3: F.avg_pool1d, 4: F.avg_pool2d, 5: F.avg_pool3d}[h.dim()]
        return pool(h, kernel, stride, pad, ceil_mode=ceil, count_include_pad=count_include_pad)
    return fn


def padded_max(kernel, stride, pads, dilation=1):
    """Asymmetric pads (ONNX order: begins, then ends) as torch's F.pad with -inf."""
    def fn(h):
        return torch_max(kernel, stride, 0, dilation)(F.pad(h, torch_pads(pads), value=-INF))
    return fn


def padded_average(kernel, stride, pads, count_include_pad):
    """Asymmetric pads with zeros; without count_include_pad the sum of each window is
    divided by the count of input elements in it (the same pooling of a padded ones)."""
    def fn(h):
        total = torch_average(kernel, stride)(F.pad(h, torch_pads(pads)))
        if count_include_pad:
            return total
        return total / torch_average(kernel, stride)(F.pad(torch.ones_like(h), torch_pads(pads)))
    return fn


def torch_pads(pads):
    # ONNX [b1, b2, e1, e2] -> F.pad's (b_last, e_last, b_first, e_first)
    rank = len(pads) // 2
    out = []
    for i in reversed(range(rank)):
        out += [pads[i], pads[i + rank]]
    return tuple(out)


def global_max(h):
    return torch_max(tuple(h.shape[2:]), 1)(h)


def global_average(h):
    return h.mean(dim=tuple(range(2, h.dim())), keepdim=True)


L1, L1_EVEN, HW, HW_SAME = (2, 3, 11), (2, 3, 10), (2, 3, 7, 9), (2, 3, 7, 8)
DHW = (2, 3, 5, 6, 7)   # 3-D pooling: two steps of the 2-D kernels (ops/pool.py pool_stages)
# HW_SAME with kernel (2, 3) and stride 2 needs one row and one column of padding: SAME_UPPER
# puts them at the end (pads [0, 0, 1, 1]), SAME_LOWER at the start ([1, 1, 0, 0]).

POOL_CASES = [
    # name, input shape, op, attributes, torch equivalent
    ("max_1d_k3", L1, "MaxPool", dict(kernel_shape=[3]), torch_max(3, 1)),
    ("max_1d_k3_s2_p1", L1, "MaxPool", dict(kernel_shape=[3], strides=[2], pads=[1, 1]),
     torch_max(3, 2, 1)),
    ("max_1d_k2_s2_ceil", L1, "MaxPool", dict(kernel_shape=[2], strides=[2], ceil_mode=1),
     torch_max(2, 2, ceil=True)),
    ("max_1d_k3_s2_p1_d2_ceil", L1, "MaxPool",
     dict(kernel_shape=[3], strides=[2], pads=[1, 1], dilations=[2], ceil_mode=1),
     torch_max(3, 2, 1, 2, True)),
    ("max_2d_k2_s2", HW, "MaxPool", dict(kernel_shape=[2, 2], strides=[2, 2]),
     torch_max(2, 2)),
    ("max_2d_k3_s2_p1_ceil", HW, "MaxPool",
     dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1], ceil_mode=1),
     torch_max(3, 2, 1, ceil=True)),
    ("max_2d_k3x2_s2x1_p1x0_d2x1", HW, "MaxPool",
     dict(kernel_shape=[3, 2], strides=[2, 1], pads=[1, 0, 1, 0], dilations=[2, 1]),
     torch_max((3, 2), (2, 1), (1, 0), (2, 1))),
    ("max_2d_k3_s2_p1_d2_ceil", HW, "MaxPool",
     dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1], dilations=[2, 2],
          ceil_mode=1),
     torch_max(3, 2, 1, 2, True)),
    ("max_2d_asymmetric_pads", HW, "MaxPool",
     dict(kernel_shape=[2, 3], strides=[2, 2], pads=[0, 2, 1, 0]),
     padded_max((2, 3), 2, [0, 2, 1, 0])),
    ("max_1d_asymmetric_pads_d2", L1, "MaxPool",
     dict(kernel_shape=[2], strides=[3], pads=[1, 0], dilations=[2]),
     padded_max(2, 3, [1, 0], 2)),
    ("max_2d_same_upper", HW_SAME, "MaxPool",
     dict(kernel_shape=[2, 3], strides=[2, 2], auto_pad="SAME_UPPER"),
     padded_max((2, 3), 2, [0, 0, 1, 1])),
    ("max_2d_same_lower", HW_SAME, "MaxPool",
     dict(kernel_shape=[2, 3], strides=[2, 2], auto_pad="SAME_LOWER"),
     padded_max((2, 3), 2, [1, 1, 0, 0])),
    ("max_2d_valid_ceil", HW_SAME, "MaxPool",
     dict(kernel_shape=[3, 3], strides=[2, 2], auto_pad="VALID", ceil_mode=1),
     torch_max(3, 2, ceil=True)),
    ("max_1d_same_upper", L1, "MaxPool",
     dict(kernel_shape=[4], strides=[3], auto_pad="SAME_UPPER"),
     padded_max(4, 3, [1, 2])),
    ("global_max_1d", L1, "GlobalMaxPool", {}, global_max),
    ("global_max_2d", HW, "GlobalMaxPool", {}, global_max),
    ("average_1d_k3_s2_p1", L1, "AveragePool",
     dict(kernel_shape=[3], strides=[2], pads=[1, 1]), torch_average(3, 2, 1)),
    ("average_1d_k3_s2_p1_count_pad", L1, "AveragePool",
     dict(kernel_shape=[3], strides=[2], pads=[1, 1], count_include_pad=1),
     torch_average(3, 2, 1, count_include_pad=True)),
    ("average_1d_k2_s2_ceil", L1, "AveragePool",
     dict(kernel_shape=[2], strides=[2], ceil_mode=1), torch_average(2, 2, ceil=True)),
    # L = 10: the last ceil_mode window [9, 12) runs past the padded edge 11, so with
    # count_include_pad it counts 2, not 3.
    ("average_1d_k3_s2_p1_ceil_count_pad_past_edge", L1_EVEN, "AveragePool",
     dict(kernel_shape=[3], strides=[2], pads=[1, 1], ceil_mode=1, count_include_pad=1),
     torch_average(3, 2, 1, True, True)),
    ("average_1d_k3_s2_p1_ceil", L1_EVEN, "AveragePool",
     dict(kernel_shape=[3], strides=[2], pads=[1, 1], ceil_mode=1),
     torch_average(3, 2, 1, True)),
    ("average_2d_k2_s2", HW, "AveragePool", dict(kernel_shape=[2, 2], strides=[2, 2]),
     torch_average(2, 2)),
    ("average_2d_k3_s2_p1_ceil", HW_SAME, "AveragePool",
     dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1], ceil_mode=1),
     torch_average(3, 2, 1, True)),
    ("average_2d_k3_s2_p1_ceil_count_pad_past_edge", HW_SAME, "AveragePool",
     dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1], ceil_mode=1,
          count_include_pad=1),
     torch_average(3, 2, 1, True, True)),
    ("average_2d_k3x2_s1x2_p1x0_count_pad", HW, "AveragePool",
     dict(kernel_shape=[3, 2], strides=[1, 2], pads=[1, 0, 1, 0], count_include_pad=1),
     torch_average((3, 2), (1, 2), (1, 0), count_include_pad=True)),
    ("average_2d_asymmetric_pads", HW, "AveragePool",
     dict(kernel_shape=[2, 3], strides=[2, 2], pads=[0, 2, 1, 0]),
     padded_average((2, 3), 2, [0, 2, 1, 0], False)),
    ("average_2d_asymmetric_pads_count_pad", HW, "AveragePool",
     dict(kernel_shape=[2, 3], strides=[2, 2], pads=[0, 2, 1, 0], count_include_pad=1),
     padded_average((2, 3), 2, [0, 2, 1, 0], True)),
    ("average_2d_same_upper", HW_SAME, "AveragePool",
     dict(kernel_shape=[2, 3], strides=[2, 2], auto_pad="SAME_UPPER"),
     padded_average((2, 3), 2, [0, 0, 1, 1], False)),
    ("average_2d_same_lower_count_pad", HW_SAME, "AveragePool",
     dict(kernel_shape=[2, 3], strides=[2, 2], auto_pad="SAME_LOWER", count_include_pad=1),
     padded_average((2, 3), 2, [1, 1, 0, 0], True)),
    ("average_2d_valid_ceil", HW_SAME, "AveragePool",
     dict(kernel_shape=[3, 3], strides=[2, 2], auto_pad="VALID", ceil_mode=1),
     torch_average(3, 2, ceil=True)),
    ("global_average_1d", L1, "GlobalAveragePool", {}, global_average),
    ("global_average_2d", HW, "GlobalAveragePool", {}, global_average),
    ("max_3d_k2_s2", DHW, "MaxPool", dict(kernel_shape=[2, 2, 2], strides=[2, 2, 2]),
     torch_max(2, 2)),
    ("max_3d_k3x2x3_s2x1x2_p1x0x1_d1x2x1_ceil", DHW, "MaxPool",
     dict(kernel_shape=[3, 2, 3], strides=[2, 1, 2], pads=[1, 0, 1, 1, 0, 1],
          dilations=[1, 2, 1], ceil_mode=1),
     torch_max((3, 2, 3), (2, 1, 2), (1, 0, 1), (1, 2, 1), True)),
    ("max_3d_asymmetric_pads", DHW, "MaxPool",
     dict(kernel_shape=[2, 3, 2], strides=[1, 2, 2], pads=[1, 0, 1, 0, 2, 0]),
     padded_max((2, 3, 2), (1, 2, 2), [1, 0, 1, 0, 2, 0])),
    ("average_3d_k3_s2_p1_ceil_count_pad", DHW, "AveragePool",
     dict(kernel_shape=[3, 3, 3], strides=[2, 2, 2], pads=[1, 1, 1, 1, 1, 1], ceil_mode=1,
          count_include_pad=1),
     torch_average(3, 2, 1, True, True)),
    ("average_3d_k2x3x2_s1x2x3_p1x1x0", DHW, "AveragePool",
     dict(kernel_shape=[2, 3, 2], strides=[1, 2, 3], pads=[1, 1, 0, 1, 1, 0]),
     torch_average((2, 3, 2), (1, 2, 3), (1, 1, 0))),
    ("global_max_3d", DHW, "GlobalMaxPool", {}, global_max),
    ("global_average_3d", DHW, "GlobalAveragePool", {}, global_average),
]


@pytest.mark.parametrize("name,shape,op_type,attrs,fn", POOL_CASES,
                         ids=[c[0] for c in POOL_CASES])
def test_pool(tmp_path, name, shape, op_type, attrs, fn):
    # Positive inputs: onnxruntime's float32 sums of values of both signs cancel to a
    # relative error above the forward tolerance near 0. onnxruntime takes ceil_mode with
    # auto_pad only from opset 19 on.
    x, b = values(name, shape, 0.5, 1.5)
    opset = 19 if "auto_pad" in attrs and attrs.get("ceil_mode") else 17
    run_case(tmp_path, x, b, [node(op_type, ["h"], "output", **attrs)], fn, opset)


def test_ceil_mode_window_starting_in_padding_at_opset_22(tmp_path):
    # L = 5, kernel 2, stride 2, pads 1: ceil_mode's fourth window would start at 6, in the
    # end padding; onnxruntime and torch drop it, and so does opset 22's shape inference.
    x, b = values("ceil_in_padding", (2, 3, 5), 0.5, 1.5)
    for op_type, fn in (("MaxPool", torch_max(2, 2, 1, ceil=True)),
                        ("AveragePool", torch_average(2, 2, 1, True, True))):
        attrs = dict(kernel_shape=[2], strides=[2], pads=[1, 1], ceil_mode=1)
        if op_type == "AveragePool":
            attrs["count_include_pad"] = 1
        run_case(tmp_path / op_type, x, b, [node(op_type, ["h"], "output", **attrs)], fn,
                 opset=22)


@pytest.mark.parametrize("shape,op_type,attrs,fn", [
    (HW, "MaxPool", dict(kernel_shape=[3, 3], pads=[1, 1, 1, 1]), torch_max(3, 1, 1)),
    (HW, "MaxPool", dict(kernel_shape=[2, 2], strides=[2, 2]), torch_max(2, 2)),
    (HW, "GlobalMaxPool", {}, global_max),
    (DHW, "MaxPool", dict(kernel_shape=[3, 3, 3], pads=[1] * 6), torch_max(3, 1, 1)),
    (DHW, "MaxPool", dict(kernel_shape=[2, 2, 2], strides=[2, 2, 2]), torch_max(2, 2)),
    (DHW, "GlobalMaxPool", {}, global_max)],
    ids=["overlapping", "k2_s2", "global", "3d_overlapping", "3d_k2_s2", "3d_global"])
def test_max_pool_ties_route_to_the_first_maximum(tmp_path, shape, op_type, attrs, fn):
    # Small integers: most windows hold several equal maxima; torch sends the gradient to
    # the first in row-major order, and so must the device (which recomputes the argmax;
    # in 3-D through the maxima of the depth slices).
    rng = np.random.default_rng(5)
    x = rng.integers(0, 3, shape).astype(np.float32)
    run_case(tmp_path, x, np.zeros(shape, np.float32),
             [node(op_type, ["h"], "output", **attrs)], fn)


def onnx_pool(op_type, kernel, strides, pads, dilations, ceil_mode, count_include_pad):
    """torch equivalent of an ONNX pool with explicit, asymmetric pads, dilations, ceil_mode
    and count_include_pad: torch's own pooling, unpadded, of the input padded out to the
    last window (-inf for a max; for an average, zeros, and the sum divided by the pooled
    mask of what counts: the input, and with count_include_pad the declared pads, never
    the extra end a ceil_mode window runs past them)."""
    rank = len(kernel)

    def fn(h):
        reach = []  # end padding the last window reads, per dimension
        for i, size in enumerate(h.shape[2:]):
            dilated = (kernel[i] - 1) * dilations[i] + 1
            span = size + pads[i] + pads[i + rank] - dilated
            out = (-(-span // strides[i]) if ceil_mode else span // strides[i]) + 1
            if ceil_mode and (out - 1) * strides[i] >= size + pads[i]:
                out -= 1  # a window may not start in the end padding
            reach.append((out - 1) * strides[i] + dilated - size - pads[i])
        full = torch_pads(list(pads[:rank]) + reach)
        if op_type == "MaxPool":
            return torch_max(kernel, strides, 0, dilations)(F.pad(h, full, value=-INF))
        total = torch_average(kernel, strides)(F.pad(h, full))
        if count_include_pad:
            extra = torch_pads([0] * rank + [r - e for r, e in zip(reach, pads[rank:])])
            mask = F.pad(F.pad(torch.ones_like(h), torch_pads(pads), value=1.0), extra)
        else:
            mask = F.pad(torch.ones_like(h), full)
        return total / torch_average(kernel, strides)(mask)
    return fn


def random_pool_cases(count, seed, ranks=(1, 2), reach=8):
    """count random pools: MaxPool or AveragePool, of a rank in `ranks`, batch and channels 1-3,
    kernel 1-4, stride 1-3, pads 0 to kernel - 1 at each end (onnxruntime's limit),
    dilations 1-3 (MaxPool), ceil_mode, count_include_pad (AveragePool); sizes odd or even
    from the smallest the window fits on. Geometries with a window of padding only, which
    microtrain refuses, are drawn again."""
    rng = np.random.default_rng(seed)
    cases = []
    while len(cases) < count:
        op_type = ("MaxPool", "AveragePool")[len(cases) % 2]
        rank = int(rng.choice(ranks))
        kernel = [int(k) for k in rng.integers(1, 5, rank)]
        strides = [int(s) for s in rng.integers(1, 4, rank)]
        pads = [int(rng.integers(0, k)) for k in kernel * 2]
        dilations = [int(d) for d in rng.integers(1, 4, rank)] if op_type == "MaxPool" \
            else [1] * rank
        ceil_mode = int(rng.integers(0, 2))
        count_include_pad = int(rng.integers(0, 2)) if op_type == "AveragePool" else 0
        spatial = [int(rng.integers(max(1, (k - 1) * d + 1 - b - e),
                                    (k - 1) * d + reach - b - e))
                   for k, d, b, e in zip(kernel, dilations, pads[:rank], pads[rank:])]
        fn = onnx_pool(op_type, kernel, strides, pads, dilations, ceil_mode, count_include_pad)
        out = fn(torch.zeros([1, 1] + spatial, dtype=torch.float64)).shape[2:]
        if not all(any(0 <= o * strides[i] - pads[i] + j * dilations[i] < spatial[i]
                       for j in range(kernel[i])) for i in range(rank) for o in range(out[i])):
            continue
        attrs = dict(kernel_shape=kernel, strides=strides, pads=pads, ceil_mode=ceil_mode)
        if op_type == "MaxPool":
            attrs["dilations"] = dilations
        else:
            attrs["count_include_pad"] = count_include_pad
        shape = [int(rng.integers(1, 4)), int(rng.integers(1, 4))] + spatial
        cases.append((op_type, tuple(shape), attrs, fn))
    return cases


def test_pool_on_random_geometries(tmp_path):
    # Issue 3's acceptance: random shapes, odd sizes and stride / padding / dilation /
    # ceil_mode / count_include_pad combinations, each through run_case (device step against
    # torch, forward against onnxruntime, which also confirms the output shape, and the
    # numpy gradient reference). Opset 22: its shape inference drops a ceil_mode window that
    # would start in the end padding, as onnxruntime and torch do.
    cases = random_pool_cases(25, seed=7)
    kinds = {(op_type, len(shape), attrs["ceil_mode"], attrs.get("count_include_pad"),
              max(attrs.get("dilations", [1])) > 1) for op_type, shape, attrs, _ in cases}
    assert len(kinds) >= 8, kinds   # the draw covers the combinations, not one corner
    assert any(attrs["pads"][:len(shape) - 2] != attrs["pads"][len(shape) - 2:]
               for _, shape, attrs, _ in cases)
    for i, (op_type, shape, attrs, fn) in enumerate(cases):
        name = f"random{i}"
        x, b = values(name, shape, 0.5, 1.5)
        try:
            run_case(tmp_path / name, x, b, [node(op_type, ["h"], "output", **attrs)], fn,
                     opset=22)
        except AssertionError as e:
            raise AssertionError(f"{name}: {op_type} {shape} {attrs}") from e


def test_3d_pool_on_random_geometries(tmp_path):
    # 3-D pooling is two steps of the 2-D kernels: random 3-D geometries through run_case.
    for i, (op_type, shape, attrs, fn) in enumerate(random_pool_cases(10, seed=11, ranks=(3,),
                                                                      reach=5)):
        name = f"random3d{i}"
        x, b = values(name, shape, 0.5, 1.5)
        try:
            run_case(tmp_path / name, x, b, [node(op_type, ["h"], "output", **attrs)], fn,
                     opset=22)
        except AssertionError as e:
            raise AssertionError(f"{name}: {op_type} {shape} {attrs}") from e


def onnxruntime_pool(op_type, x, attrs):
    n = helper.make_node(op_type, ["x"], ["y"], **attrs)
    graph = helper.make_graph(
        [n], "pool", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, x.shape)],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)], ir_version=8)
    (y,) = ort.InferenceSession(model.SerializeToString(),
                                providers=["CPUExecutionProvider"]).run(None, {"x": x})
    return n, y


def test_pool_kernels_match_onnxruntime_on_random_geometries():
    # The windows, counts and auto_pad resolution on 300 random attribute combinations,
    # straight through the device kernels, against onnxruntime's output.
    rng = np.random.default_rng(11)
    checked = 0
    for trial in range(300):
        op_type = ("MaxPool", "AveragePool")[trial % 2]
        rank = 1 + trial // 2 % 2
        kernel = [int(k) for k in rng.integers(1, 4, rank)]
        dilations = [int(d) for d in rng.integers(1, 3, rank)] if op_type == "MaxPool" \
            else [1] * rank
        attrs = dict(kernel_shape=kernel, strides=[int(s) for s in rng.integers(1, 4, rank)],
                     ceil_mode=int(rng.integers(0, 2)))
        auto_pad = ["NOTSET", "NOTSET", "VALID", "SAME_UPPER", "SAME_LOWER"][trial // 4 % 5]
        if auto_pad == "NOTSET":
            attrs["pads"] = [int(rng.integers(0, k)) for k in kernel * 2]
        else:
            attrs["auto_pad"] = auto_pad
        if op_type == "MaxPool":
            attrs["dilations"] = dilations if auto_pad[:4] != "SAME" else [1] * rank
        else:
            attrs["count_include_pad"] = int(rng.integers(0, 2))
        shape = [2, 3] + [int(s) for s in rng.integers(3, 9, rank)]
        x = rng.uniform(0.5, 1.5, shape).astype(np.float32)  # positive: see test_pool
        try:
            n, expected = onnxruntime_pool(op_type, x, attrs)
            ints = pool_kernel_ints(n, x.shape, expected.shape, op_type)
        except (mh.UnsupportedOpError, ort.capi.onnxruntime_pybind11_state.Fail,
                ort.capi.onnxruntime_pybind11_state.RuntimeException):
            continue  # a geometry one of the two refuses (negative SAME pads, ...)
        arena = array("f", x.reshape(-1).tolist() + [0.0] * expected.size)
        kernel_fn = pool_kernels.max_pool if op_type == "MaxPool" else pool_kernels.average_pool
        kernel_fn(arena, None, (x.size, 0) + tuple(ints))
        assert relative_error(arena[x.size:], expected) <= FORWARD_TOLERANCE, (op_type, attrs)
        checked += 1
    assert checked >= 200


# -- activations, at their kinks -----------------------------------------------------------

def clip_case(name, low, high, kinks):
    nodes, inputs = [], ["h"]
    for bound, value in (("min", low), ("max", high)):
        if value is None:
            inputs.append("")
        else:
            nodes.append(const(bound, np.array(value, np.float32)))
            inputs.append(bound)
    while inputs[-1] == "":
        inputs.pop()
    return (name, nodes + [node("Clip", inputs, "output")],
            lambda h: h if low is None and high is None else torch.clamp(h, low, high), kinks)


SIXTH = float(np.float32(1 / 6))  # HardSigmoid's alpha as torch exports it


def torch_hard_sigmoid(alpha, beta):
    # clamp(alpha h + beta, 0, 1) = hardsigmoid(6 alpha h + 6 beta - 3), with torch's
    # hardsigmoid gradient at the kinks (0, where clamp would give alpha)
    return lambda h: F.hardsigmoid(6 * alpha * h + 6 * beta - 3)


ACTIVATION_CASES = [
    # name, nodes, torch equivalent, kink points put in the input
    ("LeakyRelu_default", [node("LeakyRelu", ["h"], "output")],
     lambda h: F.leaky_relu(h, float(np.float32(0.01))), [0.0]),
    ("LeakyRelu_alpha0.2", [node("LeakyRelu", ["h"], "output", alpha=0.2)],
     lambda h: F.leaky_relu(h, float(np.float32(0.2))), [0.0]),
    ("LeakyRelu_negative_alpha", [node("LeakyRelu", ["h"], "output", alpha=-0.5)],
     lambda h: F.leaky_relu(h, -0.5), [0.0]),
    clip_case("Clip_min_max", -1.0, 2.0, [-1.0, 2.0]),
    clip_case("Clip_min_only", -0.5, None, [-0.5]),
    clip_case("Clip_max_only", None, 0.5, [0.5]),
    clip_case("Clip_no_bounds", None, None, []),
    clip_case("Clip_min_above_max", 2.0, 1.0, [1.0, 2.0]),
    # ReLU6 as torch exports it. Note torch's own relu6 / hardtanh give gradient 0 at 0 and
    # 6, unlike torch.clamp and onnxruntime's Clip gradient, which the device follows.
    clip_case("Clip_relu6", 0.0, 6.0, [0.0, 6.0]),
    ("HardSigmoid_default", [node("HardSigmoid", ["h"], "output")],
     torch_hard_sigmoid(float(np.float32(0.2)), 0.5), []),
    ("HardSigmoid_torch", [node("HardSigmoid", ["h"], "output", alpha=SIXTH)],
     F.hardsigmoid, [-3.0, 3.0, 0.0]),
    ("HardSigmoid_alpha0.5_beta0.5", [node("HardSigmoid", ["h"], "output", alpha=0.5,
                                           beta=0.5)],
     torch_hard_sigmoid(0.5, 0.5), [-1.0, 1.0, 0.0]),
    ("HardSigmoid_alpha0.5_beta0.25", [node("HardSigmoid", ["h"], "output", alpha=0.5,
                                            beta=0.25)],
     torch_hard_sigmoid(0.5, 0.25), []),
    ("HardSwish", [node("HardSwish", ["h"], "output")], F.hardswish, [-3.0, 3.0, 0.0]),
    # Shrink: torch's hardshrink (bias 0) and softshrink (bias = lambd)
    ("Shrink_default_hardshrink", [node("Shrink", ["h"], "output")],
     lambda h: F.hardshrink(h, 0.5), [-0.5, 0.5, 0.0]),
    ("Shrink_softshrink", [node("Shrink", ["h"], "output", lambd=0.25, bias=0.25)],
     lambda h: F.softshrink(h, 0.25), [-0.25, 0.25]),
    ("Shrink_bias_only", [node("Shrink", ["h"], "output", lambd=0.0, bias=0.5)],
     lambda h: torch.where(h > 0, h - 0.5, torch.where(h < 0, h + 0.5, h * 0)), [0.0]),
    # ThresholdedRelu (opset 10): torch's threshold(h, alpha, 0), gradient 0 at alpha too
    ("ThresholdedRelu_default", [node("ThresholdedRelu", ["h"], "output")],
     lambda h: F.threshold(h, 1.0, 0.0), [1.0, 0.0]),
    ("ThresholdedRelu_alpha_negative", [node("ThresholdedRelu", ["h"], "output", alpha=-0.5)],
     lambda h: F.threshold(h, -0.5, 0.0), [-0.5]),
]


@pytest.mark.parametrize("name,nodes,fn,kinks", ACTIVATION_CASES,
                         ids=[c[0] for c in ACTIVATION_CASES])
def test_activation(tmp_path, name, nodes, fn, kinks):
    x, _ = values(name, (5, 7), -8.0, 8.0)
    x.reshape(-1)[:2 * len(kinks)] = kinks * 2  # every kink twice; b = 0 keeps h = x exact
    run_case(tmp_path, x, np.zeros_like(x), nodes, fn)


# -- what is not supported fails at pack time, naming the node and the attribute ---------

ERROR_CASES = [
    # name, input shape, nodes, opset, words the message must contain
    ("storage_order", HW, [node("MaxPool", ["h"], "output", kernel_shape=[2, 2],
                                storage_order=1)], 17, ["storage_order"]),
    ("indices_output", HW, [node("MaxPool", ["h"], "output", kernel_shape=[2, 2])], 17,
     ["Indices"]),
    ("average_dilations", HW, [node("AveragePool", ["h"], "output", kernel_shape=[2, 2],
                                    dilations=[2, 2])], 19, ["dilations"]),
    ("same_with_dilations", HW, [node("MaxPool", ["h"], "output", kernel_shape=[2, 2],
                                      dilations=[2, 2], auto_pad="SAME_UPPER")], 17,
     ["auto_pad", "dilations"]),
    ("ceil_window_in_padding_before_opset_22", (2, 3, 5),
     [node("MaxPool", ["h"], "output", kernel_shape=[2], strides=[2], pads=[1, 1],
           ceil_mode=1)], 17, ["ceil_mode", "opset"]),
    ("pool_4d", (1, 2, 3, 4, 5, 3), [node("MaxPool", ["h"], "output",
                                         kernel_shape=[2, 2, 2, 2])], 17, ["1-D", "2-D", "3-D"]),
    ("clip_computed_min", (5, 7), [node("ReduceMean", ["input"], "low", keepdims=0),
                                   node("Clip", ["h", "low"], "output")], 17, ["min"]),
]


def error_model(shape, nodes, opset, with_indices=False, pool_first=False):
    """h = input + b, then nodes; or with pool_first the first node reads the input and
    its output is added to b. with_indices gives the nodes a second output."""
    first = [helper.make_node("Add", ["input", "b"], ["h"], name="add_0")]
    rest = []
    for i, (op_type, inputs, output, attrs) in enumerate(nodes, 1):
        outputs = [output, "indices"] if with_indices else [output]
        rest.append(helper.make_node(op_type, inputs, outputs, name=f"{op_type}_{i}", **attrs))
    if pool_first:
        first = [helper.make_node("Add", ["output", "b"], ["sum"], name="add_0")]
        rest[0].input[0] = "input"
    graph = helper.make_graph(
        rest + first if pool_first else first + rest, "errors",
        [helper.make_tensor_value_info("input", onnx.TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info("sum" if pool_first else "output",
                                       onnx.TensorProto.FLOAT, [f"d{i}" for i in shape])],
        initializer=[onnx.numpy_helper.from_array(np.ones((), np.float32), "b")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)],
                             ir_version=8)


def expect_unsupported(tmp_path, model, node_name, words, **kwargs):
    with pytest.raises(mh.UnsupportedOpError) as error:
        mh.generate_artifacts(model, loss="MSELoss", optimizer="SGD", artifact_directory=tmp_path,
                              **kwargs)
    message = str(error.value)
    assert node_name in message and all(w in message for w in words), message


@pytest.mark.parametrize("name,shape,nodes,opset,words", ERROR_CASES,
                         ids=[c[0] for c in ERROR_CASES])
def test_unsupported_attributes_fail_naming_node_and_attribute(tmp_path, name, shape, nodes,
                                                                opset, words):
    model = error_model(shape, nodes, opset, with_indices=name == "indices_output")
    expect_unsupported(tmp_path, model, f"{nodes[-1][0]}_{len(nodes)}", words)


def test_unsupported_pool_without_gradient_fails_in_lowering(tmp_path):
    # MaxPool on the input, before any parameter: no gradient rule runs, the lowering
    # must refuse it.
    model = error_model(HW, [node("MaxPool", ["h"], "output", kernel_shape=[2, 2],
                                  storage_order=1)], 17, pool_first=True)
    expect_unsupported(tmp_path, model, "MaxPool_1", ["storage_order"])


def test_clip_bounds_that_are_parameters_fail(tmp_path):
    # A float initializer is a parameter: trainable (it would need a gradient) or frozen
    # (its value may change on the device); either way not a constant bound.
    model = error_model((5, 7), [node("Clip", ["h", "low"], "output")], 17)
    model.graph.initializer.append(onnx.numpy_helper.from_array(np.float32(-1.0), "low"))
    expect_unsupported(tmp_path / "trainable", model, "Clip_1", ["min"])
    expect_unsupported(tmp_path / "frozen", model, "Clip_1", ["min"], frozen_params=["low"])


# -- a torch model with every op of this file, trained for several steps ----------------

class PoolNet(torch.nn.Module):
    """2-D and 1-D pooling and the activations, exported the way torch exports them."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.scale = torch.nn.Parameter(torch.rand(2, 7, 9) + 0.5)
        self.fc = torch.nn.Linear(2, 3)

    def forward(self, x):
        h = F.max_pool2d(x * self.scale, 3, 2, 1, ceil_mode=True)                # 4 x 5
        h = F.leaky_relu(h, 0.1)
        h = F.avg_pool2d(h, 2, 1, 1, ceil_mode=True, count_include_pad=True)     # 5 x 6
        h = F.relu6(F.hardswish(h)).flatten(2)                                   # 30
        h = F.hardsigmoid(F.max_pool1d(h, 3, 2, 1, dilation=2))                  # 14
        h = F.avg_pool1d(h, 3, 2, 1, count_include_pad=False)                    # 7
        h = F.adaptive_avg_pool1d(h, 1) + F.adaptive_max_pool1d(h, 1)
        return self.fc(h.flatten(1))


STEPS, BATCH, LR = 10, 4, 0.1


@pytest.fixture(scope="module")
def pool_net(tmp_path_factory):
    """PoolNet trained by torch and by the device runtime under CPython."""
    directory = tmp_path_factory.mktemp("pool_net")
    model = PoolNet()
    onnx_model = export(model, torch.zeros(BATCH, 2, 7, 9))
    ops = {n.op_type for n in onnx_model.graph.node}
    assert {"MaxPool", "AveragePool", "GlobalAveragePool", "GlobalMaxPool", "LeakyRelu",
            "HardSwish", "Clip", "HardSigmoid"} <= ops, ops
    mh.generate_artifacts(onnx_model, loss="MSELoss", optimizer="SGD",
                          artifact_directory=directory, batch_size=BATCH)
    rng = np.random.default_rng(3)
    xs = rng.standard_normal((STEPS, BATCH, 2, 7, 9)).astype(np.float32)
    ys = rng.standard_normal((STEPS, BATCH, 3)).astype(np.float32)
    write_batches(directory / "data.bin", xs, ys)
    reference = torch_train(copy.deepcopy(model), "MSELoss", "SGD", xs, ys, LR)
    device = run_device_cpython(directory, directory / "data.bin", STEPS, LR)
    return directory, reference, device


def test_pool_net_trains_like_torch(pool_net):
    _, (torch_losses, torch_params), (losses, params, _) = pool_net
    assert relative_error(losses, torch_losses) <= GRAD_TOLERANCE
    assert np.max(np.abs(params - torch_params)) <= GRAD_TOLERANCE * max(
        1.0, np.max(np.abs(torch_params)))


def test_pool_net_micropython_matches_cpython(pool_net, micropython):
    directory, _, (losses, params, eval_loss) = pool_net
    out = run_micropython(micropython, ROOT / "tests" / "device_scripts" / "train_steps.py",
                          directory, directory / "data.bin", STEPS, repr(LR))
    mp_losses, mp_params, mp_eval = parse_run(out)
    assert relative_error(mp_losses, losses) <= FORWARD_TOLERANCE
    assert np.max(np.abs(mp_params - params)) <= FORWARD_TOLERANCE * max(
        1.0, np.max(np.abs(params)))
    assert abs(mp_eval - eval_loss) <= FORWARD_TOLERANCE * max(1.0, abs(eval_loss))


def test_pool_net_steps_do_not_grow_the_micropython_heap(pool_net, micropython):
    directory = pool_net[0]
    before, after = run_micropython(micropython, ROOT / "tests" / "device_scripts" /
                                    "heap_steps.py", directory, 20).split()
    assert int(after) == int(before)


def test_shrink_micropython_matches_cpython(tmp_path, micropython):
    # torch exports its shrinks as Where / Greater / Less, never Shrink: a hand-built model
    # (Gemm, then Shrink) trained a few SGD steps under both interpreters.
    rng = np.random.default_rng(3)
    params = {"W": rng.standard_normal((6, 4)).astype(np.float32),
              "bias": np.zeros(4, np.float32)}
    model = build_model((BATCH, 6), params,
                        [node("Gemm", ["input", "W", "bias"], "h"),
                         node("Shrink", ["h"], "output", lambd=0.3, bias=0.1)], (BATCH, 4))
    mh.generate_artifacts(model, loss="MSELoss", optimizer="SGD", artifact_directory=tmp_path)
    xs = rng.standard_normal((STEPS, BATCH, 6)).astype(np.float32)
    ys = rng.standard_normal((STEPS, BATCH, 4)).astype(np.float32)
    write_batches(tmp_path / "data.bin", xs, ys)
    losses, trained, eval_loss = run_device_cpython(tmp_path, tmp_path / "data.bin", STEPS, LR)
    out = run_micropython(micropython, ROOT / "tests" / "device_scripts" / "train_steps.py",
                          tmp_path, tmp_path / "data.bin", STEPS, repr(LR))
    mp_losses, mp_trained, mp_eval = parse_run(out)
    assert relative_error(mp_losses, losses) <= 1e-5
    assert relative_error(mp_trained, trained) <= 1e-5
    assert relative_error(mp_eval, eval_loss) <= 1e-5
    assert losses[-1] < losses[0]


def test_thresholded_relu_micropython_matches_cpython(tmp_path, micropython):
    # torch exports its threshold as Where / Greater: a hand-built model (Gemm, then
    # ThresholdedRelu) trained a few SGD steps under both interpreters
    rng = np.random.default_rng(4)
    params = {"W": rng.standard_normal((6, 4)).astype(np.float32),
              "bias": np.zeros(4, np.float32)}
    model = build_model((BATCH, 6), params,
                        [node("Gemm", ["input", "W", "bias"], "h"),
                         node("ThresholdedRelu", ["h"], "output", alpha=0.2)], (BATCH, 4))
    mh.generate_artifacts(model, loss="MSELoss", optimizer="SGD", artifact_directory=tmp_path)
    xs = rng.standard_normal((STEPS, BATCH, 6)).astype(np.float32)
    ys = rng.standard_normal((STEPS, BATCH, 4)).astype(np.float32)
    write_batches(tmp_path / "data.bin", xs, ys)
    losses, trained, eval_loss = run_device_cpython(tmp_path, tmp_path / "data.bin", STEPS, LR)
    out = run_micropython(micropython, ROOT / "tests" / "device_scripts" / "train_steps.py",
                          tmp_path, tmp_path / "data.bin", STEPS, repr(LR))
    mp_losses, mp_trained, mp_eval = parse_run(out)
    assert relative_error(mp_losses, losses) <= 1e-5
    assert relative_error(mp_trained, trained) <= 1e-5
    assert relative_error(mp_eval, eval_loss) <= 1e-5
    assert losses[-1] < losses[0]
