"""Per-op gradient tests: one tiny hand-built ONNX model per case, trained for one step on the
device runtime (CPython), against the same computation in PyTorch autograd; the eval forward
pass against onnxruntime running the original model.

A case is one row of CASES: (name, input shape, parameters {name: shape}, nodes, torch function
[, opset, default 17]).
Nodes read "input", the parameters and earlier outputs, and the last one writes "output"; the
loss block is MSELoss. The torch function gets the input and the parameters as float64 tensors
and returns the output."""
import copy
import zlib

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

import microtrain_host as mh
from microtrain import CheckpointState, Module, TrainingError
from conftest import ROOT, run_micropython
from torch_reference import export, parse_run, run_device_cpython, torch_train, write_batches

M, K, N = 3, 5, 7          # odd sizes, so a transposed or broadcast operand cannot pass by luck
GRAD_TOLERANCE = 1e-4
FORWARD_TOLERANCE = 1e-5


# -- building models -------------------------------------------------------------------

def node(op_type, inputs, output, **attrs):
    """(op_type, inputs, output, attrs); the node name is given when the model is built."""
    return (op_type, list(inputs), output, attrs)


def const(output, value):
    """A Constant node, as torch.onnx emits them for shapes, axes and exponents."""
    return node("Constant", [], output, value=numpy_helper.from_array(np.asarray(value), output))


def build_model(input_shape, params, nodes, output_shape, opset=17):
    # A node's output is a name, or a list of names (Split).
    onnx_nodes = [helper.make_node(op, ins, out if isinstance(out, list) else [out],
                                   name=f"{op.lower()}_{i}", **attrs)
                  for i, (op, ins, out, attrs) in enumerate(nodes)]
    graph = helper.make_graph(
        onnx_nodes, "op_test",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, list(input_shape))],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, list(output_shape))],
        initializer=[numpy_helper.from_array(v, k) for k, v in params.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)],
                              ir_version=8)
    onnx.checker.check_model(model)
    return model


def relative_error(actual, expected):
    """max over elements of |a - b| / max(|b|, 1e-3)."""
    actual = np.asarray(actual, np.float64).reshape(-1)
    expected = np.asarray(expected, np.float64).reshape(-1)
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    if not expected.size:
        return 0.0
    return float(np.max(np.abs(actual - expected) / np.maximum(np.abs(expected), 1e-3)))


# -- the table of cases ----------------------------------------------------------------

def shape_id(shape):
    return "x".join(map(str, shape)) if len(shape) else "scalar"


def gemm_case(trans_a, trans_b, c_shape, alpha=None, beta=None):
    """Y = Gemm(A, B[, C]) + input, A, B and C trainable."""
    name = f"Gemm_tA{trans_a}_tB{trans_b}_C{'none' if c_shape is None else shape_id(c_shape)}"
    attrs = {"transA": trans_a, "transB": trans_b}
    if alpha is not None:
        attrs["alpha"] = alpha
        name += f"_alpha{alpha}"
    if beta is not None:
        attrs["beta"] = beta
        name += f"_beta{beta}"
    params = {"A": (K, M) if trans_a else (M, K), "B": (N, K) if trans_b else (K, N)}
    inputs = ["A", "B"]
    if c_shape is not None:
        params["C"] = c_shape
        inputs.append("C")

    def reference(x, p):
        a = p["A"].T if trans_a else p["A"]
        b = p["B"].T if trans_b else p["B"]
        y = (1.0 if alpha is None else alpha) * (a @ b)
        if c_shape is not None:
            y = y + (1.0 if beta is None else beta) * p["C"]
        return y + x

    return (name, (M, N), params,
            [node("Gemm", inputs, "y", **attrs), node("Add", ["y", "input"], "output")],
            reference)


def binary_case(op, shape_a, shape_b):
    """Y = op(a, b) + input with both operands trainable and broadcast against each other."""
    out_shape = np.broadcast_shapes(shape_a, shape_b)
    fn = {"Add": torch.add, "Sub": torch.sub, "Mul": torch.mul, "Div": torch.div}[op]
    return (f"{op}_{shape_id(shape_a)}_{shape_id(shape_b)}", out_shape,
            {"a": shape_a, "b": shape_b},
            [node(op, ["a", "b"], "y"), node("Add", ["y", "input"], "output")],
            lambda x, p: fn(p["a"], p["b"]) + x)


