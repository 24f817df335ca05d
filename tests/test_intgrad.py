"""Issue 11's sparse update in integers (kernels/intgrad.py, ops/intgrad.py,
quant/inttrain.py train_biases / train_depthwise): one integer step of a DS-CNN (the
bias of every convolution, the last block's depthwise and pointwise weights, the
classifier) against torch float64 autograd on the dequantized model, the viper kernels
equal to the pure-Python kernels and to CPython under micropython.heap_lock(), crafted
blobs refused, and the CLI."""
import subprocess
import sys
from array import array

import numpy as np
import pytest
import torch

from conftest import DEVICE, ROOT, run_micropython
from microtrain import CheckpointState, Module
from microtrain import blob as device_blob
from microtrain import parser as device_blob_parser
from microtrain.feed import copy_inputs
from microtrain.errors import BlobError
from microtrain_host.quant.inttrain import int8_training_artifacts, quantize_input

QLINEAR_CONV, INT_GEMM_LOGITS = 223, 242
SPARSE = {"train_biases": True, "train_conv": True, "train_depthwise": True}


@pytest.fixture(scope="module")
def ds_cnn_qdq(tmp_path_factory):
    from reference_models import ds_cnn
    from torch_reference import qat_qdq_model
    tmp = tmp_path_factory.mktemp("ds_cnn_intgrad")
    xs, ys = qat_qdq_model(ds_cnn(), tmp, 8)      # observers calibrated
    return tmp, xs, ys


def _signed_bytes(view, signed):
    return np.frombuffer(bytes(view), np.int8 if signed else np.uint8).astype(np.int64)


def _forward_record(model, info, x, y):
    """Run the train program's steps by hand, snapshotting each convolution's (geometry
    ints, input, output, weight, bias, their tensor ids, the requantization header [x_zp,
    y_zp, lo, hi]) as it runs (the planner reuses their planes) and the classifier's (input
    bytes, weight, bias, input id) before the classifier's step."""
    b = model.blob
    program = model._train
    copy_inputs(b, model.F, model.I, program, (x, y), b.num_classes)
    records = device_blob_parser.load(info["blob"], keep_steps=True).step_records["train"]
    signed = lambda tid: b.dtypes[tid] == device_blob.INT8        # noqa: E731
    snap = []
    for (kernel, args), (op, tensors, ints, _) in zip(program.steps, records):
        if op == INT_GEMM_LOGITS:
            classifier = (_signed_bytes(model.output(tensors[1]), signed(tensors[1])),
                          _signed_bytes(model.output(tensors[2]), True),
                          np.array(model.output(tensors[3]), np.int64), tensors[1])
        if op == QLINEAR_CONV:
            yid, xid, wid, bid, req = tensors[:5]
            before = _signed_bytes(model.output(xid), signed(xid))
        kernel(model.F, model.I, args)
        if op == QLINEAR_CONV:
            snap.append((ints, before, _signed_bytes(model.output(yid), signed(yid)),
                         _signed_bytes(model.output(wid), True),
                         np.array(model.output(bid), np.int64), xid, yid, wid, bid,
                         np.array(model.output(req), np.int64)[:4]))
    return snap, classifier


