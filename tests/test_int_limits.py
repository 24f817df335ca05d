"""Issue 22, the numeric limits of the integer training kernels (kernels/inttrain.py,
intgrad.py, fixedpoint.py and their viper twins), each once refused in words:

* a classifier wider than 256 inputs (a Flatten head): requantization exact for accumulators
  up to 2**29 (MAX_K = 4096 inputs), tested at the limit against the host's numpy mirror and
  a 1024-input conv -> Flatten -> Gemm net against torch float64;
* the sparse update at batch 8 on an 8x8 CNN (512 positions per weight, beyond one sum of
  511): summed in chunks, against torch float64;
* a backward through 29 and 41 convolutions (a cut-down MobileNetV1) whose gradient unit
  would underflow float32: carried as a float32 and a power of two, against torch float64;
and the viper kernels equal to the pure-Python ones and to CPython under heap_lock."""
import contextlib
import io
import subprocess
import sys

import numpy as np
import pytest
import torch
from torch import nn

from conftest import DEVICE, ROOT, run_micropython
from inttrain_helpers import Layer
from microtrain import CheckpointState, Module
from microtrain import parser as device_blob_parser
from microtrain.kernels import fixedpoint
from microtrain.kernels import inttrain as K
from microtrain_host.ops import inttrain as host_ops
from microtrain_host.quant.inttrain import int8_training_artifacts, quantize_input
from reference_models import ReferenceModel
from test_intgrad import SPARSE, _forward_record, _signed_bytes, torch_sparse_step
from test_inttrain import torch_step

# the existing intgrad oracle's bound beyond half a quantum (tests/test_intgrad.py): 2**-9
# of the layer's largest step (logits in 2**-8 units)
TOL = 2 ** -9
STEPS_SCRIPT = ROOT / "tests" / "device_scripts" / "inttrain_steps.py"


# -- 1. wide classifiers ---------------------------------------------------------------------
def _worst_case_layer(k, n, m, lr):
    # every product at its largest magnitude (x - x_zp = 255, |W| = 127), biases at the
    # clamp: |accumulator| = k * 255 * 127 + 2**23, 1.4e8 for k = 4096
    x = np.full((m, k), 255)
    w = np.where(np.random.default_rng(k).random((n, k)) < 0.7, 127, -127).astype(np.int8)
    w[0] = 127
    w[1] = -127
    bias = np.array([(1 << 23) * (1 if j % 2 == 0 else -1) for j in range(n)], np.int32)
    sw = np.linspace(0.04, 0.06, n).astype(np.float32)    # logits up to 2**20 - 1
    return Layer(x, 0, w, bias, 2.0 ** -12, sw, np.arange(m) % n, lr), (x, w, bias, sw)


@pytest.mark.parametrize("narrow", [False, True])
def test_logits_at_the_limit_equal_the_numpy_mirror(monkeypatch, narrow):
    # k = MAX_K = 4096: the 32-bit ports' limbs (requant_narrow) and the 64-bit product give
    # the host mirror's integers (exact int64 accumulators)
    assert K.MAX_K == host_ops.MAX_K == 4096
    if narrow:
        monkeypatch.setattr(K, "requant", fixedpoint.requant_narrow)
    layer, (x, w, bias, sw) = _worst_case_layer(4096, 4, 2, 0.01)
    layer.forward()
    got = layer.ints("z", 8).reshape(2, 4)
    expected = host_ops.logits(x, 0, w, bias, 2.0 ** -12, sw)
    assert np.abs((x - 0) @ w.astype(np.int64).T).max() + (1 << 23) > 1 << 27
    assert np.array_equal(got, expected)
    assert 2 ** 18 < np.abs(got).max() < host_ops.LOGIT_LIMIT     # not clamped


def test_wide_update_equals_torch_float64():
    # k = 1024 inputs: the fused update within one quantum of torch's float64 step
    rng = np.random.default_rng(4)
    k, n, m, lr = 1024, 6, 4, 0.05
    sx = float(np.float32(0.02))
    sw = rng.uniform(0.002, 0.004, n).astype(np.float32)
    x = rng.integers(0, 256, (m, k))
    w = rng.integers(-60, 61, (n, k)).astype(np.int8)
    b = rng.integers(-2000, 2000, n).astype(np.int32)
    y = rng.integers(0, n, m)
    layer = Layer(x, 7, w, b, sx, sw, y, lr)
    layer.forward()
    layer.update()
    dw, db, _, _ = torch_step(x, 7, w, b, sx, sw, y, lr)
    got_w = w.astype(np.int64) - layer.weights()
    free = np.abs(w - np.round(dw)) <= 127
    assert free.mean() > 0.9 and np.abs(dw).max() > 3
    assert np.all(np.abs(got_w - dw)[free] <= 0.5 + TOL * np.abs(dw).max())
    assert np.all(np.abs(b - layer.ints("bias", n) - db) <= 0.5 + TOL * np.abs(db).max())


