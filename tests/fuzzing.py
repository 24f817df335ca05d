"""Host side of the mutation fuzzing (tests/device_scripts/fuzz_mutations.py): builds the
fuzzed artifacts, runs the device script under CPython or MicroPython in chunks, and turns
a chunk that stops answering into a recorded hang instead of a stuck run."""
import collections
import os
import shutil
import subprocess
import sys

import torch
from torch import nn

import microtrain_host as mh
from conftest import DEVICE, ROOT
from torch_reference import export

SCRIPT = ROOT / "tests" / "device_scripts" / "fuzz_mutations.py"
DIGITS = ROOT / "examples" / "digits" / "mlp.onnx"


class Recurrent(nn.Module):
    """A bidirectional GRU feeding an LSTM whose last hidden state is classified."""

    def __init__(self):
        super().__init__()
        self.gru = nn.GRU(3, 4, batch_first=True, bidirectional=True)
        self.lstm = nn.LSTM(8, 3, batch_first=True)
        self.head = nn.Linear(3, 4)

    def forward(self, x):
        y, _ = self.gru(x)
        _, (h, _) = self.lstm(y)
        return self.head(h[-1])


class Decoder(nn.Module):
    """A conv decoder: ConvTranspose (strided, grouped, with output_padding) and Resize
    (nearest, bilinear, 1-D linear), whose steps carry tables of any length."""

    def __init__(self):
        super().__init__()
        self.up = nn.ConvTranspose2d(2, 4, 3, stride=2, padding=1, output_padding=1, groups=2)
        self.mix = nn.Conv2d(4, 2, 1)

    def forward(self, x):
        h = torch.tanh(self.up(x))                                            # 3x3 -> 6x6
        h = nn.functional.interpolate(h, scale_factor=2) + nn.functional.interpolate(
            h, scale_factor=2, mode="bilinear")
        return nn.functional.interpolate(self.mix(h).flatten(2), size=20, mode="linear")


def make_artifacts(directory):
    """{name: artifact directory}: the digits MLP with AdamW, a small CNN (Conv,
    BatchNormalization, Relu, MaxPool, Dropout, global average pooling, Gemm) with SGD and
    momentum, a GRU + LSTM net with AdamW and a conv decoder (ConvTranspose, Resize) with
    MSE and SGD, so that every kernel family of a typical model is fuzzed."""
    mlp = directory / "mlp"
    mh.generate_artifacts(str(DIGITS), loss="CrossEntropyLoss", optimizer="AdamW",
                          artifact_directory=mlp, batch_size=4)
    torch.manual_seed(0)
    cnn_module = nn.Sequential(
        nn.Conv2d(1, 3, 3, padding=1), nn.BatchNorm2d(3), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(3, 4, 3), nn.ReLU(), nn.Dropout(0.25), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
        nn.Linear(4, 5))
    cnn = directory / "cnn"
    mh.generate_artifacts(export(cnn_module, torch.zeros(1, 1, 8, 8)), loss="CrossEntropyLoss",
                          optimizer="SGD", optimizer_options={"momentum": 0.9},
                          artifact_directory=cnn, batch_size=2)
    torch.manual_seed(0)
    rnn = directory / "rnn"
    mh.generate_artifacts(export(Recurrent(), torch.zeros(1, 5, 3)), loss="CrossEntropyLoss",
                          optimizer="AdamW", artifact_directory=rnn, batch_size=2)
    decoder = directory / "decoder"
    mh.generate_artifacts(export(Decoder(), torch.zeros(1, 2, 3, 3)), loss="MSELoss",
                          optimizer="SGD", artifact_directory=decoder, batch_size=2)
    return {"mlp": mlp, "cnn": cnn, "rnn": rnn, "decoder": decoder}