def unary_case(name, op_nodes, fn, shape=(K, N)):
    """Y = op(input * w), w trainable; op_nodes read "h" and write "output"."""
    return (name, shape, {"w": shape}, [node("Mul", ["input", "w"], "h")] + op_nodes,
            lambda x, p: fn(x * p["w"]))


def reduce_case(op, axes, keepdims, shape=(M, K, N), opset=17, noop=None):
    """Y = Reduce(input * w); ReduceSum takes axes as an input, ReduceMean as an attribute
    before opset 18 and as an input from opset 18 on. axes=None: no axes; []: an empty axes
    input. noop: the noop_with_empty_axes attribute (1: no axes reduce nothing)."""
    nodes = []
    attrs = {"keepdims": keepdims}
    if noop is not None:
        attrs["noop_with_empty_axes"] = noop
    inputs = ["h"]
    if axes is not None and (op == "ReduceSum" or opset >= 18):
        nodes.append(const("axes", np.array(axes, np.int64)))
        inputs.append("axes")
    elif axes is not None:
        attrs["axes"] = axes
    nodes.append(node(op, inputs, "output", **attrs))
    dims = axes or list(range(len(shape)))
    fn = torch.sum if op == "ReduceSum" else torch.mean
    axes_id = "all" if axes is None else ",".join(map(str, axes)) or "empty"
    name = f"{op}_axes{axes_id}_keepdims{keepdims}"
    if noop is not None:
        name += f"_noop_with_empty_axes{noop}"
    if opset != 17:
        name += f"_opset{opset}"
    if noop and not axes:
        return unary_case(name, nodes, lambda h: h, shape) + (opset,)
    return unary_case(name, nodes, lambda h: fn(h, dim=dims, keepdim=bool(keepdims)),
                      shape) + (opset,)


def softmax_case(op, axis, shape):
    fn = torch.softmax if op == "Softmax" else torch.log_softmax
    attrs = {} if axis is None else {"axis": axis}
    return unary_case(f"{op}_axis{'default' if axis is None else axis}_{shape_id(shape)}",
                      [node(op, ["h"], "output", **attrs)],
                      lambda h: fn(h, dim=-1 if axis is None else axis), shape)


def pow_case(exponent):
    return unary_case(f"Pow_{exponent}", [const("p", np.array(exponent, np.float32)),
                                          node("Pow", ["h", "p"], "output")],
                      lambda h: h ** exponent)


def simple(op, fn, shape=(K, N)):
    return unary_case(op, [node(op, ["h"], "output")], fn, shape)


BROADCASTS = [((M, K), (M, K)),      # same shape
              ((M, K), (1, K)),      # row vector
              ((1, K), (M, K)),
              ((M, K), (M, 1)),      # column vector
              ((M, K), ()),          # scalar
              ((), (M, K)),
              ((K,), (M, K)),        # rank 1 vs rank 2
              ((M, K), (K,)),
              ((M, 1), (1, K)),      # both broadcast
              ((M, 1, N), (K, 1))]   # rank 3, both broadcast

