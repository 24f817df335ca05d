"""Issue 10, quantization-aware training: the fake-quantization kernels against PyTorch's
fake_quantize ops (forward bit-exact on float32 inputs, gradient masks identical), the
observer and weight-scale kernels against PyTorch's observers, under CPython and
MicroPython; the QDQ pass's graphs."""
import os
import subprocess
import sys
from array import array

import numpy as np
import onnx
import pytest
import torch
from torch.ao.quantization.observer import MovingAverageMinMaxObserver

import microtrain_host as mh
from conftest import DEVICE, ROOT, run_micropython
from microtrain.kernels import quant as kernels
from microtrain_host.ops.quant import channel_view

EXAMPLE = ROOT / "examples" / "digits" / "mlp.onnx"


def probe_values(rng, scale, zp, qmin, qmax, n=400):
    """Values on, just below and just above every rounding tie of the grid, far outside it,
    and ordinary ones: where a formula that rounds differently would show."""
    scale = np.float32(scale)
    k = rng.integers(qmin - zp - 3, qmax - zp + 3, n)
    ties = ((k + 0.5) * np.float64(scale)).astype(np.float32)
    up = np.nextafter(ties, np.float32(np.inf))
    down = np.nextafter(ties, np.float32(-np.inf))
    wide = (rng.standard_normal(n) * scale * (qmax - qmin)).astype(np.float32)
    far = np.array([1e6, -1e6, 3e30, -3e30, 0.0, -0.0], np.float32)
    return np.concatenate([ties, up, down, wide, far])


def run_device(function, x, scale, zp, qmin, qmax, axis, dy=None):
    """One fake_quant or fake_quant_grad on a float32 arena laid out as
    [out | x | dy | scale | zero point]."""
    n, channels = x.size, scale.size
    outer, c, inner = channel_view(x.shape, axis, channels)
    F = array("f", bytes(4 * (3 * n + 2 * channels)))
    F[n:2 * n] = array("f", x.astype(np.float32).reshape(-1).tobytes())
    if dy is not None:
        F[2 * n:3 * n] = array("f", dy.astype(np.float32).reshape(-1).tobytes())
    F[3 * n:3 * n + channels] = array("f", scale.astype(np.float32).tobytes())
    F[3 * n + channels:] = array("f", zp.astype(np.float32).tobytes())
    geometry = (outer, c, inner, qmin, qmax)
    if function == "fake_quant":
        kernels.fake_quant(F, None, (0, n, 3 * n, 3 * n + channels) + geometry)
    else:
        kernels.fake_quant_grad(F, None, (0, 2 * n, n, 3 * n, 3 * n + channels) + geometry)
    return np.frombuffer(F, np.float32)[:n].reshape(x.shape).copy()


def torch_fake_quant(x, scale, zp, qmin, qmax, axis, dy):
    t = torch.from_numpy(x.copy()).requires_grad_(True)
    if scale.size == 1:
        y = torch.fake_quantize_per_tensor_affine(t, float(scale.reshape(())), int(zp.reshape(())),
                                                  qmin, qmax)
    else:
        y = torch.fake_quantize_per_channel_affine(t, torch.from_numpy(scale),
                                                   torch.from_numpy(zp.astype(np.int32)), axis,
                                                   qmin, qmax)
    y.backward(torch.from_numpy(dy))
    return y.detach().numpy(), t.grad.numpy()


PER_TENSOR = [(0.0123456, 3, 0, 255), (0.5, 128, 0, 255), (1e-3, 0, -128, 127),
              (0.037, -5, -128, 127), (2.0 ** -7, 0, -127, 127), (1.1920929e-07, 0, 0, 255)]


@pytest.mark.parametrize("scale,zp,qmin,qmax", PER_TENSOR)
def test_fake_quant_per_tensor_equals_torch(scale, zp, qmin, qmax):
    rng = np.random.default_rng(abs(zp) + abs(qmin) + 7)
    x = probe_values(rng, scale, zp, qmin, qmax)
    dy = rng.standard_normal(x.shape).astype(np.float32)
    s, z = np.array([scale], np.float32), np.array([zp], np.int64)
    y_torch, dx_torch = torch_fake_quant(x, s, z, qmin, qmax, 0, dy)
    y = run_device("fake_quant", x, s, z, qmin, qmax, 0)
    dx = run_device("fake_quant_grad", x, s, z, qmin, qmax, 0, dy)
    assert y.tobytes() == y_torch.tobytes(), np.flatnonzero(y != y_torch)[:5]
    assert np.array_equal(dx != 0, dx_torch != 0) and dx.tobytes() == dx_torch.tobytes()
    assert 0 < np.count_nonzero(dx == 0) < x.size  # both clamped and passed elements


