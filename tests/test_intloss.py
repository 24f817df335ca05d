"""Issue 22 scope 2, losses in integers (kernels/intloss.py, ops/intloss.py, quant/inttrain.py
loss=...): the mean squared error and binary cross-entropy with logits of the last Gemm.
One integer step against torch float64 on the dequantized layer (F.mse_loss /
BCEWithLogitsLoss, SGD), the loss Module reports against torch's, the numpy mirrors against
the kernels; an autoencoder in the MLPerf Tiny AD shape and a BCE binary classifier from the
QAT pack through `microtrain export --qdq --int8-train` to integer training on the device
runtime (loss falls; the anomaly AUC against the same float32 fine-tune of the last layer;
the MicroPython Unix port under heap_lock gives CPython's bytes); losses with no integer form
refused at pack time, by name."""
import json
import struct
import subprocess
import sys
import zlib
from array import array

import numpy as np
import pytest
import torch

from conftest import DEVICE, ROOT, run_micropython
from microtrain import CheckpointState, Module, Optimizer
from microtrain import parser as device_blob_parser
from microtrain.errors import BlobError
from microtrain.kernels import intloss as L
from microtrain.kernels import inttrain as K
from microtrain.kernels.fixedpoint import f32, requant_pair
from microtrain_host.ops import intloss as host_loss
from microtrain_host.ops.inttrain import LOGIT_BITS, exp_table
from microtrain_host.quant.intloss import quantize_target
from microtrain_host.quant.inttrain import int8_training_artifacts, quantize_input

STEPS_SCRIPT = ROOT / "tests" / "device_scripts" / "inttrain_steps.py"


def _cpython_viper_pure(micropython, info, data):
    # 6 integer steps on CPython, on MicroPython under heap_lock (viper) and with the pure
    # kernels: the same parameters and loss ints
    out = str(data) + ".ckpt"
    runs = [subprocess.run([sys.executable, str(STEPS_SCRIPT), info["blob"],
                            info["checkpoint"], str(data), "6", "pure", out],
                           capture_output=True, text=True, env={"PYTHONPATH": str(DEVICE)},
                           check=True).stdout]
    for mode in ("fast", "pure"):
        runs.append(run_micropython(micropython, STEPS_SCRIPT, info["blob"], info["checkpoint"],
                                    data, 6, mode, out))
    assert "locked True" in runs[1]
    strip = [[line for line in r.splitlines() if not line.startswith("locked")] for r in runs]
    assert strip[0] == strip[1] == strip[2] and len(strip[0]) == 3


class Head:
    """The last Gemm and an integer loss in arenas, run with the kernels directly: bytes x
    [m, k] uint8, W [n, k], the mse target [m, n] uint8; ints bias, logits req, z, g, loss,
    the target's req, the bce target (Q14), exp table, update rates."""

    def __init__(self, x, x_zp, w, bias, sx, sw, tq, t_zp, st, t14, lr, loss):
        m, k = x.shape
        n = w.shape[0]
        self.m, self.k, self.n, self.loss_kind = m, k, n, loss
        self.Q = bytearray(np.concatenate([x.reshape(-1), w.reshape(-1).astype(np.int64) & 255,
                                           tq.reshape(-1) & 255]).astype(np.uint8).tobytes())
        self.x, self.w, self.t = 0, m * k, m * k + n * k
        req = [x_zp]
        for j in range(n):
            req += requant_pair(f32(f32(sx * float(sw[j])) * 2 ** LOGIT_BITS))
        count = f32(m * n / 128.0) if loss == "mse" else f32(m * n)
        rates = K.rate_values(x_zp, K.update_reals(sx, [float(s) for s in sw], count, lr))
        parts = [("bias", bias), ("req", req), ("z", [0] * (m * n)), ("g", [0] * (m * n)),
                 ("lossints", [0] * (4 * m)), ("treq", [t_zp] + list(requant_pair(f32(st * 2 ** LOGIT_BITS)))),
                 ("t14", t14.reshape(-1)), ("table", exp_table()), ("rates", rates)]
        values = []
        for name, v in parts:
            setattr(self, name, len(values))
            values += [int(t) for t in v]
        self.I = array("i", values)

    def step(self):
        m, n, k = self.m, self.n, self.k
        K.int_gemm_logits(None, self.I, (self.Q, self.z, self.x, self.w, self.bias, self.req,
                                         m, k, n, 0))
        if self.loss_kind == "mse":
            L.int_mse(None, self.I, (self.Q, self.z, self.g, self.lossints, self.t, self.treq,
                                     m, n, 0))
            value = L.mse_value(self.I, self.lossints, m, n)
        else:
            L.int_bce_logits(None, self.I, (self.z, self.g, self.lossints, self.t14,
                                            self.table, m, n))
            value = L.bce_value(self.I, self.lossints, m, n)
        self.z_before = self.ints("z", m * n).reshape(m, n)
        self.g_after = self.ints("g", m * n).reshape(m, n)
        K.int_gemm_update(None, self.I, (self.Q, self.w, self.bias, self.x, self.g, self.rates,
                                         -1, m, k, n, 0))
        return value

    def weights(self):
        return np.frombuffer(bytes(self.Q[self.w:self.w + self.n * self.k]),
                             np.int8).reshape(self.n, self.k).astype(np.int64)

    def ints(self, name, count):
        at = getattr(self, name)
        return np.array(self.I[at:at + count], np.int64)


