"""Issue 11, memory: the frozen int8 weights of a blob take no arena space. The host marks the
int8 constants that steps read only as their weight (int8 Gemm and Conv: Tensor.in_place);
a blob given to the device as a buffer (in flash: a file of a board's ROM filesystem, a
frozen bytes object) has them read where they are, a blob read from a file gets one buffer
of them. Crafted flags are refused; a model's minimal runtime keeps the viper fast path."""
import subprocess

import numpy as np
import pytest

from microtrain import CheckpointState, InferenceSession, Module
from microtrain import blob as device_blob
from microtrain import feed
from microtrain import loader as device_blob_loader
from microtrain import parser as device_blob_parser
from microtrain.errors import BlobError
from microtrain_host.quant import int8 as int8_stage
from microtrain_host.quant.int8 import pack_inference_model
from microtrain_host.tools import runtime
from test_quant_int8 import digits_qdq  # noqa: F401  (the fixture)

QLINEAR_GEMM, QLINEAR_CONV = 222, 223


@pytest.fixture(scope="module")
def digits_int8(digits_qdq):
    """QAT artifacts of the digits MLP trained 2 epochs, their QDQ export and its int8
    inference blob (test_quant_int8's)."""
    return digits_qdq


def test_the_weights_of_int8_gemm_take_no_arena_space(digits_int8):
    b = device_blob_parser.load(str(digits_int8 / "int8.mtb"), keep_steps=True)
    weights = {tensors[2] for op, tensors, _, _ in b.step_records["infer"]
               if op in (QLINEAR_GEMM, QLINEAR_CONV)}
    assert weights and b.in_place == weights
    assert all(device_blob.ROLE_NAMES[b.roles[t]] == "constant" for t in weights)
    # the byte arena holds the activations only; the weights get a buffer of their own
    in_arena = [t for t in range(len(b.names))
                if b.dtypes[t] in (device_blob.INT8, device_blob.UINT8) and t not in weights]
    assert b.byte_arena == max(b.offsets[t] + b.sizes[t] for t in in_arena)
    assert b.weights_size == sum(b.sizes[t] for t in weights) == 64 * 32 + 32 * 10


def test_a_blob_given_as_a_buffer_reads_its_weights_where_they_are(digits_int8):
    path = digits_int8 / "int8.mtb"
    data = bytearray(path.read_bytes())
    from_file = InferenceSession(str(path))
    from_buffer = InferenceSession(data)
    b = from_buffer.blob
    assert b.weights.obj is data        # the buffer itself, not a copy
    x = np.random.default_rng(0).random((8, 64), dtype=np.float32).reshape(-1)
    expected = list(from_file.run(x))
    assert list(from_buffer.run(x)) == expected
    assert list(InferenceSession(path).run(x)) == expected    # a pathlib.Path is a path
    # in place: a weight changed in the buffer changes what the buffer's session computes
    # (and nothing else reads it)
    first = min(b.in_place)
    for k in range(b.sizes[first]):
        data[b.offsets[first] + k] = 127
    assert list(from_buffer.run(x)) != expected
    assert list(from_file.run(x)) == expected


def test_training_and_export_from_a_buffer_equal_from_the_file(digits_int8, tmp_path):
    # the QAT training blob: float training, its export program writes the int8 blob
    blob = digits_int8 / "training_model.mtb"
    if not blob.exists():
        blob = next(digits_int8.glob("*.mtb"))
    out = {}
    for name, source in (("file", str(blob)), ("buffer", blob.read_bytes())):
        state = CheckpointState.load_checkpoint(str(digits_int8 / "trained"))
        model = Module(source, state)
        rng = np.random.default_rng(1)
        losses = [model(list(rng.random(512, dtype=np.float32)), [1, 2, 3, 4, 5, 6, 7, 8])
                  for _ in range(2)]
        model.export_model_for_inferencing(str(tmp_path / f"{name}.mtb"), ["output"])
        out[name] = losses, (tmp_path / f"{name}.mtb").read_bytes()
    assert out["file"] == out["buffer"]


def _crafted(monkeypatch, tmp_path, digits_int8, change):
    """The digits int8 blob packed with change(lowering) applied just before it is written."""
    write = int8_stage.serialize

    def crafted(lowering, *args, **kwargs):
        change(lowering)
        return write(lowering, *args, **kwargs)
    monkeypatch.setattr(int8_stage, "serialize", crafted)
    pack_inference_model(digits_int8 / "qdq.onnx", tmp_path / "crafted.mtb")
    return (tmp_path / "crafted.mtb").read_bytes()


