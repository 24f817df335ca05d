"""The MLPerf Tiny models at their published sizes, built in PyTorch from their layer lists
(random weights; BatchNorm statistics moved off their defaults by a few forward passes, so
folding them is not the identity): keyword spotting's DS-CNN is examples/kws/ds_cnn_kws.onnx
(pretrained), the other three are here.

  resnet8()            image classification, CIFAR-10 32x32x3: a 16-channel stem, three
                       residual stacks (16, 32, 64 channels; the last two strided with a 1x1
                       shortcut convolution), an 8x8 average pool, a 10-class classifier
  mobilenet_v1_025()   visual wake words: MobileNetV1 at width 0.25 (13 depthwise-separable
                       blocks, 8..256 channels), 2 classes; 96x96 in the benchmark, `size`
                       smaller for tests
  ad_autoencoder()     anomaly detection: 640 -> 128 x4 -> 8 -> 128 x4 -> 640 Gemms with
                       BatchNorm and ReLU, MSE loss on its own input"""
import torch
from torch import nn

from reference_models import ReferenceModel


def _settle(module, shape):
    # a few train-mode passes so the running statistics are not the identity
    module.train()
    with torch.no_grad():
        for _ in range(3):
            module(torch.randn((8,) + shape))
    return module.eval()


class _Stack(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(cin, cout, 3, stride, 1), nn.BatchNorm2d(cout), nn.ReLU(),
            nn.Conv2d(cout, cout, 3, 1, 1), nn.BatchNorm2d(cout))
        self.shortcut = (nn.Sequential(nn.Conv2d(cin, cout, 1, stride), nn.BatchNorm2d(cout))
                         if stride != 1 or cin != cout else nn.Identity())
        self.relu = nn.ReLU()

    def forward(self, x):
        return self.relu(self.body(x) + self.shortcut(x))


class ResNet8(nn.Module):
    def __init__(self, classes=10):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, 1, 1), nn.BatchNorm2d(16), nn.ReLU())
        self.stacks = nn.Sequential(_Stack(16, 16, 1), _Stack(16, 32, 2), _Stack(32, 64, 2))
        self.pool = nn.AvgPool2d(8)
        self.classifier = nn.Linear(64, classes)

    def forward(self, x):
        return self.classifier(torch.flatten(self.pool(self.stacks(self.stem(x))), 1))


def resnet8(batch=1):
    torch.manual_seed(21)
    return ReferenceModel("resnet8", _settle(ResNet8(), (3, 32, 32)), (3, 32, 32),
                          "CrossEntropyLoss", batch, {"SGD": 0.05})


def _separable(cin, cout, stride):
    return [nn.Conv2d(cin, cin, 3, stride, 1, groups=cin), nn.BatchNorm2d(cin), nn.ReLU(),
            nn.Conv2d(cin, cout, 1), nn.BatchNorm2d(cout), nn.ReLU()]


class MobileNetV1(nn.Module):
    # (output channels, stride) of the 13 blocks at width 1, scaled by alpha
    BLOCKS = ((64, 1), (128, 2), (128, 1), (256, 2), (256, 1), (512, 2), (512, 1), (512, 1),
              (512, 1), (512, 1), (512, 1), (1024, 2), (1024, 1))

    def __init__(self, alpha=0.25, classes=2):
        super().__init__()
        width = int(32 * alpha)
        layers = [nn.Conv2d(3, width, 3, 2, 1), nn.BatchNorm2d(width), nn.ReLU()]
        for channels, stride in self.BLOCKS:
            layers += _separable(width, int(channels * alpha), stride)
            width = int(channels * alpha)
        self.features = nn.Sequential(*layers)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.classifier = nn.Linear(width, classes)

    def forward(self, x):
        return self.classifier(torch.flatten(self.pool(self.features(x)), 1))


def mobilenet_v1_025(size=96, batch=1):
    torch.manual_seed(22)
    shape = (3, size, size)
    return ReferenceModel("mobilenet_v1_025", _settle(MobileNetV1(), shape), shape,
                          "CrossEntropyLoss", batch, {"SGD": 0.05})


class ADAutoencoder(nn.Module):
    def __init__(self, inputs=640, hidden=128, code=8):
        super().__init__()

        def block(a, b):
            return [nn.Linear(a, b), nn.BatchNorm1d(b), nn.ReLU()]
        sizes = [inputs] + [hidden] * 4 + [code] + [hidden] * 4
        layers = []
        for a, b in zip(sizes, sizes[1:]):
            layers += block(a, b)
        self.layers = nn.Sequential(*layers, nn.Linear(hidden, inputs))

    def forward(self, x):
        return self.layers(x)


def ad_autoencoder(batch=2):
    torch.manual_seed(23)
    return ReferenceModel("ad_autoencoder", _settle(ADAutoencoder(), (640,)), (640,),
                          "MSELoss", batch, {"SGD": 0.05})
