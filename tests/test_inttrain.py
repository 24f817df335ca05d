"""Issue 11 scope 1, integer training (kernels/inttrain.py, ops/inttrain.py,
quant/inttrain.py): one integer update against torch float64 (a float SGD step of the
dequantized layer, in weight quanta), the integer softmax cross-entropy gradient against
torch, convergence of an int8 classifier trained in integers against the float fine-tune of
the same layer on the same features, the whole train step under micropython.heap_lock() with
the viper kernels equal to the pure-Python kernels and to CPython, and crafted blobs,
checkpoints and inputs refused."""
import struct
import subprocess
import sys
import zlib

from array import array

import numpy as np
import pytest
import torch

from conftest import DEVICE, ROOT, emulated_board_plan, run_micropython
from inttrain_helpers import Layer
from microtrain import CheckpointState, Module, Optimizer
from microtrain import parser as device_blob_parser
from microtrain.errors import BlobError, InputError, ParameterError
from microtrain.kernels import inttrain as K
from microtrain_host.ops import inttrain as host_ops
from microtrain_host.formats.checkpoint import write_checkpoint
from microtrain_host.quant.inttrain import int8_training_artifacts, quantize_input
from microtrain_host.ops.inttrain import LOGIT_BITS

DIGITS = ROOT / "examples" / "digits"


def random_layer(rng, m, lr, stochastic=False):
    k, n = 32, 10
    sx = float(np.float32(rng.uniform(0.01, 0.05)))
    zp = int(rng.integers(0, 20))
    sw = rng.uniform(0.005, 0.02, n).astype(np.float32)
    x = rng.integers(0, 256, (m, k))
    w = rng.integers(-60, 61, (n, k)).astype(np.int8)
    b = rng.integers(-2000, 2000, n).astype(np.int32)
    y = rng.integers(0, n, m)
    layer = Layer(x, zp, w, b, sx, sw, y, lr)
    if stochastic:
        layer.I.append(0)                      # the generator state, after everything
        layer.random = len(layer.I) - 1
    return layer, (x, zp, w, b, sx, sw, y)


def torch_step(x, zp, w, b, sx, sw, y, lr):
    """The float64 SGD step of the dequantized layer, in quanta: (dW / s_w, dB / (s_x s_w))
    * lr, the softmax - onehot gradient, the float logits."""
    sw64 = sw.astype(np.float64)
    xr = torch.tensor((x - zp) * np.float64(sx))
    W = torch.tensor(w * sw64[:, None], requires_grad=True)
    B = torch.tensor(b * np.float64(sx) * sw64, requires_grad=True)
    logits = xr @ W.T + B
    torch.nn.functional.cross_entropy(logits, torch.tensor(y)).backward()
    p = torch.softmax(logits, 1).detach().numpy()
    p[np.arange(len(y)), y] -= 1
    return (lr * W.grad.numpy() / sw64[:, None], lr * B.grad.numpy() / (np.float64(sx) * sw64),
            p, logits.detach().numpy())


def test_int_update_equals_torch_float64_within_one_quantum():
    # Bound: the int step equals round(lr * dL/dW / s_w) of torch's float64 gradient (the
    # dequantized weights, bias and input) within 1 quantum: the logits are exact to 2**-9,
    # the probabilities to a few 2**-14, so the step's error before rounding stays far below
    # half a quantum for steps of tens of quanta.
    rng = np.random.default_rng(0)
    worst_w = worst_b = 0.0
    exact = 0
    total = 0
    for trial in range(30):
        m = (1, 2, 4)[trial % 3]
        lr = float(rng.uniform(0.01, 0.1))
        layer, (x, zp, w, b, sx, sw, y) = random_layer(rng, m, lr)
        layer.forward()
        layer.update()
        dw, db, _, _ = torch_step(x, zp, w, b, sx, sw, y, lr)
        got_w = w.astype(np.int64) - layer.weights()
        got_b = b.astype(np.int64) - layer.ints("bias", 10)
        free = np.abs(w - np.round(dw)) <= 127           # steps the int8 clamp leaves alone
        assert free.mean() > 0.9
        assert np.all(np.abs(got_w - np.round(dw))[free] <= 1), trial
        assert np.all(np.abs(got_b - np.round(db)) <= 1), trial
        worst_w = max(worst_w, float(np.abs(got_w - dw)[free].max()))
        worst_b = max(worst_b, float(np.abs(got_b - db).max()))
        exact += int(np.sum(got_w[free] == np.round(dw)[free]))
        total += int(free.sum())
    print(f"int update vs torch float64: weights within {worst_w:.3f} quanta, biases "
          f"{worst_b:.3f}; {exact / total:.4f} of weight steps equal round(lr dW / s_w)")
    assert exact / total > 0.99