def torch_sparse_step(snap, classifier, quant, info, y, lr):
    """torch float64 on the dequantized model: each convolution's output carries the int8
    forward's value and the float convolution's gradient through its clamp mask (the
    straight-through estimator of QAT), the GlobalAveragePool's likewise. Returns
    {bias id: lr * dL/db / (s_x s_w)} and {weight id: lr * dL/dW / s_w} in quanta."""
    m = info["batch_size"]
    prev = None
    biases, weights = {}, {}
    for ints, x, yv, w, bias, xid, yid, wid, bid, req in snap:
        (_, groups, cin_g, cout_g, in_h, in_w, out_h, out_w, k_h, k_w, s_h, s_w, d_h, d_w,
         pad_t, pad_l) = ints[:16]
        sx, zx = quant[xid][0][0], quant[xid][1][0]
        sy, zy = quant[yid][0][0], quant[yid][1][0]
        sw = np.array(quant[wid][0], np.float64)
        channels = groups * cout_g
        xr = torch.tensor((x.reshape(m, groups * cin_g, in_h, in_w) - zx) * sx)
        if prev is not None:
            xr = xr + prev - prev.detach()
        W = torch.tensor(w.reshape(channels, cin_g, k_h, k_w) * sw[:, None, None, None],
                         requires_grad=True)
        B = torch.tensor(bias * sx * sw, requires_grad=True)
        z = torch.nn.functional.conv2d(xr, W, B, (s_h, s_w), (pad_t, pad_l), (d_h, d_w),
                                       groups)[:, :, :out_h, :out_w]
        yq = yv.reshape(m, channels, out_h, out_w)
        mask = torch.tensor(((yq > req[2]) & (yq < req[3])).astype(np.float64))
        prev = torch.tensor((yq - zy) * sy) + (z - z.detach()) * mask
        biases[bid] = (B, sx * sw)
        weights[wid] = (W, sw)
    pooled = prev.mean(dim=(2, 3))
    feature, wc, bc, fid = classifier
    sf, zf = quant[fid][0][0], quant[fid][1][0]
    feat = torch.tensor((feature.reshape(pooled.shape) - zf) * sf) + pooled - pooled.detach()
    swc = np.array(info["weight_scales"], np.float64)
    Wc = torch.tensor(wc.reshape(len(swc), -1) * swc[:, None])
    Bc = torch.tensor(bc * sf * swc)
    torch.nn.functional.cross_entropy(feat @ Wc.T + Bc, torch.tensor(y)).backward()
    db = {bid: lr * B.grad.numpy() / unit for bid, (B, unit) in biases.items()}
    dw = {wid: lr * W.grad.numpy() / sw[:, None, None, None]
          for wid, (W, sw) in weights.items()}
    return db, dw


def test_sparse_update_equals_torch_float64(ds_cnn_qdq, tmp_path):
    tmp, xs, ys = ds_cnn_qdq
    lr = 8.0           # weight steps of several quanta (the last block's are small)
    info = int8_training_artifacts(tmp / "qdq.onnx", tmp_path, lr, stochastic=False, **SPARSE)
    state = CheckpointState.load_checkpoint(info["checkpoint"])
    model = Module(info["blob"], state)
    b = model.blob
    quant = device_blob_parser.load(info["blob"]).quant
    trained = set(info["parameters"])
    rng = np.random.default_rng(3)
    worst_b = worst_w = relative = 0.0
    biggest_b = biggest_w = 0.0
    count = 0
    for trial in range(3):
        x = quantize_input(xs[trial] + rng.standard_normal(xs[trial].shape).astype(np.float32)
                           * 0.1, info).reshape(-1).tolist()
        y = [int(v) for v in ys[trial]]
        snap, classifier = _forward_record(model, info, x, y)
        db, dw = torch_sparse_step(snap, classifier, quant, info, y, lr)
        for ints, _, _, w, bias, xid, yid, wid, bid, _ in snap:
            assert b.names[bid] in trained
            got = bias - np.array(model.output(bid), np.int64)
            err = np.abs(got - db[bid])
            worst_b = max(worst_b, float(err.max()))
            relative = max(relative, float((err.max() - 0.5) / np.abs(db[bid]).max()))
            biggest_b = max(biggest_b, float(np.abs(db[bid]).max()))
            # within half a quantum of rounding plus 2**-9 of the largest step of the layer
            # (the integer softmax's logits; 16-bit gradient mantissas through 9 layers)
            assert np.all(err <= 0.5 + np.abs(db[bid]).max() * 2 ** -9 + 1e-9), \
                (b.names[bid], err.max(), np.abs(db[bid]).max())
            count += bias.size
            if b.names[wid] in trained:
                after = _signed_bytes(model.output(wid), True)
                got = (w - after).reshape(dw[wid].shape)
                free = np.abs(w.reshape(dw[wid].shape) - np.round(dw[wid])) <= 127
                assert free.mean() > 0.5
                err = np.abs(got - dw[wid])[free]
                relative = max(relative, float((err.max() - 0.5) / np.abs(dw[wid]).max()))
                worst_w = max(worst_w, float(err.max()))
                biggest_w = max(biggest_w, float(np.abs(dw[wid]).max()))
                assert np.abs(dw[wid]).max() > 2, b.names[wid]      # real steps
                assert np.all(err <= 0.5 + np.abs(dw[wid]).max() * 2 ** -9 + 1e-9), \
                    (b.names[wid], err.max(), np.abs(dw[wid]).max())
    print(f"sparse update vs torch float64: biases within {worst_b:.3f} quanta (steps up to "
          f"{biggest_b:.0f}), last block's weights within {worst_w:.3f} (steps up to "
          f"{biggest_w:.1f}); beyond half a quantum, {relative:.2e} of the layer's largest "
          f"step; {count} bias steps")