def test_wide_logits_under_heap_lock_viper_equals_pure(micropython, tmp_path):
    # the worst case at k = 4096 through the viper kernel (the limbs of 32-bit ports, WIDE =
    # 0, and the 64-bit product) and the pure one, under heap_lock, equal to the mirror
    layer, (x, w, bias, sw) = _worst_case_layer(4096, 4, 2, 0.01)
    (tmp_path / "q.bin").write_bytes(bytes(layer.Q))
    (tmp_path / "i.bin").write_bytes(layer.I.tobytes())
    script = tmp_path / "wide.py"
    script.write_text("""
import sys
import micropython
from array import array
from microtrain.kernels import fixedpoint_viper as v
from microtrain.kernels import inttrain
Q = bytearray(open(sys.argv[1], 'rb').read())
I0 = open(sys.argv[2], 'rb').read()
args = (Q, %d, %d, %d, %d, %d, 2, 4096, 4, 0)
wide = v.WIDE
for fast, word in ((True, 0), (True, wide), (False, wide)):
    inttrain.use_fast(fast)
    v.WIDE = word
    I = array('i', I0)
    micropython.heap_lock()
    inttrain.int_gemm_logits(None, I, args)
    micropython.heap_unlock()
    print(inttrain.int_gemm_logits is not inttrain._pure['int_gemm_logits'],
          ' '.join(str(I[%d + i]) for i in range(8)))
""" % (layer.z, layer.x, layer.w, layer.bias, layer.req, layer.z))
    out = run_micropython(micropython, script, tmp_path / "q.bin", tmp_path / "i.bin")
    lines = out.strip().split("\n")
    expected = " ".join(str(v) for v in host_ops.logits(x, 0, w, bias, 2.0 ** -12, sw).ravel())
    assert [line.split(" ", 1)[0] for line in lines] == ["True", "True", "False"], out
    assert [line.split(" ", 1)[1] for line in lines] == [expected] * 3, out


LIMBS = """
import random
from microtrain.kernels import fixedpoint
try:
    from microtrain.kernels import fixedpoint_viper as v
except ImportError:     # CPython
    v = None
random.seed(5)
bad = 0
wide = v.WIDE if v else 0
for t in range(20000):
    acc = random.randint(-(1 << 29) + 1, (1 << 29) - 1)
    if t % 4 == 0:
        acc = random.randint(-(1 << 25), 1 << 25)
    if t % 50 == 1:     # beyond the limbs: the exact helper
        acc = random.choice((1, -1)) * random.randint(1 << 29, 1 << 40)
    m0 = random.randint(0, 1 << 24) if t % 7 else (1 << 23)
    if t % 50 == 2:
        m0 = random.randint((1 << 24) + 1, 1 << 30)
    shift = random.randint(1, 62) if t % 3 else random.randint(20, 56)
    q = fixedpoint.requant_wide(acc, m0, shift)
    exact = max(-(1 << 29), min(1 << 29, q))
    results = [fixedpoint.requant(acc, m0, shift), fixedpoint.requant_narrow(acc, m0, shift)]
    if v:
        for v.WIDE in (0, wide):
            results.append(v.requant(acc, m0, shift))
    bad += results != [exact] * len(results)
print('cases 20000 bad', bad)
"""


def test_limbs_exact_up_to_2_29(micropython, tmp_path):
    # fixedpoint's requantization on every port: the pure limbs, the 64-bit product and the
    # viper forms (both word widths) equal the exact formula saturated at +-2**29, inside
    # the limbs' range and beyond it (the exact helper); so a step's large results are the
    # same on a board and on CPython
    script = tmp_path / "limbs.py"
    script.write_text(LIMBS)
    assert run_micropython(micropython, script).split() == ["cases", "20000", "bad", "0"]
    namespace = {}
    with contextlib.redirect_stdout(io.StringIO()) as out:
        exec(LIMBS, namespace)
    assert out.getvalue().split() == ["cases", "20000", "bad", "0"]


