"""PyTorch side of the parity tests: models, ONNX export with the flags in FACTS.md, and
reference training runs with torch autograd and torch.optim."""
import io
import math
import subprocess
import sys

import numpy as np
import onnx
import torch

from conftest import DEVICE, ROOT

LOSSES = ("MSELoss", "CrossEntropyLoss", "BCEWithLogitsLoss", "L1Loss")


def mlp(n_in, n_out, seed=0, hidden=(16, 8), activations=("Relu", "Tanh")):
    torch.manual_seed(seed)
    layers = []
    width = n_in
    for h, act in zip(hidden, activations):
        layers += [torch.nn.Linear(width, h), getattr(torch.nn, {"Relu": "ReLU"}.get(act, act))()]
        width = h
    layers.append(torch.nn.Linear(width, n_out))
    return torch.nn.Sequential(*layers)


def export(model, example, dynamic_batch=True, opset=17):
    """torch -> ONNX ModelProto, training-mode export (parameters stay initializers)."""
    buf = io.BytesIO()
    kwargs = {}
    if dynamic_batch:
        kwargs["dynamic_axes"] = {"input": {0: "batch"}, "output": {0: "batch"}}
    torch.onnx.export(model, example, buf, input_names=["input"], output_names=["output"],
                      dynamo=False, opset_version=opset, training=torch.onnx.TrainingMode.TRAINING,
                      do_constant_folding=False, **kwargs)
    return onnx.load_from_string(buf.getvalue())


def make_batches(loss, steps, batch, n_in, n_out, seed=1):
    """Inputs ~ N(0, 1); targets from a fixed random linear teacher, so there is something
    to learn: class = argmax, BCE target = sign, regression target = the teacher's value."""
    rng = np.random.default_rng(seed)
    xs = rng.standard_normal((steps, batch, n_in)).astype(np.float32)
    teacher = xs @ rng.standard_normal((n_in, n_out)).astype(np.float32) / np.sqrt(n_in)
    if loss == "CrossEntropyLoss":
        ys = teacher.argmax(-1).astype(np.int64)
    elif loss == "BCEWithLogitsLoss":
        ys = (teacher > 0).astype(np.float32)
    else:
        ys = teacher.astype(np.float32)
    return xs, ys


def write_batches(path, xs, ys):
    with open(path, "wb") as f:
        for x, y in zip(xs, ys):
            f.write(x.astype("<i4" if x.dtype.kind == "i" else "<f4").tobytes())
            f.write(y.astype("<i4" if y.dtype.kind == "i" else "<f4").tobytes())


def torch_loss(name):
    return {"MSELoss": torch.nn.MSELoss(), "CrossEntropyLoss": torch.nn.CrossEntropyLoss(),
            "BCEWithLogitsLoss": torch.nn.BCEWithLogitsLoss(), "L1Loss": torch.nn.L1Loss()}[name]


def torch_train(model, loss, optimizer, xs, ys, lr, eps=1e-6, weight_decay=0.0, accumulate=1):
    """Train with torch; returns (losses per call, final parameters flattened).

    SGD is torch.optim.SGD. AdamW follows ORT's rule (FACTS.md), which differs from
    torch.optim.AdamW only in where eps goes: ORT divides by sqrt(v) + eps, torch by
    sqrt(v)/sqrt(1-b2^t) + eps. Setting torch's eps to eps/sqrt(1-b2^t) before each step
    makes torch.optim.AdamW compute exactly ORT's update; ORT applies weight decay after the
    update, so decay is applied by hand after torch's step."""
    criterion = torch_loss(loss)
    if optimizer == "SGD":
        opt = torch.optim.SGD(model.parameters(), lr=lr)
    else:
        opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.999), eps=eps,
                                weight_decay=0.0)
    losses, t = [], 0
    opt.zero_grad()
    for i, (x, y) in enumerate(zip(xs, ys)):
        out = model(torch.from_numpy(x))
        value = criterion(out, torch.from_numpy(y))
        value.backward()
        losses.append(value.item())
        if (i + 1) % accumulate:
            continue
        t += 1
        ort_rule_step(opt, model, optimizer, t, lr, eps, weight_decay)
        opt.zero_grad()
    params = np.concatenate([p.detach().numpy().reshape(-1) for p in model.parameters()])
    return np.array(losses), params


def ort_rule_step(opt, model, optimizer, t, lr, eps=1e-6, weight_decay=0.0):
    """One torch.optim step made to follow ORT's rule (see torch_train)."""
    if optimizer == "AdamW":
        for group in opt.param_groups:
            group["eps"] = eps / math.sqrt(1.0 - 0.999 ** t)
    opt.step()
    if weight_decay:
        with torch.no_grad():
            for p in model.parameters():
                p.mul_(1.0 - lr * weight_decay)


def parse_run(text):
    """Output of device_scripts/train_steps.py -> (losses, params, eval loss)."""
    lines = text.split()
    p = lines.index("params")
    e = lines.index("eval")
    return (np.array([float(v) for v in lines[:p]]), np.array([float(v) for v in lines[p + 1:e]]),
            float(lines[e + 1]))


def run_device_cpython(directory, data_file, steps, lr, accumulate=1):
    script = ROOT / "tests" / "device_scripts" / "train_steps.py"
    proc = subprocess.run([sys.executable, str(script), str(directory), str(data_file), str(steps),
                           repr(lr), str(accumulate)], capture_output=True, text=True,
                          env={"PYTHONPATH": str(DEVICE), "PATH": "/usr/bin:/bin"})
    if proc.returncode:
        raise AssertionError(proc.stderr)
    return parse_run(proc.stdout)


def relative_error(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.max(np.abs(a - b) / np.maximum(np.abs(b), 1e-6)))


def qat_qdq_model(ref, tmp, samples):
    """The reference model `ref` packed for QAT in tmp, `samples` SGD steps (lr 0.05) on the
    device runtime under CPython to move its weights and observers, then exported as the
    QDQ model tmp/qdq.onnx. Returns the (xs, ys) it trained on."""
    import microtrain_host as mh
    from microtrain import CheckpointState, Module, Optimizer
    from test_models import make_data
    mh.generate_artifacts(export(ref.module, torch.zeros((ref.batch,) + ref.inputs)),
                          artifact_directory=tmp, batch_size=ref.batch, optimizer="SGD",
                          quantization=True)
    xs, ys = make_data(ref, samples)
    state = CheckpointState.load_checkpoint(str(tmp / "checkpoint"))
    model = Module(str(tmp / "model.mtb"), state)
    opt = Optimizer(str(tmp / "model.mtb"), model)
    opt.set_learning_rate(0.05)
    for x, y in zip(xs, ys):
        model(x.reshape(-1), [int(v) for v in y])
        opt.step()
        model.lazy_reset_grad()
    CheckpointState.save_checkpoint(state, str(tmp / "trained"))
    mh.export_inference_model(tmp, tmp / "trained", tmp / "qdq.onnx", qdq=True)
    return xs, ys