@pytest.mark.parametrize("stochastic", [True, False])
def test_sparse_steps_under_heap_lock_viper_equals_pure_equals_cpython(
        ds_cnn_qdq, micropython, tmp_path, stochastic):
    tmp, xs, ys = ds_cnn_qdq
    info = int8_training_artifacts(tmp / "qdq.onnx", tmp_path / "int", 0.5,
                                   stochastic=stochastic, **SPARSE)
    rng = np.random.default_rng(6)
    (tmp_path / "data.bin").write_bytes(b"".join(
        quantize_input(x + rng.standard_normal(x.shape).astype(np.float32) * 0.1,
                       info).tobytes() + np.asarray(y, "<i4").tobytes()
        for x, y in zip(xs[:3], ys[:3])))
    args = [info["blob"], info["checkpoint"], tmp_path / "data.bin", 4]
    script = ROOT / "tests" / "device_scripts" / "inttrain_steps.py"
    fast = run_micropython(micropython, script, *args, "fast", tmp_path / "f.ckpt")
    pure = run_micropython(micropython, script, *args, "pure", tmp_path / "p.ckpt")
    cpython = subprocess.run([sys.executable, str(script), *map(str, args), "pure",
                              str(tmp_path / "c.ckpt")], capture_output=True, text=True,
                             env={"PYTHONPATH": str(DEVICE)}, check=True).stdout
    assert fast.startswith("locked True viper True intgrad viper True"), fast
    assert pure.startswith("locked False viper False intgrad viper False"), pure
    body = lambda out: out.split("\n", 1)[1]                      # noqa: E731
    assert body(fast) == body(pure) == body(cpython)
    start = CheckpointState.load_checkpoint(info["checkpoint"]).parameters
    trained = {line.split()[0]: line.split()[1:] for line in body(fast).split("\n")
               if line.split() and line.split()[0] in start}
    assert sorted(trained) == sorted(info["parameters"]) and len(trained) == 9
    for name, values in trained.items():       # every parameter moved
        p = start[name]
        assert values != [str(v & 255 if p.data_type == 3 else v) for v in p.data], name
    assert ((tmp_path / "f.ckpt").read_bytes() == (tmp_path / "p.ckpt").read_bytes()
            == (tmp_path / "c.ckpt").read_bytes())


def test_crafted_sparse_blobs_are_refused(ds_cnn_qdq, tmp_path):
    from test_inttrain import _patched
    tmp, _, _ = ds_cnn_qdq
    info = int8_training_artifacts(tmp / "qdq.onnx", tmp_path, 0.05, **SPARSE)
    b = device_blob_parser.load(info["blob"], keep_steps=True)
    ops = [op for op, *_ in b.step_records["train"]]
    pool, bias, grad_input, update, mask = (ops.index(248), ops.index(249), ops.index(250),
                                            ops.index(251), ops.index(252))
    for index, field, change, match in (
            # (the pool step's ints may be stored once with the bias step's: either refuses)
            (pool, 2, lambda v: [v[0], v[1], v[2] + 1], "int_pool_grad|int_clamp_bias_grad"),
            # the bias' rates where the bias goes: not a parameter
            (bias, 1, lambda t: t[:2] + [t[3]] + t[3:], "int_clamp_bias_grad"),
            (mask, 2, lambda v: [v[0], 5], "signed flag"),
            (mask, 2, lambda v: [v[0] * 2, v[1]], "int_clamp_mask"),
            (grad_input, 2, lambda v: v[:3] + [2000] + v[4:],
             "terms per input gradient|int_conv_update"),
            (update, 2, lambda v: [9] + v[1:], "int_conv_update"),
            # the update reads a gradient tensor no earlier step gave a unit
            (update, 1, lambda t: t[:2] + [t[3]] + t[3:], "int_conv_update")):
        data = _patched(info["blob"], "train", index, change, field)
        with pytest.raises(BlobError, match=match):
            device_blob_parser.load(data)


