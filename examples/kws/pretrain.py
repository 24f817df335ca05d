"""Pretrain the keyword-spotting DS-CNN on the host and write ``ds_cnn_kws.onnx``, the model
the example personalises on the device. The file is committed, so running the example needs
neither torch nor this script; torch (the test extra) is needed only to regenerate it.

The network is MLPerf Tiny's keyword-spotting DS-CNN (Zhang et al., "Hello Edge"):
  input 1 x 49 x 10 (MFCC frames); Conv 64 x (10, 4), stride 2, BatchNorm, ReLU -> 64 x 25 x 5;
  4 depthwise-separable blocks (depthwise 3 x 3 + BatchNorm + ReLU, pointwise 1 x 1 + BatchNorm
  + ReLU), 64 channels; average pooling over 25 x 5; Dropout; Linear(64, 12). 23,180 trained
  parameters; 22,604 once BatchNorm is folded.
It is trained with Adam on the synthetic pretraining set of make_data.py, then each
BatchNorm is folded into the convolution before it (w * gamma / sqrt(var + eps), bias
beta - mean * gamma / sqrt(var + eps)), as inference engines and MIT's on-device training do:
the exported graph is Conv (with bias) -> Relu, nine times, GlobalAveragePool, Flatten, Gemm.
Exported with the TorchScript exporter, training mode, no constant folding, so parameters
stay initializers named after the modules (stem.weight, blocks.0.weight, ..., classifier.bias)
and the batch axis is dynamic.

Usage: python pretrain.py [--epochs 3] [output.onnx]"""
import argparse
import os

import numpy as np
import torch
from torch import nn

import make_data

HERE = os.path.dirname(os.path.abspath(__file__))


class DSCNN(nn.Module):
    def __init__(self, channels=64, blocks=4, classes=12):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(1, channels, (10, 4), stride=2, padding=(5, 1),
                                            bias=False), nn.BatchNorm2d(channels), nn.ReLU())
        layers = []
        for _ in range(blocks):
            layers += [nn.Conv2d(channels, channels, 3, padding=1, groups=channels, bias=False),
                       nn.BatchNorm2d(channels), nn.ReLU(),
                       nn.Conv2d(channels, channels, 1, bias=False), nn.BatchNorm2d(channels),
                       nn.ReLU()]
        self.blocks = nn.Sequential(*layers)
        self.dropout = nn.Dropout(0.2)
        self.classifier = nn.Linear(channels, classes)

    def forward(self, x):
        x = self.blocks(self.stem(x)).mean((2, 3))
        return self.classifier(self.dropout(x))


class FoldedDSCNN(nn.Module):
    """The trained network with every BatchNorm folded into its convolution."""

    def __init__(self, trained):
        super().__init__()
        convs = [m for m in trained.modules() if isinstance(m, nn.Conv2d)]
        norms = [m for m in trained.modules() if isinstance(m, nn.BatchNorm2d)]
        folded = []
        for conv, norm in zip(convs, norms):
            scale = norm.weight / torch.sqrt(norm.running_var + norm.eps)
            new = nn.Conv2d(conv.in_channels, conv.out_channels, conv.kernel_size, conv.stride,
                            conv.padding, groups=conv.groups, bias=True)
            with torch.no_grad():
                new.weight.copy_(conv.weight * scale.reshape(-1, 1, 1, 1))
                new.bias.copy_(norm.bias - norm.running_mean * scale)
            folded.append(new)
        self.stem = folded[0]
        self.blocks = nn.ModuleList(folded[1:])
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.classifier = trained.classifier

    def forward(self, x):
        x = torch.relu(self.stem(x))
        for conv in self.blocks:
            x = torch.relu(conv(x))
        return self.classifier(torch.flatten(self.pool(x), 1))


def accuracy(model, x, y):
    model.eval()
    with torch.no_grad():
        return float((model(torch.from_numpy(x)).argmax(1).numpy() == y).mean())


def train(data, epochs, seed=0):
    torch.manual_seed(seed)
    model = DSCNN()
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, epochs)
    x, y = torch.from_numpy(data["x_train"]), torch.from_numpy(data["y_train"])
    rng = np.random.default_rng(seed)
    for epoch in range(epochs):
        model.train()
        for batch in np.array_split(rng.permutation(len(x)), len(x) // 64):
            opt.zero_grad()
            nn.functional.cross_entropy(model(x[batch]), y[batch]).backward()
            opt.step()
        sched.step()
        print(f"epoch {epoch + 1}/{epochs}: validation accuracy "
              f"{100 * accuracy(model, data['x_val'], data['y_val']):.1f} %", flush=True)
    return model


def export(model, path):
    model.eval()
    torch.onnx.export(model, torch.zeros(1, 1, make_data.FRAMES, make_data.COEFFS), path,
                      input_names=["input"], output_names=["output"],
                      dynamic_axes={"input": {0: "batch"}, "output": {0: "batch"}},
                      dynamo=False, opset_version=17,
                      training=torch.onnx.TrainingMode.TRAINING, do_constant_folding=False)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("output", nargs="?", default=os.path.join(HERE, "ds_cnn_kws.onnx"))
    parser.add_argument("--epochs", type=int, default=3)
    args = parser.parse_args()
    data = make_data.pretraining_set()
    trained = train(data, args.epochs)
    folded = FoldedDSCNN(trained)
    before = accuracy(trained, data["x_val"], data["y_val"])
    after = accuracy(folded, data["x_val"], data["y_val"])
    print(f"validation accuracy {100 * before:.2f} % (BatchNorm), {100 * after:.2f} % folded")
    export(folded, args.output)
    print(f"wrote {args.output} ({os.path.getsize(args.output)} bytes)")


if __name__ == "__main__":
    main()
