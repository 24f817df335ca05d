"""Integer training step vs float training step (issue 11): the DS-CNN keyword-spotting
model at MLPerf Tiny size (49x10 MFCC, 64 channels, 4 depthwise-separable blocks, 12
classes; tests/reference_models.py DSCNN), batch 1, training its classifier:

* float: generate_artifacts(requires_grad=classifier), SGD; Module(x, y) + Optimizer.step()
* int:   QAT artifacts, a few calibration steps, export --qdq, quant/inttrain.py; the
         train program's steps (frozen int8 layers, int logits, int softmax-CE, fused QAS
         update) under micropython.heap_lock()

Both run in one MicroPython process (bench/inttrain_device.py, best of ROUNDS) and the
script prints the two times and their ratio. Prints figures only; asserts nothing.

    python bench/inttrain_step.py [--rounds N] [--micropython PATH] [--channels C]
                                  [--train-conv]
"""
import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "device"), str(ROOT / "host"), str(ROOT / "tests")]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--channels", type=int, default=64)
    ap.add_argument("--train-conv", action="store_true",
                    help="int: also train the last pointwise conv (float: its weight and "
                         "BatchNorm too)")
    ap.add_argument("--micropython", default=os.environ.get(
        "MICROTRAIN_MICROPYTHON", str(ROOT / ".cache" / "micropython" / "micropython")))
    args = ap.parse_args()
    import microtrain_host as mh
    from microtrain import CheckpointState, Module, Optimizer
    from microtrain_host.quant.inttrain import int8_training_artifacts
    from reference_models import DSCNN
    from torch_reference import export
    torch.manual_seed(3)
    net = DSCNN(channels=args.channels, blocks=4)
    onnx_model = export(net, torch.zeros(1, 1, 49, 10))
    tmp = Path(tempfile.mkdtemp())
    last = [n for n, _ in net.named_parameters() if n.startswith("blocks.")][-3:]
    trained = ["classifier.weight", "classifier.bias"] + (last if args.train_conv else [])
    mh.generate_artifacts(onnx_model, requires_grad=trained,
                          artifact_directory=tmp / "float", batch_size=1, optimizer="SGD")
    mh.generate_artifacts(onnx_model, artifact_directory=tmp / "qat", batch_size=1,
                          optimizer="SGD", quantization=True)
    state = CheckpointState.load_checkpoint(str(tmp / "qat" / "checkpoint"))
    model = Module(str(tmp / "qat" / "model.mtb"), state)
    opt = Optimizer(str(tmp / "qat" / "model.mtb"), model)
    rng = np.random.default_rng(0)
    for _ in range(2):                      # calibrate the observers
        model(rng.standard_normal(490).astype(np.float32), [int(rng.integers(12))])
        opt.step()
        model.lazy_reset_grad()
    CheckpointState.save_checkpoint(state, str(tmp / "qat" / "trained"))
    mh.export_inference_model(tmp / "qat", tmp / "qat" / "trained", tmp / "qdq.onnx", qdq=True)
    info = int8_training_artifacts(tmp / "qdq.onnx", tmp / "int", 0.01,
                                   train_conv=args.train_conv)
    env = dict(os.environ, MICROPYPATH=f"{ROOT / 'device'}:{ROOT / 'bench'}")
    out = subprocess.run([args.micropython, "-X", "heapsize=8M",
                          str(ROOT / "bench" / "inttrain_device.py"), info["blob"],
                          info["checkpoint"], str(tmp / "float" / "model.mtb"),
                          str(tmp / "float" / "checkpoint"), str(args.rounds)],
                         capture_output=True, text=True, env=env, check=True).stdout.split()
    int_us, float_us, ratio, locked = float(out[0]), float(out[1]), float(out[2]), out[3]
    what = "classifier and last pointwise conv" if args.train_conv else "classifier"
    print(f"DS-CNN {args.channels} channels, batch 1, {what} trained ({', '.join(trained)} "
          f"in float), MicroPython "
          f"(best of {args.rounds}):")
    print(f"  float train step (Module + Optimizer.step): {float_us / 1000:9.1f} ms")
    print(f"  int train step (heap locked: {locked}):      {int_us / 1000:9.1f} ms")
    print(f"  ratio float / int:                          {ratio:9.1f}x")


if __name__ == "__main__":
    main()