def test_cli_export_int8_sparse(ds_cnn_qdq, tmp_path):
    import json
    tmp, _, _ = ds_cnn_qdq
    out = subprocess.run(
        [sys.executable, "-m", "microtrain_host.cli", "export", str(tmp), "--checkpoint",
         str(tmp / "trained"), "--qdq", "-o", str(tmp_path / "q.onnx"), "--int8-train",
         str(tmp_path / "int8"), "--int8-train-biases", "--int8-train-depthwise"],
        capture_output=True, text=True, check=True).stdout
    assert "integer training blob" in out and "7 more tensors" in out, out
    info = json.loads((tmp_path / "int8" / "int8_train.json").read_text())
    assert info["train_biases"] and info["train_depthwise"] and info["train_conv"]
    state = CheckpointState.load_checkpoint(info["checkpoint"])
    assert sorted(state.parameters) == sorted(info["parameters"])
    b = device_blob_parser.load(info["blob"], keep_steps=True)
    ops = [op for op, *_ in b.step_records["train"]]
    convs = ops.count(QLINEAR_CONV)
    # one bias step per convolution, input gradients down to the first, two weight updates
    assert (ops.count(249), ops.count(250), ops.count(251)) == (convs, convs - 1, 2)
    helptext = subprocess.run([sys.executable, "-m", "microtrain_host.cli", "export", "-h"],
                              capture_output=True, text=True, check=True).stdout
    assert "--int8-train-biases" in helptext and "--int8-train-depthwise" in helptext


def test_sparse_training_on_the_emulated_board_equals_cpython(ds_cnn_qdq, tmp_path):
    """The sparse update on the emulated Cortex-M3 (32-bit small ints, float32 at load): viper
    kernels under heap_lock and pure-Python kernels give CPython's parameters byte for
    byte."""
    from test_inttrain import BOARD_SCRIPT, board_firmware, train_on_board_and_cpython
    firmware = board_firmware()
    import microtrain_host as mh
    from reference_models import ds_cnn
    from torch_reference import export
    tmp, xs, ys = ds_cnn_qdq
    # the same trained QAT model exported at batch 1 (the board's heap holds its arenas)
    ref = ds_cnn()
    mh.generate_artifacts(export(ref.module, torch.zeros((1,) + ref.inputs)),
                          artifact_directory=tmp_path / "qat1", batch_size=1, optimizer="SGD",
                          quantization=True)
    mh.export_inference_model(tmp_path / "qat1", tmp / "trained", tmp_path / "qdq1.onnx",
                              qdq=True)
    info = int8_training_artifacts(tmp_path / "qdq1.onnx", tmp_path / "int", 0.5, **SPARSE)
    (tmp_path / "data.bin").write_bytes(b"".join(
        quantize_input(x[i:i + 1], info).tobytes() + np.asarray(y[i:i + 1], "<i4").tobytes()
        for x, y in zip(xs[:2], ys[:2]) for i in range(2)))
    board_script = BOARD_SCRIPT.replace(
        "from microtrain.kernels import inttrain, qlinear",
        "from microtrain.kernels import intgrad, inttrain, qlinear").replace(
        "print('viper', inttrain.FAST)", "print('viper', inttrain.FAST and intgrad.FAST)").replace(
        "inttrain.use_fast(False)", "inttrain.use_fast(False)\nintgrad.use_fast(False)")
    viper, pure_part = board_script.split("qlinear.use_fast(False)")
    pure_part = viper.split("print('viper'")[0] + "qlinear.use_fast(False)" + pure_part
    expected, fast, pure = train_on_board_and_cpython(firmware, info, tmp_path, 4,
                                                      (viper, pure_part), 1800)
    assert len(expected) == 9 and fast == pure == expected