def random_head(rng, m, loss):
    k, n = 32, 16
    sx = float(np.float32(rng.uniform(0.01, 0.03)))
    x_zp = int(rng.integers(0, 20))
    sw = rng.uniform(0.002, 0.006, n).astype(np.float32)
    x = rng.integers(0, 256, (m, k))
    w = rng.integers(-60, 61, (n, k)).astype(np.int8)
    b = rng.integers(-2000, 2000, n).astype(np.int32)
    st = float(np.float32(rng.uniform(0.02, 0.05)))
    t_zp = 128
    tq = rng.integers(0, 256, (m, n))
    t14 = rng.integers(0, 16385, (m, n))
    lr = float(rng.uniform(0.5, 2.0)) if loss == "mse" else float(rng.uniform(2.0, 8.0))
    return (x, x_zp, w, b, sx, sw, tq, t_zp, st, t14, lr), lr


def torch_head_step(x, x_zp, w, b, sx, sw, tq, t_zp, st, t14, lr, loss):
    """torch float64 on the dequantized layer: (the loss, the SGD step in weight quanta, in
    bias quanta)."""
    sw64 = sw.astype(np.float64)
    xr = torch.tensor((x - x_zp) * np.float64(sx))
    W = torch.tensor(w * sw64[:, None], requires_grad=True)
    B = torch.tensor(b * np.float64(sx) * sw64, requires_grad=True)
    y = xr @ W.T + B
    if loss == "mse":
        value = torch.nn.functional.mse_loss(y, torch.tensor((tq - t_zp) * np.float64(st)))
    else:
        value = torch.nn.BCEWithLogitsLoss()(y, torch.tensor(t14 / 16384.0))
    value.backward()
    return (float(value.detach()), lr * W.grad.numpy() / sw64[:, None],
            lr * B.grad.numpy() / (np.float64(sx) * sw64))


