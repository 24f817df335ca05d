"""Whole integer training runs with the native int8 module on more models than the KWS
DS-CNN (tests/test_board_kws_native.py): issue 22's acceptance models
(tests/int8_acceptance_models.py: ResNet-8's residual blocks and strided 3x3 convolutions,
1-D convolutions, a Flatten head) and two of ours (a strided 5x5, a grouped dilated
convolution inside a residual add, a max pool; an autoencoder's Gemm chain trained on its
own input; MobileNetV1 and the AD autoencoder do not fit the 256 KiB ROM) packed by the one
command (tests/int8_acceptance_run.py), STEPS steps at batch 1 on an emulated
board with the module deploy ships for its architecture beside the kernels, against
CPython's pure-Python kernels on the same blob, checkpoint and sample: the same int and
byte arenas (CRC-32 of parameters, gradients, momenta) and losses. The models whose arenas
fit the Cortex-M3's 140 KiB run there (armv6m build, every ARM core's), the larger ones on
the Cortex-M4F's 256 KiB (armv7m build, which deploy ships for armv7emsp). Needs both ARM
firmwares (skipped without them, failed when MICROTRAIN_REQUIRE_QEMU /
MICROTRAIN_REQUIRE_QEMU_M4=1)."""
import numpy as np
import pytest
import torch
from torch import nn

import int8_acceptance_models
import int8_acceptance_run
from int8_acceptance_run import pack, prepare
from mlperf_tiny import _settle
from reference_models import ReferenceModel
from test_board_kws_native import board_run, cpython_run, load_board_cost
from test_board_natmod import build_module

M3, M4 = "qemu-mps2-an385", "qemu-mps2-an386"


def board_case(board_cost, name, config, tmp):
    """bench/board_cost.py's Case of one training step of the model's integer blob (the
    one command's pack, calibrated on synthetic samples) on its first training sample."""
    from microtrain_host.quant.inttrain import quantize_input
    model, calibration, x, y = prepare(name, tmp, 1)
    info = pack(name, config, model, calibration, tmp / "int8")
    assert isinstance(info, dict), info
    q = np.asarray(quantize_input(x[:1], info))
    (tmp / "x.q8").write_bytes(q.tobytes())
    files = {"checkpoint": info["checkpoint"], "x.q8": tmp / "x.q8"}
    labels = None
    if info.get("loss", "cross_entropy") == "cross_entropy":   # an autoencoder has none
        (tmp / "y.i32").write_bytes(np.asarray(y[:1], "<i4").tobytes())
        files["y.i32"] = labels = tmp / "y.i32"
    return board_cost.Case(f"{name} {config}", "train", info["blob"], files, "x.q8",
                           "b" if q.dtype == np.int8 else "B",
                           None if labels is None else "y.i32")


class OddNet(nn.Module):
    """Ours, for shapes the acceptance models lack: a 5x5 convolution with stride 2 on a
    non-square 2-channel image, a grouped (not depthwise) 3x3 convolution with dilation 2
    and a residual add around it, a 2x2 max pool and a Flatten head (8 x 3 x 4 = 96)."""

    def __init__(self, classes=5):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(2, 8, 5, stride=2, padding=2), nn.ReLU())
        self.grouped = nn.Sequential(nn.Conv2d(8, 8, 3, padding=2, dilation=2, groups=2),
                                     nn.BatchNorm2d(8))
        self.pool = nn.MaxPool2d(2)
        self.classifier = nn.Linear(8 * 3 * 4, classes)

    def forward(self, x):
        x = self.stem(x)
        x = torch.relu(x + self.grouped(x))
        return self.classifier(torch.flatten(self.pool(x), 1))


class SmallAutoencoder(nn.Module):
    """A 48 -> 24 -> 12 -> 24 -> 48 autoencoder (the AD autoencoder's 640-wide one does not
    fit the emulated boards' 256 KiB ROM beside the runtime), trained on its own input."""

    def __init__(self):
        super().__init__()
        self.layers = nn.Sequential(nn.Linear(48, 24), nn.ReLU(), nn.Linear(24, 12), nn.ReLU(),
                                    nn.Linear(12, 24), nn.ReLU(), nn.Linear(24, 48))

    def forward(self, x):
        return self.layers(x)


def odd_net(batch=1):
    torch.manual_seed(41)
    return ReferenceModel("odd_net", _settle(OddNet(), (2, 12, 16)), (2, 12, 16),
                          "CrossEntropyLoss", batch, {"SGD": 0.05})


def small_autoencoder(batch=1):
    torch.manual_seed(42)
    return ReferenceModel("small_autoencoder", SmallAutoencoder(), (48,), "MSELoss", batch,
                          {"SGD": 0.1})


OURS = {"odd_net": int8_acceptance_models.AcceptanceModel(
            "odd_net", odd_net, (2, 12, 16), "CrossEntropyLoss", 5, 2),
        "small_autoencoder": int8_acceptance_models.AcceptanceModel(
            "small_autoencoder", small_autoencoder, (48,), "MSELoss", 48, 2)}


def state_spans(blob_path):
    """(offset, size) of each int32 tensor of the blob that outlives a step (all but the
    activations: the pure-Python Conv's accumulator plane, which the native and viper paths
    leave as it was, shares their scratch)."""
    from microtrain import parser
    from microtrain.blob import INT32, ROLE_ACTIVATION
    b = parser.load(str(blob_path))
    return sorted((b.offsets[t], b.sizes[t]) for t in range(len(b.names))
                  if b.dtypes[t] == INT32 and b.roles[t] != ROLE_ACTIVATION)


@pytest.mark.parametrize("name,config,board,arch", [
    ("resnet8", "classifier", M4, "armv7m"),            # residual adds, strided 3x3 convs
    ("imu_1d", "sparse", M3, "armv6m"),                 # 1-D convs, gradients through them
    ("conv_flatten_gemm", "sparse", M3, "armv6m"),      # conv -> Flatten -> Gemm
    ("odd_net", "sparse", M3, "armv6m"),                # ours: see OddNet
    ("small_autoencoder", "sparse", M4, "armv7m")])     # Gemms, MSE on the input itself
def test_int8_steps_with_the_native_module_equal_cpython(firmware, m4_firmware, tmp_path,
                                                         monkeypatch, name, config, board, arch):
    for key, model in OURS.items():
        monkeypatch.setitem(int8_acceptance_models.ACCEPTANCE_MODELS, key, model)
        monkeypatch.setitem(int8_acceptance_run.ACCEPTANCE_MODELS, key, model)
        monkeypatch.setitem(int8_acceptance_run.LEARNING_RATES, key, 0.05)
    board_cost = load_board_cost()
    case = board_case(board_cost, name, config, tmp_path)
    state = state_spans(case.blob)
    case.settings += f"STATE = {state!r}\n"
    expected = cpython_run(case, state)
    got = board_run(board_cost, m4_firmware if board == M4 else firmware, board,
                    build_module(arch), case)
    print(f"\n{name} {config} on {board} ({arch} build): losses {got[0]}, CRCs {got[1]}")
    assert got[1] == expected[1]
    assert [float(v) for v in got[0]] == pytest.approx([float(v) for v in expected[0]],
                                                       rel=1e-6)