def make_int_artifacts(directory):
    """{name: artifact directory} of the integer models, from one small DS-CNN (a strided
    conv stem, a depthwise-separable block, global average pooling, a classifier) trained
    with QAT on the device runtime and exported as QDQ: "int8", its int8 inference blob
    (pack_inference_model: QLinearConv, depthwise, QLinearGemm, requantization), fuzzed
    through InferenceSession; "inttrain", its integer-training blob
    (int8_training_artifacts: every conv bias, the last block's depthwise and pointwise
    weights and the classifier trained in integers, the classifier with SGD momentum, with
    stochastic rounding) and a checkpoint the device saved after 8 steps with its optimizer
    state (int16 / int32 momentum velocities, the dither generators)."""
    from microtrain import CheckpointState, Module, Optimizer
    from microtrain_host.quant.int8 import pack_inference_model
    from microtrain_host.quant.inttrain import int8_training_artifacts, quantize_input
    from reference_models import DSCNN, ReferenceModel
    from torch_reference import qat_qdq_model
    torch.manual_seed(11)
    ref = ReferenceModel("mini_ds_cnn", DSCNN(channels=4, blocks=1, classes=4), (1, 12, 6),
                         "CrossEntropyLoss", 2, {"SGD": 0.05})
    xs, ys = qat_qdq_model(ref, directory / "qat", 8)
    qdq = directory / "qat" / "qdq.onnx"
    int8 = directory / "int8"
    int8.mkdir()
    pack_inference_model(qdq, int8 / "model.mtb")
    inttrain = directory / "inttrain"
    info = int8_training_artifacts(qdq, inttrain, 0.05, momentum=0.9, train_conv=True,
                                   train_biases=True, train_depthwise=True)
    shutil.copyfile(info["blob"], inttrain / "model.mtb")
    state = CheckpointState.load_checkpoint(info["checkpoint"])
    model = Module(info["blob"], state)
    optimizer = Optimizer(info["blob"], model)
    for x, y in zip(xs, ys):
        model(quantize_input(x, info).reshape(-1).tolist(), [int(v) for v in y])
        optimizer.step()
    CheckpointState.save_checkpoint(state, str(inttrain / "checkpoint"), True)
    return {"int8": int8, "inttrain": inttrain}


# the files fuzzed per model: a training blob and its checkpoint, or an inference blob
KINDS = {"int8": ("inference",)}


def kinds(name):
    return KINDS.get(name, ("blob", "checkpoint"))


def command(interpreter):
    if interpreter == "cpython":
        return [sys.executable], dict(os.environ, PYTHONPATH=str(DEVICE))
    env = dict(os.environ, MICROPYPATH=str(DEVICE))
    return [interpreter, "-X", "heapsize=16M"], env


def fuzz(interpreter, directory, kind, seed, count, chunk=100, chunk_timeout=300):
    """Counter of outcomes ("trained", "refused <type>", "crash <type: message>",
    "nonfinite <where>", "hang") of mutations 0 .. count-1 of the blob or checkpoint (kind
    "blob", "checkpoint", or "inference": an inference blob), the mutations of each outcome
    but "trained" (a list, in order), and [largest arena of a loaded mutation, the
    unmutated one's]. ("trained" also counts an inference blob that loaded and ran.)"""
    argv, env = command(interpreter)
    outcomes = collections.Counter()
    examples = {}
    arena = [0, 0]
    first = 0
    while first < count:
        n = min(chunk, count - first)
        try:
            proc = subprocess.run(argv + [str(SCRIPT), str(directory), kind, str(seed),
                                          str(first), str(n)],
                                  capture_output=True, text=True, env=env, timeout=chunk_timeout)
            out, finished = proc.stdout, proc.returncode == 0
        except subprocess.TimeoutExpired as e:
            out = (e.stdout or b"").decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
            finished = False
            proc = None
        tried = first - 1
        for line in out.splitlines():
            words = line.split(" ", 2)
            if words[0] == "try":
                tried = int(words[1])
            elif words[0] == "arena":
                arena = [max(arena[0], int(words[1])), int(words[2])]
            elif words[0].isdigit():
                key = " ".join(words[1:])
                if words[1] == "nonfinite":     # grouped by where, not by value and index
                    key = key.split(":")[0]
                outcomes[key] += 1
                if key != "trained":
                    examples.setdefault(key, []).append(int(words[0]))
        if finished:
            first += n
            continue
        # The process stopped inside mutation `tried` (killed after the timeout, or died).
        if tried < first:
            raise AssertionError("the fuzz driver failed before its first mutation:\n%s\n%s"
                                 % (out, proc.stderr if proc else ""))
        key = "hang" if proc is None else "died (%d): %s" % (proc.returncode, proc.stderr[-300:])
        outcomes[key] += 1
        examples.setdefault(key, []).append(tried)
        first = tried + 1
    return outcomes, examples, arena


def failures(outcomes):
    return {k: v for k, v in outcomes.items() if k != "trained" and not k.startswith("refused")}