def test_stochastic_steps_are_the_float_step_rounded_down_or_up():
    rng = np.random.default_rng(1)
    means = []
    for trial in range(12):
        lr = float(rng.uniform(0.0005, 0.005))           # steps below one quantum
        layer, (x, zp, w, b, sx, sw, y) = random_layer(rng, 1, lr, stochastic=True)
        layer.forward()
        K.int_gemm_update(None, layer.I, (layer.Q, layer.w, layer.bias, layer.x, layer.g,
                                          layer.rates, layer.random, 1, 32, 10, 0))
        dw, db, _, _ = torch_step(x, zp, w, b, sx, sw, y, lr)
        got = w.astype(np.int64) - layer.weights()
        # floor or ceil of the exact step (2**-8 of slack for the fixed-point gradient)
        assert np.all((got >= np.floor(dw - 2 ** -8)) & (got <= np.ceil(dw + 2 ** -8)))
        means.append((got - dw).mean())
    # unbiased: round-to-nearest would lose every step below half a quantum
    assert abs(np.mean(means)) < 0.05, means


def test_softmax_cross_entropy_gradient_equals_torch():
    # Bound: |g / 2**14 - (softmax(z / 2**8) - onehot)| <= 4 / 2**14 (Q14 table entries and
    # their product rounded, the division rounded), loss within 2**-10.
    rng = np.random.default_rng(2)
    worst = worst_loss = 0.0
    for trial in range(40):
        m, n = 3, int(rng.integers(2, 13))
        z = rng.integers(-3000, 3000, (m, n)) // (1 + trial % 7)
        y = rng.integers(0, n, m)
        I = array("i", [int(v) for v in z.ravel()] + [0] * (m * n) + [0] * (2 * m)
                  + [int(v) for v in y] + host_ops.exp_table().tolist())
        K.int_softmax_ce(None, I, (0, m * n, 2 * m * n, 2 * m * n + 2 * m,
                                   2 * m * n + 3 * m, m, n))
        g = np.array(I[m * n:2 * m * n]).reshape(m, n) / 2 ** 14
        zt = torch.tensor(z / 2 ** LOGIT_BITS, dtype=torch.float64)
        p = torch.softmax(zt, 1).numpy()
        p[np.arange(m), y] -= 1
        worst = max(worst, float(np.abs(g - p).max()))
        loss = K.loss_value(I, 2 * m * n, m)
        expected = float(torch.nn.functional.cross_entropy(zt, torch.tensor(y)))
        worst_loss = max(worst_loss, abs(loss - expected))
        loss_ints, g_np = host_ops.softmax_ce(z, y)       # the numpy mirror: same integers
        assert np.array_equal(g_np, np.array(I[m * n:2 * m * n]).reshape(m, n))
    print(f"integer softmax-CE gradient vs torch: within {worst * 2 ** 14:.2f} / 2**14, "
          f"loss within {worst_loss:.2e}")
    assert worst <= 4 / 2 ** 14 and worst_loss <= 2 ** -10


def _accuracy(model, info, xs, ys):
    model.eval()
    right = 0
    for x, y in zip(xs, ys):
        _, logits = model(quantize_input(x, info).reshape(-1).tolist(), [int(y)])
        right += int(np.argmax(np.array(logits))) == int(y)
    model.train()
    return right / len(ys)


def _quant(info, name):
    # (scales, zero points, axis) of a quantized tensor: a Module's loader drops them once
    # they served the load-time checks, so the test reads the blob again
    b = device_blob_parser.load(info["blob"])
    return b.quant[b.tensor_id(name)]


def _fresh(info, tmp, name):
    # the classifier from zero (a new task for the head: chance to trained)
    n, k = info["classes"], info["features"]
    path = tmp / name
    write_checkpoint(path, {info["weight"]: np.zeros((n, k), np.int8),
                            info["bias"]: np.zeros(n, np.int32)}, {}, keep_integers=True)
    return CheckpointState.load_checkpoint(str(path))


@pytest.mark.parametrize("stochastic", [True, False])
def test_int_training_reaches_the_float_fine_tune(digits_int8, tmp_path, stochastic):
    lr, epochs = 0.01, 2
    info = int8_training_artifacts(digits_int8 / "qdq.onnx", tmp_path, lr, stochastic)
    data = np.load(DIGITS / "digits.npz")
    xs, ys, xv, yv = data["x_train"], data["y_train"], data["x_val"], data["y_val"]
    state = _fresh(info, tmp_path, "zero.ckpt")
    model = Module(info["blob"], state)
    opt = Optimizer(info["blob"], model)
    before = _accuracy(model, info, xv, yv)
    losses = []
    for _ in range(epochs):
        for x, y in zip(xs, ys):
            losses.append(model(quantize_input(x, info).reshape(-1).tolist(), [int(y)]))
            opt.step()
    after = _accuracy(model, info, xv, yv)
    # the float fine-tune: the same layer from zero, torch SGD at the same rate and order,
    # on the int8 backbone's features (dequantized)
    feature = info["feature_tensor"]
    zero_point = _quant(info, feature)[1][0]

    def features(samples):
        model.eval()
        out = []
        for x in samples:
            model(quantize_input(x, info).reshape(-1).tolist(), [0])
            out.append(np.frombuffer(bytes(model.output(feature)), np.uint8).astype(np.float64))
        model.train()
        return (np.array(out) - zero_point) * info["feature_scale"]

    ft, fv = features(xs), features(xv)
    linear = torch.nn.Linear(info["features"], info["classes"]).double()
    torch.nn.init.zeros_(linear.weight)
    torch.nn.init.zeros_(linear.bias)
    sgd = torch.optim.SGD(linear.parameters(), lr=lr)
    for _ in range(epochs):
        for i in range(len(xs)):
            sgd.zero_grad()
            torch.nn.functional.cross_entropy(linear(torch.tensor(ft[i:i + 1])),
                                              torch.tensor([int(ys[i])])).backward()
            sgd.step()
    float_acc = float((linear(torch.tensor(fv)).argmax(1).numpy() == yv).mean())
    print(f"digits classifier from zero, {epochs} epochs at lr {lr}: int8 "
          f"({'stochastic' if stochastic else 'nearest'} rounding) {before:.3f} -> {after:.3f}, "
          f"float fine-tune {float_acc:.3f}")
    assert before < 0.2
    assert np.mean(losses[-200:]) < np.mean(losses[:200])
    if stochastic:
        assert after >= float_acc - 0.02
    else:
        assert after > 0.7        # learns, but loses the steps below half a quantum
    # the trained state saves and loads: same eval logits
    CheckpointState.save_checkpoint(state, str(tmp_path / "trained.ckpt"))
    again = Module(info["blob"], CheckpointState.load_checkpoint(str(tmp_path / "trained.ckpt")))
    assert _accuracy(again, info, xv, yv) == after


