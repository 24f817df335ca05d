"""BatchNormalization (training form, inference form, folded form) and Dropout on the device
runtime, against torch autograd and torch's BatchNorm buffers; eval forwards against
onnxruntime; the dropout generator's statistics; MicroPython against CPython.

Models are torch modules exported as FACTS.md says (training mode keeps BatchNormalization's
training_mode=1 and Dropout's mask). Exporting in training mode runs one forward pass, which
moves torch's running statistics: the torch reference is copied after the export, so both
start from the exported values."""
import copy
import io
import subprocess
import sys
from array import array

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

import microtrain_host as mh
from conftest import DEVICE, ROOT, run_micropython
from microtrain import CheckpointState, Module, Optimizer
from microtrain import blob as device_blob
from microtrain import parser as device_blob_parser
from microtrain.kernels import norm as norm_kernels
from microtrain_host import opcodes as op
from microtrain_host.formats.checkpoint import read_checkpoint
from microtrain_host.ops.norm import RANDOM_SPAN
from microtrain_host.reference import reference_evaluator
from torch_reference import export, parse_run, run_device_cpython, torch_train, write_batches

GRAD_TOLERANCE = 1e-4
FORWARD_TOLERANCE = 1e-5
BN_OPS = {op.BATCH_NORM_TRAINING, op.BATCH_NORM_INFERENCE, op.BATCH_NORM_GRAD}


def rel(actual, expected):
    """max over elements of |a - b| / max(|b|, 1e-3)."""
    a = np.asarray(actual, np.float64).reshape(-1)
    b = np.asarray(expected, np.float64).reshape(-1)
    assert a.shape == b.shape, (a.shape, b.shape)
    return float(np.max(np.abs(a - b) / np.maximum(np.abs(b), 1e-3)))


class Scaled(torch.nn.Module):
    """layer(x * w), w trainable and shaped like one sample: w's gradient carries the
    gradient of the layer's input."""

    def __init__(self, sample_shape, layer, seed=0):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.w = torch.nn.Parameter(torch.rand(sample_shape, generator=g) + 0.5)
        self.layer = layer

    def forward(self, x):
        return self.layer(x * self.w)


def randomize(bn, seed=1):
    """Non-trivial scale, bias and running statistics (not 1, 0, 0, 1)."""
    g = torch.Generator().manual_seed(seed)
    c = bn.num_features
    with torch.no_grad():
        if bn.affine:
            bn.weight.copy_(torch.rand(c, generator=g) + 0.5)
            bn.bias.copy_(torch.rand(c, generator=g) - 0.5)
        bn.running_mean.copy_(torch.rand(c, generator=g) - 0.5)
        bn.running_var.copy_(torch.rand(c, generator=g) + 0.5)
    return bn


def batch_norm(shape, **kwargs):
    layer = {2: torch.nn.BatchNorm1d, 3: torch.nn.BatchNorm1d, 4: torch.nn.BatchNorm2d}
    return randomize(layer[len(shape)](shape[1], **kwargs))


def export_eval(model, example):
    """Inference-mode export: BatchNormalization with training_mode=0, no Dropout."""
    buf = io.BytesIO()
    torch.onnx.export(model.eval(), example, buf, input_names=["input"], output_names=["output"],
                      dynamo=False, opset_version=17, training=torch.onnx.TrainingMode.EVAL,
                      do_constant_folding=False)
    return onnx.load_from_string(buf.getvalue())


def data(shape, out_shape, steps=1, seed=3):
    rng = np.random.default_rng(seed)
    xs = rng.standard_normal((steps,) + tuple(shape)).astype(np.float32)
    ys = rng.standard_normal((steps,) + tuple(out_shape)).astype(np.float32)
    return xs, ys


def build(tmp_path, onnx_model, optimizer="SGD", **kwargs):
    artifacts = mh.generate_artifacts(onnx_model, loss="MSELoss", optimizer=optimizer,
                                      artifact_directory=tmp_path, **kwargs)
    state = CheckpointState.load_checkpoint(str(tmp_path / "checkpoint"))
    return artifacts, state, Module(str(tmp_path / "model.mtb"), state)


def flat(a):
    return np.asarray(a, np.float32).reshape(-1).tolist()


