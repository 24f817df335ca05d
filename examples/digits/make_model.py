"""Regenerate ``mlp.onnx``, the model of the README's first example.

A 64-32-10 multilayer perceptron for the 8x8 digits in ``digits.npz``:
Flatten -> Linear(64, 32) -> ReLU -> Linear(32, 10), weights from torch.manual_seed(0).
Exported with the TorchScript exporter in training mode and without constant folding,
so the parameters stay initializers with their torch names (1.weight, 1.bias, 3.weight, 3.bias) and
the batch axis stays dynamic ("batch"); the packager fixes it with --batch-size.

torch is needed only to regenerate the file.

Usage: python make_model.py [output.onnx]
"""
import os
import sys

import torch
from torch import nn

HERE = os.path.dirname(os.path.abspath(__file__))


def build():
    torch.manual_seed(0)
    return nn.Sequential(nn.Flatten(), nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))


def main(path=os.path.join(HERE, "mlp.onnx")):
    model = build()
    torch.onnx.export(
        model,
        torch.randn(1, 64),
        path,
        input_names=["input"],
        output_names=["output"],
        dynamic_axes={"input": {0: "batch"}, "output": {0: "batch"}},
        dynamo=False,
        opset_version=17,
        training=torch.onnx.TrainingMode.TRAINING,
        do_constant_folding=False,
    )
    print("wrote %s: %d bytes" % (path, os.path.getsize(path)))


if __name__ == "__main__":
    main(*sys.argv[1:2])
