"""Issue 10 acceptance, accuracy: on the digits example (held-out validation set), the int8
model after quantization-aware training - the QDQ model `microtrain export --qdq` writes,
run by onnxruntime with its quantized kernels - is within 1 percentage point of float
training. The usual QAT recipe: train in float, then fine-tune with fake quantization."""
import numpy as np
import onnx
import onnxruntime as ort

import microtrain_host as mh
from conftest import ROOT
from microtrain_host.tools.train import train

DIGITS = ROOT / "examples" / "digits"


def onnxruntime_accuracy(path, x, y, batch):
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    name = session.get_inputs()[0].name
    pad = (-len(x)) % batch
    xp = np.concatenate([x, np.zeros((pad,) + x.shape[1:], np.float32)])
    out = np.concatenate([session.run(None, {name: xp[i:i + batch]})[0]
                          for i in range(0, len(xp), batch)])[:len(x)]
    return float((out.argmax(1) == y).mean())


def test_int8_after_qat_within_one_point_of_float(tmp_path):
    data = np.load(DIGITS / "digits.npz")
    x_val, y_val = data["x_val"].astype(np.float32), data["y_val"]
    float_dir, qat_dir = tmp_path / "float", tmp_path / "qat"
    mh.generate_artifacts(str(DIGITS / "mlp.onnx"), artifact_directory=float_dir, batch_size=8)
    records = train(float_dir, DIGITS / "digits.npz", 6, 0.01, float_dir / "trained")
    mh.export_inference_model(float_dir, float_dir / "trained", tmp_path / "float.onnx")
    # every held-out sample (the device's evaluation counts full batches only: 352 of 359)
    float_accuracy = onnxruntime_accuracy(tmp_path / "float.onnx", x_val, y_val, 8)
    assert abs(float_accuracy - records[-1][3]) < 0.01

    mh.generate_artifacts(str(tmp_path / "float.onnx"), artifact_directory=qat_dir, batch_size=8,
                          quantization=True)
    train(qat_dir, DIGITS / "digits.npz", 2, 0.001, qat_dir / "trained")
    qdq = mh.export_inference_model(qat_dir, qat_dir / "trained", tmp_path / "int8.onnx",
                                    qdq=True)
    assert not any(n.domain == "ai.microtrain" for n in qdq.graph.node)
    assert sum(i.data_type == onnx.TensorProto.INT8 and len(i.dims) == 2
               for i in qdq.graph.initializer) == 2
    int8_accuracy = onnxruntime_accuracy(tmp_path / "int8.onnx", x_val, y_val, 8)
    print(f"digits: float {100 * float_accuracy:.1f} %, int8 after QAT "
          f"{100 * int8_accuracy:.1f} % ({len(y_val)} held-out samples)")
    assert int8_accuracy >= float_accuracy - 0.01, (int8_accuracy, float_accuracy)
