"""Issue 22's acceptance models for integer training, and synthetic data to train them on.

The four MLPerf Tiny architectures (tests/mlperf_tiny.py; keyword spotting's DS-CNN is the
pretrained examples/kws/ds_cnn_kws.onnx), an MLP, a 1-D convolution IMU classifier with a
Flatten head and a convolution -> Flatten -> Gemm net. Each entry says how the model is
built, its loss and `sparse_last`: the --train-last N of its "sparse update" configuration
(with --train-biases): the classifier and the layers of its last block.

`synthetic(model, count, seed)` draws learnable data of the model's input shape: for a
classifier, one smooth random template per class, scaled and shifted per sample, plus
noise (the classes overlap, so accuracy is neither trivial nor chance); for the
autoencoder, "normal" samples from a low-rank pattern plus noise and, with
`anomalies=True`, anomalous ones from another pattern (label 1)."""
import dataclasses

import numpy as np
import torch
from torch import nn

from mlperf_tiny import _settle, ad_autoencoder, mobilenet_v1_025, resnet8
from reference_models import ReferenceModel
from conftest import ROOT

KWS_ONNX = ROOT / "examples" / "kws" / "ds_cnn_kws.onnx"


class MLP(nn.Module):
    def __init__(self, inputs=64, classes=10):
        super().__init__()
        self.layers = nn.Sequential(nn.Linear(inputs, 32), nn.ReLU(), nn.Linear(32, 16),
                                    nn.ReLU(), nn.Linear(16, classes))

    def forward(self, x):
        return self.layers(x)


class IMUNet(nn.Module):
    """Accelerometer + gyroscope windows (6 x 64): two 1-D convolutions, a max pool and a
    Flatten head of 16 x 30 = 480 inputs."""

    def __init__(self, classes=6):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv1d(6, 16, 5), nn.BatchNorm1d(16), nn.ReLU(), nn.MaxPool1d(2),
            nn.Conv1d(16, 16, 3, padding=1), nn.ReLU())
        self.classifier = nn.Linear(16 * 30, classes)

    def forward(self, x):
        return self.classifier(torch.flatten(self.features(x), 1))


class ConvFlattenGemm(nn.Module):
    """A 1 x 16 x 16 image: two 3x3 convolutions (the second strided), Flatten (8 x 6 x 6 =
    288), a hidden Gemm and the classifier."""

    def __init__(self, classes=4):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 8, 3), nn.BatchNorm2d(8), nn.ReLU(),
            nn.Conv2d(8, 8, 3, stride=2), nn.ReLU())
        self.head = nn.Sequential(nn.Linear(8 * 6 * 6, 32), nn.ReLU(), nn.Linear(32, classes))

    def forward(self, x):
        return self.head(torch.flatten(self.features(x), 1))


