"""Crafted cases of what the int8 mutation fuzzing (issue 21, tests/test_fuzz.py) found,
each refused with microtrain's own error where it crashed before: an inference blob whose
output is not a float32 tensor (InferenceSession.run copied it into float32 views: a
ValueError), the integer classifier's gradient tensor moved over the input gradient that
the same step writes (an int32 OverflowError on CPython, wrapped garbage on MicroPython),
and a step that overwrites the integer loss (a math domain error in the loss)."""
import re
import struct
import zlib

import pytest

import fuzzing
from microtrain import CheckpointState, InferenceSession, Module, Optimizer
from microtrain import parser as P
from microtrain.blob import FLOAT, INT32, ROLE_CONSTANT, UINT8
from microtrain.errors import BlobError, TrainingError
from microtrain.kernels import inttrain as K


@pytest.fixture(scope="module")
def int_artifacts(tmp_path_factory):
    return fuzzing.make_int_artifacts(tmp_path_factory.mktemp("crafted"))


def _reader(data):
    return P.root_of(bytes(data))


def _with_crc(data):
    size = struct.unpack_from("<I", data, 0)[0]
    data[4 + size:] = struct.pack("<I", zlib.crc32(bytes(data[4:4 + size])) & 0xFFFFFFFF)
    return bytes(data)


def _moved(path, name, offset):
    """The blob at path with tensor `name`'s arena offset set to `offset`, CRC fixed."""
    data = bytearray(path.read_bytes())
    r, root = _reader(data)
    for t in r.tables(root, P._MODEL_TENSORS, "tensor"):
        if r.string(t, P._TENSOR_NAME, "tensor name") == name:
            at = r.field(t, P._TENSOR_OFFSET)
            assert at
            struct.pack_into("<I", data, at, offset)
            return _with_crc(data)
    raise AssertionError(name)


def _train(blob, directory):
    state = CheckpointState.load_checkpoint(str(directory / "checkpoint"))
    model = Module(blob, state)
    optimizer = Optimizer(blob, model)
    b = model.blob
    x, labels = b.programs["train"].inputs
    batch = ([(i * 37) % 256 for i in range(b.sizes[x])],
             [i % b.num_classes for i in range(b.sizes[labels])])
    for _ in range(2):
        model(*batch)
        optimizer.step()


def test_inference_output_that_is_not_float32_is_refused(int_artifacts, tmp_path):
    path = int_artifacts["int8"] / "model.mtb"
    b = P.load(str(path))
    byte_tensor = next(t for t in range(len(b.names)) if b.dtypes[t] != FLOAT)
    data = bytearray(path.read_bytes())
    r, root = _reader(data)
    for t in r.tables(root, P._MODEL_PROGRAMS, "program"):
        if r.string(t, P._PROGRAM_NAME, "program name") == "infer":
            at, n = r.vector(t, P._PROGRAM_OUTPUTS, 4, "outputs")
            assert n == 1
            struct.pack_into("<I", data, at, byte_tensor)
    (tmp_path / "out.mtb").write_bytes(_with_crc(data))
    with pytest.raises(BlobError, match="output '%s' of the inference program is not a "
                       "float32 tensor" % b.names[byte_tensor]):
        InferenceSession(str(tmp_path / "out.mtb"))
    InferenceSession(str(path))                             # the unpatched one loads


def test_gradient_moved_over_the_input_gradient_is_refused(int_artifacts, tmp_path):
    directory = int_artifacts["inttrain"]
    b = P.load(str(directory / "model.mtb"))
    grad, feature_grad = b.tensor_id("inttrain.grad"), b.tensor_id("inttrain.feature_grad")
    (tmp_path / "m.mtb").write_bytes(_moved(directory / "model.mtb", "inttrain.grad",
                                            b.offsets[feature_grad]))
    with pytest.raises(BlobError, match="int_gemm_grad_input.*'inttrain.feature_grad'.*"
                       "overlaps tensor 'inttrain.grad'"):
        _train(str(tmp_path / "m.mtb"), directory)
    assert b.offsets[grad] + b.sizes[grad] <= b.offsets[feature_grad]
    _train(str(directory / "model.mtb"), directory)         # the unpatched one trains


