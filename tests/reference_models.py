"""The reference models of issues 3 and 9, built in PyTorch: the small networks people train on
microcontrollers. Sizes are cut down so that 50 pure-Python train steps stay in seconds,
but every layer type and attribute of the full-size model is kept.

Each builder returns a ReferenceModel; `inputs` is the per-sample input shape.

AdamW runs at lr 0.001 (ORT's default). In the DS-CNN, a BatchNorm scale that feeds a ReLU
and then another BatchNorm starts with a gradient that is only rounding noise (about 1e-7:
the next normalisation cancels its scale), and AdamW divides such gradients by their own
size. Any two float32 implementations round that noise differently, and the difference is
amplified in proportion to the learning rate: at 0.002 the device's losses part from torch's
by 5e-4 after 50 steps although single-step gradients agree to 3e-7 relative to their
largest element; at 0.001 they stay within 5e-7.
"""
import dataclasses
import math

import torch
from torch import nn


@dataclasses.dataclass
class ReferenceModel:
    name: str
    module: nn.Module
    inputs: tuple          # one sample's shape (no batch dimension)
    loss: str              # "CrossEntropyLoss" (classes = output width) or "MSELoss"
    batch: int
    lr: dict               # optimizer name -> learning rate
    vocabulary: int = 0    # > 0: the input is int64 token ids in [0, vocabulary)


def lenet():
    """LeNet-style: two conv + max-pool stages, then two dense layers (tiny vision)."""
    torch.manual_seed(10)
    module = nn.Sequential(
        nn.Conv2d(1, 4, 3), nn.ReLU(), nn.MaxPool2d(2),            # 14x14 -> 12x12 -> 6x6
        nn.Conv2d(4, 8, 3), nn.ReLU(), nn.MaxPool2d(2),            # -> 4x4 -> 2x2
        nn.Flatten(), nn.Linear(8 * 2 * 2, 16), nn.ReLU(), nn.Linear(16, 10))
    return ReferenceModel("lenet", module, (1, 14, 14), "CrossEntropyLoss", 4,
                          {"SGD": 0.05, "AdamW": 0.001})


class DSCNN(nn.Module):
    """Keyword spotting on 49x10 MFCC frames (Zhang et al., "Hello Edge"): a strided conv,
    then depthwise-separable blocks (depthwise 3x3 + pointwise 1x1, each with BatchNorm and
    ReLU), global average pooling and a classifier."""

    def __init__(self, channels=8, blocks=2, classes=12):
        super().__init__()
        # No conv bias before a BatchNorm: the normalisation cancels it, so its gradient is
        # only rounding noise (which AdamW would blow up into full-size steps).
        self.stem = nn.Sequential(nn.Conv2d(1, channels, (10, 4), stride=(2, 2), padding=(5, 1),
                                            bias=False),
                                  nn.BatchNorm2d(channels), nn.ReLU())
        layers = []
        for _ in range(blocks):
            layers += [nn.Conv2d(channels, channels, 3, padding=1, groups=channels, bias=False),
                       nn.BatchNorm2d(channels), nn.ReLU(),
                       nn.Conv2d(channels, channels, 1, bias=False), nn.BatchNorm2d(channels),
                       nn.ReLU()]
        self.blocks = nn.Sequential(*layers)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.classifier = nn.Linear(channels, classes)

    def forward(self, x):
        x = self.pool(self.blocks(self.stem(x)))
        return self.classifier(torch.flatten(x, 1))


def ds_cnn():
    torch.manual_seed(11)
    return ReferenceModel("ds_cnn", DSCNN(), (1, 49, 10), "CrossEntropyLoss", 4,
                          {"SGD": 0.05, "AdamW": 0.001})


class GestureNet(nn.Module):
    """Gestures from a 3-axis IMU, 128 samples: 1-D convs with stride and max-pooling, a
    mean over time, a classifier."""

    def __init__(self, classes=6):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv1d(3, 8, 5, stride=2, padding=2), nn.ReLU(), nn.MaxPool1d(2),   # 128->64->32
            nn.Conv1d(8, 16, 3, padding=1), nn.ReLU(), nn.MaxPool1d(2, stride=2),  # 32->16
            nn.Conv1d(16, 16, 3, dilation=2, padding=2), nn.LeakyReLU(0.1))
        self.classifier = nn.Linear(16, classes)

    def forward(self, x):
        return self.classifier(self.features(x).mean(dim=2))


def gesture_1d():
    torch.manual_seed(12)
    return ReferenceModel("gesture_1d", GestureNet(), (3, 128), "CrossEntropyLoss", 4,
                          {"SGD": 0.05, "AdamW": 0.001})


