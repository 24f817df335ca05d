"""Fingerprint what the packager writes, to prove a refactoring changed no behaviour.

    python scripts/fingerprint_artifacts.py > before.json   # on the old code
    python scripts/fingerprint_artifacts.py > after.json    # on the new code
    cmp before.json after.json

Float lines: the digits MLP under several optimizer settings, a partial update, a Dropout
model with the loss outside the graph, a layout-op model, every reference model of the suite
(SGD and AdamW: recurrent, Resize, ConvTranspose, embedding and transformer models included)
and sparse updates with the memory moves (updates in the backward pass, ReLU masks,
recomputation). For each it packs the artifacts and records the SHA-256 of every file
written (ONNX graphs, checkpoints, blob), then trains 10 steps with the device runtime under
CPython and records each loss and the final parameters bit for bit (float.hex).

Quantized lines: QAT blobs (digits MLP, DS-CNN, LeNet) trained 10 steps, the int8 inference
blob their export program writes on the device, the host's QDQ model and int8 inference blob
with one output; integer training blobs made from that QDQ model (the classifier; for the
DS-CNN also the last conv with momentum, the sparse update, round-to-nearest with biases)
trained 10 steps in integers, saved and evaluated.

Equal output means equal blobs, checkpoints and trajectories. Needs the test extra (torch
builds the models)."""
import hashlib
import json
import os
import pathlib
import sys
import tempfile

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]
for sub in ("tests", "device", "host"):
    sys.path.insert(0, str(ROOT / sub))

import torch  # noqa: E402
from torch import nn  # noqa: E402

import microtrain_host as mh  # noqa: E402
from microtrain import CheckpointState, Module, Optimizer  # noqa: E402
from reference_models import REFERENCE_MODELS, ds_cnn, lenet  # noqa: E402
from torch_reference import export  # noqa: E402

STEPS = 10