def test_set_learning_rate_rewrites_the_sparse_multipliers(ds_cnn_qdq, tmp_path):
    from microtrain import Optimizer
    tmp, xs, ys = ds_cnn_qdq
    info = int8_training_artifacts(tmp / "qdq.onnx", tmp_path, 0.5, stochastic=False, **SPARSE)
    state = CheckpointState.load_checkpoint(info["checkpoint"])
    model = Module(info["blob"], state)
    opt = Optimizer(info["blob"], model)
    x = quantize_input(xs[0], info).reshape(-1).tolist()
    y = [int(v) for v in ys[0]]
    values = lambda: {n: bytes(p.data) for n, p in state.parameters.items()}  # noqa: E731
    start = values()
    opt.set_learning_rate(0.0)
    model(x, y)
    assert values() == start
    # twice the rate: the bias steps double (within the rounding of half a quantum each)
    moved = {}
    for lr in (0.5, 1.0):
        fresh = Module(info["blob"], CheckpointState.load_checkpoint(info["checkpoint"]))
        Optimizer(info["blob"], fresh).set_learning_rate(lr)
        fresh(x, y)
        moved[lr] = {n: np.array(fresh.state.parameters[n].data, np.int64) -
                     np.array(CheckpointState.load_checkpoint(info["checkpoint"])
                              .parameters[n].data, np.int64)
                     for n in info["parameters"] if n.endswith("bias") and n != info["bias"]}
    for name, step in moved[0.5].items():
        assert np.abs(step).max() > 10, name
        assert np.all(np.abs(moved[1.0][name] - 2 * step) <= 1), name


def test_sparse_blob_reads_frozen_weights_in_place_and_trains_on_its_minimal_runtime(
        ds_cnn_qdq, micropython, tmp_path):
    # The frozen convolutions' int8 weights, read by their forward and by the integer
    # backward alike, take no arena space; the model's minimal runtime (what `microtrain
    # deploy` puts on a board) keeps the viper kernels and trains as the whole package does.
    from microtrain_host.tools import runtime
    tmp, xs, ys = ds_cnn_qdq
    info = int8_training_artifacts(tmp / "qdq.onnx", tmp_path / "int", 0.5, **SPARSE)
    b = device_blob_parser.load(info["blob"], keep_steps=True)
    frozen = {t[2] for op, t, _, _ in b.step_records["train"] if op == QLINEAR_CONV
              and device_blob.ROLE_NAMES[b.roles[t[2]]] == "constant"}
    assert len(frozen) >= 3 and b.in_place == frozen
    (tmp_path / "data.bin").write_bytes(b"".join(
        quantize_input(x, info).tobytes() + np.asarray(y, "<i4").tobytes()
        for x, y in zip(xs[:2], ys[:2])))
    runtime.write_sources(runtime.minimal_sources(info["blob"]), tmp_path / "rt")
    script = ROOT / "tests" / "device_scripts" / "inttrain_steps.py"
    args = [info["blob"], info["checkpoint"], tmp_path / "data.bin", 3, "fast"]
    whole = run_micropython(micropython, script, *args, tmp_path / "whole.ckpt")
    proc = subprocess.run([micropython, str(script), *map(str, args), str(tmp_path / "rt.ckpt")],
                          capture_output=True, text=True,
                          env={"MICROPYPATH": str(tmp_path / "rt")})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("locked True viper True intgrad viper True"), proc.stdout
    assert proc.stdout == whole
    assert (tmp_path / "rt.ckpt").read_bytes() == (tmp_path / "whole.ckpt").read_bytes()


