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


def test_ds_cnn_keyword_task_int8_after_qat_within_one_point_of_float(tmp_path):
    """The DS-CNN on a generated keyword-spotting task (tests/kws_synthetic.py: 6 keywords,
    49x10 MFCC-like frames, speakers, speaking rates, noise; 480 training and 240 held-out
    utterances). Float training runs in PyTorch (12 epochs in seconds; microtrain's float
    training of this model equals PyTorch's step by step, tests/test_models.py), then
    microtrain fine-tunes it with fake quantization on the device runtime (60 steps of 8),
    and the int8 model - the device's own int8 inference blob and the QDQ model in
    onnxruntime - is within 1 point of the float model on the held-out utterances."""
    import torch
    from kws_synthetic import kws_dataset
    from microtrain import CheckpointState, InferenceSession, Module, Optimizer
    from microtrain_host.quant.int8 import pack_inference_model
    from reference_models import DSCNN
    from torch_reference import export
    torch.set_num_threads(1)
    x_train, y_train, x_test, y_test = kws_dataset()
    torch.manual_seed(0)
    net = DSCNN(classes=6)
    opt = torch.optim.AdamW(net.parameters(), lr=0.003)
    for epoch in range(12):
        order = np.random.default_rng(epoch).permutation(len(x_train))
        for i in range(0, len(x_train) - 7, 8):
            batch = order[i:i + 8]
            loss = torch.nn.functional.cross_entropy(net(torch.from_numpy(x_train[batch])),
                                                     torch.from_numpy(y_train[batch]))
            opt.zero_grad()
            loss.backward()
            opt.step()
    float_model = export(net, torch.zeros((8, 1, 49, 10)))
    mh.generate_artifacts(float_model, artifact_directory=tmp_path / "float", batch_size=8)
    mh.export_inference_model(tmp_path / "float", tmp_path / "float" / "checkpoint",
                              tmp_path / "float.onnx")
    float_accuracy = onnxruntime_accuracy(tmp_path / "float.onnx", x_test, y_test, 8)

    qat = tmp_path / "qat"
    mh.generate_artifacts(float_model, artifact_directory=qat, batch_size=8, quantization=True)
    state = CheckpointState.load_checkpoint(str(qat / "checkpoint"))
    model = Module(str(qat / "model.mtb"), state)
    optimizer = Optimizer(str(qat / "model.mtb"), model)
    optimizer.set_learning_rate(0.0005)
    order = np.random.default_rng(1).permutation(len(x_train))
    for step in range(60):
        batch = order[step * 8:(step + 1) * 8]
        model(x_train[batch].reshape(-1), [int(v) for v in y_train[batch]])
        optimizer.step()
        model.lazy_reset_grad()
    CheckpointState.save_checkpoint(state, str(qat / "trained"))
    mh.export_inference_model(qat, qat / "trained", tmp_path / "int8.onnx", qdq=True)
    ort_int8 = onnxruntime_accuracy(tmp_path / "int8.onnx", x_test, y_test, 8)
    pack_inference_model(tmp_path / "int8.onnx", tmp_path / "int8.mtb")
    session = InferenceSession(str(tmp_path / "int8.mtb"))
    predictions = np.concatenate([np.array(session.run(x_test[i:i + 8].reshape(-1)))
                                  .reshape(8, -1).argmax(1) for i in range(0, len(x_test), 8)])
    device_int8 = float((predictions == y_test).mean())
    print(f"DS-CNN keywords: float {100 * float_accuracy:.1f} %, int8 after QAT "
          f"{100 * device_int8:.1f} % (device int8 blob), {100 * ort_int8:.1f} % "
          f"(onnxruntime QDQ); {len(y_test)} held-out utterances")
    assert device_int8 >= float_accuracy - 0.01
    assert ort_int8 >= float_accuracy - 0.01