@pytest.fixture(scope="module")
def ds_cnn_int8(tmp_path_factory):
    from reference_models import ds_cnn
    from torch_reference import qat_qdq_model
    tmp = tmp_path_factory.mktemp("ds_cnn_inttrain")
    xs, ys = qat_qdq_model(ds_cnn(), tmp, 8)      # observers calibrated
    info = int8_training_artifacts(tmp / "qdq.onnx", tmp / "int", 0.05, train_conv=True)
    rng = np.random.default_rng(5)
    records = b""
    for x, y in zip(xs[:4], ys[:4]):
        q = quantize_input(x + rng.standard_normal(x.shape).astype(np.float32) * 0.1, info)
        records += q.tobytes() + np.asarray(y, "<i4").tobytes()
    (tmp / "data.bin").write_bytes(records)
    return tmp, info


def test_ds_cnn_int_train_steps_under_heap_lock_viper_equals_pure_equals_cpython(
        ds_cnn_int8, micropython, tmp_path):
    tmp, info = ds_cnn_int8
    b = device_blob_parser.load(info["blob"], keep_steps=True)
    ops = [op for op, *_ in b.step_records["train"]]
    # frozen convs, the last one trained: int logits, loss, input gradient, updates
    assert ops.count(223) == 5 and ops[-5:] == [242, 243, 245, 244, 246]
    args = [info["blob"], info["checkpoint"], tmp / "data.bin", 6]
    script = ROOT / "tests" / "device_scripts" / "inttrain_steps.py"
    fast = run_micropython(micropython, script, *args, "fast", tmp_path / "mp_fast.ckpt")
    pure = run_micropython(micropython, script, *args, "pure", tmp_path / "mp_pure.ckpt")
    # the blob given as a buffer (in flash): its frozen int8 weights read in place
    flash = run_micropython(micropython, script, *args, "fast", tmp_path / "mp_flash.ckpt",
                            "buffer")
    cpython = subprocess.run([sys.executable, str(script), *map(str, args), "pure",
                              str(tmp_path / "cp.ckpt")], capture_output=True, text=True,
                             env={"PYTHONPATH": str(DEVICE)}, check=True).stdout
    assert fast.startswith("locked True viper True"), fast
    assert pure.startswith("locked False viper False")
    body = lambda out: out.split("\n", 1)[1]                      # noqa: E731
    assert body(fast) == body(pure) == body(cpython) == body(flash)
    start = CheckpointState.load_checkpoint(info["checkpoint"]).parameters
    trained = {line.split()[0]: line.split()[1:] for line in body(fast).split("\n")
               if line.split() and line.split()[0] in start}
    assert sorted(trained) == sorted(info["parameters"])
    for name, values in trained.items():       # every parameter moved
        p = start[name]
        assert values != [str(v & 255 if p.data_type == 3 else v) for v in p.data], name
    assert ((tmp_path / "mp_fast.ckpt").read_bytes() == (tmp_path / "mp_pure.ckpt").read_bytes()
            == (tmp_path / "cp.ckpt").read_bytes() == (tmp_path / "mp_flash.ckpt").read_bytes())


def _patched(blob_path, program, index, change, field=2):
    """The blob's bytes with step `index` of `program`'s ints (field 2; its tensor ids:
    field 1) changed by change(values), CRC fixed. (The logits and update steps share
    one ints vector: a change of it reaches both.)"""
    data = bytearray(open(blob_path, "rb").read())
    b = device_blob_parser.load(bytes(data), keep_steps=True)
    values = b.step_records[program][index][field]
    form = "<%d%s" % (len(values), "i" if field == 2 else "I")
    needle = struct.pack(form, *values)
    at = bytes(data).find(needle)
    assert at > 0
    data[at:at + len(needle)] = struct.pack(form, *change(list(values)))
    size = struct.unpack_from("<I", data, 0)[0]
    data[4 + size:] = struct.pack("<I", zlib.crc32(bytes(data[4:4 + size])) & 0xFFFFFFFF)
    return bytes(data)