@pytest.mark.parametrize("loss", ["mse", "bce_with_logits"])
def test_int_loss_step_equals_torch_float64(loss):
    # One step of the last Gemm: every unclamped weight's and bias' integer step within half
    # a quantum (the rounding) + 1e-3 of the layer's largest step of torch's float64 SGD
    # step on the dequantized layer; the loss Module reports equal to torch's within the
    # rounding of the outputs (2**-9) and of the target (2**-9) to the outputs' fixed point
    # (mse), resp. within 2**-12 (the Q14 sigmoid table, the 2**-9 outputs: bce).
    rng = np.random.default_rng(5)
    worst = worst_loss = 0.0
    for trial in range(18):
        m = (1, 2, 4)[trial % 3]
        args, lr = random_head(rng, m, loss)
        x, x_zp, w, b, sx, sw, tq, t_zp, st, t14, _ = args
        head = Head(*args, loss)
        value = head.step()
        expected, dw, db = torch_head_step(*args, loss)
        got_w = w.astype(np.int64) - head.weights()
        got_b = b.astype(np.int64) - head.ints("bias", len(b))
        free = np.abs(w - np.round(dw)) <= 127
        top = max(np.abs(dw).max(), 1.0)
        assert np.abs(dw).max() > 3, trial                  # real steps, not all zero
        assert np.all(np.abs(got_w - dw)[free] <= 0.5 + 1e-3 * top), trial
        # the bias' quanta (s_x s_w) are finer than the outputs' fixed point: its step is
        # within half a quantum + 1e-3 of its largest step + what the outputs' and the
        # target's rounding (2**-9 each: 2**-8 per element of d, mse) moves it
        drift = lr * 2 * 2 ** -8 / len(b) / (sx * sw.astype(np.float64)) if loss == "mse" \
            else 0.0
        assert np.all(np.abs(got_b - db) <= 0.5 + 1e-3 * max(np.abs(db).max(), 1.0) + drift), \
            trial
        worst = max(worst, float((np.abs(got_w - dw)[free] - 0.5).max() / top))
        if loss == "mse":
            d = np.abs(head.z_before / 2 ** LOGIT_BITS - (tq - t_zp) * st)
            bound = float(np.mean(2 * d * 2 ** -8 + 2 ** -16)) + 1e-9
        else:       # (its loss ints take |z| in 2**-8 units: rounded, half a unit at most)
            bound = 2 ** -12 + 2 ** -9
        assert abs(value - expected) <= bound, (trial, value, expected)
        worst_loss = max(worst_loss, abs(value - expected))
        # the numpy mirrors: the same gradient ints and loss value
        if loss == "mse":
            mirror, g = host_loss.mse(head.z_before, tq, t_zp, st)
        else:
            mirror, g = host_loss.bce_with_logits(head.z_before, t14)
        assert np.array_equal(g, head.g_after) and mirror == pytest.approx(value, abs=1e-12)
    print(f"{loss}: int step vs torch float64 beyond half a quantum by at most "
          f"{max(worst, 0.0):.2e} of the largest step; loss within {worst_loss:.2e}")


def test_int_mse_loss_ints_stay_small_and_exact_far_from_the_target():
    # |d| up to the clamp, 2048 outputs: the loss ints stay below 2**30 (32-bit small ints)
    # and the value is the exact sum of squares in 2**-16 units (|d| clamped to 2**18)
    # (z in 2**-LOGIT_BITS units, d = z - t in 2**-8 units: here exactly z / 2**4)
    n = 2048
    d = np.array([(-1) ** j * (j * 131 % (1 << 19)) for j in range(n)], np.int64)
    z = d << (LOGIT_BITS - 8)
    I = array("i", list(z) + [0] * n + [0, 0] + [0, 1 << 24, 24])     # target req: 0 * ...
    Q = bytearray(n)
    L.int_mse(None, I, (Q, 0, n, 2 * n, 0, 2 * n + 2, 1, n, 0))
    hi, lo = I[2 * n], I[2 * n + 1]
    assert 0 <= hi < 2 ** 30 and 0 <= lo < 2 ** 18
    a = np.minimum(np.abs(d), 1 << 18)
    assert hi * 2 ** 18 + lo == int((a * a).sum())
    assert list(I[n:2 * n]) == list(np.clip(d, -2 ** 14, 2 ** 14))


# -- end to end: QAT pack -> host training -> export --qdq --int8-train -> device ----------
def _blocks(sizes):
    layers = []
    for a, b in zip(sizes[:-2], sizes[1:-1]):
        layers += [torch.nn.Linear(a, b), torch.nn.BatchNorm1d(b), torch.nn.ReLU()]
    return torch.nn.Sequential(*layers, torch.nn.Linear(sizes[-2], sizes[-1]))


def _normal_data(rng, count, basis):
    # normal samples: a 4-dimensional latent through a fixed basis, plus a little noise
    z = rng.standard_normal((count, basis.shape[0]))
    return (z @ basis + 0.1 * rng.standard_normal((count, basis.shape[1]))).astype(np.float32)