# Wide input gradients (kernels/intwide.py: cout_g * taps >= FULL_TERMS products per element,
# summed exactly): geometry (m, groups, cin_g, cout_g, in_h, in_w, k_h, k_w, s_h, s_w, d_h,
# d_w, pad_t, pad_l) and how the mantissas and weights are drawn
WIDE_CASES = [
    ((2, 1, 20, 640, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0), "random"),   # the AD autoencoder's Gemm
    ((2, 1, 16, 16, 8, 8, 3, 3, 1, 1, 1, 1, 1, 1), "random"),    # ResNet-8's 144 terms
    ((2, 1, 16, 16, 8, 8, 3, 3, 1, 1, 1, 1, 1, 1), "small"),     # every sum below 2**24
    ((1, 1, 8, 64, 8, 8, 3, 3, 2, 2, 1, 1, 1, 1), "random"),     # 576 terms, stride 2
    ((1, 1, 4, 32, 9, 9, 3, 3, 1, 1, 2, 2, 2, 2), "random"),     # dilation 2
    ((2, 2, 3, 64, 1, 16, 1, 5, 1, 2, 1, 1, 0, 2), "random"),    # 1-D, groups, stride 2
    ((1, 2, 1, 1, 14, 14, 12, 12, 1, 1, 1, 1, 1, 1), "random"),  # 144 taps of one channel
    ((1, 1, 2, 256, 8, 8, 4, 4, 2, 2, 1, 1, 1, 1), "random"),    # MAX_TERMS = 4096
    ((1, 1, 2, 4096, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0), "extreme"),  # |sum| = 2**35
]


def _wide_case(geometry, draw, seed):
    """(I arena, weight bytes, the kernel's ints args[1:20], G, W): G_x at 0, G after it,
    the weights at offset 3 of their buffer."""
    m, groups, cin_g, cout_g, in_h, in_w, k_h, k_w, s_h, s_w, d_h, d_w, pad_t, pad_l = geometry
    out_h = (in_h + 2 * pad_t - d_h * (k_h - 1) - 1) // s_h + 1
    out_w = (in_w + 2 * pad_l - d_w * (k_w - 1) - 1) // s_w + 1
    rng = np.random.default_rng(seed)
    channels = groups * cout_g
    shape = (m, channels, out_h, out_w)
    if draw == "extreme":
        G = np.full(shape, 1 << 16, np.int64)
        W = np.full((channels, cin_g, k_h, k_w), -128, np.int64)
    else:
        top = 1 << 6 if draw == "small" else 1 << 16
        G = rng.integers(-top, top + 1, shape) * (rng.random(shape) < 0.6)   # ReLU zeros
        W = rng.integers(-128, 128, (channels, cin_g, k_h, k_w))
    count = m * groups * cin_g * in_h * in_w
    I = np.zeros(2 + count + G.size, np.int32)
    g = 1 + count
    I[g] = -7
    I[g + 1:] = G.reshape(-1)
    weights = bytes(3) + (W.reshape(-1) & 255).astype(np.uint8).tobytes()
    ints = (0, g, 3, m, groups, cin_g, cout_g, in_h, in_w, out_h, out_w, k_h, k_w, s_h, s_w,
            d_h, d_w, pad_t, pad_l)
    return I, weights, ints, G, W


def _exact_input_gradient(geometry, G, W):
    # the transposed convolution in int64 (exact: |sum| <= 2**35), scattered tap by tap
    m, groups, cin_g, cout_g, in_h, in_w, k_h, k_w, s_h, s_w, d_h, d_w, pad_t, pad_l = geometry
    S = np.zeros((m, groups * cin_g, in_h, in_w), np.int64)
    oys, oxs = np.arange(G.shape[2]), np.arange(G.shape[3])
    for grp in range(groups):
        Gg = G[:, grp * cout_g:(grp + 1) * cout_g]
        for ky in range(k_h):
            for kx in range(k_w):
                iy, ix = oys * s_h - pad_t + ky * d_h, oxs * s_w - pad_l + kx * d_w
                vy, vx = (iy >= 0) & (iy < in_h), (ix >= 0) & (ix < in_w)
                part = np.einsum("nmyx,mc->ncyx", Gg, W[grp * cout_g:(grp + 1) * cout_g, :,
                                                         ky, kx])
                S[:, grp * cin_g:(grp + 1) * cin_g][np.ix_(range(m), range(cin_g), iy[vy],
                                                           ix[vx])] += part[:, :, vy][:, :, :,
                                                                                      vx]
    return S.reshape(-1)