CASES = (
    [gemm_case(ta, tb, (N,)) for ta in (0, 1) for tb in (0, 1)]
    + [gemm_case(ta, tb, (M, N), alpha=0.7, beta=1.3) for ta in (0, 1) for tb in (0, 1)]
    + [gemm_case(0, 1, c, alpha=0.5, beta=2.0) for c in (None, (N,), (1, N), (M, 1), (M, N), ())]
    + [gemm_case(1, 0, None, alpha=-1.5, beta=3.0)]  # beta without C is ignored
    + [("Gemm_linear_input_A", (M, K), {"W": (N, K), "bias": (N,)},
        [node("Gemm", ["input", "W", "bias"], "output", transB=1)],
        lambda x, p: x @ p["W"].T + p["bias"]),
       ("MatMul_params", (M, N), {"A": (M, K), "B": (K, N)},
        [node("MatMul", ["A", "B"], "y"), node("Add", ["y", "input"], "output")],
        lambda x, p: p["A"] @ p["B"] + x),
       ("MatMul_input", (M, K), {"W": (K, N)}, [node("MatMul", ["input", "W"], "output")],
        lambda x, p: x @ p["W"])]
    + [binary_case(op, a, b) for op in ("Add", "Sub", "Mul", "Div") for a, b in BROADCASTS]
    + [("Mul_input_row", (M, K), {"w": (K,)}, [node("Mul", ["input", "w"], "output")],
        lambda x, p: x * p["w"]),
       ("Sub_column_input", (M, K), {"w": (M, 1)}, [node("Sub", ["w", "input"], "output")],
        lambda x, p: p["w"] - x),
       ("Div_input_by_column", (M, K), {"w": (M, 1)}, [node("Div", ["input", "w"], "output")],
        lambda x, p: x / p["w"]),
       ("Mul_same_operand", (M, K), {"w": (M, K)},
        [node("Mul", ["w", "w"], "y"), node("Add", ["y", "input"], "output")],
        lambda x, p: p["w"] * p["w"] + x),
       ("Gemm_C_is_input", (M, N), {"A": (M, K), "B": (K, N)},
        [node("Gemm", ["A", "B", "input"], "output", beta=0.5)],
        lambda x, p: p["A"] @ p["B"] + 0.5 * x),
       ("Tanh_times_itself_fan_out", (M, K), {"w": (M, K)},   # two paths back to w
        [node("Tanh", ["w"], "t"), node("Mul", ["t", "w"], "y"),
         node("Add", ["y", "input"], "output")],
        lambda x, p: torch.tanh(p["w"]) * p["w"] + x),
       ("Identity_of_param", (M, K), {"w": (M, K)},   # output aliases a parameter
        [node("Identity", ["w"], "output")], lambda x, p: p["w"] + 0 * x),
       ("Reshape_of_param", (M, K), {"w": (K, M)},
        [const("shape", np.array([M, K], np.int64)), node("Reshape", ["w", "shape"], "output")],
        lambda x, p: p["w"].reshape(M, K) + 0 * x)]
    + [simple("Relu", torch.relu), simple("Sigmoid", torch.sigmoid), simple("Tanh", torch.tanh),
       simple("Identity", lambda h: h), simple("Neg", torch.neg), simple("Abs", torch.abs),
       simple("Exp", torch.exp), simple("Log", torch.log), simple("Sqrt", torch.sqrt),
       pow_case(2.0), pow_case(3.0), pow_case(0.5), pow_case(-1.0)]
    + [softmax_case(op, axis, shape) for op in ("Softmax", "LogSoftmax")
       for axis, shape in ((None, (K, N)), (-1, (K, N)), (0, (K, N)),
                           (-1, (M, K, N)), (0, (M, K, N)), (1, (M, K, N)))]
    + [unary_case(f"Flatten_axis{axis}", [node("Flatten", ["h"], "output", axis=axis)],
                  lambda h, axis=axis: h.reshape(int(np.prod(h.shape[:axis])), -1), (M, K, N))
       for axis in (0, 1, 2)]
    + [unary_case(f"Reshape_{','.join(map(str, shape))}",
                  [const("shape", np.array(shape, np.int64)),
                   node("Reshape", ["h", "shape"], "output")],
                  lambda h, shape=shape: h.reshape([M if d == 0 else d for d in shape]),
                  (M, K, N))
       for shape in ([-1, N], [0, -1], [N, K, M])]
    + [unary_case("Unsqueeze_1", [const("axes", np.array([1], np.int64)),
                                  node("Unsqueeze", ["h", "axes"], "output")],
                  lambda h: h.unsqueeze(1)),
       unary_case("Squeeze_1", [const("axes", np.array([1], np.int64)),
                                node("Squeeze", ["h", "axes"], "output")],
                  lambda h: h.squeeze(1), (K, 1, N)),
       simple("Softplus", torch.nn.functional.softplus)]
    + [reduce_case(op, axes, keepdims) for op in ("ReduceSum", "ReduceMean")
       for axes, keepdims in (([1], 1), ([1], 0), ([0, 2], 0), ([-1], 1), (None, 1),
                              (None, 0))]
    # opset 18: ReduceMean's axes become an input too; an empty axes input reduces all
    + [reduce_case(op, axes, keepdims, opset=18) for op in ("ReduceSum", "ReduceMean")
       for axes, keepdims in (([1], 1), ([0, 2], 0), ([-1], 0), ([], 1), ([], 0))]
    # noop_with_empty_axes=1: without axes (none or empty) the reduction is the identity;
    # given axes still reduce (ReduceSum has the attribute from opset 13, ReduceMean from 18)
    + [reduce_case(op, axes, keepdims, opset=opset, noop=1)
       for op, opset in (("ReduceSum", 17), ("ReduceSum", 18), ("ReduceMean", 18))
       for axes, keepdims in ((None, 1), ([], 0), ([1], 0))]
    + [reduce_case("ReduceMean", None, 0, opset=18, noop=0)]
    # Pow with a tensor exponent: trained, broadcast either way, or an integer constant
    # (negative bases then have real powers)
    + [("PowTensor_trained_exponent_column", (K, N), {"w": (K, N), "e": (K, 1)},
        [node("Mul", ["input", "w"], "h"), node("Pow", ["h", "e"], "output")],
        lambda x, p: (x * p["w"]) ** p["e"]),
       ("PowTensor_trained_base_row", (K, N), {"w": (N,)},
        [node("Pow", ["w", "input"], "output")],
        lambda x, p: p["w"] ** x),
       ("PowTensor_exponent_computed_on_the_device", (K, N), {"w": (K, N)},
        [node("Mul", ["input", "w"], "h"), node("ReduceMean", ["input"], "e", keepdims=0),
         node("Pow", ["h", "e"], "output")],
        lambda x, p: (x * p["w"]) ** x.mean()),
       ("PowIntegerExponents", (K, N), {"w": (K, N)},
        [node("Mul", ["input", "w"], "h"),
         const("e", np.array([0, 1, 2, 3, -1, -2, 4], np.int64)),
         node("Pow", ["h", "e"], "output")],
        lambda x, p: (x * p["w"]) ** torch.tensor([0, 1, 2, 3, -1, -2, 4], dtype=torch.float64))]
)
# A row may end with its opset (default 17).
CASES = [case if len(case) == 6 else case + (17,) for case in CASES]