class LayoutNet(nn.Module):
    """Transpose, Slice, Concat, Split, Pad, batched MatMul, Softmax, Dropout."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(3)
        self.proj = nn.Linear(6, 6)
        self.head = nn.Linear(24, 4)
        self.drop = nn.Dropout(0.25)

    def forward(self, x):                       # x: (N, 4, 6)
        q = self.proj(x)
        att = torch.softmax(q @ x.transpose(1, 2), dim=-1) @ x      # (N, 4, 6)
        a, b = att.split([2, 4], dim=2)
        y = torch.cat([b, torch.nn.functional.pad(a, (1, 1), value=0.5)], dim=2)
        y = y[:, 1:, :] * 2.0                   # (N, 3, 8)
        y = torch.cat([y, y[:, :1, :]], dim=1)   # (N, 4, 8)
        return self.head(self.drop(y[:, :, 1:7]).flatten(1))


def cases():
    """(name, model, generate_artifacts keywords, vocabulary of an int input)"""
    digits = str(ROOT / "examples" / "digits" / "mlp.onnx")
    yield "digits-adamw", digits, dict(batch_size=8), 0
    yield "digits-sgd-extras", digits, dict(batch_size=8, optimizer="SGD", optimizer_options={
        "momentum": 0.9, "nesterov": True, "l1_penalty": 1e-4, "l2_penalty": 1e-3,
        "clip_grad_norm": 1.0, "weight_decay": 0.01}), 0
    yield "digits-frozen", digits, dict(batch_size=8, frozen_params=["1.weight"],
                                        nominal_checkpoint=True), 0
    layout = LayoutNet()
    yield "layout-forward-backward", export(layout, torch.zeros(2, 4, 6)), dict(
        batch_size=2, loss=None, optimizer="SGD"), 0
    yield "layout-mse", export(layout, torch.zeros(2, 4, 6)), dict(batch_size=2,
                                                                   loss="MSELoss"), 0
    for build in REFERENCE_MODELS:
        ref = build()
        example = torch.zeros((ref.batch,) + ref.inputs,
                              dtype=torch.int64 if ref.vocabulary else None)
        model = export(ref.module, example)
        for optimizer in ("SGD", "AdamW"):
            yield f"{ref.name}-{optimizer}", model, dict(batch_size=ref.batch, loss=ref.loss,
                                                         optimizer=optimizer), ref.vocabulary
        if ref.name == "ds_cnn":
            biases = [i.name for i in model.graph.initializer if i.name.endswith("bias")]
            yield "ds_cnn-bias-only", model, dict(batch_size=ref.batch, loss=ref.loss,
                                                  requires_grad=biases), 0
            # the sparse update with the memory moves (issue 11)
            yield "ds_cnn-sparse-in-backward", model, dict(
                batch_size=ref.batch, loss=ref.loss, optimizer="SGD",
                optimizer_options={"momentum": 0.9},
                requires_grad=mh.sparse_update(model, True, 1), update_in_backward=True,
                recompute=True), 0
            yield "ds_cnn-sparse-recompute", model, dict(
                batch_size=ref.batch, loss=ref.loss,
                requires_grad=mh.sparse_update(model, True, 2), recompute=True), 0


def _inputs(module, program, rng, vocabulary=0):
    inputs = []
    for tid in program.inputs:
        n = module.blob.sizes[tid]
        if module.blob.dtypes[tid] == 1:
            top = module.blob.num_classes if module.blob.roles[tid] == 1 else vocabulary
            inputs.append([int(v) for v in rng.integers(0, max(top, 1), n)])
        else:
            inputs.append([float(v) for v in rng.standard_normal(n).astype(np.float32)])
    return inputs


def train(directory, blob, vocabulary=0, learning_rate=None):
    """10 steps from the directory's checkpoint: (losses, parameters' SHA-256, state)."""
    state = CheckpointState.load_checkpoint(os.path.join(directory, "checkpoint"))
    module = Module(blob, state)
    optimizer = Optimizer(blob, module)
    if learning_rate is not None:
        optimizer.set_learning_rate(learning_rate)
    module.set_seed(5)
    rng = np.random.default_rng(0)
    results = []
    for step in range(STEPS):
        inputs = _inputs(module, module._train or module._forward, rng, vocabulary)
        if module._forward is not None:
            outputs = module.forward(*inputs)
            outputs = outputs if isinstance(outputs, list) else [outputs]
            module.backward(*[[0.5 * float(v) for v in out] for out in outputs])
            results.append(sum(float(v) for v in outputs[0]).hex())
        else:
            results.append(float(module(*inputs)).hex())
        optimizer.step()
        module.lazy_reset_grad()
    params = module.get_contiguous_parameters()
    return (results, hashlib.sha256(bytes(memoryview(params).cast("B"))).hexdigest(),
            (state, module))


def _sha(data):
    return hashlib.sha256(bytes(data)).hexdigest()


def _file_sha(path):
    with open(path, "rb") as f:
        return _sha(f.read())


def _hashes(directory):
    return {f: _file_sha(os.path.join(directory, f)) for f in sorted(os.listdir(directory))
            if os.path.isfile(os.path.join(directory, f))}


def quantized_cases(report):
    """QAT, the int8 exports, integer training (issues 10 and 11)."""
    from microtrain import InferenceSession     # (here: a minimal runtime has none)
    from microtrain_host.quant.int8 import pack_inference_model
    from microtrain_host.quant.inttrain import int8_training_artifacts
    digits = str(ROOT / "examples" / "digits" / "mlp.onnx")
    for name, source in (("digits", digits), ("ds_cnn", ds_cnn()), ("lenet", lenet())):
        with tempfile.TemporaryDirectory() as directory:
            batch = 8
            if not isinstance(source, str):
                batch = source.batch
                source = export(source.module, torch.zeros((source.batch,) + source.inputs))
            result = mh.generate_artifacts(source, artifact_directory=directory,
                                           batch_size=batch, optimizer="SGD",
                                           quantization=True)
            files = _hashes(directory)
            losses, params, (state, module) = train(directory, result.blob, learning_rate=0.05)
            trained = os.path.join(directory, "trained")
            CheckpointState.save_checkpoint(state, trained, include_optimizer_state=True)
            device_export = os.path.join(directory, "device_int8.mtb")
            module.export_model_for_inferencing(device_export, module.output_names(False)[1:])
            qdq = os.path.join(directory, "qdq.onnx")
            mh.export_inference_model(directory, trained, qdq, qdq=True)
            int8_blob = os.path.join(directory, "int8.mtb")
            pack_inference_model(qdq, int8_blob)
            rng = np.random.default_rng(1)
            x = rng.standard_normal(module.blob.sizes[module._train.inputs[0]]).astype(np.float32)
            outputs = [float(v).hex() for v in InferenceSession(int8_blob).run(x.tolist())]
            report[f"qat-{name}"] = {
                "files": files, "losses": losses, "params": params,
                "trained": _file_sha(trained), "device_export": _file_sha(device_export),
                "qdq": _file_sha(qdq), "int8": _file_sha(int8_blob), "int8_outputs": outputs}
            print(f"qat-{name}", file=sys.stderr)
            configurations = [("classifier", dict())]
            if name == "ds_cnn":
                configurations += [("last-conv-momentum", dict(train_conv=True, momentum=0.9)),
                                   ("sparse", dict(train_conv=True, train_biases=True,
                                                   train_depthwise=True)),
                                   ("nearest-biases", dict(stochastic=False, train_biases=True))]
            for config, kwargs in configurations:
                info = int8_training_artifacts(qdq, os.path.join(directory, "int_" + config),
                                               0.05, **kwargs)
                report[f"inttrain-{name}-{config}"] = integer_training(info, x.shape)
                print(f"inttrain-{name}-{config}", file=sys.stderr)


def integer_training(info, shape):
    from microtrain_host.quant.inttrain import quantize_input
    files = {os.path.basename(info[k]): _file_sha(info[k]) for k in ("blob", "checkpoint")}
    state = CheckpointState.load_checkpoint(info["checkpoint"])
    module = Module(info["blob"], state)
    optimizer = Optimizer(info["blob"], module)
    rng = np.random.default_rng(2)
    labels = module.blob.sizes[module._train.inputs[1]]
    losses = []
    for step in range(STEPS):
        x = quantize_input(rng.standard_normal(shape).astype(np.float32), info)
        y = [int(v) for v in rng.integers(0, info["classes"], labels)]
        losses.append(float(module(x.reshape(-1).tolist(), y)).hex())
        optimizer.step()
    saved = info["checkpoint"] + ".trained"
    CheckpointState.save_checkpoint(state, saved, include_optimizer_state=True)
    module.eval()
    outputs = module(x.reshape(-1).tolist(), y)
    return {"files": files, "losses": losses, "trained": _file_sha(saved),
            "eval": [float(outputs[0]).hex(), _sha(outputs[1])]}


def main():
    report = {}
    for name, model, kwargs, vocabulary in cases():
        with tempfile.TemporaryDirectory() as directory:
            result = mh.generate_artifacts(model, artifact_directory=directory, **kwargs)
            files = _hashes(directory)
            losses, params, _ = train(directory, result.blob, vocabulary)
            report[name] = {"files": files, "losses": losses, "params": params}
        print(name, file=sys.stderr)
    quantized_cases(report)
    json.dump(report, sys.stdout, indent=1, sort_keys=True)
    print()


if __name__ == "__main__":
    main()
