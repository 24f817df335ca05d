"""The `microtrain` command on the bundled example: pack, inspect, train under both
interpreters (acceptance: >= 90 % validation accuracy), and the help texts."""
import re
import subprocess
import sys

import pytest

from conftest import ROOT
from microtrain_host.cli import main

EXAMPLE = ROOT / "examples" / "digits"


@pytest.fixture(scope="module")
def build(tmp_path_factory):
    out = tmp_path_factory.mktemp("digits")
    assert main(["pack", str(EXAMPLE / "mlp.onnx"), "-o", str(out), "--loss", "cross_entropy",
                 "--optimizer", "adamw", "--batch-size", "8"]) == 0
    return out


def _accuracies(text):
    return [float(a) for a in re.findall(r"val accuracy ([0-9.]+)%", text)]


@pytest.mark.parametrize("runtime", ["cpython", "micropython"])
def test_digits_example_learns(build, runtime, capsys, request):
    if runtime == "micropython":
        request.getfixturevalue("micropython")
    out = build / f"trained_{runtime}"
    assert main(["train", str(build), "--data", str(EXAMPLE / "digits.npz"), "--epochs", "5",
                 "--lr", "0.01", "--runtime", runtime, "--output", str(out)]) == 0
    text = capsys.readouterr().out
    accuracies = _accuracies(text)
    assert len(accuracies) == 5, text
    assert accuracies[-1] >= 90.0, text
    assert out.exists()
    # The trained checkpoint loads and differs from the initial one.
    from microtrain import CheckpointState
    trained = CheckpointState.load_checkpoint(str(out))
    initial = CheckpointState.load_checkpoint(str(build / "checkpoint"))
    assert list(trained.parameters["1.weight"].data) != list(initial.parameters["1.weight"].data)


def test_both_runtimes_give_the_same_epochs(build, micropython):
    from microtrain_host.tools.train import train
    kwargs = dict(epochs=1, learning_rate=0.01, seed=3)
    a = train(build, EXAMPLE / "digits.npz", output=build / "a", runtime="cpython", **kwargs)
    b = train(build, EXAMPLE / "digits.npz", output=build / "b", runtime="micropython",
              micropython=micropython, **kwargs)
    for ra, rb in zip(a, b):
        for va, vb in zip(ra, rb):
            assert va == pytest.approx(vb, rel=1e-5)


def test_inspect_shows_the_memory_plan(build, capsys):
    assert main(["inspect", str(build / "model.mtb")]) == 0
    text = capsys.readouterr().out
    arena = int(re.search(r"arena\s+(\d+)", text).group(1))
    naive = int(re.search(r"naive sum\s+(\d+)", text).group(1))
    bound = int(re.search(r"lower bound\s+(\d+)", text).group(1))
    assert bound <= arena <= naive
    assert "program train:" in text and "program eval:" in text and "program optimizer:" in text
    assert "GEMM" in text and "SOFTMAX_CE_GRAD" in text and "ADAMW" in text


HELP_TEXTS = {
    # command: what its --help must say (whitespace-normalized: argparse rewraps)
    "": ["Train neural networks on microcontrollers", "example: microtrain pack"],
    "pack": ["Generate ORT-style training artifacts", "--batch-size", "--frozen",
             "--train-biases", "--train-last N", "the last N layers", "--update-in-backward",
             "no gradient buffers", "--loss-inputs NAMES",
             "naming several computes the loss outside the graph"],
    "inspect": ["memory", "For a partial update", "what pruning saved",
                "against training every parameter", "example: microtrain inspect",
                "--plan", "as TensorFlow Lite Micro's planner does",
                "Given an ONNX model instead", "what each costs"],
    "train": ["with the device runtime", "--runtime", "micropython"],
    "export": ["Write a standard ONNX model for inference", "--checkpoint",
               "example: microtrain export build/ --checkpoint build/trained_checkpoint "
               "-o model.onnx [--ort]", "--ort", "in ORT format", "minimal builds",
               ".required_operators.config"],
    "aggregate": ["Federated averaging", "weighted by the number of samples", "--weights",
                  "example: microtrain aggregate dev0/ckpt dev1/ckpt dev2/ckpt --weights"],
    "samples": ["Read a sample store", "dropped (torn by a power cut, or corrupt)", "--npz OUT",
                "example: microtrain samples samples.mts --npz captured.npz"],
}


@pytest.mark.parametrize("command", list(HELP_TEXTS), ids=lambda c: c or "microtrain")
def test_help(command):
    proc = subprocess.run([sys.executable, "-m", "microtrain_host.cli", *command.split(),
                           "--help"], capture_output=True, text=True)
    assert proc.returncode == 0
    text = " ".join(proc.stdout.split())
    assert text.startswith(f"usage: microtrain {command}".rstrip()), text
    for words in HELP_TEXTS[command]:
        assert words in text, (words, text)


def test_train_rejects_mismatched_data(build, tmp_path, capsys):
    import numpy as np
    bad = tmp_path / "bad.npz"
    np.savez(bad, x_train=np.zeros((16, 63), np.float32), y_train=np.zeros(16, np.int64))
    assert main(["train", str(build), "--data", str(bad), "--epochs", "1"]) == 2
    assert "63 values per sample" in capsys.readouterr().err
