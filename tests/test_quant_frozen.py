"""Issue 10, int8 frozen layers: a quantized model (the QDQ model `microtrain export --qdq`
writes) packed for a partial update runs its frozen layers with the int8 kernels, their
int8 weights and int32 biases in the blob, and trains the rest in float; the blob +
checkpoint and the arena shrink against the float fine-tune of the same layers; the trained
model exports, on the device, an int8 inference blob that equals its eval program. Measured
on the KWS DS-CNN at MLPerf Tiny size (49x10 MFCCs, 64 channels, 4 depthwise-separable
blocks, 12 classes), last layer trained, batch 1."""
import os

import numpy as np
import torch

import microtrain_host as mh
from microtrain import CheckpointState, InferenceSession, Module, Optimizer
from microtrain import blob as device_blob
from microtrain import parser as device_blob_parser
from reference_models import DSCNN
from torch_reference import export

HEAD = ["classifier.weight", "classifier.bias"]


def sizes(directory):
    b = device_blob_parser.load(str(directory / "model.mtb"))
    files = os.path.getsize(directory / "model.mtb") + os.path.getsize(directory / "checkpoint")
    return files, 4 * (b.float_arena + b.int_arena) + b.byte_arena, b


def test_ds_cnn_last_layer_fine_tune_with_int8_frozen_layers(tmp_path):
    torch.manual_seed(0)
    net = DSCNN(channels=64, blocks=4, classes=12)
    model = export(net, torch.zeros((1, 1, 49, 10)))
    mh.generate_artifacts(model, artifact_directory=tmp_path / "float", batch_size=1,
                          optimizer="SGD", requires_grad=HEAD)
    # QAT (a couple of steps, enough to give the observers their ranges), the QDQ model
    qat = tmp_path / "qat"
    mh.generate_artifacts(model, artifact_directory=qat, batch_size=1, optimizer="SGD",
                          quantization=True)
    state = CheckpointState.load_checkpoint(str(qat / "checkpoint"))
    module = Module(str(qat / "model.mtb"), state)
    opt = Optimizer(str(qat / "model.mtb"), module)
    rng = np.random.default_rng(0)
    xs = rng.standard_normal((4, 490)).astype(np.float32)
    for i in range(2):
        module(xs[i], [i])
        opt.step()
        module.lazy_reset_grad()
    CheckpointState.save_checkpoint(state, str(qat / "trained"))
    mh.export_inference_model(qat, qat / "trained", tmp_path / "qdq.onnx", qdq=True)

    int8 = tmp_path / "int8"
    result = mh.generate_artifacts(str(tmp_path / "qdq.onnx"), artifact_directory=int8,
                                   batch_size=1, optimizer="SGD", requires_grad=HEAD)
    assert result.trainable == HEAD
    float_files, float_arena, _ = sizes(tmp_path / "float")
    int8_files, int8_arena, b = sizes(int8)
    int8_weights = sum(b.sizes[t] for t in range(len(b.names)) if b.dtypes[t] == 2
                       and device_blob.ROLE_NAMES[b.roles[t]] == "constant")
    print(f"DS-CNN (64 ch) last-layer fine-tune: blob + checkpoint {float_files:,} B float, "
          f"{int8_files:,} B with int8 frozen layers ({int8_files / float_files:.3f}x); "
          f"arenas {float_arena:,} B vs {int8_arena:,} B ({int8_arena / float_arena:.2f}x); "
          f"{int8_weights:,} int8 weights")
    from microtrain_host.tools.inspect import blob_bytes
    for kind in ("float", "int8"):
        print(kind, "\n".join(blob_bytes(str(tmp_path / kind / "model.mtb"))))
    assert int8_files <= 0.35 * float_files
    # the frozen weights moved from float32 in the arena to int8: the arena shrinks by at
    # least three quarters of their float size
    assert float_arena - int8_arena >= 0.75 * 4 * int8_weights
    steps = [op for op, *_ in device_blob_parser.load(str(int8 / "model.mtb"), keep_steps=True)
             .step_records["train"]]
    assert steps.count(223) == 9            # 9 frozen convolutions run as QLinearConv

    state = CheckpointState.load_checkpoint(str(int8 / "checkpoint"))
    assert sorted(state.parameters) == sorted(HEAD)
    module = Module(str(int8 / "model.mtb"), state)
    opt = Optimizer(str(int8 / "model.mtb"), module)
    opt.set_learning_rate(0.05)
    losses = []
    for _ in range(6):
        losses.append(module(xs[3], [5]))
        opt.step()
        module.lazy_reset_grad()
    assert losses[-1] < losses[0]
    module.export_model_for_inferencing(str(int8 / "infer.mtb"), ["output"])
    session = InferenceSession(str(int8 / "infer.mtb"))
    assert session.blob.byte_arena > 0
    module.eval()
    expected = list(module(xs[2], [0])[1])
    assert list(session.run(xs[2])) == expected