@pytest.mark.parametrize("shape,axis", [((6, 3, 3, 3), 0), ((5, 7), 0), ((7, 5), 1),
                                        ((2, 4, 3), 1), ((8, 1, 2, 2), 0)])
def test_fake_quant_per_channel_equals_torch(shape, axis):
    rng = np.random.default_rng(sum(shape) + axis)
    channels = shape[axis]
    w = (rng.standard_normal(shape) * 0.3).astype(np.float32)
    scale = (np.abs(np.moveaxis(w, axis, 0)).reshape(channels, -1).max(1) / 127).astype(np.float32)
    scale[0] = np.float32(1.1920929e-07)   # a collapsed channel: everything clamps
    zp = np.zeros(channels, np.int64)
    # put some values exactly on ties of their channel's grid
    flat = np.moveaxis(w, axis, 0).reshape(channels, -1)
    flat[:, 0] = (np.float64(scale) * 10.5).astype(np.float32)
    w = np.moveaxis(flat.reshape((channels,) + tuple(np.delete(shape, axis))), 0, axis).copy()
    dy = rng.standard_normal(shape).astype(np.float32)
    y_torch, dx_torch = torch_fake_quant(w, scale, zp, -127, 127, axis, dy)
    y = run_device("fake_quant", w, scale, zp, -127, 127, axis)
    dx = run_device("fake_quant_grad", w, scale, zp, -127, 127, axis, dy)
    assert y.tobytes() == y_torch.tobytes()
    assert dx.tobytes() == dx_torch.tobytes()


def test_abs_max_scale_equals_torch_per_channel_observer():
    from torch.ao.quantization.observer import PerChannelMinMaxObserver
    rng = np.random.default_rng(3)
    for shape, axis in (((6, 3, 3, 3), 0), ((7, 5), 1), ((5, 7), 0)):
        w = (rng.standard_normal(shape) * 0.2).astype(np.float32)
        w[(slice(None),) * axis + (1,)] = 0.0     # an all-zero channel: scale eps, no 1/0
        observer = PerChannelMinMaxObserver(ch_axis=axis, dtype=torch.qint8, quant_min=-127,
                                            quant_max=127, qscheme=torch.per_channel_symmetric)
        observer(torch.from_numpy(w))
        expected = observer.calculate_qparams()[0].numpy().astype(np.float32)
        outer, channels, inner = channel_view(shape, axis, shape[axis])
        F = array("f", w.reshape(-1).tobytes() + bytes(4 * channels))
        kernels.abs_max_scale(F, None, (w.size, 0, outer, channels, inner, 127.0,
                                        float(np.finfo(np.float32).eps)))
        assert np.frombuffer(F, np.float32)[w.size:].tobytes() == expected.tobytes()


@pytest.mark.parametrize("dtype", ["uint8", "int8"])
def test_observer_equals_torch_moving_average(dtype):
    qmin, qmax, qdtype = (0, 255, torch.quint8) if dtype == "uint8" else (-128, 127, torch.qint8)
    observer = MovingAverageMinMaxObserver(averaging_constant=0.01, dtype=qdtype,
                                           quant_min=qmin, quant_max=qmax)
    rng = np.random.default_rng(5)
    momentum = float(np.float32(0.01))
    F = array("f", [0.0, 0.0, float("inf"), float("-inf")] + [0.0] * 64)
    args = (0, 1, 2, 4, 64, qmin, qmax, momentum, float(np.finfo(np.float32).eps))
    batches = [rng.standard_normal(64).astype(np.float32) * (1 + k % 3) + k % 5 - 2
               for k in range(60)]
    batches[7] = np.full(64, 0.25, np.float32)            # a constant batch
    batches[8] = np.full(64, np.nan, np.float32)           # ignored by the device (see below)
    for k, x in enumerate(batches):
        F[4:] = array("f", x.tobytes())
        kernels.observe_min_max(F, None, args)
        if k == 8:
            assert np.isnan(x).all()   # torch's range would turn NaN here; ours is kept
            continue
        observer(torch.from_numpy(x))
        scale, zp = observer.calculate_qparams()
        got = np.frombuffer(F, np.float32)
        assert got[2] == np.float32(observer.min_val) and got[3] == np.float32(observer.max_val), k
        assert got[0] == np.float32(scale) and got[1] == int(zp), k


