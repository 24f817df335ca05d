"""Smooth activations (Elu, Selu, Celu, Gelu, Erf, Softsign; ops/smooth.py,
kernels/smooth.py): per-op cases as in tests/test_ops.py (one device training step against
float64 torch autograd, the training graph in onnx.reference against the same, the eval
forward against onnxruntime) on fixed and seeded random shapes with odd sizes; GELU as
torch exports it at opset 17 (Erf and arithmetic); the erf without libm; MicroPython
against CPython."""
import math
import zlib

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from microtrain.kernels import smooth
from test_ops import (check_case, check_exported_module, check_micropython_training, node,
                      relative_error, shape_id, unary_case)
from test_ops_layout import reference_training_step

TOLERANCE = 1e-5      # the issue's: gradients vs float64 autograd, forward vs onnxruntime
SHAPES = [(5, 7), (3, 1, 4), (1, 9)] + [
    tuple(int(d) for d in np.random.default_rng(seed).integers(1, 8, size=rank))
    for seed, rank in ((1, 2), (2, 3), (3, 4))]


def wide_values(name, input_shape, param_shapes):
    """Inputs in [-3, 3] (both sides of every kink and the tails), w in [0.5, 1.5]."""
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    x = rng.uniform(-3.0, 3.0, input_shape).astype(np.float32)
    params = {k: rng.uniform(0.5, 1.5, s).astype(np.float32) for k, s in param_shapes.items()}
    return x, params, rng


def op_case(op, fn, shape, opset=17, **attrs):
    label = "_".join(f"{k}{v}" for k, v in attrs.items())
    name = f"{op}{'_' + label if label else ''}_{shape_id(shape)}"
    return unary_case(name, [node(op, ["h"], "output", **attrs)], fn, shape) + (opset,)


SELU_ALPHA, SELU_SCALE = 1.6732632423543772, 1.0507009873554805
CASES = (
    [op_case("Elu", F.elu, s) for s in SHAPES]
    + [op_case("Elu", lambda h: F.elu(h, 0.4), (4, 5), alpha=0.4),
       op_case("Elu", lambda h: F.elu(h, 2.5), (3, 7), alpha=2.5)]
    + [op_case("Selu", F.selu, s) for s in SHAPES[:3]]
    + [op_case("Selu", lambda h: 1.5 * torch.where(h > 0, h, 0.7 * torch.expm1(h)), (5, 3),
               alpha=0.7, gamma=1.5)]
    + [op_case("Celu", F.celu, s) for s in SHAPES[:3]]
    + [op_case("Celu", lambda h: F.celu(h, 0.3), (4, 6), alpha=0.3),
       op_case("Celu", lambda h: F.celu(h, 2.0), (7, 3), alpha=2.0)]
    + [op_case("Gelu", F.gelu, s, opset=20) for s in SHAPES]
    + [op_case("Gelu", lambda h: F.gelu(h, approximate="tanh"), s, opset=20,
               approximate="tanh") for s in SHAPES]
    + [op_case("Erf", torch.erf, s) for s in SHAPES]
    + [op_case("Softsign", F.softsign, s) for s in SHAPES]
)


@pytest.mark.parametrize("name,input_shape,params,nodes,fn,opset", CASES,
                         ids=[c[0] for c in CASES])
def test_smooth_op_gradient(tmp_path, name, input_shape, params, nodes, fn, opset):
    x, target, grads = check_case(tmp_path, name, input_shape, params, nodes, fn, opset,
                                  grad_tolerance=TOLERANCE, values=wide_values)
    # the numpy references of the gradient ops (ops/smooth.py) agree with torch too
    _, reference_grads = reference_training_step(tmp_path, x, target)
    for param, expected in grads.items():
        assert relative_error(reference_grads[param], expected) <= TOLERANCE, param


class Scaled(torch.nn.Module):
    def __init__(self, shape, layer):
        super().__init__()
        self.w = torch.nn.Parameter(torch.linspace(0.5, 1.5, math.prod(shape)).reshape(shape))
        self.layer = layer

    def forward(self, x):
        return self.layer(x * self.w)


@pytest.mark.parametrize("approximate", ["none", "tanh"])
@pytest.mark.parametrize("shape", [(3, 5), (2, 3, 7)], ids=shape_id)
def test_gelu_as_torch_exports_it_at_opset_17(tmp_path, approximate, shape):
    # exact: Div, Erf, Add, Mul, Mul; tanh: Mul, Pow-free cubes, Tanh, ... (no Gelu op)
    x = np.random.default_rng(4).uniform(-3.0, 3.0, shape).astype(np.float32)
    model = check_exported_module(tmp_path, Scaled(shape, torch.nn.GELU(approximate)), x,
                                  grad_tolerance=TOLERANCE)
    ops = {n.op_type for n in model.graph.node}
    assert "Gelu" not in ops and ("Erf" in ops) == (approximate == "none")


@pytest.mark.parametrize("module", [torch.nn.ELU(0.8), torch.nn.SELU(), torch.nn.CELU(0.6),
                                    torch.nn.Softsign()], ids=lambda m: type(m).__name__)
def test_torch_exports(tmp_path, module):
    x = np.random.default_rng(5).uniform(-3.0, 3.0, (4, 6)).astype(np.float32)
    check_exported_module(tmp_path, Scaled((4, 6), module), x, grad_tolerance=TOLERANCE)


def test_celu_refuses_alpha_zero(tmp_path):
    import microtrain_host as mh
    from test_ops import build_model
    model = build_model((3, 4), {"w": np.ones((3, 4), np.float32)},
                        [node("Mul", ["input", "w"], "h"), node("Celu", ["h"], "output",
                                                                alpha=0.0)], (3, 4))
    with pytest.raises(mh.UnsupportedOpError, match=r"celu_1.*alpha"):
        mh.generate_artifacts(model, loss="MSELoss", optimizer="SGD", artifact_directory=tmp_path)


def test_erf_without_libm_has_float32_accuracy():
    # Ports built without math.erf use smooth._erf_without_libm.
    values = np.concatenate([np.linspace(-6, 6, 2001), np.geomspace(1e-8, 6, 500),
                             -np.geomspace(1e-8, 6, 500), [0.0, 0.5, -0.5, math.inf, -math.inf]])
    for v in values:
        expected = math.erf(v)
        actual = smooth._erf_without_libm(float(v))
        assert abs(actual - expected) <= 2e-7 * max(abs(expected), 1e-30), (v, actual, expected)


class SmoothNet(torch.nn.Module):
    """Every smooth activation in one net, for the MicroPython run."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(3)
        self.a = torch.nn.Linear(6, 8)
        self.b = torch.nn.Linear(8, 8)
        self.c = torch.nn.Linear(8, 3)

    def forward(self, x):
        h = F.elu(self.a(x)) + F.selu(self.a(x)) * 0.5
        h = F.gelu(self.b(F.celu(h, 0.7))) + F.gelu(self.b(h), approximate="tanh")
        return self.c(F.softsign(h) + torch.erf(h))


def test_smooth_net_micropython_matches_cpython_and_torch(tmp_path, micropython):
    check_micropython_training(tmp_path, micropython, SmoothNet(), (4, 6), (4, 3))