def _normalised(ref, seed):
    """The reference model with every BatchNorm's running statistics those of a few batches
    of N(0, 1) inputs (cumulative averages, not mlperf_tiny's three momentum-0.1 passes,
    which leave a deep net's statistics near their defaults: MobileNetV1's 13 blocks then
    give the same features for every input, and nothing is learnable)."""
    norms = [m for m in ref.module.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    for norm in norms:
        norm.reset_running_stats()
        norm.momentum = None
    torch.manual_seed(seed)
    ref.module.train()
    with torch.no_grad():
        for _ in range(4):
            ref.module(torch.randn((16,) + ref.inputs))
    for norm in norms:
        norm.momentum = 0.1
    ref.module.eval()
    return ref


def mlp(batch=1):
    torch.manual_seed(31)
    return ReferenceModel("mlp", MLP(), (64,), "CrossEntropyLoss", batch, {"SGD": 0.05})


def imu_1d(batch=1):
    torch.manual_seed(32)
    return ReferenceModel("imu_1d", _settle(IMUNet(), (6, 64)), (6, 64), "CrossEntropyLoss",
                          batch, {"SGD": 0.05})


def conv_flatten_gemm(batch=1):
    torch.manual_seed(33)
    return ReferenceModel("conv_flatten_gemm", _settle(ConvFlattenGemm(), (1, 16, 16)),
                          (1, 16, 16), "CrossEntropyLoss", batch, {"SGD": 0.05})


@dataclasses.dataclass
class AcceptanceModel:
    name: str
    build: object        # batch -> ReferenceModel (None: the ONNX file `onnx`)
    inputs: tuple        # one sample's shape
    loss: str            # "CrossEntropyLoss" or "MSELoss"
    classes: int         # output width
    sparse_last: int     # --train-last of the sparse configuration (with --train-biases)
    onnx: object = None  # a pretrained ONNX file instead of a torch builder


ACCEPTANCE_MODELS = {
    "ds_cnn_kws": AcceptanceModel("ds_cnn_kws", None, (1, 49, 10), "CrossEntropyLoss", 12, 3,
                                  onnx=KWS_ONNX),
    "mobilenet_v1_025": AcceptanceModel(
        "mobilenet_v1_025",
        lambda batch=1: _normalised(mobilenet_v1_025(size=48, batch=batch), 34),
        (3, 48, 48), "CrossEntropyLoss", 2, 3),
    "resnet8": AcceptanceModel("resnet8", lambda batch=1: _normalised(resnet8(batch), 35),
                                 (3, 32, 32), "CrossEntropyLoss", 10, 4),
    "ad_autoencoder": AcceptanceModel("ad_autoencoder", ad_autoencoder, (640,), "MSELoss",
                                      640, 2),
    "mlp": AcceptanceModel("mlp", mlp, (64,), "CrossEntropyLoss", 10, 2),
    "imu_1d": AcceptanceModel("imu_1d", imu_1d, (6, 64), "CrossEntropyLoss", 6, 2),
    "conv_flatten_gemm": AcceptanceModel("conv_flatten_gemm", conv_flatten_gemm, (1, 16, 16),
                                         "CrossEntropyLoss", 4, 2),
}


def _smooth(rng, shape):
    """A random pattern of the given shape, smoothed along its last axis (and the one before
    it for images), unit standard deviation."""
    x = rng.standard_normal(shape)
    for axis in range(max(len(shape) - 2, 0), len(shape)):
        x = (x + np.roll(x, 1, axis) + np.roll(x, -1, axis)) / 3
    return x / x.std()


def synthetic(model, count, seed, noise=1.0, anomalies=False):
    """(x float32 [count, *inputs], y): y the class (int64) for a classifier; for the
    autoencoder, y is 0 for normal samples and 1 for anomalous ones (only with
    anomalies=True, half the samples)."""
    m = ACCEPTANCE_MODELS[model] if isinstance(model, str) else model
    templates_rng = np.random.default_rng(1000 + sum(map(ord, m.name)))
    rng = np.random.default_rng(seed)
    if m.loss == "MSELoss":
        basis = _smooth(templates_rng, (4,) + m.inputs)
        odd = _smooth(templates_rng, (4,) + m.inputs)
        y = (np.arange(count) % 2).astype(np.int64) if anomalies else \
            np.zeros(count, np.int64)
        codes = rng.standard_normal((count, 4))
        x = np.einsum("nk,k...->n...", codes, basis)
        x[y == 1] = np.einsum("nk,k...->n...", codes[y == 1], odd)
        x += 0.3 * rng.standard_normal(x.shape)
        return x.astype(np.float32), y
    templates = np.stack([_smooth(templates_rng, m.inputs) for _ in range(m.classes)])
    y = rng.integers(0, m.classes, count).astype(np.int64)
    scale = rng.uniform(0.7, 1.3, count).reshape((count,) + (1,) * len(m.inputs))
    x = templates[y] * scale + noise * rng.standard_normal((count,) + m.inputs)
    return x.astype(np.float32), y