def test_collapsed_ranges_give_finite_scales():
    # A constant activation (range [0, 0]) and an all-zero weight: eps scales, no NaN, no 1/0.
    eps = float(np.finfo(np.float32).eps)
    F = array("f", [0.0, 0.0, float("inf"), float("-inf")] + [0.0] * 8)
    kernels.observe_min_max(F, None, (0, 1, 2, 4, 8, 0, 255, 0.01, eps))
    assert F[0] == np.float32(eps) and F[1] == 0.0
    W = array("f", [0.0] * 12 + [0.0] * 3)
    kernels.abs_max_scale(W, None, (12, 0, 1, 3, 4, 127.0, eps))
    assert list(W[12:]) == [np.float32(eps)] * 3
    x = np.zeros(8, np.float32)
    y = run_device("fake_quant", x, np.array([eps], np.float32), np.array([0]), 0, 255, 0)
    assert np.all(y == 0)


def test_kernels_bit_identical_under_micropython(micropython, tmp_path):
    rng = np.random.default_rng(11)
    scale, zp, qmin, qmax = 0.0123456, 3, 0, 255
    x = probe_values(rng, scale, zp, qmin, qmax, 100)[:-2]   # finite products only
    dy = rng.standard_normal(x.shape).astype(np.float32)
    n = x.size
    arena = np.concatenate([np.zeros(n, np.float32), x, dy, [scale, zp]]).astype(np.float32)
    cases = [("fake_quant", f"0,{n},{3 * n},{3 * n + 1},1,1,{n},{qmin},{qmax}"),
             ("fake_quant_grad", f"0,{2 * n},{n},{3 * n},{3 * n + 1},1,1,{n},{qmin},{qmax}")]
    for function, args in cases:
        results = []
        for runner in ("cpython", "micropython"):
            f_file, i_file = tmp_path / f"{runner}.f", tmp_path / f"{runner}.i"
            f_file.write_bytes(arena.tobytes())
            i_file.write_bytes(b"")
            script = ROOT / "tests" / "device_scripts" / "run_kernel.py"
            if runner == "cpython":
                subprocess.run([sys.executable, str(script), "quant", function, str(f_file),
                                str(i_file), args], check=True,
                               env={"PYTHONPATH": str(DEVICE), "PATH": os.environ["PATH"]})
            else:
                run_micropython(micropython, script, "quant", function, f_file, i_file, args)
            results.append(f_file.read_bytes())
        assert results[0] == results[1], function
        y = np.frombuffer(results[0], np.float32)[:n]
        s, z = np.array([scale], np.float32), np.array([zp])
        expected = torch_fake_quant(x, s, z, qmin, qmax, 0, dy)[0 if function == "fake_quant"
                                                                   else 1]
        assert y.tobytes() == expected.tobytes()


# -- the QDQ pass ---------------------------------------------------------------------------

def test_qat_artifacts_hold_qdq_pairs(tmp_path):
    result = mh.generate_artifacts(str(EXAMPLE), artifact_directory=tmp_path, batch_size=8,
                                   quantization=True)
    for path in (result.training_model, result.eval_model):
        model = onnx.load(path)
        nodes = model.graph.node
        producers = {o: n for n in nodes for o in n.output}
        pairs = [n for n in nodes if n.op_type == "DequantizeLinear"
                 and producers[n.input[0]].op_type == "QuantizeLinear"]
        # input (and its Flatten view, with the input's scale), hidden and logits
        # activations; two weights
        assert len(pairs) == 6, [n.name for n in pairs]
        assert sum(n.op_type == "QuantizeLinear" for n in nodes) == 6
        onnx.checker.check_model(model)
    eval_ops = {n.op_type for n in onnx.load(result.eval_model).graph.node}
    assert "MinMaxObserver" not in eval_ops and "QuantParams" in eval_ops
    assert sorted(result.frozen) == sorted(["input.observer_range", "output.observer_range",
                                            "/2/Relu_output_0.observer_range"])


def test_op_without_int8_kernel_is_refused_by_name(tmp_path):
    with pytest.raises(mh.UnsupportedOpError, match=r"Relu node '/2/Relu'.*no int8 kernel"):
        mh.generate_artifacts(str(EXAMPLE), artifact_directory=tmp_path, batch_size=8,
                              quantization={"layers": ["/2/Relu"]})
    with pytest.raises(mh.ArtifactError, match="neither node nor weight"):
        mh.generate_artifacts(str(EXAMPLE), artifact_directory=tmp_path, batch_size=8,
                              quantization={"skip": ["nope"]})