def _gemms(lowering):
    return [s for s in lowering.programs["infer"].steps if s.op == QLINEAR_GEMM]


def test_crafted_in_place_flags_are_refused(digits_int8, tmp_path, monkeypatch):
    def activation_in_place(lowering):
        # one that does not end the byte arena (else the arena size check refuses it first)
        t = next(lowering.tensors[s.tensors[0]] for s in _gemms(lowering)
                 if lowering.tensors[s.tensors[0]].offset + lowering.tensors[s.tensors[0]].size
                 < lowering.byte_arena)
        t.in_place = True

    def weight_read_as_an_input(lowering):
        gemm = _gemms(lowering)[1]
        gemm.tensors[1] = _gemms(lowering)[0].tensors[2]     # another layer's weight as x

    def weight_as_an_output(lowering):
        lowering.programs["infer"].outputs[0] = _gemms(lowering)[0].tensors[2]

    for change, message in ((activation_in_place, "read in place but is not a given int8 "
                                                  "constant"),
                            (weight_read_as_an_input, "only a weight argument"),
                            (weight_as_an_output, "in no arena")):
        data = _crafted(monkeypatch, tmp_path, digits_int8, change)
        monkeypatch.undo()
        for source in (data, str(tmp_path / "crafted.mtb")):
            with pytest.raises(BlobError, match=message):
                device_blob_loader.load_into_arenas(source)


def test_a_minimal_runtime_keeps_the_viper_fast_path(digits_int8, micropython, tmp_path):
    sources = runtime.minimal_sources(digits_int8 / "int8.mtb")
    assert {"microtrain/kernels/qlinear_viper.py", "microtrain/kernels/fastpath.py"} <= set(
        sources)
    assert "FAST = use_fast()" in sources["microtrain/kernels/qlinear.py"]
    # the viper module keeps the kernels the model uses (and their helpers) only
    assert "def qlinear_gemm(" in sources["microtrain/kernels/qlinear_viper.py"]
    assert "def qlinear_add(" not in sources["microtrain/kernels/qlinear_viper.py"]
    # the shared requantization comes along (kernels/fixedpoint.py imports it), the training
    # families' helpers (kernels/intsgd.py) do not
    assert "def requant_store(" in sources["microtrain/kernels/fixedpoint_viper.py"]
    assert "microtrain/kernels/intsgd_viper.py" not in sources
    runtime.write_sources(sources, tmp_path / "rt")
    x = np.random.default_rng(2).random(8 * 64, dtype=np.float32)
    script = tmp_path / "infer.py"
    script.write_text(      # a training runtime has no InferenceSession: the steps by hand
        "from microtrain import feed, loader\n"
        "from microtrain.kernels import qlinear\n"
        f"b, F, I = loader.load_into_arenas({str(digits_int8 / 'int8.mtb')!r})\n"
        "p = b.programs['infer']\n"
        f"feed.copy_inputs(b, F, I, p, ({x.tolist()!r},), 0)\n"
        "for kernel, args in p.steps:\n"
        "    kernel(F, I, args)\n"
        "y = p.outputs[0]\n"
        "print(qlinear.FAST, list(F[b.offsets[y]:b.offsets[y] + b.sizes[y]]))\n")
    proc = subprocess.run([micropython, str(script)], capture_output=True, text=True,
                          env={"MICROPYPATH": str(tmp_path / "rt")})
    assert proc.returncode == 0, proc.stderr
    fast, values = proc.stdout.split(" ", 1)
    assert fast == "True"
    expected = InferenceSession(str(digits_int8 / "int8.mtb")).run(x)
    assert np.array(eval(values), np.float32).tolist() == np.array(expected).tolist()


def test_a_crafted_size_of_the_weights_is_refused(digits_int8):
    # Model.weights_in_place (field 17: the buffer a blob file's loader allocates for them,
    # before it parses) must equal what the in-place tensors hold.
    import struct
    import zlib
    data = bytearray((digits_int8 / "int8.mtb").read_bytes())
    needle = struct.pack("<I", device_blob_parser.load(bytes(data)).weights_size)
    refused = 0
    for at in [i for i in range(8, len(data) - 4) if data[i:i + 4] == needle]:
        crafted = bytearray(data)
        crafted[at:at + 4] = struct.pack("<I", 1 << 30)
        size = struct.unpack_from("<I", crafted, 0)[0]
        crafted[4 + size:] = struct.pack("<I", zlib.crc32(bytes(crafted[4:4 + size])))
        try:
            device_blob_parser.load(bytes(crafted))
        except BlobError as e:
            refused += "weights read in place" in str(e)
    assert refused == 1