POSITIVE = ("Log", "Sqrt", "Div", "Pow_0.5", "Pow_-1", "PowTensor")  # values must stay positive


def case_values(name, input_shape, param_shapes):
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    low, high = (0.5, 1.5) if name.startswith(POSITIVE) else (-1.0, 1.0)
    x = rng.uniform(low, high, input_shape).astype(np.float32)
    params = {k: rng.uniform(low, high, s).astype(np.float32) for k, s in param_shapes.items()}
    return x, params, rng


def torch_reference(fn, x, params, target_of):
    """(loss, output, {param: grad}, target) of MSELoss(fn(x, params), target), in float64
    autograd; target_of(output shape) draws the target."""
    p = {k: torch.tensor(v, dtype=torch.float64, requires_grad=True) for k, v in params.items()}
    out = fn(torch.tensor(x, dtype=torch.float64), p)
    target = torch.tensor(target_of(tuple(out.shape)), dtype=torch.float64)
    loss = torch.nn.functional.mse_loss(out, target)
    loss.backward()
    return loss.item(), out.detach().numpy(), {k: v.grad.numpy() for k, v in p.items()}, target


@pytest.mark.parametrize("name,input_shape,param_shapes,nodes,fn,opset", CASES,
                         ids=[c[0] for c in CASES])
def test_op_gradient(tmp_path, name, input_shape, param_shapes, nodes, fn, opset):
    check_case(tmp_path, name, input_shape, param_shapes, nodes, fn, opset)


def check_case(tmp_path, name, input_shape, param_shapes, nodes, fn, opset,
               grad_tolerance=GRAD_TOLERANCE, values=case_values):
    """One case of CASES: a device training step against torch autograd in float64 (loss and
    gradients within grad_tolerance), the eval forward against onnxruntime. values(name,
    input shape, parameter shapes) draws the input and the parameters. Returns the input,
    the target and torch's gradients."""
    x, params, rng = values(name, input_shape, param_shapes)
    loss, out, grads, target = torch_reference(
        fn, x, params, lambda shape: rng.standard_normal(shape).astype(np.float32))
    model = build_model(input_shape, params, nodes, out.shape, opset)
    target = target.numpy().astype(np.float32)

    mh.generate_artifacts(model, loss="MSELoss", optimizer="SGD", artifact_directory=tmp_path)
    state = CheckpointState.load_checkpoint(str(tmp_path / "checkpoint"))
    device = Module(str(tmp_path / "model.mtb"), state)
    x_flat, target_flat = x.reshape(-1).tolist(), target.reshape(-1).tolist()

    device_loss = device(x_flat, target_flat)
    assert relative_error(device_loss, loss) <= grad_tolerance, (device_loss, loss)
    for param, expected in grads.items():
        actual = np.array(state.parameters[param].grad.tolist())
        assert relative_error(actual, expected) <= grad_tolerance, (param, actual, expected)

    device.eval()
    device_out = device(x_flat, target_flat)
    (ort_out,) = ort.InferenceSession(model.SerializeToString(),
                                      providers=["CPUExecutionProvider"]).run(None, {"input": x})
    assert ort_out.shape == out.shape
    # onnxruntime's float32 kernels may stand off the float64 result (its erf 2e-5, its
    # opset-21 GroupNormalization 1.2e-4): that distance (relative to onnxruntime's values)
    # is allowed on top, and the device must be within tolerance of float64 itself.
    ort_rounding = relative_error(out, ort_out)
    assert relative_error(device_out[1].tolist(), ort_out) <= FORWARD_TOLERANCE + ort_rounding
    assert relative_error(device_out[1].tolist(), out) <= FORWARD_TOLERANCE
    assert relative_error(device_out[0], loss) <= grad_tolerance
    return x, target, grads


