"""Fingerprint what the packager writes, to prove a refactoring changed no behaviour.

    python scripts/fingerprint_artifacts.py > before.json   # on the old code
    python scripts/fingerprint_artifacts.py > after.json    # on the new code
    cmp before.json after.json

For the digits MLP under several optimizer settings, a partial update, a Dropout model with
the loss outside the graph, a layout-op model and every reference model of the suite (SGD
and AdamW), it packs the artifacts and records the SHA-256 of every file written (ONNX
graphs, checkpoints, blob), then trains 10 steps with the device runtime under CPython and
records each loss and the final parameters bit for bit (float.hex). Equal output means equal
blobs, checkpoints and trajectories. Needs the test extra (torch builds the models)."""
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
from reference_models import REFERENCE_MODELS  # noqa: E402

# The reference models the issue-8 baseline fingerprinted (/work/fingerprint_before.json).
BASELINE_MODELS = ("lenet", "ds_cnn", "gesture_1d", "mobilenet_v2_block", "conv_autoencoder")
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
    digits = str(ROOT / "examples" / "digits" / "mlp.onnx")
    yield "digits-adamw", digits, dict(batch_size=8)
    yield "digits-sgd-extras", digits, dict(batch_size=8, optimizer="SGD", optimizer_options={
        "momentum": 0.9, "nesterov": True, "l1_penalty": 1e-4, "l2_penalty": 1e-3,
        "clip_grad_norm": 1.0, "weight_decay": 0.01})
    yield "digits-frozen", digits, dict(batch_size=8, frozen_params=["1.weight"],
                                        nominal_checkpoint=True)
    layout = LayoutNet()
    yield "layout-forward-backward", export(layout, torch.zeros(2, 4, 6)), dict(
        batch_size=2, loss=None, optimizer="SGD")
    yield "layout-mse", export(layout, torch.zeros(2, 4, 6)), dict(batch_size=2, loss="MSELoss")
    for build in REFERENCE_MODELS:
        if build.__name__ not in BASELINE_MODELS:
            continue  # added later: compare against a baseline made after them
        ref = build()
        model = export(ref.module, torch.zeros((ref.batch,) + ref.inputs))
        for optimizer in ("SGD", "AdamW"):
            yield f"{ref.name}-{optimizer}", model, dict(batch_size=ref.batch, loss=ref.loss,
                                                         optimizer=optimizer)
        if ref.name == "ds_cnn":
            biases = [i.name for i in model.graph.initializer if i.name.endswith("bias")]
            yield "ds_cnn-bias-only", model, dict(batch_size=ref.batch, loss=ref.loss,
                                                  requires_grad=biases)


def train(directory, blob):
    state = CheckpointState.load_checkpoint(os.path.join(directory, "checkpoint"))
    module = Module(blob, state)
    optimizer = Optimizer(blob, module)
    module.set_seed(5)
    rng = np.random.default_rng(0)
    results = []
    for step in range(STEPS):
        inputs = []
        for tid in (module._train or module._forward).inputs:
            n = module.blob.sizes[tid]
            if module.blob.dtypes[tid] == 1:
                inputs.append([int(v) for v in rng.integers(0, max(module.blob.num_classes, 1), n)])
            else:
                inputs.append([float(v) for v in rng.standard_normal(n).astype(np.float32)])
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
    return results, hashlib.sha256(bytes(memoryview(params).cast("B"))).hexdigest()


def main():
    report = {}
    for name, model, kwargs in cases():
        with tempfile.TemporaryDirectory() as directory:
            result = mh.generate_artifacts(model, artifact_directory=directory, **kwargs)
            files = {f: hashlib.sha256(open(os.path.join(directory, f), "rb").read()).hexdigest()
                     for f in sorted(os.listdir(directory))}
            losses, params = train(directory, result.blob)
            report[name] = {"files": files, "losses": losses, "params": params}
        print(name, file=sys.stderr)
    json.dump(report, sys.stdout, indent=1, sort_keys=True)
    print()


if __name__ == "__main__":
    main()
