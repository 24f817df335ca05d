"""Issue 22 scope 6: the host never writes an integer training blob the device refuses.
Every reference model (tests/reference_models.py) and the MLPerf Tiny models
(tests/mlperf_tiny.py; keyword spotting's DS-CNN is examples/kws/ds_cnn_kws.onnx) go through
the one command (`pack --int8 --calibrate`, int8pack.pack_int8) in every integer
configuration: what the pack accepts loads and trains 2 steps on the device runtime
(CPython for the small models; the MicroPython Unix port, viper kernels under heap_lock, for
the MLPerf Tiny ones), the loss finite; what it refuses is refused before anything is
written, in one line that names the node (or the loss, or the input) and the reason."""
import math

import numpy as np
import onnx
import pytest

from conftest import ROOT, run_micropython
from microtrain import CheckpointState, Module, Optimizer
from microtrain_host.errors import ArtifactError, UnsupportedOpError
from microtrain_host.int8pack import pack_int8
from microtrain_host.quant.inttrain import quantize_input
from reference_models import REFERENCE_MODELS
from test_models import example
from torch_reference import export

CONFIGS = {"classifier": {}, "momentum": dict(momentum=0.9), "last2": dict(train_last=2),
           "last3": dict(train_last=3), "biases": dict(train_biases=True),
           "sparse": dict(train_biases=True, train_last=3)}
LOSS = "CrossEntropyLoss needs a [batch, classes] output"
BACKWARD = "node '/ReduceMean' (ReduceMean) has no integer backward"
# what each model is refused for, in every configuration (None: nothing) or in those beyond
# the classifier alone ("deep": a float op between the layers and the classifier)
REFUSALS = {
    "lenet": None, "ds_cnn": None, "resnet_block": None,
    "gesture_1d": ("deep", BACKWARD), "mobilenet_v2_block": ("deep", BACKWARD),
    "conv_autoencoder": ("all", LOSS), "deconv_autoencoder": ("all", LOSS),
    "upsample_net": ("all", LOSS),
    "tiny_transformer": ("all", "node '/norm1/LayerNormalization' (LayerNormalization) "
                                "reads it"),
    "imu_gru_classifier": ("all", "node '/gru/Transpose' (Transpose) reads it"),
    "keyword_classifier": ("all", "the model's input 'input' is INT64"),
    "lstm_autoencoder": ("all", "no Conv, Gemm or MatMul"),
}


def _onnx_and_data(ref, tmp, samples=8):
    onnx.save(export(ref.module, example(ref, ref.batch)), tmp / "model.onnx")
    rng = np.random.default_rng(1)
    x = (rng.integers(0, ref.vocabulary, (samples,) + ref.inputs) if ref.vocabulary else
         rng.standard_normal((samples,) + ref.inputs).astype(np.float32))
    np.savez(tmp / "data.npz", x_train=x)
    return tmp / "model.onnx", x


@pytest.mark.parametrize("builder", REFERENCE_MODELS, ids=lambda f: f.__name__)
def test_every_reference_model_in_every_integer_configuration(builder, tmp_path):
    ref = builder()
    model, x = _onnx_and_data(ref, tmp_path)
    refusal = REFUSALS[ref.name]
    accepted = []
    for name, options in CONFIGS.items():
        out = tmp_path / name
        deep = "train_last" in options or "train_biases" in options
        expected = refusal and (refusal[0] == "all" or deep) and refusal[1]
        try:
            info = pack_int8(model, out, calibration=tmp_path / "data.npz",
                             batch_size=ref.batch, learning_rate=0.05, **options)
        except (ArtifactError, UnsupportedOpError) as e:
            assert expected and expected in str(e) and "\n" not in str(e), (name, str(e))
            assert not out.exists()         # nothing written
            continue
        assert not expected, (name, "accepted")
        state = CheckpointState.load_checkpoint(info["checkpoint"])
        module = Module(info["blob"], state)
        optimizer = Optimizer(info["blob"], module)
        losses = []
        for step in range(2):
            batch = x[step:step + ref.batch]
            losses.append(module(quantize_input(batch, info).reshape(-1).tolist(),
                                 [step % info["classes"]] * ref.batch))
            optimizer.step()
        assert all(math.isfinite(v) for v in losses), (name, losses)
        accepted.append(name)
    print(f"{ref.name}: trains in integers as {accepted or 'nothing'}")
    if refusal is None:
        assert accepted == list(CONFIGS)
    elif refusal[0] == "deep":
        assert accepted == ["classifier", "momentum"]


def _mlperf(name):
    import mlperf_tiny
    return getattr(mlperf_tiny, name)()


MLPERF = {"resnet8": ("classifier", "sparse"), "mobilenet_v1_025": ("classifier", "sparse"),
          "ad_autoencoder": ("classifier", "sparse"), "ds_cnn_kws": ("classifier", "sparse")}
# the AD autoencoder's loss: MSE on its own input (the device called model(x)); the others
# train with the cross-entropy
LOSSES = {"ad_autoencoder": dict(loss="mse", target="input")}


@pytest.mark.parametrize("name", list(MLPERF))
def test_mlperf_tiny_models_train_in_integers_on_micropython(name, micropython, tmp_path):
    if name == "ds_cnn_kws":
        model = ROOT / "examples" / "kws" / "ds_cnn_kws.onnx"
        shape = [d.dim_value for d in
                 onnx.load(model).graph.input[0].type.tensor_type.shape.dim][1:]
        x = np.random.default_rng(1).standard_normal([8] + shape).astype(np.float32)
        np.savez(tmp_path / "data.npz", x_train=x)
        batch = 1
    else:
        ref = _mlperf(name)
        model, x = _onnx_and_data(ref, tmp_path)
        batch = ref.batch
    for config in MLPERF[name]:
        info = pack_int8(model, tmp_path / config, calibration=tmp_path / "data.npz",
                         batch_size=batch, learning_rate=0.05, **CONFIGS[config],
                         **LOSSES.get(name, {}))
        records = b"".join(quantize_input(x[i:i + batch], info).tobytes()
                           + (np.full(batch, i % info["classes"], "<i4").tobytes()
                              if info["labels"] else b"") for i in range(2))
        (tmp_path / "data.bin").write_bytes(records)
        out = run_micropython(micropython, ROOT / "tests" / "device_scripts" /
                              "inttrain_steps.py", info["blob"], info["checkpoint"],
                              tmp_path / "data.bin", 2, "fast", tmp_path / "out.ckpt",
                              heap="64M")
        assert out.startswith("locked True"), out[:200]
        loss = [int(v) for v in out.split("loss ", 1)[1].split()]
        assert len(loss) == 2 * batch and all(abs(v) < 1 << 30 for v in loss), loss
        trained = CheckpointState.load_checkpoint(str(tmp_path / "out.ckpt")).parameters
        assert sorted(trained) == sorted(info["parameters"])
        print(f"{name} {config}: {len(info['parameters'])} parameters, 2 integer steps on "
              f"MicroPython under heap_lock, loss ints {loss}")