def test_crafted_blobs_checkpoints_and_inputs_are_refused(digits_int8, tmp_path):
    info = int8_training_artifacts(digits_int8 / "qdq.onnx", tmp_path, 0.01)
    b = device_blob_parser.load(info["blob"], keep_steps=True)
    train_ops = [op for op, *_ in b.step_records["train"]]
    logits_at, update_at = train_ops.index(242), train_ops.index(244)
    for index, field, change, match in (
            (logits_at, 2, lambda v: [v[0], v[1] * 4, v[2], v[3]], "int_gemm_logits"),
            (logits_at, 2, lambda v: [v[0], v[1], v[2] + 1, v[3]], "int_gemm_logits"),
            (logits_at, 2, lambda v: [v[0] + 5, v[1], v[2], v[3]], "int_gemm_logits"),
            (logits_at, 2, lambda v: [v[0], 5000, v[2], v[3]], "inputs per output"),
            (logits_at, 2, lambda v: [v[0], v[1], v[2], 7], "signed flag"),
            # the update's weight: the input; its generator state: the rates
            (update_at, 1, lambda t: [t[2]] + t[1:], "int_gemm_update"),
            (update_at, 1, lambda t: t[:5] + [t[4]], "optimizer_state"),
            (update_at, 1, lambda t: t[:3] + [t[0]] + t[4:], "op 244")):
        data = _patched(info["blob"], "train", index, change, field)
        with pytest.raises(BlobError, match=match):
            device_blob_parser.load(data)
    # a corrupt exp table (an increasing entry)
    table = host_ops.exp_table()
    data = bytearray(open(info["blob"], "rb").read())
    at = bytes(data).find(table.astype("<i4").tobytes())
    assert at > 0
    data[at + 8:at + 12] = struct.pack("<i", 16384)
    size = struct.unpack_from("<I", data, 0)[0]
    data[4 + size:] = struct.pack("<I", zlib.crc32(bytes(data[4:4 + size])) & 0xFFFFFFFF)
    with pytest.raises(BlobError, match="exp table"):
        device_blob_parser.load(bytes(data))
    # a checkpoint whose weight is float, or of the wrong size
    n, k = info["classes"], info["features"]
    write_checkpoint(tmp_path / "float.ckpt", {info["weight"]: np.zeros((n, k), np.float32),
                                               info["bias"]: np.zeros(n, np.int32)}, {},
                     keep_integers=True)
    with pytest.raises(ParameterError, match="data type"):
        Module(info["blob"], CheckpointState.load_checkpoint(str(tmp_path / "float.ckpt")))
    write_checkpoint(tmp_path / "short.ckpt", {info["weight"]: np.zeros((n, k - 1), np.int8),
                                               info["bias"]: np.zeros(n, np.int32)}, {},
                     keep_integers=True)
    with pytest.raises(ParameterError):
        Module(info["blob"], CheckpointState.load_checkpoint(str(tmp_path / "short.ckpt")))
    model = Module(info["blob"], CheckpointState.load_checkpoint(info["checkpoint"]))
    x = [0] * 64
    with pytest.raises(InputError, match="class index"):
        model(x, [10])
    with pytest.raises(InputError, match="uint8 range"):
        model([300] + x[1:], [1])
    with pytest.raises(ParameterError, match="integer parameters"):
        model.get_contiguous_parameters()


def test_cli_export_int8_train(digits_int8, tmp_path):
    import json
    out = subprocess.run(
        [sys.executable, "-m", "microtrain_host.cli", "export", str(digits_int8),
         "--checkpoint", str(digits_int8 / "trained"), "--qdq", "-o", str(tmp_path / "q.onnx"),
         "--int8-train", str(tmp_path / "int8"), "--int8-lr", "0.02", "--int8-nearest",
         "--int8-momentum", "0.5"],
        capture_output=True, text=True, check=True).stdout
    assert "integer training blob" in out
    info = json.loads((tmp_path / "int8" / "int8_train.json").read_text())
    assert info["learning_rate"] == 0.02 and info["stochastic"] is False
    assert info["momentum"] == 0.5
    b = device_blob_parser.load(info["blob"], keep_steps=True)
    assert [op for op, *_ in b.step_records["train"]][-3:] == [242, 243, 247]
    assert b.optimizer["learning_rate"] == pytest.approx(0.02)
    update = b.step_records["train"][-1]
    assert update[1][5] == 0xFFFFFFFF and update[3 - 1][-1] == 8192   # nearest; mu 0.5 Q14
    refused = subprocess.run(
        [sys.executable, "-m", "microtrain_host.cli", "export", str(digits_int8),
         "--checkpoint", str(digits_int8 / "trained"), "-o", str(tmp_path / "f.onnx"),
         "--int8-train", str(tmp_path / "x")], capture_output=True, text=True)
    assert refused.returncode != 0 and "--int8-train needs --qdq" in refused.stderr