class InvertedResidual(nn.Module):
    """MobileNetV2's block: 1x1 expand (ReLU6), 3x3 depthwise (ReLU6), 1x1 linear project,
    each with BatchNorm, and the skip connection; then a small classifier head."""

    def __init__(self, channels=8, expand=3, classes=5):
        super().__init__()
        hidden = channels * expand
        self.block = nn.Sequential(
            nn.Conv2d(channels, hidden, 1, bias=False), nn.BatchNorm2d(hidden), nn.ReLU6(),
            nn.Conv2d(hidden, hidden, 3, padding=1, groups=hidden, bias=False),
            nn.BatchNorm2d(hidden), nn.ReLU6(),
            nn.Conv2d(hidden, channels, 1, bias=False), nn.BatchNorm2d(channels))
        self.head = nn.Linear(channels, classes)

    def forward(self, x):
        y = x + self.block(x)
        return self.head(y.mean((2, 3)))


def mobilenet_v2_block():
    torch.manual_seed(13)
    return ReferenceModel("mobilenet_v2_block", InvertedResidual(), (8, 6, 6),
                          "CrossEntropyLoss", 4, {"SGD": 0.05, "AdamW": 0.001})


class ConvAutoencoder(nn.Module):
    """Anomaly detection by reconstruction: strided conv encoder to a small code, a dense
    decoder back to feature maps, a conv to the image; trained with MSE against its input."""

    def __init__(self):
        super().__init__()
        self.encoder = nn.Sequential(
            nn.Conv2d(1, 4, 3, stride=2, padding=1), nn.ReLU(),     # 12x12 -> 6x6
            nn.Conv2d(4, 8, 3, stride=2, padding=1), nn.ReLU(),     # -> 3x3
            nn.Flatten(), nn.Linear(8 * 3 * 3, 8), nn.Tanh())
        self.decoder = nn.Sequential(nn.Linear(8, 2 * 12 * 12), nn.ReLU())
        self.out = nn.Conv2d(2, 1, 3, padding=1)

    def forward(self, x):
        code = self.encoder(x)
        maps = self.decoder(code).view(x.shape[0], 2, 12, 12)
        return self.out(maps)


def conv_autoencoder():
    torch.manual_seed(14)
    return ReferenceModel("conv_autoencoder", ConvAutoencoder(), (1, 12, 12), "MSELoss", 4,
                          {"SGD": 0.05, "AdamW": 0.001})


class TinyTransformer(nn.Module):
    """One pre-norm transformer encoder block (issue 9): LayerNorm, two-head self-attention
    (MatMul, scaled, Softmax, MatMul), a GELU MLP (exact GELU: Erf in the export), residual
    connections, mean over tokens, a classifier. Sensor or audio frames as tokens."""

    def __init__(self, dim=8, heads=2, classes=4):
        super().__init__()
        self.heads = heads
        self.norm1 = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 2 * dim), nn.GELU(), nn.Linear(2 * dim, dim))
        self.head = nn.Linear(dim, classes)

    def forward(self, x):
        b, t, d = x.shape
        size = d // self.heads
        q, k, v = self.qkv(self.norm1(x)).split(d, dim=-1)
        q, k, v = (z.reshape(b, t, self.heads, size).transpose(1, 2) for z in (q, k, v))
        attention = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(size), dim=-1)
        mixed = (attention @ v).transpose(1, 2).reshape(b, t, d)
        x = x + self.proj(mixed)
        x = x + self.mlp(self.norm2(x))
        return self.head(x.mean(dim=1))


def tiny_transformer():
    torch.manual_seed(15)
    return ReferenceModel("tiny_transformer", TinyTransformer(), (6, 8), "CrossEntropyLoss", 4,
                          {"SGD": 0.05, "AdamW": 0.001})


class KeywordClassifier(nn.Module):
    """Embedding lookup of token ids (Gather with indices from the int input), mean over the
    sequence, a small MLP: keyword / text classification on device (issue 9)."""

    def __init__(self, vocabulary=20, dim=8, classes=3):
        super().__init__()
        self.embed = nn.Embedding(vocabulary, dim)
        self.fc = nn.Linear(dim, 16)
        self.out = nn.Linear(16, classes)

    def forward(self, tokens):
        return self.out(torch.relu(self.fc(self.embed(tokens).mean(dim=1))))


def keyword_classifier():
    torch.manual_seed(16)
    return ReferenceModel("keyword_classifier", KeywordClassifier(), (10,), "CrossEntropyLoss",
                          4, {"SGD": 0.5, "AdamW": 0.01}, vocabulary=20)


