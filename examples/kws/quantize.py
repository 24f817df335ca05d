"""The int8 keyword-spotting backbone: ds_cnn_kws.onnx calibrated through microtrain's
quantization-aware-training path on the pretraining set of make_data.py (deterministic, no
downloads), exported as the QDQ model and the device's int8 inference blob.

  1. `generate_artifacts(..., quantization=...)` (`microtrain pack --qat`) inserts fake
     quantization: int8 weights per output channel, activation ranges observed by moving
     min/max observers (uint8 by default; int8 with --activation-dtype int8).
  2. Calibration: the device runtime (CPython) runs the QAT training program over the first
     --steps batches of the pretraining set at learning rate --lr (0: the weights stay the
     float model's and only the observers move - post-training quantization through the QAT
     graph; > 0: a short QAT fine-tune). The observers' momentum is --momentum (the first batch
     sets each range, later ones move it).
  3. `export_inference_model(..., qdq=True)` (`microtrain export --qdq`) writes the QDQ model,
     `pack_inference_model` (`--int8-blob`) the int8 inference blob.
  4. Accuracy on the 960 pretraining validation utterances: the float model and the QDQ
     model in onnxruntime (its quantized kernels), and the int8 blob on the device runtime
     for --device-samples of them (the device's int8 kernels equal onnxruntime's on the QDQ
     model element for element: tests/test_quant_int8.py).

Usage: python quantize.py [--out DIR] -> DIR/ds_cnn_kws_qdq.onnx, DIR/ds_cnn_kws_int8.mtb"""
import argparse
import os
import pathlib
import sys

import numpy as np

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path[:0] = [str(HERE), str(ROOT / "host"), str(ROOT / "device")]

import make_data  # noqa: E402
import microtrain_host as mh  # noqa: E402
from microtrain_host.quant.int8 import pack_inference_model  # noqa: E402

MODEL = HERE / "ds_cnn_kws.onnx"


def onnxruntime_predictions(path, x):
    import onnxruntime as ort
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    given = session.get_inputs()[0]
    batch = given.shape[0] if isinstance(given.shape[0], int) else 64  # the packed batch
    xp = np.concatenate([x, np.zeros(((-len(x)) % batch,) + x.shape[1:], x.dtype)])
    return np.concatenate([session.run(None, {given.name: xp[i:i + batch]})[0].argmax(1)
                           for i in range(0, len(xp), batch)])[:len(x)]


def qat_artifacts(directory, batch, momentum, activation_dtype, lr):
    """The model packed for quantization-aware training (`microtrain pack --qat`). With lr 0
    only the classifier's bias is trainable (a blob needs one; it is never stepped): the
    train program is then the forward pass with its observers and the backward of one
    vector, all that calibration needs."""
    return mh.generate_artifacts(
        str(MODEL), artifact_directory=directory, batch_size=batch,
        requires_grad=None if lr > 0 else ["classifier.bias"], optimizer="SGD",
        optimizer_options={"learning_rate": lr if lr > 0 else 0.001},
        quantization={"momentum": momentum, "activation_dtype": activation_dtype})


def calibrate(out, steps=20, batch=16, lr=0.0, momentum=0.1, activation_dtype="uint8",
              data=None):
    """Pack for QAT, run `steps` training batches on the device runtime, export the QDQ
    model and the int8 blob (at batch 1, as the device runs it) into out. Returns (QDQ
    model path, int8 blob path)."""
    from microtrain import CheckpointState, Module, Optimizer
    data = data or make_data.pretraining_set()
    out = pathlib.Path(out)
    qat = out / "qat"
    qat_artifacts(qat, batch, momentum, activation_dtype, lr)
    state = CheckpointState.load_checkpoint(str(qat / "checkpoint"))
    model = Module(str(qat / "model.mtb"), state)
    optimizer = Optimizer(str(qat / "model.mtb"), model) if lr > 0 else None
    if optimizer:
        optimizer.set_learning_rate(lr)
    x, y = data["x_train"], data["y_train"]
    for step in range(steps):
        rows = slice(step * batch, (step + 1) * batch)
        model(x[rows].reshape(-1), [int(v) for v in y[rows]])
        if optimizer:
            optimizer.step()
        model.lazy_reset_grad()
    CheckpointState.save_checkpoint(state, str(qat / "calibrated"))
    # the same QAT graph at batch 1 (the checkpoint does not depend on the batch size)
    qat_artifacts(out / "qat_batch1", 1, momentum, activation_dtype, lr)
    qdq, blob = out / "ds_cnn_kws_qdq.onnx", out / "ds_cnn_kws_int8.mtb"
    mh.export_inference_model(out / "qat_batch1", qat / "calibrated", qdq, qdq=True)
    pack_inference_model(qdq, blob)
    return qdq, blob


def device_predictions(blob, x):
    from microtrain import InferenceSession
    session = InferenceSession(str(blob))
    return np.array([int(np.argmax(session.run(row.reshape(-1)))) for row in x])


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=str(HERE / "build"))
    parser.add_argument("--steps", type=int, default=20, help="calibration batches (20)")
    parser.add_argument("--batch", type=int, default=16, help="calibration batch size (16)")
    parser.add_argument("--lr", type=float, default=0.0,
                        help="learning rate during calibration (0: observers only)")
    parser.add_argument("--momentum", type=float, default=0.1, help="observer momentum (0.1)")
    parser.add_argument("--activation-dtype", default="uint8", choices=("uint8", "int8"))
    parser.add_argument("--device-samples", type=int, default=96,
                        help="validation utterances also run by the device's int8 blob (96)")
    args = parser.parse_args()
    data = make_data.pretraining_set()
    qdq, blob = calibrate(args.out, args.steps, args.batch, args.lr, args.momentum,
                          args.activation_dtype, data)
    x, y = data["x_val"], data["y_val"]
    float_ok = onnxruntime_predictions(MODEL, x) == y
    int8 = onnxruntime_predictions(qdq, x)
    print(f"calibrated on {args.steps * args.batch} pretraining utterances "
          f"({args.steps} batches of {args.batch}, lr {args.lr}, observer momentum "
          f"{args.momentum}, {args.activation_dtype} activations)")
    print(f"wrote {qdq} ({os.path.getsize(qdq)} bytes), {blob} ({os.path.getsize(blob)} bytes)")
    print(f"pretraining validation accuracy ({len(y)} utterances): float "
          f"{100 * float_ok.mean():.2f} %, int8 (QDQ, onnxruntime) {100 * (int8 == y).mean():.2f} %")
    if args.device_samples:
        n = args.device_samples
        device = device_predictions(blob, x[:n])
        print(f"first {n}: float {100 * float_ok[:n].mean():.2f} %, int8 blob on the device "
              f"runtime {100 * (device == y[:n]).mean():.2f} %, same predictions as "
              f"onnxruntime's QDQ on {int((device == int8[:n]).sum())}/{n}")


if __name__ == "__main__":
    main()