def check_exported_module(tmp_path, module, x, opset=17, grad_tolerance=GRAD_TOLERANCE,
                          seed=0):
    """A torch module exported as torch.onnx writes it at `opset`: one device training step
    (MSELoss against a random target) against the module's float64 autograd, parameters
    matched by name; the eval forward against onnxruntime. Returns the exported model."""
    model = export(module, torch.from_numpy(x), dynamic_batch=False, opset=opset)
    reference = copy.deepcopy(module).double()
    torch_x = torch.from_numpy(x.astype(np.float64) if x.dtype.kind == "f" else x)
    out = reference(torch_x)
    target = np.random.default_rng(seed).standard_normal(tuple(out.shape)).astype(np.float32)
    loss = torch.nn.functional.mse_loss(out, torch.from_numpy(target).double())
    loss.backward()
    mh.generate_artifacts(model, loss="MSELoss", optimizer="SGD", artifact_directory=tmp_path)
    state = CheckpointState.load_checkpoint(str(tmp_path / "checkpoint"))
    device = Module(str(tmp_path / "model.mtb"), state)
    x_flat, target_flat = x.reshape(-1).tolist(), target.reshape(-1).tolist()
    assert relative_error(device(x_flat, target_flat), loss.item()) <= grad_tolerance
    for name, p in reference.named_parameters():
        actual = np.array(state.parameters[name].grad.tolist())
        assert relative_error(actual, p.grad.numpy()) <= grad_tolerance, name
    device.eval()
    device_out = device(x_flat, target_flat)[1].tolist()
    (ort_out,) = ort.InferenceSession(model.SerializeToString(),
                                      providers=["CPUExecutionProvider"]).run(None, {"input": x})
    # Against the output's scale, as test_models compares parameters: an output that is a
    # cancellation of O(1) float32 terms (a normalised value near 0) carries ~1e-7 absolute
    # rounding in any float32 implementation, onnxruntime's included.
    for expected in (ort_out, out.detach().numpy()):
        scale = max(1.0, float(np.max(np.abs(expected))))
        error = np.max(np.abs(np.array(device_out) - np.reshape(expected, -1)))
        assert error <= FORWARD_TOLERANCE * scale, (error, scale)
    return model


def check_micropython_training(tmp_path, micropython, module, input_shape, output_shape,
                               steps=6, lr=0.05, seed=8):
    """A torch module (float input, MSELoss, SGD) trained a few steps by torch, by the device
    under CPython (losses within 1e-4 of torch's) and under MicroPython (losses, parameters
    and eval loss within 1e-5 of CPython's)."""
    mh.generate_artifacts(export(module, torch.zeros(input_shape)), loss="MSELoss",
                          optimizer="SGD", artifact_directory=tmp_path,
                          batch_size=input_shape[0])
    rng = np.random.default_rng(seed)
    xs = rng.standard_normal((steps,) + tuple(input_shape)).astype(np.float32)
    ys = rng.standard_normal((steps,) + tuple(output_shape)).astype(np.float32)
    write_batches(tmp_path / "data.bin", xs, ys)
    torch_losses, _ = torch_train(copy.deepcopy(module), "MSELoss", "SGD", xs, ys, lr)
    losses, params, eval_loss = run_device_cpython(tmp_path, tmp_path / "data.bin", steps, lr)
    assert relative_error(losses, torch_losses) <= GRAD_TOLERANCE
    out = run_micropython(micropython, ROOT / "tests" / "device_scripts" / "train_steps.py",
                          tmp_path, tmp_path / "data.bin", steps, repr(lr))
    mp_losses, mp_params, mp_eval = parse_run(out)
    assert relative_error(mp_losses, losses) <= 1e-5
    assert relative_error(mp_params, params) <= 1e-5
    assert relative_error(mp_eval, eval_loss) <= 1e-5


