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
from microtrain_host.errors import UnsupportedOpError
from microtrain_host.ops.intlookup import fixed_point_slopes, lookup_slopes
from microtrain_host.quant.int8 import int8_graph
from reference_models import ReferenceModel


def conv_net(activation):
    # conv -> max pool -> activation (nothing to fuse it into) -> conv + ReLU -> GAP -> Linear
    torch.manual_seed(7)
    module = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.MaxPool2d(2), activation,
                           nn.Conv2d(4, 6, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                           nn.Flatten(), nn.Linear(6, 3))
    return ReferenceModel("conv_net", module, (1, 8, 8), "CrossEntropyLoss", 4, {"SGD": 0.05})


def gemm_stack(activation):
    # Linear -> Flatten (a view) -> activation -> Linear + ReLU -> Linear
    torch.manual_seed(8)
    module = nn.Sequential(nn.Linear(12, 16), nn.Flatten(), activation, nn.Linear(16, 10),
                           nn.ReLU(), nn.Linear(10, 4))
    return ReferenceModel("gemm_stack", module, (12,), "CrossEntropyLoss", 4, {"SGD": 0.05})


NETS = {"conv_relu6": lambda: conv_net(nn.ReLU6()), "conv_relu": lambda: conv_net(nn.ReLU())}


@pytest.fixture(scope="module", params=list(NETS))
def qdq(request, tmp_path_factory):
    from torch_reference import qat_qdq_model
    tmp = tmp_path_factory.mktemp(request.param)
    xs, ys = qat_qdq_model(NETS[request.param](), tmp, 8)
    fused = int8_graph(onnx.load(tmp / "qdq.onnx"))
    assert "QLinearLookup" in [n.op_type for n in fused.graph.node], request.param
    return request.param, tmp, xs, ys


@pytest.mark.parametrize("loss", list(oracle.TOLERANCE))
@pytest.mark.parametrize("config", ["biases", "last3"])
def test_lookup_backward_equals_torch_float64(qdq, config, loss, tmp_path):
    oracle.test_integer_backward_equals_torch_float64(qdq, config, loss, tmp_path)


def test_lookup_backward_micropython_heap_lock_equals_cpython(qdq, micropython, tmp_path):
    oracle.test_integer_backward_micropython_heap_lock_equals_cpython(
        qdq, "biases_last2", micropython, tmp_path)


def test_relu_and_clip_slopes_are_the_clamp_mask(qdq):
    # a Relu / Clip passes the gradient unchanged inside the clamp and the output range,
    # nothing outside: slopes 0 or 1, in fixed point 0 or 2**15 with the unit 2**-15
    _, tmp, _, _ = qdq
    fused = int8_graph(onnx.load(tmp / "qdq.onnx"))
    for node in (n for n in fused.graph.node if n.op_type == "QLinearLookup"):
        slopes = lookup_slopes(node)
        assert set(np.unique(slopes)) <= {0.0, 1.0} and 0 < slopes.sum() < 256
        ints, unit = fixed_point_slopes(slopes)
        assert unit == 2.0 ** -15 and set(np.unique(ints)) <= {0, 1 << 15}


def test_a_lookup_without_its_activation_is_refused_naming_the_node():
    node = onnx.helper.make_node("QLinearLookup", ["x"], ["y"], name="act",
                                 table=list(range(256)))
    with pytest.raises(UnsupportedOpError, match="node 'act' .*does not say which activation"):
        lookup_slopes(node)
    node = onnx.helper.make_node("QLinearLookup", ["x"], ["y"], name="act2",
                                 table=list(range(256)), activation="Softsign", x_scale=0.1)
    with pytest.raises(UnsupportedOpError, match="node 'act2' .*Softsign.* no integer backward"):
        lookup_slopes(node)
