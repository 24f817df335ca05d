"""Max, Min, Sum, Mean (variadic, broadcasting) and PRelu (slope broadcast to X, trainable;
ops/elementwise.py, kernels/elementwise.py): per-op cases as in tests/test_ops.py against
float64 torch autograd within 1e-5 (and the training graph in onnx.reference), forward
against onnxruntime. Max / Min's oracle is torch.amax / amin over the broadcast inputs
stacked, which shares the gradient equally among tied inputs (torch.maximum's split for
two); the tie cases draw values from a coarse grid so that ties are common."""
import zlib

import numpy as np
import pytest
import torch

from test_ops import (check_case, check_exported_module, check_micropython_training, node,
                      relative_error, shape_id)
from test_ops_layout import reference_training_step

TOLERANCE = 1e-5
M, K, N = 3, 5, 7


def values(name, input_shape, param_shapes):
    """Uniform values, or for *_ties cases multiples of 0.5 in [-1, 1] (many ties)."""
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    if "ties" in name:
        draw = lambda s: (rng.integers(-2, 3, s) / 2.0).astype(np.float32)  # noqa: E731
    else:
        draw = lambda s: rng.uniform(-1.0, 1.0, s).astype(np.float32)  # noqa: E731
    return draw(input_shape), {k: draw(s) for k, s in param_shapes.items()}, rng


def stacked(reduce):
    def fn(*xs):
        return reduce(torch.stack(torch.broadcast_tensors(*xs)), 0)
    return fn


ORACLES = {"Max": stacked(torch.amax), "Min": stacked(torch.amin),
           "Sum": lambda *xs: sum(torch.broadcast_tensors(*xs)),
           "Mean": lambda *xs: sum(torch.broadcast_tensors(*xs)) / len(xs)}


def variadic_case(op, shapes, with_input=False, ties=False):
    """Y = op(p0, p1, ...[, input]) + input, every p trainable."""
    params = {f"p{i}": s for i, s in enumerate(shapes)}
    out_shape = tuple(np.broadcast_shapes(*shapes))
    names = list(params) + (["input"] if with_input else [])
    label = "_".join(shape_id(s) for s in shapes) + ("_input" if with_input else "") + (
        "_ties" if ties else "")

    def reference(x, p):
        xs = [p[k] for k in params] + ([x] if with_input else [])
        return ORACLES[op](*xs) + x

    return (f"{op}_{label}", out_shape, params,
            [node(op, names, "y"), node("Add", ["y", "input"], "output")], reference, 17)


def prelu_case(x_shape, slope_shape):
    """Y = PRelu(input * w, slope), w and slope trainable."""
    def reference(x, p):
        h = x * p["w"]
        return torch.where(h > 0, h, p["slope"] * h)

    return (f"PRelu_{shape_id(x_shape)}_slope{shape_id(slope_shape)}", x_shape,
            {"w": x_shape, "slope": slope_shape},
            [node("Mul", ["input", "w"], "h"), node("PRelu", ["h", "slope"], "output")],
            reference, 17)


def random_shapes(seed):
    """A random rank-3 shape and a copy with random dimensions broadcast (set to 1)."""
    rng = np.random.default_rng(seed)
    shape = rng.integers(2, 7, size=3)
    return tuple(int(d) for d in shape), tuple(int(d) for d in np.where(
        rng.random(3) < 0.5, 1, shape))


RANDOM = random_shapes(11)
CASES = (
    [variadic_case(op, shapes, with_input, ties)
     for op in ("Max", "Min", "Sum", "Mean")
     for shapes, with_input, ties in (
         (((M, K),), False, False),                  # one input: the identity
         (((M, K), (M, K)), False, False),
         (((M, K), (M, K)), False, True),            # ties: dY split in halves
         (((M, K), (1, K), (M, 1)), False, True),    # three-way ties, broadcast
         (((M, 1, N), (K, 1), (N,)), True, False),   # rank 3, four inputs
         ((RANDOM[0], RANDOM[1]), False, False))]
    + [prelu_case(x, s) for x, s in (
        ((2, M, N), (M, 1)),           # one slope per channel, as torch's PReLU(C) exports
        ((2, M, K, N), (M, 1, 1)),
        ((M, K), (1,)),                # one slope for everything: PReLU()
        ((M, K), (K,)),
        ((M, K), (M, K)),
        (RANDOM[0], RANDOM[0][-1:]))]
)


@pytest.mark.parametrize("name,input_shape,params,nodes,fn,opset", CASES,
                         ids=[c[0] for c in CASES])
def test_variadic_op_gradient(tmp_path, name, input_shape, params, nodes, fn, opset):
    x, target, grads = check_case(tmp_path, name, input_shape, params, nodes, fn, opset,
                                  grad_tolerance=TOLERANCE, values=values)
    if name.startswith("Mean") and tuple(params["p0"]) != tuple(input_shape):
        return  # onnx.reference's Mean adds in place into its first input: no broadcasting
    _, reference_grads = reference_training_step(tmp_path, x, target)
    for param, expected in grads.items():
        assert relative_error(reference_grads[param], expected) <= TOLERANCE, param


class PReluNet(torch.nn.Module):
    def __init__(self, channels):
        super().__init__()
        torch.manual_seed(2)
        self.conv = torch.nn.Conv1d(3, 4, 3)
        self.act = torch.nn.PReLU(channels, init=0.2)

    def forward(self, x):
        return self.act(self.conv(x))


@pytest.mark.parametrize("channels", [1, 4])
def test_prelu_as_torch_exports_it(tmp_path, channels):
    x = np.random.default_rng(3).standard_normal((2, 3, 9)).astype(np.float32)
    check_exported_module(tmp_path, PReluNet(channels), x, grad_tolerance=TOLERANCE)


def test_prelu_refuses_a_slope_larger_than_x(tmp_path):
    import microtrain_host as mh
    from test_ops import build_model
    model = build_model((M, 1), {"slope": np.ones((M, K), np.float32)},
                        [node("PRelu", ["input", "slope"], "output")], (M, K))
    with pytest.raises(mh.UnsupportedOpError, match=r"prelu_0.*slope"):
        mh.generate_artifacts(model, loss="MSELoss", optimizer="SGD", artifact_directory=tmp_path)


class VariadicNet(torch.nn.Module):
    """torch.maximum / minimum (Max, Min) with broadcasting and ties (ReLU zeros), PReLU."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(4)
        self.a = torch.nn.Linear(6, 8)
        self.b = torch.nn.Linear(6, 8)
        self.floor = torch.nn.Parameter(torch.randn(8) * 0.1)
        self.act = torch.nn.PReLU(8, init=0.3)
        self.out = torch.nn.Linear(8, 3)

    def forward(self, x):
        a, b = torch.relu(self.a(x)), torch.relu(self.b(x))
        h = torch.maximum(a, b) - torch.minimum(torch.relu(self.b(x)), self.floor)
        return self.out(self.act(h.unsqueeze(-1)).squeeze(-1))


def test_variadic_net_micropython_matches_cpython_and_torch(tmp_path, micropython):
    check_micropython_training(tmp_path, micropython, VariadicNet(), (4, 6), (4, 3))