class FlattenHead(nn.Module):
    """conv -> ReLU -> Flatten -> Gemm: 4 x 16 x 16 = 1024 classifier inputs."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 4, 3, padding=1)
        self.classifier = nn.Linear(4 * 16 * 16, 5)

    def forward(self, x):
        return self.classifier(torch.flatten(torch.relu(self.conv(x)), 1))


@pytest.fixture(scope="module")
def flatten_head(tmp_path_factory):
    from torch_reference import qat_qdq_model
    torch.manual_seed(21)
    tmp = tmp_path_factory.mktemp("flatten_head")
    ref = ReferenceModel("flatten_head", FlattenHead(), (1, 16, 16), "CrossEntropyLoss", 4,
                         {"SGD": 0.05})
    xs, ys = qat_qdq_model(ref, tmp, 4)
    return tmp, xs, ys


def _data(tmp_path, info, xs, ys, count):
    (tmp_path / "data.bin").write_bytes(b"".join(
        quantize_input(x, info).tobytes() + np.asarray(y, "<i4").tobytes()
        for x, y in zip(xs[:count], ys[:count])))
    return tmp_path / "data.bin"


def _viper_pure_cpython(micropython, info, data, steps, tmp_path):
    # the steps under heap_lock with the viper kernels, with the pure ones, and on CPython:
    # identical parameters and checkpoints
    args = [info["blob"], info["checkpoint"], data, steps]
    fast = run_micropython(micropython, STEPS_SCRIPT, *args, "fast", tmp_path / "f.ckpt")
    pure = run_micropython(micropython, STEPS_SCRIPT, *args, "pure", tmp_path / "p.ckpt")
    cpython = subprocess.run([sys.executable, str(STEPS_SCRIPT), *map(str, args), "pure",
                              str(tmp_path / "c.ckpt")], capture_output=True, text=True,
                             env={"PYTHONPATH": str(DEVICE)}, check=True).stdout
    assert fast.startswith("locked True viper True intgrad viper True"), fast
    body = lambda out: out.split("\n", 1)[1]                      # noqa: E731
    assert body(fast) == body(pure) == body(cpython)
    assert ((tmp_path / "f.ckpt").read_bytes() == (tmp_path / "p.ckpt").read_bytes()
            == (tmp_path / "c.ckpt").read_bytes())
    start = CheckpointState.load_checkpoint(info["checkpoint"]).parameters
    after = CheckpointState.load_checkpoint(str(tmp_path / "c.ckpt")).parameters
    return {name: bytes(after[name].data) != bytes(start[name].data) for name in start}


def test_flatten_head_trains_and_equals_torch(flatten_head, micropython, tmp_path):
    tmp, xs, ys = flatten_head
    lr = 0.5
    info = int8_training_artifacts(tmp / "qdq.onnx", tmp_path / "int", lr, stochastic=False)
    assert info["features"] == 1024
    # one step against torch float64 on the classifier's int8 input (its forward recorded)
    state = CheckpointState.load_checkpoint(info["checkpoint"])
    model = Module(info["blob"], state)
    quant = device_blob_parser.load(info["blob"]).quant
    x = quantize_input(xs[0], info).reshape(-1).tolist()
    y = [int(v) for v in ys[0]]
    _, (feature, w, bias, fid) = _forward_record(model, info, x, y)
    sw = np.array(info["weight_scales"], np.float32)
    n = len(sw)
    dw, db, _, _ = torch_step(feature.reshape(4, -1), quant[fid][1][0], w.reshape(n, -1),
                              bias, quant[fid][0][0], sw, np.array(y), lr)
    records = device_blob_parser.load(info["blob"], keep_steps=True).step_records["train"]
    _, wid, bid = [t for op, t, _, _ in records if op == 242][0][1:4]
    after_w = _signed_bytes(model.output(wid), True)
    after_b = np.array(model.output(bid), np.int64)
    got_w = (w - after_w).reshape(n, -1)
    free = np.abs(w.reshape(n, -1) - np.round(dw)) <= 127
    assert np.abs(dw).max() > 2
    assert np.all(np.abs(got_w - dw)[free] <= 0.5 + TOL * np.abs(dw).max())
    assert np.all(np.abs(bias - after_b - db) <= 0.5 + TOL * np.abs(db).max())
    moved = _viper_pure_cpython(micropython, info, _data(tmp_path, info, xs, ys, 3), 3,
                                tmp_path)
    assert moved == {info["weight"]: True, info["bias"]: True}


def test_imu_1d_conv_flatten_head_of_928_inputs_trains(micropython, tmp_path):
    # issue 22's refused net: Conv1d -> ReLU -> Flatten -> Gemm, 16 x 58 = 928 inputs; 3
    # integer steps under heap_lock, viper == pure == CPython, both parameters moved
    from torch_reference import qat_qdq_model
    torch.manual_seed(3)
    module = nn.Sequential(nn.Conv1d(6, 16, 5), nn.ReLU(), nn.Flatten(),
                           nn.Linear(16 * 58, 4))
    ref = ReferenceModel("imu", module, (6, 62), "CrossEntropyLoss", 4, {"SGD": 0.05})
    xs, ys = qat_qdq_model(ref, tmp_path / "qat", 3)
    info = int8_training_artifacts(tmp_path / "qat" / "qdq.onnx", tmp_path / "int", 0.05)
    assert info["features"] == 928
    moved = _viper_pure_cpython(micropython, info, _data(tmp_path, info, xs, ys, 3), 3,
                                tmp_path)
    assert moved == {info["weight"]: True, info["bias"]: True}


class WideHead(nn.Module):
    """conv -> ReLU -> Flatten -> Gemm with channels x side x side classifier inputs."""

    def __init__(self, channels, side):
        super().__init__()
        self.conv = nn.Conv2d(1, channels, 3, padding=1)
        self.classifier = nn.Linear(channels * side * side, 3)

    def forward(self, x):
        return self.classifier(torch.flatten(torch.relu(self.conv(x)), 1))


def test_pack_at_the_limit_trains_beyond_it_is_refused(tmp_path):
    # 4 x 32 x 32 = MAX_K inputs: packed, loaded and trained by the device runtime; 5 x 29 x
    # 29 = 4205: refused at pack time, naming the node and the limit
    from microtrain_host.errors import UnsupportedOpError
    from torch_reference import qat_qdq_model
    torch.manual_seed(24)
    ref = ReferenceModel("wide", WideHead(4, 32), (1, 32, 32), "CrossEntropyLoss", 2,
                         {"SGD": 0.05})
    xs, ys = qat_qdq_model(ref, tmp_path / "at", 2)
    info = int8_training_artifacts(tmp_path / "at" / "qdq.onnx", tmp_path / "int", 0.5)
    assert info["features"] == 4096
    state = CheckpointState.load_checkpoint(info["checkpoint"])
    start = {n: bytes(p.data) for n, p in state.parameters.items()}
    model = Module(info["blob"], state)
    for x, y in zip(xs, ys):
        model(quantize_input(x, info).reshape(-1).tolist(), [int(v) for v in y])
    assert all(bytes(p.data) != start[n] for n, p in state.parameters.items())
    torch.manual_seed(24)
    ref = ReferenceModel("wider", WideHead(5, 29), (1, 29, 29), "CrossEntropyLoss", 2,
                         {"SGD": 0.05})
    qat_qdq_model(ref, tmp_path / "beyond", 1)
    with pytest.raises(UnsupportedOpError, match=r"4205 inputs per output; integer training "
                                                 r"takes at most 4096"):
        int8_training_artifacts(tmp_path / "beyond" / "qdq.onnx", tmp_path / "no", 0.5)


# -- the sparse update's oracle --------------------------------------------------------------
def _sample_scales(snap, classifier, quant, info, y, lr):
    """{tensor id: the layer's largest step with every sample's contribution counted in
    absolute value} (max over channels / weights of sum_i |step_i|): the scale of the
    rounding a batch's sum carries (its samples' steps may cancel, their errors do not).
    torch_sparse_step run once per sample, the loss that sample's share of the mean."""
    ce = torch.nn.functional.cross_entropy
    sums = {}
    try:
        for i in range(len(y)):
            torch.nn.functional.cross_entropy = \
                lambda z, t, i=i: ce(z[i:i + 1], t[i:i + 1]) / len(y)    # noqa: E731
            db, dw = torch_sparse_step(snap, classifier, quant, info, y, lr)
            for tid, step in list(db.items()) + list(dw.items()):
                sums[tid] = sums.get(tid, 0.0) + np.abs(step)
    finally:
        torch.nn.functional.cross_entropy = ce
    return {tid: float(v.max()) for tid, v in sums.items()}