def torch_step(model, x, y):
    """(loss, output, {name: grad}) of MSELoss(model(x), y) in float64 autograd; model is
    a float64 copy, left with its buffers updated by the forward pass."""
    model.zero_grad()
    out = model(torch.tensor(x, dtype=torch.float64))
    loss = torch.nn.functional.mse_loss(out, torch.tensor(y, dtype=torch.float64))
    loss.backward()
    grads = {n: p.grad.numpy().copy() for n, p in model.named_parameters()}
    return loss.item(), out.detach().numpy(), grads


def ops_of(tmp_path, program):
    b = device_blob_parser.load(str(tmp_path / "model.mtb"), keep_steps=True)
    return [record[0] for record in b.step_records[program]]


def eval_with_onnxruntime(tmp_path, state, x, y):
    """Run eval_model.onnx (standard ONNX only) in onnxruntime with the device's parameters."""
    model = onnx.load(tmp_path / "eval_model.onnx")
    feeds = {"input": x, "target": y}
    for vi in model.graph.input:
        if vi.name in state.parameters:
            p = state.parameters[vi.name]
            feeds[vi.name] = np.array(list(p.data), np.float32).reshape(p.shape)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


# -- BatchNormalization, training form ---------------------------------------------------

BN_SHAPES = [(7, 5), (5, 3, 7), (3, 5, 3, 5)]


@pytest.mark.parametrize("shape", BN_SHAPES + [(7, 5, "affine=False")],
                         ids=["NC", "NCL", "NCHW", "NC_affine_false"])
def test_batch_norm_training_step_matches_torch(tmp_path, shape):
    affine = shape[-1] != "affine=False"
    shape = shape if affine else shape[:-1]
    model = Scaled(shape[1:], batch_norm(shape, affine=affine))
    onnx_model = export(model, torch.zeros(shape), dynamic_batch=False)
    reference = copy.deepcopy(model).double()
    node = next(n for n in onnx_model.graph.node if n.op_type == "BatchNormalization")
    assert {a.name: a.i for a in node.attribute}["training_mode"] == 1
    assert len(node.output) == 3
    artifacts, state, device = build(tmp_path, onnx_model)
    assert artifacts.frozen == ["layer.running_mean", "layer.running_var"]

    (x,), (y,) = data(shape, shape)
    loss, _, grads = torch_step(reference, x, y)
    assert rel(device(flat(x), flat(y)), loss) <= GRAD_TOLERANCE
    assert set(grads) == set(artifacts.trainable)
    for name, expected in grads.items():
        assert rel(list(state.parameters[name].grad), expected) <= GRAD_TOLERANCE, name
    # The forward pass updated the running statistics in place, like torch's buffers
    # (unbiased batch variance for running_var).
    for name in ("running_mean", "running_var"):
        actual = list(state.parameters[f"layer.{name}"].data)
        assert rel(actual, getattr(reference.layer, name).numpy()) <= FORWARD_TOLERANCE, name
    assert state.parameters["layer.running_mean"].grad is None
    assert set(ops_of(tmp_path, "train")) & BN_OPS == {op.BATCH_NORM_TRAINING,
                                                       op.BATCH_NORM_GRAD}


def train_both(tmp_path, model, shape, out_shape, steps, lr, optimizer="SGD"):
    """Train the device and torch (float64 SGD) on the same batches; returns the device's
    state and module, the torch model and both loss curves."""
    onnx_model = export(model, torch.zeros(shape), dynamic_batch=False)
    reference = copy.deepcopy(model).double()
    _, state, device = build(tmp_path, onnx_model, optimizer=optimizer)
    opt = Optimizer(str(tmp_path / "model.mtb"), device)
    opt.set_learning_rate(lr)
    torch_opt = torch.optim.SGD(reference.parameters(), lr=lr)
    xs, ys = data(shape, out_shape, steps)
    losses, torch_losses = [], []
    for x, y in zip(xs, ys):
        losses.append(device(flat(x), flat(y)))
        opt.step()
        device.lazy_reset_grad()
        torch_losses.append(torch_step(reference, x, y)[0])
        torch_opt.step()
    return state, device, reference, np.array(losses), np.array(torch_losses), xs, ys