def _run_wide(I, weights, ints):
    from microtrain.kernels import fastpath, intgrad
    I = array("i", I.tobytes())
    W = bytearray(weights)
    # as the checker of a wide layer does
    fastpath.load_helper(vars(intgrad), "intwide", "int_conv_grad_input")
    intgrad.int_conv_grad_input(None, I, (W,) + ints + (W,))
    return np.array(I, np.int64)


@pytest.mark.parametrize("case", range(len(WIDE_CASES)))
def test_wide_input_gradient_is_the_exact_sum_rounded(case):
    # The pure-Python kernel (CPython) against the exact integer sum: 16-bit mantissas, each
    # the exact sum rounded once, half to even (kernels/intwide.py: rounded to odd, then to
    # nearest), however many terms
    from microtrain.kernels import intgrad
    geometry, draw = WIDE_CASES[case]
    assert geometry[3] * geometry[6] * geometry[7] >= intgrad.FULL_TERMS
    I, weights, ints, G, W = _wide_case(geometry, draw, case)
    S = _exact_input_gradient(geometry, G, W)
    out = _run_wide(I, weights, ints)
    e = int(out[0]) + 7                    # G's exponent was -7: e is the sum's power of two
    got = out[1:1 + S.size]
    assert 1 << 15 <= np.abs(got).max() <= 1 << 16        # normalized: 16 bits
    exact = S.astype(np.float64) / 2.0 ** e              # (exact: S < 2**53)
    assert np.array_equal(got, np.round(exact))          # half to even, as round_shift
    err = np.abs(got - exact)
    # (beyond 2**24 the sums are rounded to odd before the last rounding, e >= 9 bits)
    assert (np.abs(S).max() < 1 << 24) == (draw == "small")
    assert e >= (0 if draw == "small" else 9)
    if draw == "extreme":
        assert np.all(got == -(1 << 15)) and e == 20    # -2**35 = -2**15 * 2**20
    print(f"wide case {case}: {S.size} sums of up to {geometry[3] * geometry[6] * geometry[7]}"
          f" terms, |sum| < 2**{np.log2(np.abs(S).max() + 1):.1f}, mantissas within "
          f"{err.max():.4f} of the exact sum")


# kernels/inttrain.py int_gemm_grad_input beyond 31 outputs (D's unit 2**-x, x < GRAD_BITS:
# kernels/intwide.py gemm_grad_input_wide) and at 31 (the narrow path, for contrast)
GEMM_OUTPUTS = (31, 32, 640, 2048)


def _gemm_case(n, m=2, k=24):
    """(I arena, weight bytes, the kernel's ints args[1:8], x): D at 0, g after it, then the
    factors (m0, shift) of s_w[j] / max(s_w) * 2**x, x as int_gemm_grad_input_check sets it
    for an MSE loss; the weights [n, k] at offset 5 of their buffer."""
    rng = np.random.default_rng(n)
    x = 4
    while n * 2.0 ** x > 511:
        x -= 1
    g = rng.integers(-(1 << 14) + 1, 1 << 14, (m, n)) * (rng.random((m, n)) < 0.8)
    W = rng.integers(-128, 128, (n, k))
    m0 = rng.integers(1 << 23, 1 << 24, n)
    shift = np.where(rng.random(n) < 0.2, 23, rng.integers(24, 27, n)) - x  # max(s_w): <= 2**x
    I = np.zeros(m * k + m * n + 2 * n, np.int32)
    I[m * k:m * k + m * n] = g.reshape(-1)
    I[m * k + m * n::2], I[m * k + m * n + 1::2] = m0, shift
    weights = bytes(5) + (W.reshape(-1) & 255).astype(np.uint8).tobytes()
    return I, weights, (0, m * k, 5, m * k + m * n, m, k, n), x


