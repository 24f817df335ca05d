"""Issue 10 acceptance, int8 execution: the QDQ model `microtrain export --qdq` writes runs in
onnxruntime with its quantized kernels, and the device's int8 inference blob
(pack_inference_model: int8 kernels, integer requantization) gives outputs within one unit
of the output quantization step on every element, for the digits MLP and the DS-CNN; the
int8 kernels run the same under MicroPython; crafted int8 steps are refused at load."""

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import numpy_helper

import microtrain_host as mh
from conftest import ROOT, run_micropython
from microtrain import InferenceSession
from microtrain import parser as device_blob_parser
from microtrain.errors import BlobError
from microtrain_host.quant.int8 import int8_graph, pack_inference_model
from microtrain_host.tools.train import train
from reference_models import ds_cnn
from torch_reference import qat_qdq_model, write_batches

DIGITS = ROOT / "examples" / "digits"


def output_step(model, name="output"):
    """The scale of the QuantizeLinear that makes the model output."""
    producers = {o: n for n in model.graph.node for o in n.output}
    dq = producers[name]
    values = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    return float(values[dq.input[1]])


def unfused_session(qdq_path):
    """onnxruntime running a QDQ model as written: DequantizeLinear, the float op,
    QuantizeLinear, with no graph optimization. Its fused int8 kernels are no oracle: on x86
    without VNNI (an AVX2-only EPYC, measured) MLAS sums u8 * s8 pairs in saturating int16
    (vpmaddubsw) and lands up to 69 output steps off where two products are large."""
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(str(qdq_path), options, providers=["CPUExecutionProvider"])


def compare(qdq_path, blob_path, xs):
    """(largest |device - onnxruntime| in output steps, outputs) over the batches xs:
    onnxruntime computes the QDQ graph in float (unfused_session), the device in integers
    with one requantization per layer, so they can differ by one step where a value lies at
    a rounding boundary."""
    model = onnx.load(qdq_path)
    session = unfused_session(qdq_path)
    name = session.get_inputs()[0].name
    device = InferenceSession(str(blob_path))
    worst, outs = 0.0, []
    for x in xs:
        expected = session.run(None, {name: x})[0]
        got = np.array(device.run(x.reshape(-1))).reshape(expected.shape)
        worst = max(worst, float(np.max(np.abs(got - expected))) / output_step(model))
        outs.append(got)
    return worst, outs