def test_running_statistics_after_sgd_steps_match_torch_buffers(tmp_path):
    shape = (4, 3, 3, 5)
    model = Scaled(shape[1:], batch_norm(shape))
    state, _, reference, losses, torch_losses, _, _ = train_both(tmp_path, model, shape, shape,
                                                                 6, 0.1)
    assert rel(losses, torch_losses) <= GRAD_TOLERANCE
    for name, buffer in list(reference.named_parameters()) + list(reference.named_buffers()):
        if name.endswith("num_batches_tracked"):
            continue
        assert rel(list(state.parameters[name].data), buffer.detach().numpy()) <= GRAD_TOLERANCE, \
            name
    # The running statistics moved away from their exported values: the check has teeth.
    assert not np.allclose(reference.layer.running_var.numpy(), 1.0, atol=0.05)
    # Saved with the other frozen parameters.
    CheckpointState.save_checkpoint(state, str(tmp_path / "trained"))
    saved = read_checkpoint(tmp_path / "trained").frozen
    for name in ("layer.running_mean", "layer.running_var"):
        assert list(saved[name].reshape(-1)) == list(state.parameters[name].data), name


def test_batch_norm_momentum_and_epsilon_match_torch(tmp_path):
    # ONNX's momentum weighs the old running value, torch's the batch statistic: torch's
    # momentum 0.99 exports as ONNX momentum 0.01. Inputs are scaled down to a batch variance
    # of a few 1e-3, so that epsilon 1e-3 (not the default 1e-5) shows in every output and
    # gradient; two SGD steps, each checked for loss, gradients and running statistics.
    shape = (3, 4, 3, 5)
    model = Scaled(shape[1:], batch_norm(shape, momentum=0.99, eps=1e-3))
    onnx_model = export(model, torch.zeros(shape), dynamic_batch=False)
    node = next(n for n in onnx_model.graph.node if n.op_type == "BatchNormalization")
    attrs = {a.name: a.f for a in node.attribute if a.name in ("momentum", "epsilon")}
    assert attrs == {"momentum": pytest.approx(0.01, rel=1e-6),
                     "epsilon": pytest.approx(1e-3, rel=1e-6)}
    reference = copy.deepcopy(model).double()
    _, state, device = build(tmp_path, onnx_model)
    opt = Optimizer(str(tmp_path / "model.mtb"), device)
    opt.set_learning_rate(0.1)
    torch_opt = torch.optim.SGD(reference.parameters(), lr=0.1)
    xs, ys = data(shape, shape, steps=2)
    for step, (x, y) in enumerate(zip((0.05 * xs).astype(np.float32), ys)):
        loss, _, grads = torch_step(reference, x, y)
        assert rel(device(flat(x), flat(y)), loss) <= GRAD_TOLERANCE, step
        for name, expected in grads.items():
            assert rel(list(state.parameters[name].grad), expected) <= GRAD_TOLERANCE, \
                (step, name)
        for name in ("running_mean", "running_var"):
            actual = list(state.parameters[f"layer.{name}"].data)
            assert rel(actual, getattr(reference.layer, name).numpy()) <= FORWARD_TOLERANCE, \
                (step, name)
        opt.step()
        device.lazy_reset_grad()
        torch_opt.step()
    # Mostly the batch's statistics (momentum 0.99 in torch's terms): the batch variance is
    # about 3e-3, far from the exported values in [0.5, 1.5].
    assert np.all(reference.layer.running_var.numpy() < 0.1)


def test_eval_uses_running_statistics(tmp_path):
    # Eval runs BatchNormalization in inference form with the trained running statistics:
    # against onnxruntime on eval_model.onnx (with the device's parameters) and torch eval.
    shape = (5, 3, 7)
    model = Scaled(shape[1:], batch_norm(shape))
    state, device, reference, _, _, xs, ys = train_both(tmp_path, model, shape, shape, 4, 0.1)
    eval_model = onnx.load(tmp_path / "eval_model.onnx")
    modes = [a.i for n in eval_model.graph.node if n.op_type == "BatchNormalization"
             for a in n.attribute if a.name == "training_mode"]
    assert modes in ([], [0])
    assert op.BATCH_NORM_INFERENCE in ops_of(tmp_path, "eval")
    device.eval()
    loss, out = device(flat(xs[0]), flat(ys[0]))
    ort_loss, ort_out = eval_with_onnxruntime(tmp_path, state, xs[0], ys[0])
    assert rel(list(out), ort_out) <= FORWARD_TOLERANCE
    assert rel(loss, ort_loss) <= FORWARD_TOLERANCE
    reference.eval()
    with torch.no_grad():
        expected = reference(torch.tensor(xs[0], dtype=torch.float64)).numpy()
    assert rel(list(out), expected) <= GRAD_TOLERANCE
    # Eval does not move the running statistics.
    before = list(state.parameters["layer.running_var"].data)
    device(flat(xs[1]), flat(ys[1]))
    assert list(state.parameters["layer.running_var"].data) == before