def _run_gemm(I, weights, ints):
    from microtrain.kernels import fastpath, inttrain
    I = array("i", I.tobytes())
    # as the checker of a wide layer does
    fastpath.load_helper(vars(inttrain), "intwide", "int_gemm_grad_input")
    inttrain.int_gemm_grad_input(None, I, (bytearray(weights),) + ints)
    return np.array(I, np.int64)


def _half_even(numerator, shift):
    # round half to even of numerator / 2**shift (Python ints)
    q, r = numerator >> shift, numerator & ((1 << shift) - 1)
    half = 1 << shift >> 1
    return q + (r > half or (r == half and q & 1)) if shift else numerator


@pytest.mark.parametrize("n", GEMM_OUTPUTS)
def test_wide_gemm_input_gradient_is_its_exact_sum_rounded_once(n):
    # D[i, c] = sum_j h[i, j] * W[j, c] with h the output gradient times its factor, taken
    # with GRAD_BITS extra bits (2**(x + wide) = 2**GRAD_BITS) and the exact sum rounded
    # once to D's unit; up to 31 outputs x = GRAD_BITS already and D is the plain sum. The
    # error against the unrounded real sum is printed beside that of rounding each term to
    # D's unit (what the kernel did beyond 31 outputs before)
    I, weights, ints, x = _gemm_case(n)
    d, g, _, factors, m, k, _ = ints
    W = (np.frombuffer(weights[5:], np.uint8).astype(np.int64) ^ 128) - 128
    W = W.reshape(n, k)
    wide = 4 - x
    D = _run_gemm(I, weights, ints)[:m * k].reshape(m, k)
    real = np.zeros((m, k))
    per_term = np.zeros((m, k), np.int64)
    for i in range(m):
        for c in range(k):
            exact = 0
            for j in range(n):
                v, m0, shift = (int(I[g + i * n + j]), int(I[factors + 2 * j]),
                                int(I[factors + 2 * j + 1]))
                exact += _half_even(v * m0, shift - wide) * int(W[j, c])
                per_term[i, c] += _half_even(v * m0, shift) * int(W[j, c])
                real[i, c] += v * m0 / 2.0 ** shift * float(W[j, c])
            assert D[i, c] == _half_even(exact, wide), (i, c)
    assert np.abs(D).max() < 1 << 30 and np.abs(D).max() > 1 << (20 + x)
    if wide == 0:
        assert np.array_equal(D, per_term)
    print(f"{n} outputs (x = {x}): D within {np.abs(D - real).max():.2f} of the real sum, "
          f"each term rounded: {np.abs(per_term - real).max():.2f}")


def test_wide_input_gradient_viper_equals_pure_equals_cpython(micropython, tmp_path):
    # every wide case on MicroPython under heap_lock, viper and pure-Python, equal to CPython
    script = ROOT / "tests" / "device_scripts" / "wide_grad_input.py"
    for case, (geometry, draw) in enumerate(WIDE_CASES):
        I, weights, ints, _, _ = _wide_case(geometry, draw, case)
        expected = _run_wide(I, weights, ints).astype(np.int32).tobytes()
        (tmp_path / "w.bin").write_bytes(weights)
        for mode in ("fast", "pure"):
            (tmp_path / "i.bin").write_bytes(I.tobytes())
            run_micropython(micropython, script, mode, "conv", tmp_path / "i.bin",
                            tmp_path / "w.bin", ",".join(map(str, ints)))
            assert (tmp_path / "i.bin").read_bytes() == expected, (case, mode)
    for n in GEMM_OUTPUTS:
        I, weights, ints, _ = _gemm_case(n)
        expected = _run_gemm(I, weights, ints).astype(np.int32).tobytes()
        (tmp_path / "w.bin").write_bytes(weights)
        for mode in ("fast", "pure"):
            (tmp_path / "i.bin").write_bytes(I.tobytes())
            run_micropython(micropython, script, mode, "gemm", tmp_path / "i.bin",
                            tmp_path / "w.bin", ",".join(map(str, ints)))
            assert (tmp_path / "i.bin").read_bytes() == expected, (n, mode)
