"""One case per numbered item of the reliability issue (data loss, silent corruption, saves
that could be redirected, crafted files, bad arguments), run by
tests/device_scripts/reliability_checks.py under CPython and MicroPython: each line of its
output must be the one in tests/data/reliability_cases.txt, on both interpreters. Items 13-15 (the CLI and
pack) are tests/test_bad_arguments.py's; item 10 (int8 scales) is test_int8_crafted.py's."""
import os
import re
import struct
import subprocess
import sys

import numpy as np
import pytest
import torch
from torch import nn

import microtrain_host as mh
from conftest import DEVICE, ROOT, run_micropython
from microtrain.crc32 import crc32
from microtrain.errors import BlobError
from microtrain import CheckpointState, Module, Optimizer, parser as P
from microtrain.flatbuf import Reader
from microtrain_host.formats.checkpoint import read_checkpoint, write_checkpoint
from torch_reference import export

CASES = ROOT / "tests" / "data" / "reliability_cases.txt"
SCRIPT = ROOT / "tests" / "device_scripts" / "reliability_checks.py"
DIGITS = ROOT / "examples" / "digits" / "mlp.onnx"


def _trained_checkpoint(directory, out):
    # a checkpoint with optimizer state (AdamW moments) after one step
    state = CheckpointState.load_checkpoint(str(directory / "checkpoint"))
    model = Module(str(directory / "model.mtb"), state)
    opt = Optimizer(str(directory / "model.mtb"), model)
    b = model.blob
    x_id, y_id = b.programs["train"].inputs
    model([0.1 * (i % 7) for i in range(b.sizes[x_id])], [i % 4 for i in range(b.sizes[y_id])])
    opt.step()
    CheckpointState.save_checkpoint(state, str(out), True)


def _crafted_checkpoints(source, directory):
    # item 4: state a checkpoint must not bring in (each refused at load, naming it)
    directory.mkdir()
    c = read_checkpoint(source)
    weight = next(n for n in c.trainable if n.endswith("weight"))
    variance = next(n for n in c.frozen if "var" in n)

    def write(name, trainable=c.trainable, frozen=c.frozen, momentums=c.momentums):
        write_checkpoint(directory / name, trainable, frozen, optimizer_step=c.optimizer_step,
                         momentums=momentums, properties=c.properties)

    for label, value in (("nan", np.nan), ("inf", np.inf)):
        moments = {k: [m.copy() for m in v] for k, v in c.momentums.items()}
        moments[weight][1].reshape(-1)[3] = value
        write("second_moment_" + label, momentums=moments)
    frozen = {k: v.copy() for k, v in c.frozen.items()}
    frozen[variance].reshape(-1)[1] = -1.0
    write("running_var_negative", frozen=frozen)
    trainable = {k: v.copy() for k, v in c.trainable.items()}
    trainable[weight].reshape(-1)[0] = np.nan
    write("weight_nan", trainable=trainable)
    write("untouched")
    return weight, variance


def _tensors_apart(blob, out):
    # item 9: a tensor moved far out and the float arena grown to match: a blob whose
    # sizes agree, which would make the device allocate ~200 MB for nothing
    data = bytearray(blob.read_bytes())
    size = struct.unpack_from("<I", data, 0)[0]
    r = Reader(memoryview(bytes(data))[:4 + size], BlobError, start=4)
    root = r.root()
    tensors = list(r.tables(root, P._MODEL_TENSORS, "tensor"))
    arena = r.scalar(root, P._MODEL_FLOAT_ARENA, "I", 0)
    # the last tensor of the float arena, moved to 50,000,000 elements
    last = max((t for t in tensors if r.scalar(t, P._TENSOR_DTYPE, "B", 0) == 0),
               key=lambda t: r.scalar(t, P._TENSOR_OFFSET, "I", 0)
               + r.scalar(t, P._TENSOR_SIZE, "I", 0))
    moved = 50_000_000
    struct.pack_into("<I", data, r.field(last, P._TENSOR_OFFSET), moved)
    struct.pack_into("<I", data, r.field(root, P._MODEL_FLOAT_ARENA),
                     moved + r.scalar(last, P._TENSOR_SIZE, "I", 0))
    struct.pack_into("<I", data, 4 + size, crc32(memoryview(data)[4:4 + size]) & 0xFFFFFFFF)
    out.write_bytes(bytes(data))
    return arena


@pytest.fixture(scope="module")
def place(tmp_path_factory):
    d = tmp_path_factory.mktemp("reliability")
    mh.generate_artifacts(str(DIGITS), loss="CrossEntropyLoss", optimizer="AdamW",
                          artifact_directory=d / "mlp", batch_size=4)
    torch.manual_seed(0)
    cnn = nn.Sequential(nn.Conv2d(1, 3, 3, padding=1), nn.BatchNorm2d(3), nn.ReLU(),
                        nn.MaxPool2d(2), nn.Flatten(), nn.Linear(48, 4))
    mh.generate_artifacts(export(cnn, torch.zeros(1, 1, 8, 8)), loss="CrossEntropyLoss",
                          optimizer="AdamW", artifact_directory=d / "cnn", batch_size=2)
    _trained_checkpoint(d / "cnn", d / "cnn_trained")
    _crafted_checkpoints(d / "cnn_trained", d / "crafted")
    _tensors_apart(d / "mlp" / "model.mtb", d / "apart.mtb")
    (d / "a_directory").mkdir()
    (d / "a_directory" / "inside").write_text("kept")
    os.mkfifo(d / "fifo")
    with open(d / "zeros", "wb") as f:      # sparse: no disk space
        f.truncate(512 << 20)
    return d


def _plant_links(d):
    # item 8: links at PATH.tmp pointing at files that must not be written
    for victim, link in (("victim", "linked.tmp"), ("victim2", "linked_inference.mtb.tmp")):
        (d / victim).write_bytes(b"precious")
        if (d / link).is_symlink() or (d / link).exists():
            (d / link).unlink()
        os.symlink(d / victim, d / link)


def _run(interpreter, d, micropython=None):
    _plant_links(d)
    for name in ("exported.mtb", "saved_ck", "linked", "linked_inference.mtb"):
        if (d / name).exists():
            (d / name).unlink()
    if interpreter == "cpython":
        proc = subprocess.run([sys.executable, str(SCRIPT), str(d)], capture_output=True,
                              text=True, env={"PYTHONPATH": str(DEVICE), "PATH": "/usr/bin:/bin"},
                              timeout=600)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        out = proc.stdout
    else:
        out = run_micropython(micropython, SCRIPT, d, heap="64M")
    assert out.rstrip().endswith("done"), out
    return dict(line.split(": ", 1) for line in out.splitlines() if ": " in line)


@pytest.mark.parametrize("interpreter", ["cpython", "micropython"])
def test_reliability_cases(place, interpreter, request):
    binary = request.getfixturevalue("micropython") if interpreter == "micropython" else None
    got = {case: outcome.replace(str(place), "D")
           for case, outcome in _run(interpreter, place, binary).items()}
    expected = {}
    for line in CASES.read_text().splitlines():
        if line.startswith("["):
            only, case, outcome = re.match(r"\[[^]]+\]( \[cpython\])? (.*?): (.*)$",
                                           line).groups()
            if not only or interpreter == "cpython":
                expected[case] = outcome
    assert got == expected