def _sparse_against_torch(info, xs, ys, lr, per_layer=0.0, trials=2):
    """One integer step per trial against torch float64 on the dequantized model: every
    trained bias and weight within half a quantum + tol of the layer's largest step (its
    samples' steps in absolute value: _sample_scales), tol = TOL + per_layer * the number
    of convolutions between the layer and the loss (each rounds the gradient to 16-bit
    mantissas once more). Returns (layers, the worst error beyond half a quantum relative to
    that step, {bias id: largest step} in the layers' order)."""
    state = CheckpointState.load_checkpoint(info["checkpoint"])
    model = Module(info["blob"], state)
    b = model.blob
    quant = device_blob_parser.load(info["blob"]).quant
    relative = 0.0
    steps = {}      # bias id -> its largest step, in the order of the convolutions
    for trial in range(trials):
        x = quantize_input(xs[trial], info).reshape(-1).tolist()
        y = [int(v) for v in ys[trial]]
        snap, classifier = _forward_record(model, info, x, y)
        db, dw = torch_sparse_step(snap, classifier, quant, info, y, lr)
        scale = _sample_scales(snap, classifier, quant, info, y, lr)
        for index, (_, _, _, w, bias, _, _, wid, bid, _) in enumerate(snap):
            tol = TOL + per_layer * (len(snap) - 1 - index)
            got = bias - np.array(model.output(bid), np.int64)
            err = np.abs(got - db[bid])
            top = scale[bid]
            steps[bid] = max(steps.get(bid, 0.0), float(np.abs(db[bid]).max()))
            relative = max(relative, float((err.max() - 0.5) / max(top, 1e-12)))
            assert np.all(err <= 0.5 + tol * top + 1e-9), (b.names[bid], err.max(), top)
            if b.names[wid] in info["parameters"]:
                after = _signed_bytes(model.output(wid), True)
                got = (w - after).reshape(dw[wid].shape)
                free = np.abs(w.reshape(dw[wid].shape) - np.round(dw[wid])) <= 127
                top = scale[wid]
                err = np.abs(got - dw[wid])[free]
                relative = max(relative, float((err.max() - 0.5) / top))
                assert np.abs(dw[wid]).max() > 1, b.names[wid]
                assert np.all(err <= 0.5 + tol * top + 1e-9), (b.names[wid], err.max(), top)
    return len(snap), relative, steps