def _qat_pack(net, tmp, batch, loss, xs, ts, steps, lr=0.05):
    """The model packed for QAT (SGD), `steps` host training steps with the device runtime
    (batches of xs and targets ts), the trained checkpoint tmp/trained."""
    import microtrain_host as mh
    from torch_reference import export
    n_in = xs.shape[1]
    mh.generate_artifacts(export(net, torch.zeros(batch, n_in)), artifact_directory=tmp,
                          batch_size=batch, optimizer="SGD", loss=loss, quantization=True)
    state = CheckpointState.load_checkpoint(str(tmp / "checkpoint"))
    model = Module(str(tmp / "model.mtb"), state)
    opt = Optimizer(str(tmp / "model.mtb"), model)
    opt.set_learning_rate(lr)
    for s in range(steps):
        at = (s * batch) % (len(xs) - batch + 1)
        model(xs[at:at + batch].reshape(-1), ts[at:at + batch].reshape(-1))
        opt.step()
        model.lazy_reset_grad()
    CheckpointState.save_checkpoint(state, str(tmp / "trained"))


def _export(tmp, out, *extra):
    return subprocess.run(
        [sys.executable, "-m", "microtrain_host.cli", "export", str(tmp), "--checkpoint",
         str(tmp / "trained"), "--qdq", "-o", str(out / "q.onnx"), "--int8-train",
         str(out / "int8"), *extra], capture_output=True, text=True)


def _auc(normal, anomalous):
    # the probability that an anomalous sample scores above a normal one (ties count half)
    a = np.asarray(anomalous)[:, None]
    b = np.asarray(normal)[None, :]
    return float((a > b).mean() + 0.5 * (a == b).mean())


def _int_model(info):
    state = CheckpointState.load_checkpoint(info["checkpoint"])
    model = Module(info["blob"], state)
    return model, Optimizer(info["blob"], model), state


@pytest.fixture(scope="module")
def autoencoder(tmp_path_factory):
    # the MLPerf Tiny AD autoencoder cut down: 32 -> 16 -> 8 -> 16 -> 32 Gemms with
    # BatchNorm1d + ReLU, MSE on reconstructing its input; batch 4
    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    tmp = tmp_path_factory.mktemp("intloss_ae")
    basis = rng.standard_normal((4, 32)) * 0.6
    xs = _normal_data(rng, 400, basis)
    _qat_pack(_blocks([32, 16, 8, 16, 32]), tmp, 4, "MSELoss", xs, xs, 300, 0.1)
    import microtrain_host as mh
    mh.export_inference_model(tmp, tmp / "trained", tmp / "qdq.onnx", qdq=True)
    return tmp, basis


