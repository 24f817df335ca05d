"""Issue 10, int8 kernels beyond Conv / Gemm: the residual blocks of tests/reference_models.py
(MobileNetV2's inverted residual with its skip Add, a ResNet-8 style block with a strided
shortcut, Add, ReLU and a 3x3 average pool) trained with QAT on the device, exported with
`export --qdq`, run by onnxruntime with its quantized kernels (QLinearAdd,
QLinearAveragePool, QLinearConv, QGemm) and by the device's int8 blob: within one output
quantization step on every element, under MicroPython too. Standalone Relu / Relu6 / Clip
of a QDQ model become lookup tables equal to onnxruntime's float chain byte for byte."""
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from conftest import ROOT, run_micropython
from microtrain import InferenceSession
from microtrain import parser as device_blob_parser
from microtrain_host.quant.int8 import int8_graph, pack_inference_model
from reference_models import mobilenet_v2_block, resnet_block
from test_quant_int8 import compare
from torch_reference import qat_qdq_model

MODELS = {"mobilenet_v2_block": mobilenet_v2_block, "resnet_block": resnet_block}


def ort_ops(path, tmp):
    so = ort.SessionOptions()
    so.optimized_model_filepath = str(tmp / "ort_optimized.onnx")
    ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    return [n.op_type for n in onnx.load(tmp / "ort_optimized.onnx").graph.node]


@pytest.fixture(scope="module", params=list(MODELS))
def residual(request, tmp_path_factory):
    tmp = tmp_path_factory.mktemp(request.param)
    ref = MODELS[request.param]()
    xs, ys = qat_qdq_model(ref, tmp, 12)
    pack_inference_model(tmp / "qdq.onnx", tmp / "int8.mtb")
    return request.param, tmp, ref, xs


def test_residual_int8_blob_equals_onnxruntime(residual):
    name, tmp, ref, xs = residual
    fused = [n.op_type for n in int8_graph(onnx.load(tmp / "qdq.onnx")).graph.node]
    optimized = ort_ops(tmp / "qdq.onnx", tmp)
    assert fused.count("QLinearAdd") == 1 and optimized.count("QLinearAdd") == 1, (fused,
                                                                                 optimized)
    if name == "resnet_block":
        assert "QLinearAveragePool" in fused and "QLinearAveragePool" in optimized
        assert fused.count("QLinearConv") == 4
    else:
        assert fused.count("QLinearConv") == 3
    rng = np.random.default_rng(5)
    inputs = list(xs[:4]) + [rng.standard_normal(xs[0].shape).astype(np.float32) * 3
                             for _ in range(4)]
    worst, outs = compare(tmp / "qdq.onnx", tmp / "int8.mtb", inputs)
    print(f"{name}: device int8 vs onnxruntime, largest difference {worst:g} output steps "
          f"over {len(inputs)} batches; fused {fused}")
    assert worst <= 1.0 + 1e-6
    assert max(float(np.ptp(o)) for o in outs) > 0   # not a constant output


def test_residual_int8_micropython_equals_cpython(residual, micropython, tmp_path):
    name, tmp, ref, xs = residual
    x = xs[1].astype("<f4")
    (tmp_path / "x.f32").write_bytes(x.tobytes())
    out = run_micropython(micropython, ROOT / "tests" / "device_scripts" / "int8_heap_lock.py",
                          tmp / "int8.mtb", tmp_path / "x.f32")
    b = device_blob_parser.load(str(tmp / "int8.mtb"), keep_steps=True)
    byte_steps = sum(1 for op, *_ in b.step_records["infer"] if 222 <= op <= 228)
    assert f"locked {byte_steps} of" in out and "same True" in out, out
    script = tmp_path / "infer.py"
    script.write_text(
        "import sys\nfrom array import array\nfrom microtrain import InferenceSession\n"
        "s = InferenceSession(sys.argv[1])\nx = array('f', open(sys.argv[2], 'rb').read())\n"
        "for v in s.run(x):\n    print(repr(v))\n")
    mp = np.array([float(v) for v in run_micropython(micropython, script, tmp / "int8.mtb",
                                                      tmp_path / "x.f32").split()], np.float32)
    cp = np.array(InferenceSession(str(tmp / "int8.mtb")).run(x.reshape(-1)), np.float32)
    assert mp.tobytes() == cp.tobytes()


def clamp_model(path, elem, zero_point, clamp):
    """input -> Q -> DQ -> Relu | Clip -> Q -> DQ -> output, with its own output scale."""
    zp_type = np.uint8 if elem == TensorProto.UINT8 else np.int8
    inits = [numpy_helper.from_array(np.array(0.05, np.float32), "s_in"),
             numpy_helper.from_array(np.array(zero_point, zp_type), "z_in"),
             numpy_helper.from_array(np.array(0.031, np.float32), "s_out"),
             numpy_helper.from_array(np.array(zero_point // 2, zp_type), "z_out")]
    extra = []
    if clamp == "Clip":
        inits += [numpy_helper.from_array(np.array(-1.0, np.float32), "lo"),
                  numpy_helper.from_array(np.array(6.0, np.float32), "hi")]
        extra = ["lo", "hi"]
    nodes = [helper.make_node("QuantizeLinear", ["input", "s_in", "z_in"], ["q"]),
             helper.make_node("DequantizeLinear", ["q", "s_in", "z_in"], ["d"]),
             helper.make_node(clamp, ["d"] + extra, ["c"], name="clamp"),
             helper.make_node("QuantizeLinear", ["c", "s_out", "z_out"], ["q2"]),
             helper.make_node("DequantizeLinear", ["q2", "s_out", "z_out"], ["output"])]
    graph = helper.make_graph(nodes, "clamp", [helper.make_tensor_value_info(
        "input", TensorProto.FLOAT, [4, 64])], [helper.make_tensor_value_info(
            "output", TensorProto.FLOAT, [4, 64])], initializer=inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)


@pytest.mark.parametrize("elem,zero_point,clamp", [(TensorProto.UINT8, 40, "Relu"),
                                                   (TensorProto.INT8, -20, "Relu"),
                                                   (TensorProto.UINT8, 100, "Clip"),
                                                   (TensorProto.INT8, 10, "Clip")])
def test_standalone_relu_and_clip_equal_onnxruntime(tmp_path, elem, zero_point, clamp):
    clamp_model(tmp_path / "m.onnx", elem, zero_point, clamp)
    fused = [n.op_type for n in int8_graph(onnx.load(tmp_path / "m.onnx")).graph.node]
    assert fused == ["Quantize", "QLinearLookup", "Dequantize"]
    pack_inference_model(tmp_path / "m.onnx", tmp_path / "m.mtb")
    # every byte: inputs on each quantization step of the input scale, and beyond the range
    x = (np.arange(-180, 300, 1.0, np.float32)[:256] * 0.05).reshape(4, 64)
    x[0, :8] = [-1e4, 1e4, -7.0, 7.0, 0.0, 6.0, -6.0, 0.025]
    worst, outs = compare(tmp_path / "m.onnx", tmp_path / "m.mtb", [x])
    assert worst == 0.0
    assert len(np.unique(outs[0])) > 50