# -- 2. the sparse update at batch 8 on an 8x8 CNN ---------------------------------------------
def small_cnn():
    torch.manual_seed(22)
    module = nn.Sequential(
        nn.Conv2d(1, 2, 3, padding=1), nn.ReLU(),
        nn.Conv2d(2, 2, 3, padding=1, groups=2), nn.ReLU(),
        nn.Conv2d(2, 4, 1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
        nn.Linear(4, 3))      # small enough for the emulated board's heap at batch 8
    for conv in module[:6:2]:
        nn.init.kaiming_normal_(conv.weight, nonlinearity="relu")
        nn.init.constant_(conv.bias, 0.05)
    return ReferenceModel("small_cnn", module, (1, 8, 8), "CrossEntropyLoss", 8, {"SGD": 0.05})


@pytest.fixture(scope="module")
def small_cnn_qdq(tmp_path_factory):
    from torch_reference import qat_qdq_model
    tmp = tmp_path_factory.mktemp("small_cnn")
    xs, ys = qat_qdq_model(small_cnn(), tmp, 4)
    return tmp, xs, ys


def test_batch_8_sparse_update_equals_torch(small_cnn_qdq, micropython, tmp_path):
    tmp, xs, ys = small_cnn_qdq
    lr = 16.0          # weight steps of several quanta
    info = int8_training_artifacts(tmp / "qdq.onnx", tmp_path / "int", lr, stochastic=False,
                                   **SPARSE)
    # 8 samples x 64 positions per weight of the depthwise conv: two chunks of sums
    b = device_blob_parser.load(info["blob"], keep_steps=True)
    updates = [ints for op, _, ints, _ in b.step_records["train"] if op == 251]
    assert updates and max(i[0] * i[6] * i[7] for i in updates) == 512
    layers, relative, _ = _sparse_against_torch(info, xs, ys, lr)
    assert layers == 3
    print(f"batch 8 sparse update vs torch float64: {relative:.2e} of the largest step "
          f"beyond half a quantum")
    info = int8_training_artifacts(tmp / "qdq.onnx", tmp_path / "st", 0.5, **SPARSE)
    moved = _viper_pure_cpython(micropython, info, _data(tmp_path, info, xs, ys, 2), 3,
                                tmp_path)
    assert all(moved.values()) and len(moved) == 7


def test_batch_8_sparse_update_on_the_emulated_board_equals_cpython(small_cnn_qdq, tmp_path):
    """The chunked sums on the emulated Cortex-M3 (32-bit small ints and machine words,
    float32 at load): viper kernels under heap_lock and pure-Python kernels give CPython's
    parameters byte for byte."""
    from test_inttrain import BOARD_SCRIPT, board_firmware, train_on_board_and_cpython
    firmware = board_firmware()
    tmp, xs, ys = small_cnn_qdq
    info = int8_training_artifacts(tmp / "qdq.onnx", tmp_path / "int", 0.5, **SPARSE)
    _data(tmp_path, info, xs, ys, 2)
    board_script = BOARD_SCRIPT.replace(
        "from microtrain.kernels import inttrain, qlinear",
        "from microtrain.kernels import intgrad, inttrain, qlinear").replace(
        "print('viper', inttrain.FAST)", "print('viper', inttrain.FAST and intgrad.FAST)").replace(
        "inttrain.use_fast(False)", "inttrain.use_fast(False)\nintgrad.use_fast(False)")
    expected, fast, pure = train_on_board_and_cpython(firmware, info, tmp_path, 2,
                                                      board_script, 1800)
    assert len(expected) == 7 and fast == pure == expected


def test_chunked_sum_equals_one_sum_below_the_chunk(small_cnn_qdq):
    # _fold_sum of a single chunk is _step's own halving: the same step as before chunking
    from microtrain.kernels import intgrad
    for part in (0, 5, -7, (1 << 24) - 1, 1 << 24, -(1 << 26) - 3, (1 << 30) - 1,
                 -(1 << 30) + 1):
        total = intgrad._fold_sum(0, part)
        for shift in (20, 40, 70):
            assert intgrad._step(None, total >> 5, 3 << 22, shift, 2 + (total & 31), -1) == \
                intgrad._step(None, part, 3 << 22, shift, 2, -1)
    # and more chunks: the exact sum within its roundings (each below 2**-23 of the sum
    # so far: the chunks' sizes, not their sum, bound them)
    rng = np.random.default_rng(1)
    for _ in range(2000):
        parts = rng.integers(-(1 << 30) + 1, 1 << 30, rng.integers(2, 40))
        total = 0
        for p in parts:
            total = intgrad._fold_sum(total, int(p))
        exact = int(parts.sum())
        got = (total >> 5) * 2 ** (total & 31)
        assert abs(got - exact) <= int(np.abs(parts).sum()) * 2.0 ** -22


def test_sums_of_many_chunks_viper_equal_pure_and_the_exact_sum(micropython):
    # tests/device_scripts/int_sums.py: a bias over 2 x 40000 positions (2 chunks of
    # MAX_BIAS_SUM) and 1x1 conv weights over 4 x 64 x 64 positions (33 chunks of MAX_SUM),
    # under heap_lock: the viper and pure kernels and CPython take the same steps, the exact
    # sums' steps rounded (numpy int64 here)
    script = ROOT / "tests" / "device_scripts" / "int_sums.py"
    fast = run_micropython(micropython, script, "fast")
    pure = run_micropython(micropython, script, "pure")
    cpython = subprocess.run([sys.executable, str(script), "pure"], capture_output=True,
                             text=True, env={"PYTHONPATH": str(DEVICE)}, check=True).stdout
    assert fast.endswith("viper True\n") and pure.endswith("viper False\n"), fast + pure
    assert fast.split("viper")[0] == pure.split("viper")[0] == cpython.split("viper")[0]
    lines = dict(line.split(" ", 1) for line in cpython.strip().split("\n"))
    mantissa = lambda i: ((i * 7919) % 12000) - 4000                  # noqa: E731
    count = 2 * 2 * 40000
    g = np.array([mantissa(i) for i in range(count)], np.int64)
    mask = np.array([(i * 37) & 255 | 1 for i in range((count + 7) >> 3)], np.int64)
    g = (g * ((mask[np.arange(count) >> 3] >> (np.arange(count) & 7)) & 1)).reshape(2, 2, -1)
    exact = [-g[:, c].sum() * (9000000 + c) / 2.0 ** 33 for c in range(2)]
    got = [int(v) for v in lines["bias"].split()]
    assert np.all(np.abs(np.array(got) - exact) <= 0.5 + 1e-6 * np.abs(exact)), (got, exact)
    x = np.array([(i * 13 + i // 100) & 255 for i in range(4 * 2 * 64 * 64)],
                 np.int64).reshape(4, 2, -1) - 100
    g = np.array([mantissa(i) >> 4 for i in range(4 * 2 * 64 * 64)], np.int64).reshape(4, 2, -1)
    exact = [-(g[:, c] * x[:, t]).sum() * (12000000 - c) / 2.0 ** 44
             for c in range(2) for t in range(2)]
    got = [int(v) for v in lines["weights"].split()]
    assert np.all(np.abs(np.array(got) - exact) <= 0.5 + 1e-6 * np.abs(exact)), (got, exact)
    assert min(np.abs(exact)) > 30        # real steps, no clamp


# -- 3. a deep backward: MobileNetV1's 14 depthwise separable blocks, cut down ----------------
def mobilenet_like(blocks):
    """A stem and `blocks` depthwise separable blocks (3x3 depthwise + 1x1 pointwise, each
    with ReLU6), the 2nd, 4th and 6th strided: 1 + 2 * blocks convolutions from a 32x32
    input down to 2x2, 8 channels, then GlobalAveragePool and the classifier. He
    initialization and small positive biases keep the activations alive through every
    layer (PyTorch's default initialization shrinks them layer by layer to the zero point,
    where every ReLU's gradient is 0)."""
    torch.manual_seed(23)
    layers = [nn.Conv2d(1, 8, 3, stride=2, padding=1), nn.ReLU6()]
    for i in range(blocks):
        layers += [nn.Conv2d(8, 8, 3, stride=2 if i in (1, 3, 5) else 1, padding=1,
                             groups=8), nn.ReLU6(), nn.Conv2d(8, 8, 1), nn.ReLU6()]
    for conv in layers[::2]:
        nn.init.kaiming_normal_(conv.weight, nonlinearity="relu")
        nn.init.constant_(conv.bias, 0.05)
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 4)]
    return ReferenceModel(f"mobilenet_{blocks}", nn.Sequential(*layers), (1, 32, 32),
                          "CrossEntropyLoss", 2, {"SGD": 0.05})


@pytest.mark.parametrize("blocks", [14, 20])
def test_deep_backward_equals_torch(micropython, tmp_path, blocks):
    from torch_reference import qat_qdq_model
    xs, ys = qat_qdq_model(mobilenet_like(blocks), tmp_path, 4)
    lr = 16.0          # the last block's weight steps of several quanta
    info = int8_training_artifacts(tmp_path / "qdq.onnx", tmp_path / "int", lr,
                                   stochastic=False, **SPARSE)
    model = Module(info["blob"], CheckpointState.load_checkpoint(info["checkpoint"]))
    assert max(model.blob.int_unit_exps.values()) >= 64       # the unit renormalized
    # 16-bit gradient mantissas through up to 40 layers: 2**-9 of the largest step (as for
    # the 5-layer DS-CNN and the 3-layer CNN above: the integer softmax's logits) + 2**-15
    # per layer above (measured: at most 1.2e-3 after 39 layers, at the head, 7.9e-4 after
    # 27; with 13-bit mantissas it was 9.8e-3 and 3.4e-3, deepest layers worst)
    layers, relative, steps = _sparse_against_torch(info, xs, ys, lr, 2 ** -15)
    assert layers == 1 + 2 * blocks
    # the first convolution's bias moves: the gradient reached it through every layer
    first = next(iter(steps))
    assert steps[first] > 0.5, steps
    print(f"{layers} convolutions: sparse update vs torch float64 within half a quantum + "
          f"{relative:.2e} of the layer's largest step; the first bias' largest step "
          f"{steps[first]:.2f} quanta")
    if blocks == 14:
        info = int8_training_artifacts(tmp_path / "qdq.onnx", tmp_path / "st", lr, **SPARSE)
        moved = _viper_pure_cpython(micropython, info, _data(tmp_path, info, xs, ys, 2), 2,
                                    tmp_path)
        assert len(moved) == layers + 4 and sum(moved.values()) >= layers