def test_batch_norm_without_running_statistics(tmp_path):
    # track_running_stats=False: torch exports the "running" inputs as the batch statistics
    # computed in the graph; nothing is updated, and eval normalizes with batch statistics
    # too, as torch does.
    shape = (6, 4, 3)
    model = Scaled(shape[1:], torch.nn.BatchNorm1d(4, track_running_stats=False))
    onnx_model = export(model, torch.zeros(shape), dynamic_batch=False)
    reference = copy.deepcopy(model).double()
    artifacts, state, device = build(tmp_path, onnx_model)
    assert artifacts.frozen == []
    (x,), (y,) = data(shape, shape)
    loss, out, grads = torch_step(reference, x, y)
    assert rel(device(flat(x), flat(y)), loss) <= GRAD_TOLERANCE
    for name, expected in grads.items():
        assert rel(list(state.parameters[name].grad), expected) <= GRAD_TOLERANCE, name
    device.eval()
    _, device_out = device(flat(x), flat(y))
    assert rel(list(device_out), out) <= GRAD_TOLERANCE


class MLP(torch.nn.Module):
    def __init__(self, n_in=6, hidden=7, n_out=3, seed=4):
        super().__init__()
        torch.manual_seed(seed)
        self.fc1 = torch.nn.Linear(n_in, hidden)
        self.bn = randomize(torch.nn.BatchNorm1d(hidden))
        self.fc2 = torch.nn.Linear(hidden, n_out)

    def forward(self, x):
        return self.fc2(torch.relu(self.bn(self.fc1(x))))


@pytest.mark.parametrize("optimizer,lr", [("SGD", 0.05), ("AdamW", 0.01)])
def test_linear_batchnorm_mlp_trains_like_torch(tmp_path, optimizer, lr):
    steps, batch = 20, 8
    model = MLP()
    onnx_model = export(model, torch.zeros(batch, 6), dynamic_batch=False)
    reference = copy.deepcopy(model)
    _, state, device = build(tmp_path, onnx_model, optimizer=optimizer)
    opt = Optimizer(str(tmp_path / "model.mtb"), device)
    opt.set_learning_rate(lr)
    xs, ys = data((batch, 6), (batch, 3), steps)
    losses = []
    for x, y in zip(xs, ys):
        losses.append(device(flat(x), flat(y)))
        opt.step()
        device.lazy_reset_grad()
    torch_losses, _ = torch_train(reference, "MSELoss", optimizer, xs, ys, lr)
    assert rel(losses, torch_losses) <= GRAD_TOLERANCE
    assert np.mean(losses[-5:]) < np.mean(losses[:5])
    for name, value in reference.state_dict().items():
        if not name.endswith("num_batches_tracked"):
            assert rel(list(state.parameters[name].data), value.numpy()) <= 10 * GRAD_TOLERANCE, \
                name


# -- BatchNormalization, inference form and folded form ------------------------------------

def test_inference_form_gradients_use_running_statistics(tmp_path):
    # A model exported in eval mode: training_mode=0, scale and bias trainable.
    shape = (3, 5, 3, 3)
    model = Scaled(shape[1:], batch_norm(shape))
    onnx_model = export_eval(model, torch.zeros(shape))
    reference = copy.deepcopy(model).double().eval()
    artifacts, state, device = build(tmp_path, onnx_model)
    assert artifacts.trainable == ["w", "layer.weight", "layer.bias"]
    assert artifacts.folded == []
    assert set(ops_of(tmp_path, "train")) & BN_OPS == {op.BATCH_NORM_INFERENCE,
                                                       op.BATCH_NORM_GRAD}
    (x,), (y,) = data(shape, shape)
    stats = list(state.parameters["layer.running_mean"].data)
    loss, _, grads = torch_step(reference, x, y)
    assert rel(device(flat(x), flat(y)), loss) <= GRAD_TOLERANCE
    for name, expected in grads.items():
        assert rel(list(state.parameters[name].grad), expected) <= GRAD_TOLERANCE, name
    assert list(state.parameters["layer.running_mean"].data) == stats


