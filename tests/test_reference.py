"""The generated ONNX artifacts, run on the host (onnx.reference with the ai.microtrain ops of
microtrain_host.reference, or onnxruntime for the standard-only eval graph), against torch."""
import copy

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper
import pytest
import torch

import microtrain_host as mh
from microtrain_host.formats.checkpoint import read_checkpoint
from microtrain_host.reference import reference_evaluator
from torch_reference import LOSSES, export, make_batches, mlp, ort_rule_step, torch_loss

BATCH = 8
N_IN = 12
N_OUT = {"CrossEntropyLoss": 5, "MSELoss": 3, "BCEWithLogitsLoss": 3, "L1Loss": 3}
TOL = 1e-5


def rel(a, b):
    """Largest difference relative to the reference tensor's largest magnitude."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    assert a.shape == b.shape, (a.shape, b.shape)
    return float(np.max(np.abs(a - b)) / max(float(np.max(np.abs(b))), 1e-12))


def build(tmp_path, loss, optimizer="AdamW", **kwargs):
    model = mlp(N_IN, N_OUT[loss])
    mh.generate_artifacts(export(model, torch.zeros(1, N_IN)), loss=loss, optimizer=optimizer,
                          artifact_directory=tmp_path, batch_size=BATCH, **kwargs)
    state = read_checkpoint(tmp_path / "checkpoint")
    xs, ys = make_batches(loss, 2, BATCH, N_IN, N_OUT[loss])
    return model, dict(state.trainable), dict(state.frozen), xs, ys


def label_name(model):
    names = [i.name for i in model.graph.input if i.name in ("labels", "target")]
    assert len(names) == 1, [i.name for i in model.graph.input]
    return names[0]


def torch_step(model, loss, x, y):
    """Loss and gradients {name: array} of one batch, by torch autograd."""
    model.zero_grad()
    value = torch_loss(loss)(model(torch.from_numpy(x)), torch.from_numpy(y))
    value.backward()
    return value.item(), {n: p.grad.numpy().copy() for n, p in model.named_parameters()}


def run_training(session, label, params, x, y, buffers=None, reset=True):
    feeds = {"input": x, label: y, "lazy_reset_grad": np.array([reset])}
    feeds.update({name: np.asarray(v, np.float32) for name, v in params.items()})
    for name, value in params.items():
        feeds[f"{name}_grad.accumulation.buffer"] = (
            buffers[name] if buffers is not None else np.zeros_like(value, dtype=np.float32))
    return dict(zip(session.output_names, session.run(None, feeds)))


@pytest.mark.parametrize("loss", LOSSES)
def test_training_graph_matches_torch(tmp_path, loss):
    model, trainable, frozen, xs, ys = build(tmp_path, loss)
    assert not frozen
    training = onnx.load(tmp_path / "training_model.onnx")
    label = label_name(training)
    assert label == ("labels" if loss == "CrossEntropyLoss" else "target")
    session = reference_evaluator(training)
    outs = run_training(session, label, trainable, xs[0], ys[0])
    expected_loss, grads = torch_step(model, loss, xs[0], ys[0])
    loss_name = training.graph.output[0].name
    assert rel(outs[loss_name], expected_loss) <= TOL
    assert set(grads) == set(trainable)
    for name, grad in grads.items():
        assert rel(outs[f"{name}_grad.accumulation.out"], grad) <= TOL, name

    # Without the reset flag the gradient is added to the buffer.
    ones = {n: np.ones_like(v, dtype=np.float32) for n, v in trainable.items()}
    outs = run_training(session, label, trainable, xs[0], ys[0], buffers=ones, reset=False)
    for name, grad in grads.items():
        assert rel(outs[f"{name}_grad.accumulation.out"], grad + 1) <= TOL, name


@pytest.mark.parametrize("loss", LOSSES)
def test_eval_graph_matches_torch(tmp_path, loss):
    model, trainable, _, xs, ys = build(tmp_path, loss)
    eval_model = onnx.load(tmp_path / "eval_model.onnx")
    assert all(n.domain in ("", "ai.onnx") for n in eval_model.graph.node)
    session = ort.InferenceSession(str(tmp_path / "eval_model.onnx"),
                                   providers=["CPUExecutionProvider"])
    feeds = {"input": xs[1], label_name(eval_model): ys[1]}
    feeds.update(trainable)
    value = session.run(None, feeds)[0]
    with torch.no_grad():
        expected = torch_loss(loss)(model(torch.from_numpy(xs[1])), torch.from_numpy(ys[1]))
    assert rel(value, expected.item()) <= TOL


def torch_optimizer(model, optimizer, lr, weight_decay):
    if optimizer == "SGD":
        return torch.optim.SGD(model.parameters(), lr=lr)
    return torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.999), eps=1e-6,
                             weight_decay=0.0)


@pytest.mark.parametrize("loss", LOSSES)
@pytest.mark.parametrize("optimizer,weight_decay", [("SGD", 0.0), ("AdamW", 0.0),
                                                    ("AdamW", 0.01)])
def test_optimizer_graph_matches_torch(tmp_path, loss, optimizer, weight_decay):
    """Two full steps on the host (training graph, then optimizer graph) against torch.optim."""
    lr, eps = 0.01, 1e-6
    options = {"weight_decay": weight_decay} if optimizer == "AdamW" else None
    model, params, _, xs, ys = build(tmp_path, loss, optimizer, optimizer_options=options)
    training_path = tmp_path / "training_model.onnx"
    training = reference_evaluator(training_path)
    label = label_name(onnx.load(training_path))
    opt_model = onnx.load(tmp_path / "optimizer_model.onnx")
    step_graph = reference_evaluator(opt_model)
    output_names = [o.name for o in opt_model.graph.output]
    states = {f"{p}.{s}": np.zeros_like(v, dtype=np.float32) for p, v in params.items()
              for s in (("momentum0", "momentum1") if optimizer == "AdamW" else ())}

    reference = copy.deepcopy(model)
    opt = torch_optimizer(reference, optimizer, lr, weight_decay)
    for t, (x, y) in enumerate(zip(xs, ys), start=1):
        outs = run_training(training, label, params, x, y)
        feeds = {"learning_rate": np.array([lr], np.float32), "step": np.array([t], np.int64)}
        feeds.update(params)
        feeds.update(states)
        feeds.update({f"{p}_grad.accumulation.buffer": outs[f"{p}_grad.accumulation.out"]
                      for p in params})
        feeds = {i.name: feeds[i.name] for i in opt_model.graph.input}
        updated = dict(zip(output_names, step_graph.run(None, feeds)))
        params = {p: updated[f"{p}.out"] for p in params}
        states = {s: updated[f"{s}.out"] for s in states}

        opt.zero_grad()
        torch_loss(loss)(reference(torch.from_numpy(x)), torch.from_numpy(y)).backward()
        ort_rule_step(opt, reference, optimizer, t, lr, eps, weight_decay)

        for name, p in reference.named_parameters():
            assert rel(params[name], p.detach().numpy()) <= TOL, (t, name)
            before = dict(model.named_parameters())[name].detach().numpy()
            assert not np.array_equal(params[name], before), name  # it did move


@pytest.mark.parametrize("loss", LOSSES)
def test_declared_shapes_match_reference_run(tmp_path, loss):
    """Every tensor the graphs declare (value_info, inputs, outputs) has the shape and type the
    reference run computes: lowering to the device trusts these declarations."""
    _, params, _, xs, ys = build(tmp_path, loss)
    rng = np.random.default_rng(0)
    for artifact in ("training_model.onnx", "eval_model.onnx", "optimizer_model.onnx"):
        model = onnx.load(tmp_path / artifact)
        onnx.checker.check_model(model)
        graph = model.graph
        declared = {v.name: v.type.tensor_type
                    for v in list(graph.value_info) + list(graph.input) + list(graph.output)}
        feeds = {"input": xs[0], "labels": ys[0], "target": ys[0],
                 "lazy_reset_grad": np.array([True]),
                 "learning_rate": np.array([0.01], np.float32), "step": np.array([1], np.int64)}
        feeds.update(params)
        feeds = {i.name: feeds.get(i.name, np.abs(rng.standard_normal(
            [d.dim_value for d in i.type.tensor_type.shape.dim])).astype(np.float32))
            for i in graph.input}
        produced = [o for node in graph.node for o in node.output if o]
        for name, value in zip(produced, reference_evaluator(model).run(produced, feeds)):
            assert name in declared, (artifact, name)
            kind = declared[name]
            assert value.shape == tuple(d.dim_value for d in kind.shape.dim), (artifact, name)
            assert value.dtype == helper.tensor_dtype_to_np_dtype(kind.elem_type), name


def _single_op(op_type, shape, **attrs):
    info = lambda n: helper.make_tensor_value_info(n, TensorProto.FLOAT, shape)  # noqa: E731
    node = helper.make_node(op_type, ["dY", "Y"], ["dX"], domain="ai.microtrain", **attrs)
    graph = helper.make_graph([node], op_type, [info("dY"), info("Y")], [info("dX")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                   helper.make_opsetid("ai.microtrain", 1)])


@pytest.mark.parametrize("op_type,forward,axis", [
    ("ReluGrad", torch.relu, None), ("SigmoidGrad", torch.sigmoid, None),
    ("TanhGrad", torch.tanh, None), ("SoftmaxGrad", torch.softmax, 1),
    ("SoftmaxGrad", torch.softmax, -1), ("LogSoftmaxGrad", torch.log_softmax, 1),
    ("LogSoftmaxGrad", torch.log_softmax, -1)])
def test_activation_grads_match_torch(op_type, forward, axis):
    """The backward ops not reached by the MLPs above, against torch autograd."""
    rng = np.random.default_rng(2)
    shape = [3, 4, 5]
    x = torch.tensor(rng.standard_normal(shape).astype(np.float32), requires_grad=True)
    dy = rng.standard_normal(shape).astype(np.float32)
    y = forward(x, axis) if axis is not None else forward(x)
    (expected,) = torch.autograd.grad(y, x, torch.from_numpy(dy))
    attrs = {"axis": axis} if axis is not None else {}
    (dx,) = reference_evaluator(_single_op(op_type, shape, **attrs)).run(
        None, {"dY": dy, "Y": y.detach().numpy()})
    assert dx.dtype == np.float32
    assert rel(dx, expected.numpy()) <= TOL