def test_last_conv_update_equals_torch_float64(ds_cnn_int8, tmp_path):
    # The DS-CNN's last pointwise conv (1x1, ReLU) and the classifier trained together: one
    # integer step against torch float64 on the dequantized layers, with the int8 forward's
    # values and its ReLU / clamp mask (straight through the GlobalAveragePool, as QAT).
    # Bound: within 1 quantum of round(lr * dL/dW / s_w) (D carries 9 significant bits in
    # the weight steps, 15 in the bias steps, the probabilities 14).
    tmp, _ = ds_cnn_int8
    lr = 2.0
    info = int8_training_artifacts(tmp / "qdq.onnx", tmp_path, lr, stochastic=False,
                                   train_conv=True)
    state = CheckpointState.load_checkpoint(info["checkpoint"])
    model = Module(info["blob"], state)
    b = model.blob
    rng = np.random.default_rng(9)
    x = rng.integers(0, 256, info["input_shape"]).reshape(-1).tolist()
    y = [int(v) for v in rng.integers(0, info["classes"], info["batch_size"])]
    w_name, b_name, w2_name, b2_name = info["parameters"]
    before = {name: np.array(state.parameters[name].data).copy() for name in info["parameters"]}
    before[w_name] = before[w_name].astype(np.uint8).view(np.int8).astype(np.int64)
    before[w2_name] = before[w2_name].astype(np.uint8).view(np.int8).astype(np.int64)
    model.eval()
    model(x, y)
    records = device_blob_parser.load(info["blob"], keep_steps=True).step_records["train"]
    conv_step = [r for r in records if r[0] == 246][0]
    x2_id, y2_id = conv_step[1][2], conv_step[1][3]
    # the scales as the host parses them (a loaded blob drops them once its checks derived
    # the multipliers: loader.load_into_arenas)
    quant = device_blob_parser.load(info["blob"]).quant
    grab = lambda tid: np.frombuffer(bytes(model.output(tid)),                 # noqa: E731
                                     np.int8 if b.dtypes[tid] == 2 else np.uint8).astype(np.int64)
    x2, y2, feat = grab(x2_id), grab(y2_id), grab(b.tensor_id(info["feature_tensor"]))
    model.train()
    model(x, y)
    after = {name: np.array(state.parameters[name].data) for name in info["parameters"]}
    after[w_name] = after[w_name].astype(np.uint8).view(np.int8).astype(np.int64)
    after[w2_name] = after[w2_name].astype(np.uint8).view(np.int8).astype(np.int64)
    # torch float64
    m, k, n = info["batch_size"], info["features"], info["classes"]
    cout = state.parameters[w2_name].shape[0]
    cin = before[w2_name].size // cout
    sx2, zx2 = quant[x2_id][0][0], quant[x2_id][1][0]
    zy2 = quant[y2_id][1][0]
    sw2 = np.array(quant[b.tensor_id(w2_name)][0], np.float64)
    sw = np.array(info["weight_scales"], np.float64)
    sf, zf = quant[b.tensor_id(info["feature_tensor"])][0][0], \
        quant[b.tensor_id(info["feature_tensor"])][1][0]
    plane = x2.size // (m * cin)
    X2 = torch.tensor((x2.reshape(m, cin, plane) - zx2) * sx2)
    W2 = torch.tensor(before[w2_name].reshape(cout, cin) * sw2[:, None], requires_grad=True)
    B2 = torch.tensor(before[b2_name] * sx2 * sw2, requires_grad=True)
    Y2 = torch.einsum("ct,mtp->mcp", W2, X2) + B2[None, :, None]
    lo, hi = (0, 255) if b.dtypes[y2_id] == 3 else (-128, 127)
    lo = max(lo, zy2)                                                   # the fused ReLU
    mask = torch.tensor(((y2.reshape(m, cout, plane) > lo) & (y2.reshape(m, cout, plane) < hi))
                        .astype(np.float64))
    pooled = (Y2 * mask).mean(dim=2)
    feature = torch.tensor((feat.reshape(m, k) - zf) * sf) + pooled - pooled.detach()
    W = torch.tensor(before[w_name].reshape(n, k) * sw[:, None], requires_grad=True)
    B = torch.tensor(before[b_name] * info["feature_scale"] * sw, requires_grad=True)
    torch.nn.functional.cross_entropy(feature @ W.T + B, torch.tensor(y)).backward()
    dw2 = lr * W2.grad.numpy() / sw2[:, None]
    db2 = lr * B2.grad.numpy() / (sx2 * sw2)
    dw = lr * W.grad.numpy() / sw[:, None]
    got_w2 = (before[w2_name] - after[w2_name]).reshape(cout, cin)
    got_b2 = before[b2_name] - after[b2_name]
    got_w = (before[w_name] - after[w_name]).reshape(n, k)
    assert np.abs(dw2).max() > 3 and np.abs(dw).max() > 3       # real steps, not all zero
    free = np.abs(before[w2_name].reshape(cout, cin) - np.round(dw2)) <= 127
    free_w = np.abs(before[w_name].reshape(n, k) - np.round(dw)) <= 127
    print(f"last conv: int step vs torch float64 within "
          f"{np.abs(got_w2 - dw2)[free].max():.3f} quanta (weights, steps up to "
          f"{np.abs(dw2).max():.1f}), {np.abs(got_b2 - db2).max():.3f} (biases, steps up to "
          f"{np.abs(db2).max():.0f}); classifier "
          f"{np.abs(got_w - dw)[free_w].max():.3f} (unclamped weights)")
    assert np.all(np.abs(got_w2 - np.round(dw2))[free] <= 1)
    assert np.all(np.abs(got_b2 - np.round(db2)) <= 1)
    assert np.all(np.abs(got_w - np.round(dw))[free_w] <= 1)


