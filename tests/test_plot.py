"""`microtrain train --plot`: a PNG with the loss and accuracy curves (matplotlib, the
optional extra `plot`), and a clear error before training when matplotlib is missing."""
import sys

import pytest

from conftest import ROOT
from microtrain_host.cli import main

EXAMPLE = ROOT / "examples" / "digits"
BLUE = (0x1f, 0x77, 0xb4)      # matplotlib's tab:blue, the train loss
ORANGE = (0xff, 0x7f, 0x0e)    # tab:orange, the validation accuracy


@pytest.fixture(scope="module")
def build(tmp_path_factory):
    out = tmp_path_factory.mktemp("digits_plot")
    assert main(["pack", str(EXAMPLE / "mlp.onnx"), "-o", str(out), "--batch-size", "8"]) == 0
    return out


def _pixels_of(image, rgb):
    return int(((abs(image[:, :, :3] * 255 - rgb) < 8).all(axis=2)).sum())


def test_plot_draws_loss_and_accuracy(build, tmp_path, capsys):
    image_module = pytest.importorskip("matplotlib.image")
    png = tmp_path / "curves.png"
    assert main(["train", str(build), "--data", str(EXAMPLE / "digits.npz"), "--epochs", "2",
                 "--output", str(tmp_path / "ckpt"), "--plot", str(png)]) == 0
    assert f"curves written to {png}" in capsys.readouterr().out
    image = image_module.imread(str(png))
    assert image.shape[:2] == (400, 700)
    assert _pixels_of(image, BLUE) > 200 and _pixels_of(image, ORANGE) > 200


def test_plot_without_matplotlib_fails_before_training(build, tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)    # import matplotlib -> ImportError
    out = tmp_path / "ckpt"
    assert main(["train", str(build), "--data", str(EXAMPLE / "digits.npz"), "--epochs", "1",
                 "--output", str(out), "--plot", str(tmp_path / "c.png")]) == 2
    assert "pip install 'microtrain[plot]'" in capsys.readouterr().err
    assert not out.exists()