# -- ops microtrain cannot handle fail loudly, naming the op and the node ---------------

def test_op_without_gradient_rule_names_op_and_node(tmp_path):
    # Cos on the path from the trainable w to the loss: autodiff needs its gradient.
    params = {"w": np.ones((M, K), np.float32)}
    model = build_model((M, K), params, [node("Mul", ["input", "w"], "h"),
                                         node("Cos", ["h"], "output")], (M, K))
    with pytest.raises(mh.UnsupportedOpError) as error:
        mh.generate_artifacts(model, loss="MSELoss", optimizer="SGD", artifact_directory=tmp_path)
    assert "Cos" in str(error.value) and "cos_1" in str(error.value)


def test_op_without_kernel_names_op_and_node(tmp_path):
    # Cos on the input, before the first trainable layer: no gradient flows through it, so
    # autodiff passes, but the device has no kernel to run it forward.
    params = {"W": np.ones((N, K), np.float32), "bias": np.zeros((N,), np.float32)}
    model = build_model((M, K), params, [node("Cos", ["input"], "h"),
                                         node("Gemm", ["h", "W", "bias"], "output", transB=1)],
                        (M, N))
    with pytest.raises(mh.UnsupportedOpError) as error:
        mh.generate_artifacts(model, loss="MSELoss", optimizer="SGD", artifact_directory=tmp_path)
    assert "Cos" in str(error.value) and "cos_0" in str(error.value)


# -- IEEE special values: the device gives inf and NaN where onnxruntime does ----------

@pytest.mark.parametrize("op,exponent", [("Div", None), ("Pow", -1.0), ("Pow", -2.0),
                                         ("Pow", 0.5), ("Pow", 3.0)])
def test_special_values_match_onnxruntime(tmp_path, op, exponent):
    # Division by +-0 and powers of zero and of negative numbers raise in Python
    # (ZeroDivisionError, or a complex result); the kernels must give ONNX's inf and NaN, so
    # that training stops with TrainingError instead of an exception deep in a kernel.
    x = np.array([[1.0, -1.0, 0.0, 2.0, -0.5], [0.0, 3.0, -2.0, -0.0, 0.25]], np.float32)
    if op == "Div":
        params = {"w": np.array([[0.0, 0.0, 0.0, -0.0, -0.0], [1.0, -0.0, 0.5, 0.0, 2.0]],
                                np.float32)}
        nodes = [node("Div", ["input", "w"], "output")]
    else:
        params = {"w": np.ones(x.shape, np.float32)}
        nodes = [node("Mul", ["input", "w"], "h"), const("p", np.array(exponent, np.float32)),
                 node("Pow", ["h", "p"], "output")]
    model = build_model(x.shape, params, nodes, x.shape)
    mh.generate_artifacts(model, loss="MSELoss", optimizer="SGD", artifact_directory=tmp_path)
    device = Module(str(tmp_path / "model.mtb"),
                    CheckpointState.load_checkpoint(str(tmp_path / "checkpoint")))
    target = [0.0] * x.size
    (expected,) = ort.InferenceSession(model.SerializeToString(),
                                       providers=["CPUExecutionProvider"]).run(None, {"input": x})
    actual = np.array(device.eval()(x.reshape(-1).tolist(), target)[1].tolist())
    np.testing.assert_allclose(actual, expected.reshape(-1), rtol=FORWARD_TOLERANCE,
                               equal_nan=True)
    if not np.all(np.isfinite(expected)):
        with pytest.raises(TrainingError):
            device.train()(x.reshape(-1).tolist(), target)