BOARD_SCRIPT = """
import gc
from array import array
import micropython
from microtrain import CheckpointState, Module
from microtrain.feed import copy_inputs
from microtrain.kernels import inttrain, qlinear


def run(path, lock):
    state = CheckpointState.load_checkpoint('int8_train.ckpt')
    model = Module('int8_train.mtb', state)
    b = model.blob
    program = model._train
    xin, lab = program.inputs
    nx, nl = b.sizes[xin], b.sizes[lab]
    data = open('data.bin', 'rb').read()
    record = nx + 4 * nl
    for s in range(STEPS):
        at = (s % (len(data) // record)) * record
        copy_inputs(b, model.F, model.I, program, (array('B', data[at:at + nx]),
                    array('i', data[at + nx:at + record])), b.num_classes)
        if lock:
            micropython.heap_lock()
        try:
            for kernel, args in program.steps:
                kernel(model.F, model.I, args)
        finally:
            if lock:
                micropython.heap_unlock()
    for name in sorted(state.parameters):
        print(name, ' '.join(str(v) for v in state.parameters[name].data))
    CheckpointState.save_checkpoint(state, path)
    del model, state
    gc.collect()


print('viper', inttrain.FAST)
run('trained', True)
qlinear.use_fast(False)
inttrain.use_fast(False)     # the pure-Python kernels: 12-bit limbs on 32-bit small ints
print('pure')
run('pure.ckpt', False)
"""


def board_firmware():
    """The emulated board's firmware (skipped when not built; MICROTRAIN_REQUIRE_QEMU=1
    makes that a failure)."""
    import os
    from pathlib import Path
    from microtrain_host.tools import deploy
    path = Path(os.environ.get("MICROTRAIN_QEMU_FIRMWARE")
                or ROOT / ".cache" / "qemu-board" / "firmware.elf")
    if not path.exists() or deploy.shutil.which("qemu-system-arm") is None:
        if os.environ.get("MICROTRAIN_REQUIRE_QEMU") == "1":
            pytest.fail(f"emulated board not built ({path})")
        pytest.skip("emulated board not built: run scripts/build_qemu_board.sh")
    return path


def train_on_board_and_cpython(firmware, info, tmp_path, steps, board_script, timeout,
                               board="qemu-mps2-an385"):
    """`steps` integer train steps over tmp_path/data.bin under CPython and on an emulated
    board (board_script: BOARD_SCRIPT or a variant); the board's checkpoint must equal
    CPython's byte for byte. Returns the trained parameters' lines of CPython, of the board's
    viper kernels and of its pure-Python kernels."""
    from microtrain_host.tools import deploy
    script = ROOT / "tests" / "device_scripts" / "inttrain_steps.py"
    cpython = subprocess.run([sys.executable, str(script), info["blob"], info["checkpoint"],
                              str(tmp_path / "data.bin"), str(steps), "pure",
                              str(tmp_path / "cp.ckpt")], capture_output=True, text=True,
                             env={"PYTHONPATH": str(DEVICE)}, check=True).stdout
    expected = [line for line in cpython.splitlines() if line.split()[0] in info["parameters"]]
    plan = emulated_board_plan(tmp_path, tmp_path, [
        (info["blob"], "int8_train.mtb"), (info["checkpoint"], "int8_train.ckpt"),
        (tmp_path / "data.bin", "data.bin")], board=board)
    # a board script, or (viper part, pure part) run on two boots: a big model's second run
    # may not find its arenas' blocks in the heap the first one left
    out = []
    for part, script in enumerate([board_script] if isinstance(board_script, str)
                                  else board_script):
        path = tmp_path / "on_board.py"
        path.write_text(f"STEPS = {steps}\n" + script)
        with deploy.QemuBoard(firmware, board=board, rom=plan.romfs_image) as qemu:
            proc = deploy.subprocess.run(deploy.mpremote_command(
                plan, qemu.port, path, tmp_path / "board.ckpt" if part == 0 else None,
                rom_loaded=True),
                capture_output=True, text=True, timeout=timeout)
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
        out += proc.stdout.splitlines()
    assert "pure" in out, out[-20:]
    assert "viper True" in out
    at = out.index("pure")
    fast = [line for line in out[out.index("viper True"):at] if line.split() and
            line.split()[0] in info["parameters"]]
    pure = [line for line in out[at + 1:] if line.split() and
            line.split()[0] in info["parameters"]]
    assert (tmp_path / "board.ckpt").read_bytes() == (tmp_path / "cp.ckpt").read_bytes()
    return expected, fast, pure