def test_autoencoder_mse_exports_and_trains_in_integers(autoencoder, tmp_path, micropython):
    tmp, basis = autoencoder
    out = _export(tmp, tmp_path, "--int8-target-is-input", "--int8-lr", "1.0")
    assert out.returncode == 0, out.stderr
    assert "loss mse" in out.stdout
    info = json.loads((tmp_path / "int8" / "int8_train.json").read_text())
    assert info["loss"] == "mse" and info["target"] == info["input"] and info["labels"] is None
    b = device_blob_parser.load(info["blob"], keep_steps=True)
    assert b.loss == "int_mean_squared_error" and len(b.programs["train"].inputs) == 1
    assert [op for op, *_ in b.step_records["train"]][-3:] == [242, 194, 244]

    # a new machine's normal data (shifted): 50 integer steps, the device called model(x),
    # the last Gemm fine-tuned to it; anomalies are its normal samples plus noise
    rng = np.random.default_rng(1)
    shift = rng.standard_normal(32).astype(np.float32)
    train = _normal_data(rng, 200, basis) + shift
    normal = _normal_data(rng, 200, basis) + shift
    anomalous = normal + rng.standard_normal((200, 32)).astype(np.float32) * 0.6
    model, opt, state = _int_model(info)

    def errors(data):
        # per sample: the mean squared reconstruction error of the int32 outputs (eval)
        model.eval()
        out = []
        for i in range(0, len(data), 4):
            loss, z = model(quantize_input(data[i:i + 4], info).reshape(-1))
            e = ((np.array(z).reshape(4, 32) / 2 ** LOGIT_BITS - data[i:i + 4]) ** 2).mean(axis=1)
            # the loss Module reports: F.mse_loss of the output and the dequantized target
            # within the rounding of the target to the outputs' 2**-8 (the numpy mirror's
            # value exactly)
            tq = quantize_input(data[i:i + 4], info)
            target = (tq.astype(np.float64) - info["target_zero_point"]) * info["target_scale"]
            d = np.array(z).reshape(4, 32) / 2 ** LOGIT_BITS - target
            assert abs(loss - float(np.mean(d ** 2))) <= np.mean(np.abs(d)) * 2 ** -8 + 2 ** -18
            assert loss == pytest.approx(host_loss.mse(z, tq, info["target_zero_point"],
                                                       info["target_scale"])[0], rel=1e-6)
            out += list(e)
        model.train()
        return out

    before = np.mean(errors(normal))
    losses = [model(quantize_input(train[s * 4 % 200:s * 4 % 200 + 4], info).reshape(-1))
              for s in range(50)]
    after = np.mean(errors(normal))
    print(f"autoencoder, integer MSE (50 steps, lr 1.0): train loss {np.mean(losses[:10]):.4f} "
          f"-> {np.mean(losses[-10:]):.4f}; held-out normal {before:.4f} -> {after:.4f}")
    assert after < 0.8 * before and np.mean(losses[-10:]) < 0.8 * np.mean(losses[:10])

    # the anomaly AUC (reconstruction error as the score) of the integer-trained model
    # against the float32 fine-tune of the same last layer (SGD, same lr and batches)
    int_auc = _auc(errors(normal), errors(anomalous))
    float_auc = _float_finetune_auc(tmp_path / "q.onnx", info, train, normal, anomalous)
    print(f"autoencoder anomaly AUC: integer-trained {int_auc:.4f}, float32 fine-tune of "
          f"the last layer {float_auc:.4f} (difference {int_auc - float_auc:+.4f})")
    assert int_auc > 0.75 and abs(int_auc - float_auc) <= 0.02

    # the MicroPython Unix port (viper kernels under heap_lock, then pure) gives CPython's
    # bytes over a few steps
    data = tmp_path / "data.bin"
    data.write_bytes(b"".join(quantize_input(train[i:i + 4], info).tobytes()
                              for i in range(0, 40, 4)))
    _cpython_viper_pure(micropython, info, data)


def _float_finetune_auc(qdq, info, train, normal, anomalous):
    """The AUC after the float32 SGD fine-tune of the last Gemm (torch, float32, the same
    50 batches and lr, mean-squared error on the input) on the dequantized features the QDQ
    model feeds it (onnxruntime), from the same dequantized starting weights."""
    W, B, features = _float_head(qdq, info)
    opt = torch.optim.SGD([W, B], lr=info["learning_rate"])
    for s in range(50):
        at = (s * 4) % 200
        x = train[at:at + 4]
        opt.zero_grad()
        torch.nn.functional.mse_loss(features(x) @ W.T + B, torch.tensor(x)).backward()
        opt.step()
    with torch.no_grad():
        def score(data):
            return (((features(data) @ W.T + B).numpy() - data) ** 2).mean(axis=1)
        return _auc(score(normal), score(anomalous))


def test_mlperf_ad_shape_exports_with_its_mse_loss(tmp_path):
    # the case: the AD autoencoder at full size (640 -> 128 x4 -> 8 -> 128 x4 -> 640,
    # BatchNorm1d + ReLU; batch 2), `export --qdq --int8-train` keeps its MSE loss (it was
    # turned into a 640-class softmax classifier) and the device trains its last Gemm
    torch.manual_seed(0)
    xs = np.random.default_rng(7).standard_normal((8, 640)).astype(np.float32)
    qat = tmp_path / "qat"
    _qat_pack(_blocks([640] + [128] * 4 + [8] + [128] * 4 + [640]), qat, 2, "MSELoss", xs, xs,
              3, 0.01)
    out = _export(qat, tmp_path, "--int8-target-is-input", "--int8-lr", "0.1")
    assert out.returncode == 0 and "loss mse" in out.stdout, out.stderr
    info = json.loads((tmp_path / "int8" / "int8_train.json").read_text())
    assert info["loss"] == "mse" and info["classes"] == 640 and info["features"] == 128
    model, _, state = _int_model(info)
    before = bytes(state.parameters[info["weight"]].data)
    losses = [model(quantize_input(xs[i:i + 2], info).reshape(-1)) for i in range(0, 8, 2)]
    assert all(0.5 < v < 2.0 for v in losses)         # inputs N(0, 1): an MSE near 1
    assert bytes(state.parameters[info["weight"]].data) != before