def test_overwritten_integer_loss_is_a_training_error(int_artifacts, tmp_path):
    # a gradient of a convolution (written after the loss, in the same program) moved to
    # end inside the loss ints: the load-time checks see every step inside its tensors
    directory = int_artifacts["inttrain"]
    b = P.load(str(directory / "model.mtb"), keep_steps=True)
    loss = b.programs["train"].outputs[0]
    grads = [t for t in range(len(b.names)) if b.names[t].startswith("intgrad.grad")
             and b.offsets[t] + b.sizes[t] == b.offsets[loss]]
    assert grads
    moved = _moved(directory / "model.mtb", b.names[grads[0]], b.offsets[grads[0]] + 2)
    (tmp_path / "m.mtb").write_bytes(moved)
    with pytest.raises(TrainingError, match="integer loss of sample 0 is not a softmax's"):
        _train(str(tmp_path / "m.mtb"), directory)
    # and the loss ints themselves: a sum of exponentials below 1.0 never leaves the kernel
    with pytest.raises(TrainingError, match="sum of exponentials is 0"):
        K.loss_value([0, 16384, 5, 0], 0, 2)
    assert K.loss_value([1 << K.LOGIT_BITS, 16384], 0, 1) == 1.0     # max - z_label = 1.0


def test_running_statistic_beyond_float32_is_refused(tmp_path):
    # a finite checkpoint whose conv weight is huge: the BatchNorm after it normalizes the
    # loss and the gradients to finite values, but its running variance overflows to inf.
    # The train call is refused and the running statistics are put back.
    import torch
    from torch import nn
    import microtrain_host as mh
    from torch_reference import export
    torch.manual_seed(0)
    module = nn.Sequential(nn.Conv2d(1, 2, 3, padding=1), nn.BatchNorm2d(2), nn.ReLU(),
                           nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(2, 3))
    mh.generate_artifacts(export(module, torch.zeros(1, 1, 4, 4)), loss="CrossEntropyLoss",
                          optimizer="SGD", artifact_directory=tmp_path, batch_size=2)
    state = CheckpointState.load_checkpoint(str(tmp_path / "checkpoint"))
    state.materialize()
    state.parameters["0.weight"].data[1] = -1.3e29
    CheckpointState.save_checkpoint(state, str(tmp_path / "huge"))
    state = CheckpointState.load_checkpoint(str(tmp_path / "huge"))
    model = Module(str(tmp_path / "model.mtb"), state)
    var = [p for p in state.parameters if p.endswith("running_var")][0]
    before = list(state.parameters[var].data)
    x = [((i * 7) % 13 - 6) * 0.1 for i in range(32)]
    with pytest.raises(TrainingError, match="running statistic '%s' became inf" % var):
        model(x, [0, 1])
    assert list(state.parameters[var].data) == before


def test_tensor_moved_over_a_constant_is_refused(int_artifacts, tmp_path):
    # inttrain blob mutations 4335 and 9933 (seed 1): a gradient moved onto the int
    # constants (the exp table, the rates) corrupted them in the first step and overflowed
    # in the second; a tensor sharing a constant's place is refused at load
    directory = int_artifacts["inttrain"]
    b = P.load(str(directory / "model.mtb"))
    constants = [t for t in range(len(b.names))
                 if b.dtypes[t] == INT32 and b.roles[t] == ROLE_CONSTANT and b.sizes[t]]
    grads = [t for t in range(len(b.names)) if b.names[t].startswith("intgrad.grad")]
    assert constants and grads
    target = constants[0]
    (tmp_path / "m.mtb").write_bytes(_moved(directory / "model.mtb", b.names[grads[0]],
                                            b.offsets[target]))
    with pytest.raises(BlobError, match="^tensor '%s' overlaps the constant '%s'$"
                       % (b.names[grads[0]], b.names[target])):
        _train(str(tmp_path / "m.mtb"), directory)


def test_bias_quantum_that_underflows_is_refused(int_artifacts, tmp_path):
    # inttrain blob mutations 1015, 4605 and 9283 (seed 1): an input scale that is positive
    # and finite but so small that input scale x weight scale, the bias quantum the bias
    # step divides by, is 0 in float32 (a ZeroDivisionError at load before). Each uint8
    # tensor's scale in turn is set to the smallest float32 above 0: each such blob trains
    # or is refused with a BlobError, the input of a bias step by this check
    from microtrain.quantized import _TENSOR_SCALE
    directory = int_artifacts["inttrain"]
    original = (directory / "model.mtb").read_bytes()
    r, root = _reader(bytearray(original))
    messages = []
    for t in r.tables(root, P._MODEL_TENSORS, "tensor"):
        if r.field(t, _TENSOR_SCALE) and r.scalar(t, P._TENSOR_DTYPE, "B", 0) == UINT8:
            data = bytearray(original)
            pos, n = r.vector(t, _TENSOR_SCALE, 4, "tensor scales")
            struct.pack_into("<f", data, pos, 1.5e-45)
            (tmp_path / "m.mtb").write_bytes(_with_crc(data))
            try:
                _train(str(tmp_path / "m.mtb"), directory)
            except BlobError as e:
                messages.append(str(e))
    pattern = (r"train step \d+ \(int_clamp_bias_grad\): the bias quantum \(input scale "
               r"1\.4\d*e-45 x weight scale [0-9.e-]+\) underflows float32$")
    assert any(re.match(pattern, m) for m in messages), messages