def check_digits_int_training_on_board(digits_int8, firmware, tmp_path,
                                       board="qemu-mps2-an385"):
    """The digits classifier trained in integers on an emulated board, viper kernels under
    heap_lock and pure-Python kernels: the same parameters and checkpoint, byte for byte, as
    CPython (40 samples, 30 steps)."""
    info = int8_training_artifacts(digits_int8 / "qdq.onnx", tmp_path / "int", 0.05)
    data = np.load(DIGITS / "digits.npz")
    records = b"".join(quantize_input(x, info).tobytes() + np.int32(y).tobytes()
                       for x, y in zip(data["x_train"][:40], data["y_train"][:40]))
    (tmp_path / "data.bin").write_bytes(records)
    expected, fast, pure = train_on_board_and_cpython(firmware, info, tmp_path, 30,
                                                      BOARD_SCRIPT, 900, board=board)
    assert len(expected) == 2 and fast == pure == expected


def test_int_training_on_the_emulated_board_equals_cpython(digits_int8, tmp_path):
    # on the emulated Cortex-M3: 32-bit small ints, float32 at load
    check_digits_int_training_on_board(digits_int8, board_firmware(), tmp_path)


def test_momentum_steps_follow_torch_sgd_momentum():
    # torch.optim.SGD(momentum=mu): v = mu v + g, w -= lr v. In quanta the int velocity V
    # (1/256 quanta) must satisfy V_t / 256 = mu V_{t-1} / 256 + lr dW_t / s_w (dW_t: torch's
    # float64 gradient at the current int weights) within 2**-7 quanta plus the fixed-point
    # gradient error, and each weight must move by V_t / 256 rounded half to even.
    rng = np.random.default_rng(4)
    mu, lr = 0.9, 0.02
    worst = 0.0
    for trial in range(4):
        layer, (x, zp, w, b, sx, sw, y) = random_layer(rng, 2, lr)
        n, k = 10, 32
        vw_at = len(layer.Q)
        layer.Q.extend(bytes(2 * n * k))
        vb_at = len(layer.I)
        layer.I.extend(array("i", [0] * n))
        velocity = np.zeros((n, k))
        for step in range(4):
            w_now = layer.weights().astype(np.int64)
            b_now = layer.ints("bias", n)
            layer.forward()
            K.int_gemm_update_momentum(None, layer.I, (
                layer.Q, layer.w, layer.bias, layer.x, layer.g, layer.rates, -1, vw_at, vb_at,
                2, k, n, 0, round(mu * 16384)))
            dw, db, _, _ = torch_step(x, zp, w_now.astype(np.int8), b_now, sx, sw, y, lr)
            v_int = np.frombuffer(bytes(layer.Q[vw_at:vw_at + 2 * n * k]),
                                  "<i2").reshape(n, k) / 256
            expected = mu * velocity + dw
            worst = max(worst, float(np.abs(v_int - expected).max()))
            assert np.all(np.abs(v_int - expected) <= 2 ** -7 + 0.01 * np.abs(dw) + 2 ** -8), step
            moved = w_now - layer.weights()
            free = np.abs(w_now - np.round(v_int)) <= 127
            assert np.array_equal(moved[free], np.round(v_int)[free])
            velocity = v_int
    print(f"int momentum velocity vs torch's rule: within {worst:.4f} quanta")


def test_momentum_training_reaches_torch_sgd_momentum(digits_int8, tmp_path):
    lr, mu, epochs = 0.002, 0.9, 2
    info = int8_training_artifacts(digits_int8 / "qdq.onnx", tmp_path, lr, momentum=mu)
    b = device_blob_parser.load(info["blob"], keep_steps=True)
    assert [op for op, *_ in b.step_records["train"]][-1] == 247
    data = np.load(DIGITS / "digits.npz")
    xs, ys, xv, yv = data["x_train"], data["y_train"], data["x_val"], data["y_val"]
    model = Module(info["blob"], _fresh(info, tmp_path, "zero.ckpt"))
    for _ in range(epochs):
        for x, y in zip(xs, ys):
            model(quantize_input(x, info).reshape(-1).tolist(), [int(y)])
    after = _accuracy(model, info, xv, yv)
    model.eval()
    feats = []
    for x in list(xs) + list(xv):
        model(quantize_input(x, info).reshape(-1).tolist(), [0])
        feats.append(np.array(model.output(info["feature_tensor"]), np.float64))
    zero_point = _quant(info, info["feature_tensor"])[1][0]
    feats = (np.array(feats) - zero_point) * info["feature_scale"]
    ft, fv = feats[:len(xs)], feats[len(xs):]
    linear = torch.nn.Linear(info["features"], info["classes"]).double()
    torch.nn.init.zeros_(linear.weight)
    torch.nn.init.zeros_(linear.bias)
    sgd = torch.optim.SGD(linear.parameters(), lr=lr, momentum=mu)
    for _ in range(epochs):
        for i in range(len(xs)):
            sgd.zero_grad()
            torch.nn.functional.cross_entropy(linear(torch.tensor(ft[i:i + 1])),
                                              torch.tensor([int(ys[i])])).backward()
            sgd.step()
    float_acc = float((linear(torch.tensor(fv)).argmax(1).numpy() == yv).mean())
    print(f"digits classifier from zero, SGD momentum {mu} lr {lr}, {epochs} epochs: int8 "
          f"{after:.3f}, float {float_acc:.3f}")
    assert after >= float_acc - 0.02