def test_autoencoder_target_quantized_as_the_output(autoencoder, tmp_path):
    # without --int8-target-is-input: model(x, target), the target quantized with the
    # output's scale and zero point (quantize_target); the loss falls over 50 steps
    tmp, basis = autoencoder
    assert _export(tmp, tmp_path, "--int8-lr", "1.0").returncode == 0
    info = json.loads((tmp_path / "int8" / "int8_train.json").read_text())
    assert info["target"] == "target" and info["target_type"] in ("int8", "uint8")
    model, _, _ = _int_model(info)
    rng = np.random.default_rng(2)
    # a shifted machine, within the output's int8 range
    train = _normal_data(rng, 200, basis) * 0.5 + rng.standard_normal(32).astype(np.float32) * 0.4
    losses = [model(quantize_input(x, info).reshape(-1), quantize_target(x, info).reshape(-1))
              for x in (train[s * 4 % 200:s * 4 % 200 + 4] for s in range(50))]
    print(f"autoencoder, target as the output: loss {np.mean(losses[:10]):.4f} -> "
          f"{np.mean(losses[-10:]):.4f}")
    assert np.mean(losses[-10:]) < 0.8 * np.mean(losses[:10])


def test_bce_with_logits_classifier_trains_in_integers(tmp_path, micropython):
    # a binary classifier (16 -> 16 -> 1, BatchNorm1d + ReLU) packed for QAT with
    # BCEWithLogitsLoss, exported with --int8-train: its last Gemm trains in integers on the
    # device (model(x, t), t in Q14); accuracy on held-out data against the same float32
    # fine-tune of the last layer
    torch.manual_seed(1)
    rng = np.random.default_rng(3)
    teacher = rng.standard_normal(16)
    xs = rng.standard_normal((600, 16)).astype(np.float32)
    ts = (xs @ teacher > 0).astype(np.float32)[:, None]
    qat = tmp_path / "qat"
    _qat_pack(_blocks([16, 16, 1]), qat, 4, "BCEWithLogitsLoss", xs[:200], ts[:200], 50, 0.1)
    out = _export(qat, tmp_path, "--int8-lr", "0.1")
    assert out.returncode == 0, out.stderr
    assert "loss bce_with_logits" in out.stdout
    info = json.loads((tmp_path / "int8" / "int8_train.json").read_text())
    assert info["loss"] == "bce_with_logits" and info["target_type"] == "q14"
    b = device_blob_parser.load(info["blob"], keep_steps=True)
    assert b.loss == "int_bce_with_logits"
    assert [op for op, *_ in b.step_records["train"]][-3:] == [242, 195, 244]
    model, _, _ = _int_model(info)
    # the device's task moved: a higher threshold than the pack's (the last layer's job)
    ts = (xs @ teacher > 2.0).astype(np.float32)[:, None]
    train, held = (xs[200:400], ts[200:400]), (xs[400:], ts[400:])

    def accuracy():
        model.eval()
        right = 0
        for i in range(0, len(held[0]), 4):
            _, z = model(quantize_input(held[0][i:i + 4], info).reshape(-1),
                         quantize_target(held[1][i:i + 4], info).reshape(-1))
            right += int(((np.array(z) > 0) == (held[1][i:i + 4, 0] > 0.5)).sum())
        model.train()
        return right / len(held[0])

    start = accuracy()
    losses = []
    for s in range(50):
        at = s * 4 % 200
        losses.append(model(quantize_input(train[0][at:at + 4], info).reshape(-1),
                            quantize_target(train[1][at:at + 4], info).reshape(-1)))
    int_accuracy = accuracy()
    float_accuracy = _float_finetune_accuracy(tmp_path / "q.onnx", info, train, held)
    print(f"BCE classifier, integer: loss {np.mean(losses[:10]):.4f} -> "
          f"{np.mean(losses[-10:]):.4f}; held-out accuracy {start:.3f} -> {int_accuracy:.3f}, "
          f"float32 fine-tune of the last layer {float_accuracy:.3f}")
    assert np.mean(losses[-10:]) < 0.9 * np.mean(losses[:10])
    assert int_accuracy >= float_accuracy - 0.02

    # MicroPython under heap_lock (viper, then pure) gives CPython's bytes
    data = tmp_path / "data.bin"
    data.write_bytes(b"".join(quantize_input(train[0][i:i + 4], info).tobytes() +
                              quantize_target(train[1][i:i + 4], info).astype("<i4").tobytes()
                              for i in range(0, 40, 4)))
    _cpython_viper_pure(micropython, info, data)


