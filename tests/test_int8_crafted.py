"""Issue 21 item 10: crafted int8 blobs (a real packed blob of the digits MLP, one value
changed, the CRC-32 recomputed) are refused at load, with the same message on CPython and
MicroPython, naming the step and the tensor: a quantization scale that is not a positive
finite float32, a zero point outside the range of its tensor's type (in the tensor's
quantization fields or in the header of a requantization tensor), and quantization
parameters the kernel reads as constants that are not a constant. The host refuses a QDQ
model with such a scale when it packs it."""
import struct
import zlib

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from conftest import run_micropython
from microtrain import InferenceSession
from microtrain import parser as device_blob_parser
from microtrain.errors import BlobError
from microtrain.flatbuf import Reader
from microtrain_host.errors import ArtifactError
from microtrain_host.quant.int8 import pack_inference_model
import test_quant_int8

# the fixture: the digits MLP trained with QAT, its QDQ export and int8 blob
digits_qdq = test_quant_int8.digits_qdq

# infer program of the digits int8 blob: 0 quantize_linear (input.quantized), 1 and 2
# qlinear_gemm, 3 dequantize_linear
SCALE = "a quantization scale must be a positive finite number"
UINT8 = "a uint8 tensor's zero point must lie in [0, 255]"


def crafted(blob, edit):
    """blob's bytes after edit(data, reader, tensor tables, parsed blob), its CRC-32
    recomputed so that only the checks of the values stand in the way."""
    data = bytearray(blob)
    size = struct.unpack_from("<I", data, 0)[0]
    r = Reader(memoryview(bytes(data))[:4 + size], BlobError, start=4)
    edit(data, r, list(r.tables(r.root(), 2, "tensor")), device_blob_parser.load(blob))
    struct.pack_into("<I", data, 4 + size, zlib.crc32(bytes(data[4:4 + size])) & 0xFFFFFFFF)
    return bytes(data)


def set_scale(name, value, channel=0):
    def edit(data, r, tables, b):
        pos, n = r.vector(tables[b.names.index(name)], 9, 4, "scales")
        assert channel < n
        struct.pack_into("<f", data, pos + 4 * channel, value)
    return edit


def set_zero_point(name, value):
    def edit(data, r, tables, b):
        pos, n = r.vector(tables[b.names.index(name)], 10, 4, "zero points")
        struct.pack_into("<i", data, pos, value)
    return edit


def set_header(step, index, value):
    # element `index` of the given header of the requantization tensor of infer step `step`
    def edit(data, r, tables, b):
        program = next(p for p in r.tables(r.root(), 4, "program")
                       if r.string(p, 0, "name") == "infer")
        req = r.scalars(list(r.tables(program, 1, "step"))[step], 1, "I", "tensors")[4]
        pos, nbytes = r.vector(tables[req], 6, 1, "data")
        assert nbytes == 16         # x_zp, y_zp, lo, hi
        struct.pack_into("<i", data, pos + 4 * index, value)
    return edit


def quantization_parameters_written(data, r, tables, b):
    # the [scale, zero point, scratch] constant quantize_linear reads: made an activation
    struct.pack_into("<B", data, r.field(tables[2], 2), 4)


CASES = [
    (set_scale("/2/Relu_output_0.quantized", -0.5),
     "infer step 1 (qlinear_gemm): scale of tensor '/2/Relu_output_0.quantized' is -0.5; "
     + SCALE),
    (set_scale("1.weight.quantized", 0.0, channel=3),
     "infer step 1 (qlinear_gemm): scale of tensor '1.weight.quantized' is 0.0; " + SCALE),
    (set_scale("3.weight.quantized", float("nan"), channel=1),
     "infer step 2 (qlinear_gemm): scale of tensor '3.weight.quantized' is nan; " + SCALE),
    (set_scale("output.quantized", float("inf")),
     "infer step 2 (qlinear_gemm): scale of tensor 'output.quantized' is inf; " + SCALE),
    (set_zero_point("output.quantized", 256),
     "infer step 2 (qlinear_gemm): zero point of tensor 'output.quantized' is 256; " + UINT8),
    (set_header(1, 0, -1),
     "infer step 1 (qlinear_gemm): zero point of tensor '/0/Flatten_output_0.quantized' is "
     "-1; " + UINT8),
    (set_header(2, 1, 300),
     "infer step 2 (qlinear_gemm): zero point of tensor 'output.quantized' is 300; " + UINT8),
    (quantization_parameters_written,
     "infer step 0 (quantize_linear): the quantization parameters of tensor "
     "'input.quantized' (tensor 2) have role 'activation'; the kernel reads them as "
     "constants: they must be a constant (an initializer), not a tensor a program writes"),
]