@pytest.fixture(scope="module")
def digits_qdq(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("digits_int8")
    mh.generate_artifacts(str(DIGITS / "mlp.onnx"), artifact_directory=tmp, batch_size=8,
                          quantization=True)
    train(tmp, DIGITS / "digits.npz", 2, 0.01, tmp / "trained")
    mh.export_inference_model(tmp, tmp / "trained", tmp / "qdq.onnx", qdq=True)
    pack_inference_model(tmp / "qdq.onnx", tmp / "int8.mtb")
    return tmp


def test_digits_int8_blob_equals_onnxruntime(digits_qdq):
    fused = [n.op_type for n in int8_graph(onnx.load(digits_qdq / "qdq.onnx")).graph.node]
    assert fused == ["Quantize", "Flatten", "QLinearGemm", "QLinearGemm", "Dequantize"]
    x = np.load(DIGITS / "digits.npz")["x_val"].astype(np.float32)
    x = x[:len(x) // 8 * 8].reshape(-1, 8, 64)
    worst, outs = compare(digits_qdq / "qdq.onnx", digits_qdq / "int8.mtb", x)
    print(f"digits MLP: device int8 vs onnxruntime, largest difference {worst:g} output steps "
          f"over {x.shape[0] * 8} samples")
    assert worst <= 1.0 + 1e-6
    b = device_blob_parser.load(str(digits_qdq / "int8.mtb"))
    assert b.byte_arena > 0 and {b.dtypes[t] for t in range(len(b.names))} >= {2, 3}


@pytest.fixture(scope="module")
def ds_cnn_qdq(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ds_cnn_int8")
    ref = ds_cnn()
    xs, ys = qat_qdq_model(ref, tmp, 20)   # 20 SGD steps on the device runtime
    write_batches(tmp / "data.bin", xs, ys)
    pack_inference_model(tmp / "qdq.onnx", tmp / "int8.mtb")
    return tmp, ref, xs


def test_ds_cnn_int8_blob_equals_onnxruntime(ds_cnn_qdq):
    tmp, ref, xs = ds_cnn_qdq
    qdq = onnx.load(tmp / "qdq.onnx")
    assert not any(n.op_type == "BatchNormalization" for n in qdq.graph.node)  # folded
    fused = [n.op_type for n in int8_graph(qdq).graph.node]
    assert fused.count("QLinearConv") == 5 and "QLinearGlobalAveragePool" in fused
    assert "QLinearGemm" in fused and fused.count("Dequantize") == 1
    rng = np.random.default_rng(3)
    inputs = list(xs[:4]) + [rng.standard_normal(xs[0].shape).astype(np.float32) * 2
                             for _ in range(2)]
    worst, _ = compare(tmp / "qdq.onnx", tmp / "int8.mtb", inputs)
    print(f"DS-CNN: device int8 vs onnxruntime, largest difference {worst:g} output steps")
    assert worst <= 1.0 + 1e-6
    so = ort.SessionOptions()
    so.optimized_model_filepath = str(tmp / "ort_optimized.onnx")
    ort.InferenceSession(str(tmp / "qdq.onnx"), so, providers=["CPUExecutionProvider"])
    optimized = [n.op_type for n in onnx.load(tmp / "ort_optimized.onnx").graph.node]
    assert optimized.count("QLinearConv") == 5 and "QGemm" in optimized   # ORT's int8 kernels


def test_int8_blob_micropython_equals_cpython(ds_cnn_qdq, micropython, tmp_path):
    tmp, ref, xs = ds_cnn_qdq
    x = xs[0].astype("<f4")
    (tmp_path / "x.f32").write_bytes(x.tobytes())
    script = tmp_path / "infer.py"
    script.write_text(
        "import sys\nfrom array import array\nfrom microtrain import InferenceSession\n"
        "s = InferenceSession(sys.argv[1])\nx = array('f', open(sys.argv[2], 'rb').read())\n"
        "for v in s.run(x):\n    print(repr(v))\n")
    out = run_micropython(micropython, script, tmp / "int8.mtb", tmp_path / "x.f32")
    mp = np.array([float(v) for v in out.split()], np.float32)
    cp = np.array(InferenceSession(str(tmp / "int8.mtb")).run(x.reshape(-1)), np.float32)
    assert mp.tobytes() == cp.tobytes()


def test_crafted_int8_step_is_refused(digits_qdq, tmp_path):
    import struct
    import zlib
    data = bytearray((digits_qdq / "int8.mtb").read_bytes())
    b = device_blob_parser.load(bytes(data), keep_steps=True)
    op, tensors, ints, floats = b.step_records["infer"][2]     # the first QLinearGemm
    assert op == 222
    # make its k (inner size) larger than the input holds: find the ints vector and patch it
    body = bytes(data)
    needle = struct.pack("<9i", *ints)
    at = body.find(needle)
    assert at > 0
    data[at + 4:at + 8] = struct.pack("<i", ints[1] * 100)
    size = struct.unpack_from("<I", data, 0)[0]
    data[4 + size:] = struct.pack("<I", zlib.crc32(bytes(data[4:4 + size])) & 0xFFFFFFFF)
    with pytest.raises(BlobError, match="qlinear_gemm"):
        device_blob_parser.load(bytes(data))


@pytest.mark.parametrize("pair,message", [(None, None), ((1 << 25, 30), "multiplier"),
                                          ((1 << 23, 0), "shift"), ((1 << 23, 63), "shift")])
def test_stored_requantization_tensors_are_checked(digits_qdq, tmp_path, monkeypatch, pair,
                                                   message):
    # Blobs of this version store only the zero points and bounds of a requantization tensor
    # and the device derives the multipliers; one stored whole is read as it is, so its
    # (m0, shift) pairs are checked at load like everything else the kernels trust.
    from microtrain_host.ops import qlinear as qlinear_ops
    from microtrain_host.pipeline.lower import CONSTANT, INT32, Tensor

    def whole(ctx, node, head, size):
        pairs = list(pair or (1 << 23, 30)) * ((size - len(head)) // 2)
        data = np.asarray(list(head) + pairs, "<i4").tobytes()
        return ctx.add(Tensor("", INT32, CONSTANT, (size,), data=data))

    monkeypatch.setattr(qlinear_ops, "_derived_requant", whole)
    pack_inference_model(digits_qdq / "qdq.onnx", tmp_path / "whole.mtb")
    if message is None:
        session = InferenceSession(str(tmp_path / "whole.mtb"))
        assert len(session.run([0.5] * 512)) > 0
    else:
        with pytest.raises(BlobError, match="requantization " + message):
            device_blob_parser.load(str(tmp_path / "whole.mtb"))


def test_int8_forward_under_heap_lock_and_viper_equals_pure(ds_cnn_qdq, micropython, tmp_path):
    tmp, ref, xs = ds_cnn_qdq
    (tmp_path / "x.f32").write_bytes(xs[1].astype("<f4").tobytes())
    out = run_micropython(micropython, ROOT / "tests" / "device_scripts" / "int8_heap_lock.py",
                          tmp / "int8.mtb", tmp_path / "x.f32")
    # stem, 2 x (depthwise, pointwise), pool, classifier: every int8 step locked
    assert "locked 7 of 9" in out and "same True" in out, out


def test_viper_requantization_equals_pure(micropython, tmp_path):
    script = tmp_path / "requant.py"
    script.write_text("""
import random
from microtrain.kernels import fixedpoint, qlinear
from microtrain.kernels import fixedpoint_viper as v
random.seed(1)
bad = 0
cases = 0
wide = v.WIDE
for t in range(20000):
    acc = random.randint(-(1 << 24) + 1, (1 << 24) - 1)
    if t % 3 == 0:
        acc = random.randint(-3000, 3000)
    m0 = random.randint(1 << 23, 1 << 24)
    shift = random.randint(1, 62) if t % 5 else random.randint(20, 45)
    if t % 7 == 0:
        m0 = 1 << 23          # exact ties
    if t % 11 == 0:           # beyond the machine-word range: the exact helper
        acc, m0, shift = acc * 3, random.choice((m0, -m0, 3 << 23)), random.randint(-2, 70)
    clamp = lambda q: max(-1000, min(1000, q))
    cases += 1
    exact = clamp(fixedpoint.requant_wide(acc, m0, shift))
    results = [clamp(fixedpoint.requant_narrow(acc, m0, shift))]
    for v.WIDE in (0, wide):  # the limbs, and one product on 64-bit ports
        results.append(clamp(v.requant(acc, m0, shift)))
    if results != [exact] * 3:
        bad += 1
print(qlinear.FAST, cases, bad)
""")
    assert run_micropython(micropython, script).split() == ["True", "20000", "0"]


def test_viper_kernels_equal_pure_on_random_geometries(micropython):
    out = run_micropython(micropython, ROOT / "tests" / "device_scripts" / "qlinear_fast.py")
    assert out.split() == ["cases", "600", "different", "0"], out


def test_crafted_byte_arena_size_is_refused(digits_qdq):
    # Model.byte_arena (field 16) must equal what the int8 tensors need, before anything
    # is allocated: a blob claiming a huge byte arena is refused, as for the other arenas.
    import struct
    import zlib
    data = bytearray((digits_qdq / "int8.mtb").read_bytes())
    b = device_blob_parser.load(bytes(data))
    needle = struct.pack("<I", b.byte_arena)
    positions = [i for i in range(8, len(data) - 4) if data[i:i + 4] == needle]
    refused = 0
    for at in positions:
        crafted = bytearray(data)
        crafted[at:at + 4] = struct.pack("<I", 1 << 30)
        size = struct.unpack_from("<I", crafted, 0)[0]
        crafted[4 + size:] = struct.pack("<I", zlib.crc32(bytes(crafted[4:4 + size])) & 0xFFFFFFFF)
        try:
            device_blob_parser.load(bytes(crafted))
        except BlobError as e:
            refused += "byte arena" in str(e)
    assert refused == 1


def test_inspect_shows_scales_and_zero_points_of_the_qdq_model(ds_cnn_qdq):
    """The int8 blob stores every quantized tensor's scale(s) and zero point(s); inspect
    prints them (and the int32 biases' scales, input x weight scale), equal to the QDQ
    model's initializers bit for bit."""
    import re
    from microtrain_host.tools.inspect import describe
    tmp, ref, xs = ds_cnn_qdq
    qdq = onnx.load(tmp / "qdq.onnx")
    values = {i.name: numpy_helper.to_array(i) for i in qdq.graph.initializer}
    expected = {}   # quantized tensor -> (dtype, scales, zero points)
    for n in qdq.graph.node:
        if n.op_type in ("QuantizeLinear", "DequantizeLinear"):
            q = n.output[0] if n.op_type == "QuantizeLinear" else n.input[0]
            zp = values[n.input[2]]
            dtype = {np.dtype(np.uint8): "uint8", np.dtype(np.int8): "int8",
                     np.dtype(np.int32): "int32"}[zp.dtype]
            expected[q] = (dtype, values[n.input[1]].reshape(-1), zp.reshape(-1))
    text = describe(tmp / "int8.mtb", steps=False, scales=True)
    shown = {}
    for line in text.split("quantized tensors (")[1].splitlines()[1:]:
        m = re.match(r"  (\S+)\s+(u?int\d+)\s+scale(?: \(axis \d+\)| \(input x weight\))? "
                     r"(.*); zero point (.*)$", line)
        if not m:
            break
        shown[m.group(1)] = (m.group(2), np.array(m.group(3).split(), np.float64),
                             np.array(m.group(4).split(), np.int64))
    # every int8 / uint8 tensor of the blob and every bias, with the model's exact values:
    # 6 layers (5 convolutions, the classifier) x (weight, bias, output), input, pool, view
    assert len(shown) == 3 * 6 + 3, sorted(shown)
    for name, (dtype, scales, zps) in shown.items():
        e_dtype, e_scales, e_zps = expected[name]
        assert dtype == e_dtype, name
        assert scales.astype(np.float32).tobytes() == e_scales.astype(np.float32).tobytes(), name
        assert np.array_equal(np.broadcast_to(zps, e_zps.shape), e_zps), name
    # without --scales: a count and a range per channel vector
    assert "8 values" in describe(tmp / "int8.mtb", steps=False)


def test_int8_kernels_compile_for_every_board():
    """The viper fast paths compile with mpy-cross for every board's architecture (32-bit
    ports: 2**30 is no small int there, and xtensa's branches reach only so far), without
    the emitter's error messages."""
    import json
    import subprocess
    from microtrain_host.tools import runtime
    tool = runtime.mpy_cross_tool()
    archs = sorted({json.loads(p.read_text())["mpy_arch"]
                    for p in (ROOT / "boards").glob("*.json")})
    assert {"armv6m", "armv7m", "xtensawin"} <= set(archs)
    for arch in archs:
        for module in ("qlinear_viper.py", "qlinear.py", "quant.py", "inttrain_viper.py",
                       "inttrain.py"):
            proc = subprocess.run([tool, f"-march={arch}", "-o", "/dev/null",
                                   str(ROOT / "device" / "microtrain" / "kernels" / module)],
                                  capture_output=True, text=True)
            assert proc.returncode == 0 and "ERROR" not in proc.stdout + proc.stderr, (
                arch, module, proc.stdout, proc.stderr)


def test_constants_sharing_their_data_are_refused_by_name(ds_cnn_qdq, tmp_path):
    # A crafted blob whose constant points its data at another's (the host never shares
    # them): the file loader, which streams the constants in one pass, names it; a blob
    # given as a buffer reads both from the same bytes.
    import struct
    import zlib
    from microtrain.flatbuf import Reader
    tmp, _, xs = ds_cnn_qdq
    data = bytearray((tmp / "int8.mtb").read_bytes())
    b = device_blob_parser.load(bytes(data))
    r = Reader(memoryview(data)[:len(data) - 4], BlobError, start=4)
    tables = list(r.tables(r.root(), 2, "tensor"))
    same = {}
    for tid in sorted(b.in_place):          # two weights of one size: the pointwise convs
        same.setdefault(b.sizes[tid], []).append(tid)
    first, second = next(ids for ids in same.values() if len(ids) > 1)[:2]
    target = r.field(tables[first], 6)
    target += struct.unpack_from("<I", data, target)[0]        # the first's data vector
    field = r.field(tables[second], 6)
    struct.pack_into("<I", data, field, target - field)          # the second's points there
    size = struct.unpack_from("<I", data, 0)[0]
    data[4 + size:] = struct.pack("<I", zlib.crc32(bytes(data[4:4 + size])))
    (tmp_path / "shared.mtb").write_bytes(data)
    with pytest.raises(BlobError, match="constant '%s' shares its data" % b.names[second]):
        InferenceSession(str(tmp_path / "shared.mtb"))
    session = InferenceSession(bytes(data))
    assert len(session.run(xs[0].reshape(-1))) > 0