def _float_finetune_accuracy(qdq, info, train, held):
    """Held-out accuracy after the float32 SGD fine-tune (BCEWithLogitsLoss) of the last
    Gemm on the QDQ model's features, the same 50 batches and lr."""
    W, B, features = _float_head(qdq, info)
    opt = torch.optim.SGD([W, B], lr=info["learning_rate"])
    for s in range(50):
        at = s * 4 % 200
        opt.zero_grad()
        torch.nn.BCEWithLogitsLoss()(features(train[0][at:at + 4]) @ W.T + B,
                                     torch.tensor(train[1][at:at + 4])).backward()
        opt.step()
    with torch.no_grad():
        z = (features(held[0]) @ W.T + B).numpy()
    return float(((z > 0) == (held[1] > 0.5)).mean())


def test_losses_without_an_integer_form_are_refused_by_name(tmp_path):
    # an L1 model: `export --int8-train` refuses it naming the loss, in one line, before
    # writing anything; the API too; mse with the cross-entropy's own options refused
    torch.manual_seed(2)
    rng = np.random.default_rng(4)
    xs = rng.standard_normal((40, 8)).astype(np.float32)
    qat = tmp_path / "qat"
    _qat_pack(_blocks([8, 8, 4]), qat, 4, "L1Loss", xs, xs[:, :4], 4)
    out = _export(qat, tmp_path)
    assert out.returncode != 0 and "'l1'" in out.stderr and "Traceback" not in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert not (tmp_path / "int8").exists() and not (tmp_path / "q.onnx").exists()
    from microtrain_host.errors import ArtifactError
    import microtrain_host as mh
    mh.export_inference_model(qat, qat / "trained", tmp_path / "l1.onnx", qdq=True)
    with pytest.raises(ArtifactError, match="'l1'"):
        int8_training_artifacts(tmp_path / "l1.onnx", tmp_path / "x", loss="l1")
    with pytest.raises(ArtifactError, match="'huber'"):
        int8_training_artifacts(tmp_path / "l1.onnx", tmp_path / "x", loss="huber")
    for option in ({"train_conv": True}, {"train_depthwise": True}, {"max_classes": 8}):
        with pytest.raises(ArtifactError, match="'mse'.*" + next(iter(option))):
            int8_training_artifacts(tmp_path / "l1.onnx", tmp_path / "x", loss="mse", **option)
    with pytest.raises(ArtifactError, match="target"):
        int8_training_artifacts(tmp_path / "l1.onnx", tmp_path / "x", loss="bce_with_logits",
                                target="input")
    # the blob's loss name must be its loss step's: a crafted one is refused at load
    info = int8_training_artifacts(tmp_path / "l1.onnx", tmp_path / "ok", loss="mse")
    raw = bytearray(open(info["blob"], "rb").read())
    at = raw.find(b"int_mean_squared_error")
    raw[at:at + 22] = b"int_bce_with_logits\0\0\0"
    size = struct.unpack_from("<I", raw, 0)[0]          # the CRC-32 after the blob, redone
    raw[4 + size:] = struct.pack("<I", zlib.crc32(bytes(raw[4:4 + size])) & 0xFFFFFFFF)
    bad = tmp_path / "bad.mtb"
    bad.write_bytes(bytes(raw))
    with pytest.raises(BlobError, match="loss"):
        Module(str(bad), CheckpointState.load_checkpoint(info["checkpoint"]))