@pytest.fixture(scope="module")
def crafted_blobs(digits_qdq, tmp_path_factory):
    blob = (digits_qdq / "int8.mtb").read_bytes()
    InferenceSession(blob)                           # the blob as packed loads
    directory = tmp_path_factory.mktemp("int8_crafted")
    paths = []
    for i, (edit, _) in enumerate(CASES):
        paths.append(directory / ("%d.mtb" % i))
        paths[-1].write_bytes(crafted(blob, edit))
    return paths


@pytest.mark.parametrize("case", range(len(CASES)))
def test_crafted_int8_blob_is_refused_at_load(crafted_blobs, case):
    message = CASES[case][1]
    for source in (str(crafted_blobs[case]), crafted_blobs[case].read_bytes()):
        with pytest.raises(BlobError) as refused:
            InferenceSession(source)
        assert str(refused.value) == message


def test_micropython_refuses_them_with_the_same_messages(crafted_blobs, micropython, tmp_path):
    script = tmp_path / "refuse.py"
    script.write_text(
        "import sys\nfrom microtrain import InferenceSession\nfrom microtrain.errors import "
        "BlobError\nfor path in sys.argv[1:]:\n    try:\n        InferenceSession(path)\n"
        "        print('loaded')\n    except BlobError as e:\n        print(str(e))\n")
    out = run_micropython(micropython, script, *crafted_blobs)
    assert out.splitlines() == [message for _, message in CASES]


@pytest.mark.parametrize("values,message", [
    ((-0.5, 0.0), "scale of tensor 'input.quantized' is -0.5; " + SCALE),
    ((0.25, 256.0), "zero point of tensor 'input.quantized' is 256; " + UINT8),
    ((0.25, 0.5), "zero point of tensor 'input.quantized' is 0.5; a zero point must be an "
                  "integer"),
    ((0.25, 3.0), None)])
def test_stored_quantization_parameters_are_checked(digits_qdq, tmp_path, monkeypatch,
                                                   values, message):
    # Blobs of this version derive a Quantize / Dequantize step's [scale, zero point,
    # scratch] from the byte tensor's fields; one stored whole (older blobs) is read as it
    # is, so its values are checked at load like the fields.
    from microtrain_host.ops import qlinear as qlinear_ops
    from microtrain_host.pipeline.lower import CONSTANT, FLOAT, Tensor

    def stored(ctx, node):
        data = np.asarray(list(values) + [0.0], "<f4").tobytes()
        return ctx.add(Tensor("", FLOAT, CONSTANT, (3,), data=data))

    monkeypatch.setattr(qlinear_ops, "_qparams", stored)
    pack_inference_model(digits_qdq / "qdq.onnx", tmp_path / "stored.mtb")
    if message is None:
        assert len(InferenceSession(str(tmp_path / "stored.mtb")).run([0.5] * 512)) > 0
    else:
        with pytest.raises(BlobError) as refused:
            device_blob_parser.load(str(tmp_path / "stored.mtb"))
        assert str(refused.value) == "infer step 0 (quantize_linear): " + message


def test_host_refuses_a_non_positive_scale(digits_qdq, tmp_path):
    model = onnx.load(digits_qdq / "qdq.onnx")
    values = {i.name for i in model.graph.initializer}
    node = next(n for n in model.graph.node
                if n.op_type == "DequantizeLinear" and n.input[0] not in values)
    for i in model.graph.initializer:
        if i.name == node.input[1]:
            i.CopyFrom(numpy_helper.from_array(np.array(-0.5, np.float32), i.name))
    with pytest.raises(ArtifactError) as refused:
        pack_inference_model(model, tmp_path / "bad.mtb")
    assert str(refused.value) == ("DequantizeLinear node '%s': scale '%s' is -0.5; %s"
                                  % (node.name, node.input[1], SCALE))