@pytest.mark.parametrize("affine", [True, False])
def test_frozen_inference_batch_norm_folds_into_a_multiply_add(tmp_path, affine):
    shape = (3, 5, 3, 3)
    model = Scaled(shape[1:], batch_norm(shape, affine=affine))
    onnx_model = export_eval(model, torch.zeros(shape))
    reference = copy.deepcopy(model).double().eval()
    frozen = ["layer.weight", "layer.bias"] if affine else None
    artifacts, state, device = build(tmp_path, onnx_model, frozen_params=frozen)
    statistics = ["layer.running_mean", "layer.running_var"]
    assert sorted(artifacts.folded) == sorted((frozen or []) + statistics)
    assert artifacts.trainable == ["w"] and artifacts.frozen == []
    checkpoint = read_checkpoint(tmp_path / "checkpoint")
    assert set(checkpoint.trainable) == {"w"} and not checkpoint.frozen
    # Forward and dX are one per-channel multiply-add each, with precomputed constants.
    for program, count in (("train", 2), ("eval", 1)):
        ops = ops_of(tmp_path, program)
        assert not set(ops) & BN_OPS, program
        assert ops.count(op.CHANNEL_AFFINE) == count, program
    # The folded statistics are read by no step, so they take no arena space or blob bytes.
    names = device_blob_parser.load(str(tmp_path / "model.mtb")).names
    assert not set(artifacts.folded) & set(names), names
    (x,), (y,) = data(shape, shape)
    loss, _, grads = torch_step(reference, x, y)
    assert rel(device(flat(x), flat(y)), loss) <= GRAD_TOLERANCE
    assert rel(list(state.parameters["w"].grad), grads["w"]) <= GRAD_TOLERANCE
    device.eval()
    _, out = device(flat(x), flat(y))
    session = ort.InferenceSession(onnx_model.SerializeToString(),
                                   providers=["CPUExecutionProvider"])
    assert rel(list(out), session.run(None, {"input": x})[0]) <= FORWARD_TOLERANCE


# -- the training graph on the host (numpy references of the gradient ops) ---------------

@pytest.mark.parametrize("mode", ["training", "inference"])
def test_reference_batch_norm_grad_matches_torch(tmp_path, mode):
    shape = (5, 3, 4)
    model = Scaled(shape[1:], batch_norm(shape))
    if mode == "training":
        onnx_model = export(model, torch.zeros(shape), dynamic_batch=False)
        reference = copy.deepcopy(model).double()
    else:
        onnx_model = export_eval(model, torch.zeros(shape))
        reference = copy.deepcopy(model).double().eval()
    artifacts, state, _ = build(tmp_path, onnx_model)
    (x,), (y,) = data(shape, shape)
    loss, _, grads = torch_step(reference, x, y)
    training = onnx.load(tmp_path / "training_model.onnx")
    feeds = {"input": x, "target": y, "lazy_reset_grad": np.array([True])}
    for name in artifacts.trainable + artifacts.frozen:
        p = state.parameters[name]
        feeds[name] = np.array(list(p.data), np.float32).reshape(p.shape)
    for name in artifacts.trainable:
        feeds[f"{name}_grad.accumulation.buffer"] = np.zeros_like(feeds[name])
    session = reference_evaluator(training)
    outs = dict(zip(session.output_names, session.run(None, feeds)))
    assert rel(outs[training.graph.output[0].name], loss) <= GRAD_TOLERANCE
    for name, expected in grads.items():
        assert rel(outs[f"{name}_grad.accumulation.out"], expected) <= GRAD_TOLERANCE, name


# -- parameter classes and refusals ------------------------------------------------------

def test_running_statistics_are_frozen_and_not_trainable(tmp_path):
    model = MLP()
    onnx_model = export(model, torch.zeros(8, 6), dynamic_batch=False)
    with pytest.raises(mh.ArtifactError, match="bn.running_var.*running statistic"):
        mh.generate_artifacts(onnx_model, requires_grad=["fc1.weight", "bn.running_var"],
                              loss="MSELoss", artifact_directory=tmp_path)
    artifacts = mh.generate_artifacts(onnx_model, requires_grad=["fc1.weight"], loss="MSELoss",
                                      optimizer="AdamW", artifact_directory=tmp_path)
    assert artifacts.trainable == ["fc1.weight"]
    checkpoint = read_checkpoint(tmp_path / "checkpoint")
    assert {"bn.running_mean", "bn.running_var"} <= set(checkpoint.frozen)
    b = device_blob_parser.load(str(tmp_path / "model.mtb"))
    for tensor, grad, states in b.parameters:
        if b.names[tensor].startswith("bn.running"):
            assert grad == -1 and states == ()
    # Listing them as frozen is allowed (ORT needs users to do it).
    mh.generate_artifacts(onnx_model, frozen_params=["bn.running_mean"], loss="MSELoss",
                          artifact_directory=tmp_path)