def test_momentum_viper_equals_pure_equals_cpython(digits_int8, micropython, tmp_path):
    info = int8_training_artifacts(digits_int8 / "qdq.onnx", tmp_path / "int", 0.01,
                                   momentum=0.9)
    data = np.load(DIGITS / "digits.npz")
    (tmp_path / "data.bin").write_bytes(b"".join(
        quantize_input(x, info).tobytes() + np.int32(y).tobytes()
        for x, y in zip(data["x_train"][:20], data["y_train"][:20])))
    args = [info["blob"], info["checkpoint"], tmp_path / "data.bin", 20]
    script = ROOT / "tests" / "device_scripts" / "inttrain_steps.py"
    fast = run_micropython(micropython, script, *args, "fast", tmp_path / "f.ckpt")
    pure = run_micropython(micropython, script, *args, "pure", tmp_path / "p.ckpt")
    cpython = subprocess.run([sys.executable, str(script), *map(str, args), "pure",
                              str(tmp_path / "c.ckpt")], capture_output=True, text=True,
                             env={"PYTHONPATH": str(DEVICE)}, check=True).stdout
    assert fast.startswith("locked True viper True")
    body = lambda out: out.split("\n", 1)[1]                      # noqa: E731
    assert body(fast) == body(pure) == body(cpython)


def test_set_learning_rate_rewrites_the_integer_multipliers(digits_int8, tmp_path):
    info = int8_training_artifacts(digits_int8 / "qdq.onnx", tmp_path, 0.01, stochastic=False)
    state = CheckpointState.load_checkpoint(info["checkpoint"])
    model = Module(info["blob"], state)
    opt = Optimizer(info["blob"], model)
    x = quantize_input(np.load(DIGITS / "digits.npz")["x_train"][0], info).reshape(-1).tolist()
    n, k = info["classes"], info["features"]
    weights = lambda: np.frombuffer(bytes(state.parameters[info["weight"]].data),  # noqa: E731
                                    np.int8).reshape(n, k).copy()
    biases = lambda: np.array(state.parameters[info["bias"]].data, np.int64)      # noqa: E731
    w0, b0 = weights(), biases()
    opt.set_learning_rate(0.0)
    model(x, [3])
    assert np.array_equal(weights(), w0) and opt.get_learning_rate() == 0.0
    # lr 0.5: the device's step equals the numpy mirror's (ops/inttrain.py) at lr 0.5
    model.eval()
    model(x, [3])
    feature = np.frombuffer(bytes(model.output(info["feature_tensor"])), np.uint8)[None]
    model.train()
    opt.set_learning_rate(0.5)
    model(x, [3])
    q = _quant(info, info["feature_tensor"])
    sx, zx = q[0][0], q[1][0]
    sw = np.array(info["weight_scales"], np.float32)
    z = host_ops.logits(feature, zx, w0, b0, sx, sw)
    _, g = host_ops.softmax_ce(z, np.array([3]))
    w1, b1 = host_ops.update(w0, b0, feature, zx, g, sx, sw, 0.5)
    assert np.abs(w0.astype(int) - w1).max() > 0
    assert np.array_equal(weights(), w1) and np.array_equal(biases(), b1)
    opt.step()
    assert state.optimizer_step == 1          # Optimizer.step counts; the update is done
    with pytest.raises(ParameterError):
        opt.set_learning_rate(float("nan"))


@pytest.mark.parametrize("trained", [{"train_conv": True}, {"momentum": 0.5},
                                     {"train_biases": True, "train_depthwise": True}])
def test_room_for_classes_trains_as_the_plain_classifier(ds_cnn_int8, tmp_path, trained):
    # Every integer configuration packed with unused class slots (--int8-max-classes) loads
    # and trains on the device runtime, every trained tensor bit for bit as without the slots
    # (the same stochastic-rounding draws: unused rows draw none), the slots untouched.
    tmp, _ = ds_cnn_int8
    data = (tmp / "data.bin").read_bytes()
    runs = []
    for room in ({}, {"max_classes": 15}):
        info = int8_training_artifacts(tmp / "qdq.onnx", tmp_path / str(len(room)), 0.05,
                                       **trained, **room)
        state = CheckpointState.load_checkpoint(info["checkpoint"])
        model = Module(info["blob"], state)
        opt = Optimizer(info["blob"], model)
        x_id, y_id = model._train.inputs       # data.bin: batches of inputs, then labels
        n, m = model.blob.sizes[x_id], model.blob.sizes[y_id]
        kind = np.int8 if model.blob.dtypes[x_id] == 2 else np.uint8
        for at in range(0, len(data), n + 4 * m):
            model(np.frombuffer(data[at:at + n], kind).tolist(),
                  list(struct.unpack("<%di" % m, data[at + n:at + n + 4 * m])))
            opt.step()
        runs.append({name: np.array(p.data, np.int64) for name, p in state.parameters.items()})
    plain, padded = runs
    classes = len(plain[info["bias"]])
    assert classes < 15 and set(plain) == set(padded)
    for name in plain:
        if name in (info["weight"], info["bias"]):
            rows = padded[name].reshape(15, -1)
            assert np.array_equal(rows[:classes].reshape(-1), plain[name]), name
            unused = rows[classes:]
            assert (unused == (K.UNUSED_BIAS if name == info["bias"] else 0)).all()
        else:
            assert np.array_equal(padded[name], plain[name]), name