def test_pow_tensor_exponent_at_its_special_values(tmp_path):
    # Zero bases, zero exponents, negative bases with integer exponents: the outputs where
    # onnxruntime gives them and the gradients of torch's pow backward, which takes the
    # limits (0 for dX where P == 0, 0 for dP where X == 0 and P >= 0) and NaN for the
    # exponent's gradient at a negative base.
    x = np.array([[0.0, 0.0, 2.0, -1.0, 0.5, -2.0, -0.0]], np.float32)
    exponents = np.array([[0.0, 2.0, 0.0, 3.0, -1.0, 2.0, 1.5]], np.float32)
    params = {"w": np.ones(x.shape, np.float32), "e": exponents}
    model = build_model(x.shape, params, [node("Mul", ["input", "w"], "h"),
                                          node("Pow", ["h", "e"], "output")], x.shape)
    mh.generate_artifacts(model, loss="MSELoss", optimizer="SGD", artifact_directory=tmp_path)
    state = CheckpointState.load_checkpoint(str(tmp_path / "checkpoint"))
    device = Module(str(tmp_path / "model.mtb"), state)
    target = np.zeros(x.shape, np.float32)
    w = torch.ones(x.shape, dtype=torch.float64, requires_grad=True)
    e = torch.tensor(exponents, dtype=torch.float64, requires_grad=True)
    out = (torch.tensor(x, dtype=torch.float64) * w) ** e
    torch.nn.functional.mse_loss(out, torch.tensor(target, dtype=torch.float64)).backward()
    # The NaN gradient (as torch's) makes the device refuse the train call (no optimizer
    # step may use it); the gradients it computed are still in their buffers.
    with pytest.raises(TrainingError, match="^a gradient is nan"):
        device(x.reshape(-1).tolist(), target.reshape(-1).tolist())
    for name, expected in (("w", w.grad), ("e", e.grad)):
        np.testing.assert_allclose(np.array(state.parameters[name].grad.tolist()),
                                   expected.numpy().reshape(-1), rtol=1e-5, atol=1e-7,
                                   equal_nan=True, err_msg=name)
    (expected,) = ort.InferenceSession(model.SerializeToString(),
                                       providers=["CPUExecutionProvider"]).run(None, {"input": x})
    actual = np.array(device.eval()(x.reshape(-1).tolist(), target.reshape(-1).tolist())[1])
    np.testing.assert_allclose(actual, expected.reshape(-1), rtol=FORWARD_TOLERANCE,
                               equal_nan=True)


class PowNet(torch.nn.Module):
    """A trained exponent per output (torch exports the parameter as Pow's exponent)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(2)
        self.fc = torch.nn.Linear(6, 3)
        self.exponent = torch.nn.Parameter(torch.rand(3) + 0.5)

    def forward(self, x):
        return torch.sigmoid(self.fc(x)) ** self.exponent


def test_pow_tensor_micropython_matches_cpython_and_torch(tmp_path, micropython):
    check_micropython_training(tmp_path, micropython, PowNet(), (4, 6), (4, 3))


def test_pow_frozen_exponent_is_read_from_the_device(tmp_path):
    # A frozen parameter is not a constant: the device can give it another value (through
    # its arena view, copy_buffer_to_parameters, a federated round), and the forward pass
    # and the gradient must both use that one.
    rng = np.random.default_rng(9)
    x = rng.uniform(0.5, 1.5, (K, N)).astype(np.float32)
    params = {"w": rng.uniform(0.5, 1.5, (K, N)).astype(np.float32), "e": np.float32(2.0)}
    model = build_model((K, N), params, [node("Mul", ["input", "w"], "h"),
                                         node("Pow", ["h", "e"], "output")], (K, N))
    mh.generate_artifacts(model, loss="MSELoss", optimizer="SGD", frozen_params=["e"],
                          artifact_directory=tmp_path)
    state = CheckpointState.load_checkpoint(str(tmp_path / "checkpoint"))
    device = Module(str(tmp_path / "model.mtb"), state)
    state.parameters["e"].data[0] = 0.75
    target = rng.standard_normal((K, N)).astype(np.float32)
    w = torch.tensor(params["w"], dtype=torch.float64, requires_grad=True)
    out = (torch.tensor(x, dtype=torch.float64) * w) ** 0.75
    loss = torch.nn.functional.mse_loss(out, torch.tensor(target, dtype=torch.float64))
    loss.backward()
    assert relative_error(device(x.reshape(-1).tolist(), target.reshape(-1).tolist()),
                          loss.item()) <= GRAD_TOLERANCE
    assert relative_error(np.array(state.parameters["w"].grad.tolist()),
                          w.grad.numpy()) <= GRAD_TOLERANCE