def test_one_value_per_channel_is_refused(tmp_path):
    model = MLP()
    onnx_model = export(model, torch.zeros(2, 6), dynamic_batch=False)
    onnx_model.graph.input[0].type.tensor_type.shape.dim[0].dim_value = 1
    with pytest.raises(mh.UnsupportedOpError, match="BatchNormalization.*more than one value"):
        mh.generate_artifacts(onnx_model, loss="MSELoss", artifact_directory=tmp_path)


# -- Dropout -----------------------------------------------------------------------------

def run_dropout_kernel(n, ratio, seed=0, stream=0, state=None):
    """Dropout over x = 1..n straight through the kernel (generator state in I[0:2], mask
    from I[2]): (y, mask bits, I)."""
    F = array("f", [float(i + 1) for i in range(n)] + [0.0] * n)
    words = (n + 29) // 30
    I = state if state is not None else array("i", [0] * (words + 2))
    scale = 1.0 / (1.0 - ratio)
    norm_kernels.dropout(F, I, (n, 0, 2, 0, n, round(ratio * RANDOM_SPAN), seed, stream, scale))
    y = np.array(F[n:])
    bits = np.array([(I[2 + w // 30] >> (w % 30)) & 1 for w in range(n)], bool)
    return y, bits, I


@pytest.mark.parametrize("ratio", [0.1, 0.5, 0.8])
def test_dropout_kernel_drop_rate_and_scale(ratio):
    n = 30001
    y, bits, _ = run_dropout_kernel(n, ratio, seed=11)
    dropped = y == 0.0
    sigma = np.sqrt(ratio * (1 - ratio) / n)
    assert abs(dropped.mean() - ratio) <= 4.5 * sigma
    # Neighbouring draws are independent: both dropped about ratio^2 of the time.
    both = np.mean(dropped[1:] & dropped[:-1])
    assert abs(both - ratio ** 2) <= 4.5 * np.sqrt(ratio ** 2 * (1 - ratio ** 2) / n)
    assert np.array_equal(bits, ~dropped)
    x = np.arange(1, n + 1, dtype=np.float32)
    kept = ~dropped
    np.testing.assert_allclose(y[kept], x[kept] * np.float32(1.0 / (1.0 - ratio)), rtol=1e-6)


def test_dropout_kernel_is_deterministic_per_seed_and_stream():
    n = 300
    first = run_dropout_kernel(n, 0.5, seed=5)[1]
    assert np.array_equal(first, run_dropout_kernel(n, 0.5, seed=5)[1])
    assert not np.array_equal(first, run_dropout_kernel(n, 0.5, seed=6)[1])
    assert not np.array_equal(first, run_dropout_kernel(n, 0.5, seed=5, stream=1)[1])
    # The state carries on: the next call draws a new mask.
    _, _, state = run_dropout_kernel(n, 0.5, seed=5)
    assert not np.array_equal(first, run_dropout_kernel(n, 0.5, state=state)[1])
    assert all(0 < v < 2**30 for v in state)  # small ints on 32-bit MicroPython


class DropoutModel(torch.nn.Module):
    def __init__(self, shape, ratio):
        super().__init__()
        self.w = torch.nn.Parameter(torch.rand(shape, generator=torch.Generator().manual_seed(2))
                                    + 0.5)
        self.drop = torch.nn.Dropout(ratio)

    def forward(self, x):
        return self.drop(x * self.w)


def test_dropout_gradient_matches_torch_with_the_same_mask(tmp_path):
    shape, ratio = (9, 13), 0.4
    onnx_model = export(DropoutModel(shape, ratio), torch.zeros(shape), dynamic_batch=False)
    dropout = next(n for n in onnx_model.graph.node if n.op_type == "Dropout")
    assert len(dropout.input) == 3 and len(dropout.output) == 2  # ratio, training_mode, mask
    artifacts, state, device = build(tmp_path, onnx_model)
    (x,), (y,) = data(shape, shape)
    device.set_seed(3)
    loss = device(flat(x), flat(y))
    grad = np.array(list(state.parameters["w"].grad)).reshape(shape)
    # A dropped element gets exactly zero gradient (x, w and the error are never zero).
    mask = grad != 0.0
    assert 0.2 < 1.0 - mask.mean() < 0.6
    w = torch.tensor(np.array(list(state.parameters["w"].data)).reshape(shape),
                     dtype=torch.float64, requires_grad=True)
    out = torch.tensor(x, dtype=torch.float64) * w * torch.tensor(mask) / (1.0 - ratio)
    expected = torch.nn.functional.mse_loss(out, torch.tensor(y, dtype=torch.float64))
    expected.backward()
    assert rel(loss, expected.item()) <= GRAD_TOLERANCE
    assert rel(grad, w.grad.numpy()) <= GRAD_TOLERANCE

    # The same seed gives the same masks, in another Module too; the next step a new one.
    twin_state = CheckpointState.load_checkpoint(str(tmp_path / "checkpoint"))
    twin = Module(str(tmp_path / "model.mtb"), twin_state)
    twin.set_seed(3)
    assert twin(flat(x), flat(y)) == loss
    assert list(twin_state.parameters["w"].grad) == list(state.parameters["w"].grad)
    twin(flat(x), flat(y))
    assert list(twin_state.parameters["w"].grad) != list(state.parameters["w"].grad)
    twin.set_seed(4)
    twin(flat(x), flat(y))
    assert list(twin_state.parameters["w"].grad) != list(state.parameters["w"].grad)

    # Eval: Dropout is the identity (eval_model.onnx has no Dropout; onnxruntime runs it).
    eval_ops = [n.op_type for n in onnx.load(tmp_path / "eval_model.onnx").graph.node]
    assert "Dropout" not in eval_ops
    assert op.DROPOUT not in ops_of(tmp_path, "eval")
    device.eval()
    _, out = device(flat(x), flat(y))
    _, ort_out = eval_with_onnxruntime(tmp_path, state, x, y)
    assert rel(list(out), ort_out) <= FORWARD_TOLERANCE
    assert rel(list(out), x * np.array(list(state.parameters["w"].data)).reshape(shape)) \
        <= FORWARD_TOLERANCE


def test_dropout_seed_attribute_sets_the_first_mask(tmp_path):
    # Without Module.set_seed a Dropout's stream starts from its seed attribute: another seed
    # gives another first mask, the same seed the same mask (in another Module, and in a
    # blob packed again), and set_seed(s) restarts the stream exactly where seed=s starts it.
    shape = (9, 13)
    exported = export(DropoutModel(shape, 0.5), torch.zeros(shape), dynamic_batch=False)
    (x,), (y,) = data(shape, shape)

    def first_mask(name, seed=None, set_seed=None):
        model = copy.deepcopy(exported)
        if seed is not None:
            dropout = next(n for n in model.graph.node if n.op_type == "Dropout")
            dropout.attribute.append(onnx.helper.make_attribute("seed", seed))
        _, state, device = build(tmp_path / name, model)
        if set_seed is not None:
            device.set_seed(set_seed)
        device(flat(x), flat(y))
        # A dropped element gets exactly zero gradient (x, w and the error are never zero).
        return np.array(list(state.parameters["w"].grad)) != 0.0

    seeded = first_mask("seed7", seed=7)
    assert 0.3 < 1.0 - seeded.mean() < 0.7
    assert np.array_equal(first_mask("seed7_again", seed=7), seeded)
    assert not np.array_equal(first_mask("seed8", seed=8), seeded)
    unseeded = first_mask("no_seed")
    assert not np.array_equal(unseeded, seeded)
    assert np.array_equal(first_mask("seed0", seed=0), unseeded)   # the default seed is 0
    assert np.array_equal(first_mask("set_seed7", set_seed=7), seeded)


def test_dropout_mask_is_bit_packed_in_the_int_arena(tmp_path):
    shape = (9, 13)
    onnx_model = export(DropoutModel(shape, 0.5), torch.zeros(shape), dynamic_batch=False)
    build(tmp_path, onnx_model)
    b = device_blob_parser.load(str(tmp_path / "model.mtb"))
    masks = [t for t in range(len(b.names))
             if b.dtypes[t] == device_blob.INT32 and b.roles[t] == 4]  # activation
    assert [b.sizes[t] for t in masks] == [(9 * 13 + 29) // 30]


def test_dropout_refuses_a_ratio_of_one(tmp_path):
    onnx_model = export(DropoutModel((4, 5), 0.5), torch.zeros(4, 5), dynamic_batch=False)
    for node in onnx_model.graph.node:
        if node.op_type == "Constant" and node.attribute[0].t.data_type == onnx.TensorProto.FLOAT:
            node.attribute[0].t.CopyFrom(onnx.numpy_helper.from_array(np.float32(1.0)))
    with pytest.raises(mh.UnsupportedOpError, match="Dropout.*ratio 1.0"):
        mh.generate_artifacts(onnx_model, loss="MSELoss", artifact_directory=tmp_path)


# -- MicroPython against CPython -------------------------------------------------------------

class SequenceNet(torch.nn.Module):
    """(N, C, L) -> x * w -> BatchNorm1d -> ReLU -> Dropout -> Flatten -> Linear."""

    def __init__(self, c=3, length=5, n_out=2):
        super().__init__()
        torch.manual_seed(5)
        self.w = torch.nn.Parameter(torch.rand(c, length) + 0.5)
        self.bn = randomize(torch.nn.BatchNorm1d(c))
        self.drop = torch.nn.Dropout(0.25)
        self.fc = torch.nn.Linear(c * length, n_out)

    def forward(self, x):
        return self.fc(self.drop(torch.relu(self.bn(x * self.w))).flatten(1))


def test_micropython_matches_cpython(tmp_path, micropython):
    steps, shape = 6, (4, 3, 5)
    onnx_model = export(SequenceNet(), torch.zeros(shape), dynamic_batch=False)
    mh.generate_artifacts(onnx_model, loss="MSELoss", optimizer="SGD", artifact_directory=tmp_path)
    xs, ys = data(shape, (4, 2), steps)
    write_batches(tmp_path / "data.bin", xs, ys)
    losses, params, eval_loss = run_device_cpython(tmp_path, tmp_path / "data.bin", steps, 0.1)
    out = run_micropython(micropython, ROOT / "tests" / "device_scripts" / "train_steps.py",
                          tmp_path, tmp_path / "data.bin", steps, "0.1")
    mp_losses, mp_params, mp_eval = parse_run(out)
    assert len(mp_losses) == steps
    assert rel(mp_losses, losses) <= FORWARD_TOLERANCE
    assert rel(mp_params, params) <= FORWARD_TOLERANCE   # running statistics included
    assert rel(mp_eval, eval_loss) <= FORWARD_TOLERANCE


def test_dropout_generator_is_the_same_on_micropython_and_allocation_free(micropython):
    script = ROOT / "tests" / "device_scripts" / "dropout_stream.py"
    args = ["12345", "2", "97"]
    cpython = subprocess.run([sys.executable, str(script)] + args, capture_output=True,
                             text=True, env={"PYTHONPATH": str(DEVICE)}, check=True).stdout
    assert len(cpython.split("\n")[0].split()) == 4   # 97 elements: 4 mask words
    assert run_micropython(micropython, script, *args) == cpython


def test_dropout_seeding_is_four_lehmer_steps_of_each_generator():
    # seed_state multiplies by A**4 mod M in one step: the same state as four steps of each
    # Lehmer generator by their definition (a <- a * A mod M), from 1 + seed mod (M1 - 1)
    # and 1 + stream mod (M2 - 1)
    m1, a1, m2, a2 = 2**30 - 35, 31999, 2**30 - 41, 32000
    for seed, stream in ((0, 0), (1, 1), (12345, 2), (2**31 - 1, 97), (2**63 - 1, 2**40),
                         (m1 - 2, m2 - 2), (m1 - 1, m2 - 1), (-5, 3)):
        a, b = 1 + seed % (m1 - 1), 1 + stream % (m2 - 1)
        for _ in range(4):
            a, b = a * a1 % m1, b * a2 % m2
        state = [0, 0]
        norm_kernels.seed_state(state, 0, seed, stream)
        assert state == [a, b], (seed, stream)
    # the module's powers are those of its own generators and warm-up
    k = norm_kernels
    assert (k._A1_WARM, k._A2_WARM) == (pow(k._A1, k._WARM_UP, k._M1),
                                        pow(k._A2, k._WARM_UP, k._M2))