class IMUGRUClassifier(nn.Module):
    """Activities from a 6-axis IMU (accelerometer and gyroscope), 24 samples per window
    (issue 9): one GRU layer over the window, its last hidden state, a classifier."""

    def __init__(self, channels=6, hidden=16, classes=5):
        super().__init__()
        self.gru = nn.GRU(channels, hidden, batch_first=True)
        self.head = nn.Linear(hidden, classes)

    def forward(self, x):
        _, h = self.gru(x)
        return self.head(h[-1])


def imu_gru_classifier():
    torch.manual_seed(17)
    return ReferenceModel("imu_gru_classifier", IMUGRUClassifier(), (24, 6), "CrossEntropyLoss",
                          4, {"SGD": 0.05, "AdamW": 0.001})


class LSTMAutoencoder(nn.Module):
    """Anomaly detection on windows of 4 sensor channels, 16 steps (predictive maintenance,
    issue 9): an LSTM encoder's final hidden state, repeated over the window, drives an LSTM
    decoder whose outputs a Linear maps back to the channels; trained with MSE to reconstruct
    the input, so a high reconstruction error flags an anomaly."""

    def __init__(self, channels=4, code=8):
        super().__init__()
        self.encoder = nn.LSTM(channels, code, batch_first=True)
        self.decoder = nn.LSTM(code, code, batch_first=True)
        self.out = nn.Linear(code, channels)

    def forward(self, x):
        _, (h, _) = self.encoder(x)
        y, _ = self.decoder(h[-1].unsqueeze(1).expand(-1, x.shape[1], -1))
        return self.out(y)


def lstm_autoencoder():
    torch.manual_seed(18)
    return ReferenceModel("lstm_autoencoder", LSTMAutoencoder(), (16, 4), "MSELoss", 4,
                          {"SGD": 0.05, "AdamW": 0.001})


class DeconvAutoencoder(nn.Module):
    """Anomaly detection by reconstruction with a decoder of transposed convolutions (issue
    9): a strided conv encoder 12x12 -> 6x6 -> 3x3, then ConvTranspose back up (stride 2,
    padding with output_padding, a grouped one, the kernel-4 form), MSE against its input."""

    def __init__(self):
        super().__init__()
        self.encoder = nn.Sequential(
            nn.Conv2d(1, 4, 3, stride=2, padding=1), nn.ReLU(),      # 12x12 -> 6x6
            nn.Conv2d(4, 8, 3, stride=2, padding=1), nn.ReLU())      # -> 3x3
        self.decoder = nn.Sequential(
            nn.ConvTranspose2d(8, 4, 3, stride=2, padding=1, output_padding=1), nn.ReLU(),  # 6x6
            nn.ConvTranspose2d(4, 4, 3, padding=1, groups=2), nn.Tanh(),
            nn.ConvTranspose2d(4, 1, 4, stride=2, padding=1))        # -> 12x12

    def forward(self, x):
        return self.decoder(self.encoder(x))


def deconv_autoencoder():
    torch.manual_seed(17)
    return ReferenceModel("deconv_autoencoder", DeconvAutoencoder(), (1, 12, 12), "MSELoss", 4,
                          {"SGD": 0.05, "AdamW": 0.001})


class UpsampleNet(nn.Module):
    """A dense-prediction head (segmentation, heat maps; issue 9): conv and max-pool encoder
    16x16 -> 8x8 -> 4x4, back up by nn.Upsample (nearest) with a skip connection and by
    bilinear F.interpolate, a per-pixel output; MSE."""

    def __init__(self):
        super().__init__()
        self.enc1 = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2))
        self.enc2 = nn.Sequential(nn.Conv2d(4, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2))
        self.up = nn.Upsample(scale_factor=2)
        self.merge = nn.Conv2d(8, 4, 3, padding=1)
        self.out = nn.Conv2d(4, 1, 3, padding=1)

    def forward(self, x):
        skip = self.enc1(x)                                           # 4 x 8x8
        h = torch.relu(self.merge(self.up(self.enc2(skip)))) + skip   # 4 x 8x8
        h = nn.functional.interpolate(h, scale_factor=2, mode="bilinear")   # 16x16
        return self.out(h)


def upsample_net():
    torch.manual_seed(18)
    return ReferenceModel("upsample_net", UpsampleNet(), (1, 16, 16), "MSELoss", 4,
                          {"SGD": 0.05, "AdamW": 0.001})


REFERENCE_MODELS = (lenet, ds_cnn, gesture_1d, mobilenet_v2_block, conv_autoencoder,
                    tiny_transformer, keyword_classifier, imu_gru_classifier, lstm_autoencoder,
                    deconv_autoencoder, upsample_net)
