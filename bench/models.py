"""Train-step benchmark of the reference models of the test suite (tests/reference_models.py:
LeNet-style, DS-CNN keyword spotting, 1-D gesture net, MobileNetV2 inverted residual block,
conv autoencoder, ConvTranspose autoencoder, Upsample net, ...).

Packs each model (AdamW, the batch the tests use), counts the multiply-accumulates of one
train step from the training graph (forward and backward Gemm/MatMul/Conv/ConvTranspose/GRU/
LSTM and the conv gradients), then runs bench/model_step.py under CPython and under the
MicroPython Unix port
and prints a table: time per train step, its effective MAC/s, the interpreter's plain
MAC-loop rate measured in the same process, and their ratio. The ratio includes everything
a step does besides MACs (activations, pooling, BatchNorm, the optimizer), so it is a lower
bound on how close the conv kernels themselves come to the plain loop (for the kernels
alone see bench/conv_kernels.py). Prints figures only; asserts nothing.

    python bench/models.py [--steps N] [--micropython PATH] [--only NAME]
"""
import argparse
import os
import sys
import tempfile
from pathlib import Path

import numpy as np
import onnx
import torch

ROOT = Path(__file__).resolve().parent.parent
DEVICE = ROOT / "device"
DEVICE_SCRIPT = Path(__file__).resolve().parent / "model_step.py"
sys.path[:0] = [str(DEVICE), str(ROOT / "tests")]
from microtrain import parser as blobfile_parser
from microtrain_host import generate_artifacts  # noqa: E402
from reference_models import REFERENCE_MODELS  # noqa: E402
from torch_reference import export  # noqa: E402
from train_step import device_runtimes, run_results  # noqa: E402


def _shapes(model):
    shapes = {}
    graph = model.graph
    for vi in list(graph.input) + list(graph.value_info) + list(graph.output):
        shapes[vi.name] = [d.dim_value for d in vi.type.tensor_type.shape.dim]
    for init in graph.initializer:
        shapes[init.name] = list(init.dims)
    return shapes


def train_step_macs(training_model):
    """Multiply-accumulates of one train step, read off the training graph."""
    shapes = _shapes(training_model)
    total = 0
    for node in training_model.graph.node:
        size = lambda name: int(np.prod(shapes[name]))  # noqa: E731
        if node.op_type in ("Gemm", "MatMul"):
            a = shapes[node.input[0]]
            trans_a = any(at.name == "transA" and at.i for at in node.attribute)
            total += size(node.output[0]) * (a[-2] if trans_a else a[-1])
        elif node.op_type in ("Conv", "ConvGradInput"):
            # Each output (or input-gradient) element is a dot over C_in/group x kernel for
            # Conv; ConvGradInput does the same work as the forward conv it inverts.
            w = shapes[node.input[1]]
            y = node.output[0] if node.op_type == "Conv" else node.input[0]
            total += size(y) * int(np.prod(w[1:]))
        elif node.op_type == "ConvTranspose":
            # Each input element is spread over C_out/group x kernel outputs.
            total += size(node.input[0]) * int(np.prod(shapes[node.input[1]][1:]))
        elif node.op_type == "ConvGradWeight":
            dy, dw = node.input[0], node.output[0]
            total += size(dy) * int(np.prod(shapes[dw][1:]))
        elif node.op_type in ("GRU", "LSTM", "GRUGrad", "LSTMGrad"):
            # Per step and sample: X.W and H.R forward; backward dH_prev = dG.R every step,
            # and dR, dW, dX (each when computed) the same sizes again.
            x = shapes[node.input[0]]
            inputs, recurrent = size(node.input[1]), size(node.input[2])
            if node.op_type in ("GRU", "LSTM"):
                total += x[0] * x[1] * (inputs + recurrent)
            else:
                outputs = list(node.output) + [""] * 3
                total += x[0] * x[1] * (recurrent * (1 + bool(outputs[2]))
                                        + inputs * (bool(outputs[0]) + bool(outputs[1])))
    return total


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=10, help="timed steps per round (3 rounds)")
    ap.add_argument("--micropython", help="MicroPython binary (default: $MICROTRAIN_MICROPYTHON, "
                                          "then .cache/micropython/micropython)")
    ap.add_argument("--only", help="run only the reference model with this name")
    args = ap.parse_args()
    runtimes = device_runtimes(args.micropython, heap="8M")
    print(f"best of 3 rounds of {args.steps} train steps (AdamW)")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for build in REFERENCE_MODELS:
            ref = build()
            if args.only and ref.name != args.only:
                continue
            directory = os.path.join(tmp, ref.name)
            result = generate_artifacts(export(ref.module, torch.zeros((ref.batch,) + ref.inputs)),
                                        loss=ref.loss, optimizer="AdamW",
                                        artifact_directory=directory, batch_size=ref.batch)
            macs = train_step_macs(onnx.load(result.training_model))
            b = blobfile_parser.load(result.blob)
            params = sum(b.sizes[t] for t, _, _ in b.parameters)
            for name, command, env in runtimes:
                results = run_results(command, env, DEVICE_SCRIPT, directory, args.steps)
                if results:
                    rows.append((ref, name, macs, params, b.float_arena, results[0]))
    print("\n%-20s %-12s %5s %7s %7s %9s %9s %11s %11s %6s" % (
        "model", "runtime", "batch", "params", "arena", "MACs", "step ms", "step MMAC/s",
        "loop MMAC/s", "ratio"))
    for ref, name, macs, params, arena, r in rows:
        train_us, loop = float(r["train_us"]), float(r["loop_macs"])
        rate = macs / (train_us / 1e6)
        print("%-20s %-12s %5d %7d %7d %9d %9.1f %11.2f %11.2f %5.0f%%" % (
            ref.name, name, ref.batch, params, arena, macs, train_us / 1000, rate / 1e6,
            loop / 1e6, 100 * rate / loop))


if __name__ == "__main__":
    main()