def test_collapsed_ranges_train_without_nan(tmp_path):
    # A hidden layer whose weights and bias are all zero: its ReLU output is constant 0
    # (range [0, 0]) and its weight scale would be 0 / 127; the eps floors keep everything
    # finite, and the layer after it still trains.
    import torch
    from microtrain import CheckpointState, Module, Optimizer
    from torch_reference import export
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(6, 4), torch.nn.ReLU(), torch.nn.Linear(4, 3))
    with torch.no_grad():
        net[0].weight.zero_()
        net[0].bias.zero_()
    mh.generate_artifacts(export(net, torch.zeros(1, 6)), artifact_directory=tmp_path,
                          batch_size=4, optimizer="SGD", quantization=True)
    state = CheckpointState.load_checkpoint(str(tmp_path / "checkpoint"))
    model = Module(str(tmp_path / "model.mtb"), state)
    opt = Optimizer(str(tmp_path / "model.mtb"), model)
    rng = np.random.default_rng(0)
    losses = []
    for _ in range(20):
        losses.append(model(list(rng.standard_normal(24)), [0, 1, 2, 0]))
        opt.step()
        model.lazy_reset_grad()
    assert np.all(np.isfinite(losses))
    hidden = state.parameters["/1/Relu_output_0.observer_range"].data
    assert list(hidden) == [0.0, 0.0]
    assert all(np.isfinite(v) for p in state.parameters.values() for v in p.data)
    assert losses[-1] < losses[0]   # the output bias still learns


def test_cli_qat_pack_train_export(tmp_path, capsys):
    from microtrain_host.cli import main
    digits = ROOT / "examples" / "digits"
    build = tmp_path / "build"
    assert main(["pack", str(EXAMPLE), "-o", str(build), "--qat", "--batch-size", "8"]) == 0
    assert main(["train", str(build), "--data", str(digits / "digits.npz"), "--epochs", "1"]) == 0
    assert main(["export", str(build), "--checkpoint", str(build / "trained_checkpoint"),
                 "--qdq", "-o", str(build / "model_qdq.onnx")]) == 0
    text = capsys.readouterr().out
    assert "QDQ model: 2 int8 weight tensors" in text
    assert main(["export", str(build), "--checkpoint", str(build / "trained_checkpoint"),
                 "--qdq", "-o", str(build / "q.onnx"), "--int8-blob", str(build / "int8.mtb")]) == 0
    assert "int8 inference blob" in capsys.readouterr().out
    from microtrain import InferenceSession
    x = np.load(digits / "digits.npz")["x_val"][:8].astype(np.float32)
    import onnxruntime as ort
    # Without graph optimizations onnxruntime runs the QDQ model as written (DequantizeLinear,
    # float Gemm, QuantizeLinear): its fused int8 QGemm on AVX2-only x86 sums u8 * s8 pairs in
    # saturating int16 (vpmaddubsw) and is then off by many output steps where two products
    # are large, which the machines with VNNI or AVX-512 do not do (measured on an EPYC: 27 %
    # of the outputs, up to 21 steps). The device accumulates in int32: within one output
    # step of the float graph (its requantization rounds once, the graph in float32).
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    expected = ort.InferenceSession(str(build / "q.onnx"), options,
                                    providers=["CPUExecutionProvider"]).run(None, {"input": x})[0]
    got = np.array(InferenceSession(str(build / "int8.mtb")).run(x.reshape(-1))).reshape(8, 10)
    qdq = onnx.load(build / "q.onnx")
    output = next(n for n in qdq.graph.node if n.output[0] == qdq.graph.output[0].name)
    step = float(next(onnx.numpy_helper.to_array(i) for i in qdq.graph.initializer
                      if i.name == output.input[1]))
    print(f"device int8 vs onnxruntime: {np.mean(got == expected):.1%} equal, the rest within "
          f"{np.max(np.abs(got - expected)) / step:g} output steps")
    assert np.max(np.abs(got - expected)) <= step * (1 + 1e-6)
    assert np.mean(got == expected) >= 0.9
    model = onnx.load(build / "model_qdq.onnx")
    assert not any(n.domain for n in model.graph.node)   # no ai.microtrain op
    assert main(["inspect", str(build / "model.mtb"), "--no-steps"]) == 0
    text = capsys.readouterr().out
    assert "1.weight" in text and "int8  [-127, 127]  symmetric, 32 channel scales" in text
    assert "quantized weights: 9,472 B as float32, 2,536 B as int8" in text
    with pytest.raises(SystemExit):
        main(["pack", "--help"])
    assert "--qat" in capsys.readouterr().out
    float_build = tmp_path / "float"
    assert main(["pack", str(EXAMPLE), "-o", str(float_build), "--batch-size", "8"]) == 0
    assert main(["export", str(float_build), "--checkpoint", str(float_build / "checkpoint"),
                 "--qdq", "-o", str(tmp_path / "x.onnx")]) == 2
    assert "not packed for quantization-aware training" in capsys.readouterr().err