def _float_head(qdq, info):
    """(W, B) float32 leaf tensors of the last Gemm dequantized from the integer checkpoint,
    and features(x): the QDQ model's input to that Gemm (onnxruntime)."""
    import onnx
    import onnxruntime as ort
    sw = np.array(info["weight_scales"], np.float32)
    ckpt = CheckpointState.load_checkpoint(info["checkpoint"]).parameters
    w = np.array(ckpt[info["weight"]].data, np.float32).reshape(len(sw), -1) * sw[:, None]
    b = np.array(ckpt[info["bias"]].data, np.float32) * sw * np.float32(info["feature_scale"])
    # the features: the QDQ model's input to its last Gemm (dequantized)
    model = onnx.load(str(qdq))
    last = [n for n in model.graph.node if n.op_type == "Gemm"][-1]
    del model.graph.output[:]
    model.graph.output.extend([onnx.helper.make_tensor_value_info(
        last.input[0], onnx.TensorProto.FLOAT, None)])
    session = ort.InferenceSession(model.SerializeToString())
    name = session.get_inputs()[0].name

    def features(x):     # the QDQ model runs at the pack's batch size (4)
        return torch.tensor(np.concatenate([session.run(None, {name: x[i:i + 4]})[0].reshape(
            4, -1) for i in range(0, len(x), 4)]))
    return torch.tensor(w, requires_grad=True), torch.tensor(b, requires_grad=True), features


def test_bce_on_the_emulated_board_equals_cpython(autoencoder, tmp_path):
    # On the emulated Cortex-M3 (32-bit small ints: an int beyond 2**30 would allocate, and
    # the train steps run under heap_lock): BCE with logits on the autoencoder's 32 outputs
    # (its products come closest to 2**30: P (1 + e) < 2**30 - 2**13) trains to CPython's
    # parameters and checkpoint, byte for byte, with the viper and the pure-Python kernels.
    # (The mse loss ints' bound is checked above at 2048 outputs; one board run: ~1 min.)
    from test_inttrain import BOARD_SCRIPT, board_firmware, train_on_board_and_cpython
    firmware = board_firmware()
    tmp, basis = autoencoder
    rng = np.random.default_rng(6)
    info = int8_training_artifacts(tmp / "qdq.onnx", tmp_path / "int", 1.0,
                                   loss="bce_with_logits")
    x = _normal_data(rng, 40, basis) * 2
    t = (x > 0).astype(np.float32)
    (tmp_path / "data.bin").write_bytes(b"".join(
        quantize_input(x[i:i + 4], info).tobytes() + quantize_target(t[i:i + 4], info).tobytes()
        for i in range(0, 40, 4)))
    expected, fast, pure = train_on_board_and_cpython(firmware, info, tmp_path, 12, BOARD_SCRIPT,
                                                      900)
    assert len(expected) == 2 and fast == pure == expected


@pytest.mark.parametrize("loss,options", [
    ("mse", {}), ("mse", {"momentum": 0.9}), ("mse", {"stochastic": False, "target": "input"}),
    ("mse", {"momentum": 0.5, "target": "input"}), ("bce_with_logits", {"momentum": 0.9}),
    ("bce_with_logits", {"stochastic": False}), ("mse", {"train_biases": True, "train_last": 3}),
    ("bce_with_logits", {"train_last": 2, "momentum": 0.9})])
def test_every_accepted_configuration_loads_and_trains(autoencoder, tmp_path, loss, options):
    # the host never writes what the device refuses: each option the integer losses accept
    # (momentum: int16 velocities, round to nearest, the input as target, the backward into
    # the layers before the last Gemm with a separate target) loads and trains 2
    # steps on the device runtime, its eval program too
    tmp, basis = autoencoder
    info = int8_training_artifacts(tmp / "qdq.onnx", tmp_path, 0.5, loss=loss, **options)
    model, opt, state = _int_model(info)
    x = _normal_data(np.random.default_rng(8), 4, basis)
    inputs = [quantize_input(x, info).reshape(-1)]
    if options.get("target") != "input":
        inputs.append(quantize_target(x if loss == "mse" else x > 0, info).reshape(-1))
    before = {name: bytes(p.data) for name, p in state.parameters.items()}
    losses = [model(*inputs) for _ in range(2)]
    opt.step()
    assert all(np.isfinite(losses)) and losses[1] < losses[0]
    assert all(bytes(p.data) != before[name] for name, p in state.parameters.items())
    model.eval()
    loss_value, z = model(*inputs)
    assert np.isfinite(loss_value) and len(z) == 4 * 32
