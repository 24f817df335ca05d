"""Issue 22 scope 4: `pack --int8` at --batch-size 1 for models with BatchNorm1d (a
BatchNorm with one value per channel at batch 1: after a Gemm, or after a Conv1d whose
output is one position long; also one after a ReLU, left a float op, and one after the
classifier). The pack calibrates and quantizes the float model's eval
graph (BatchNormalization with its running statistics, then folded into the layer before
it), never its training graph, so the batch size only sets the blob's batch
(int8pack.py, artifacts.eval_graph). Each model is packed by the one command in the
classifier and the sparse configuration and trained by the device runtime; the int8 model
(onnxruntime running model_qdq.onnx) is checked against torch float64 in eval mode, and the
packs at batch 1 and 2 against each other (the same folded weights and ranges)."""
import numpy as np
import onnx
import pytest
import torch
from torch import nn

from conftest import ROOT, run_micropython
from microtrain import CheckpointState, Module, Optimizer
from microtrain_host.quant.inttrain import quantize_input
from mlperf_tiny import _settle, ad_autoencoder
from test_int8_pack import output_scale, pack, run_qdq
from torch_reference import export

pytest.importorskip("onnxruntime")
SAMPLES = 32


class GemmBatchNorm(nn.Module):
    """12 -> 16 -> 8 Gemms, each with BatchNorm1d + ReLU, and a 4-class classifier."""

    def __init__(self):
        super().__init__()
        self.layers = nn.Sequential(nn.Linear(12, 16), nn.BatchNorm1d(16), nn.ReLU(),
                                    nn.Linear(16, 8), nn.BatchNorm1d(8), nn.ReLU(),
                                    nn.Linear(8, 4))

    def forward(self, x):
        return self.layers(x)


class Conv1dBatchNorm(nn.Module):
    """3 x 9 windows: Conv1d(k 3) -> 8 x 7, Conv1d(k 7) -> 8 x 1, each with BatchNorm1d +
    ReLU (the second's one position: one value per channel at batch 1), a 4-class Gemm."""

    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(nn.Conv1d(3, 8, 3), nn.BatchNorm1d(8), nn.ReLU(),
                                      nn.Conv1d(8, 8, 7), nn.BatchNorm1d(8), nn.ReLU())
        self.classifier = nn.Linear(8, 4)

    def forward(self, x):
        return self.classifier(torch.flatten(self.features(x), 1))


def _small(build, shape, seed):
    torch.manual_seed(seed)
    return _settle(build(), shape), shape


# name -> (torch module (eval mode, running statistics set), one sample's shape)
MODELS = {
    "gemm_bn1d": lambda: _small(GemmBatchNorm, (12,), 41),
    "conv1d_bn1d": lambda: _small(Conv1dBatchNorm, (3, 9), 42),
    "ad_autoencoder": lambda: (ad_autoencoder().module, (640,)),
    # a BatchNorm1d no Gemm comes right before (it stays a float op of the frozen part) and
    # one after the classifier (folded into it)
    "bn1d_after_relu": lambda: _small(lambda: nn.Sequential(
        nn.Linear(12, 8), nn.ReLU(), nn.BatchNorm1d(8), nn.Linear(8, 4)), (12,), 43),
    "bn1d_last": lambda: _small(lambda: nn.Sequential(
        nn.Linear(12, 8), nn.ReLU(), nn.Linear(8, 4), nn.BatchNorm1d(4)), (12,), 44),
}
# the options of each configuration: the classifier (the last Gemm) and the sparse update
CONFIGS = {"classifier": (), "sparse": ("--train-biases", "--train-last", 2)}
# every configuration the pack accepts (bn1d_after_relu has one layer the integer backward
# can reach: the classifier, --train-last 2 is refused at any batch)
CASES = [(name, config) for name in MODELS for config in CONFIGS
         if (name, config) != ("bn1d_after_relu", "sparse")]
MSE = ("--loss", "mse", "--target-is-input", "--lr", 0.5)
# output quanta the int8 model (onnxruntime, QDQ) may lie from torch float64 in eval mode
# (measured, either configuration: gemm_bn1d 0.88, conv1d_bn1d 1.36, ad_autoencoder 0.97,
# bn1d_after_relu 1.83, bn1d_last 1.85)
QUANTA = 2


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """model(name): (name, ONNX path, calibration .npz, samples, torch float64 eval outputs,
    pack options), made once per name."""
    made = {}

    def model(name):
        if name not in made:
            made[name] = _model(name, tmp_path_factory.mktemp(name))
        return made[name]
    return model


def _model(name, tmp):
    module, shape = MODELS[name]()
    # exported in training mode (BatchNormalization with training_mode = 1), which torch
    # traces at batch 2; the ONNX batch is dynamic. The export's trace moves the running
    # statistics, so the oracle is taken after it (it then equals the ONNX initializers).
    onnx.save(export(module, torch.zeros((2,) + shape)), str(tmp / "model.onnx"))
    x = np.random.default_rng(7).standard_normal((SAMPLES,) + shape).astype(np.float32)
    np.savez(tmp / "data.npz", x_train=x)
    with torch.no_grad():
        expected = module.eval().double()(torch.tensor(x, dtype=torch.float64)).numpy()
    options = MSE if name == "ad_autoencoder" else ()
    return name, tmp / "model.onnx", tmp / "data.npz", x, expected, options


def device_losses(info, x, y, steps=3):
    """Losses of `steps` device train steps on the first sample (x alone: an autoencoder)."""
    module = Module(info["blob"], CheckpointState.load_checkpoint(info["checkpoint"]))
    optimizer = Optimizer(info["blob"], module)
    xq = quantize_input(x[:1], info).reshape(-1).tolist()
    losses = []
    for _ in range(steps):
        losses.append(module(xq) if y is None else module(xq, [int(y[0])]))
        optimizer.step()
    return losses


@pytest.mark.parametrize("name,config", CASES)
def test_batch_one_packs_trains_and_stays_close_to_float(models, name, config, tmp_path):
    name, path, data, x, expected, options = models(name)
    info = pack(path, tmp_path, data, "--batch-size", 1, *options, *CONFIGS[config])
    assert info["batch_size"] == 1 and info["input_shape"][0] == 1
    assert len(info["parameters"]) > (2 if config == "sparse" else 1)
    quantum = output_scale(info["qdq_model"])
    worst = float(np.abs(run_qdq(info, x) - expected).max()) / quantum
    y = None if options else expected.argmax(1)
    losses = device_losses(info, x, y)
    print(f"{name} {config} at batch 1: int8 (onnxruntime) within {worst:.2f} output quanta "
          f"of torch float64 in eval mode; device losses {losses}")
    assert worst <= QUANTA
    assert all(np.isfinite(losses)) and losses[-1] < losses[0], losses


def _initializers(path):
    return {i.name: onnx.numpy_helper.to_array(i) for i in onnx.load(str(path)).graph.initializer}


@pytest.mark.parametrize("name", list(MODELS))
def test_calibration_does_not_depend_on_the_batch(models, name, tmp_path):
    # the packs at batch 1 and 2 quantize the same folded weights with the same ranges:
    # equal QDQ initializers (int8 weights, int32 biases, every scale and zero point) and
    # equal integer checkpoints
    name, path, data, x, expected, options = models(name)
    one = pack(path, tmp_path / "one", data, "--batch-size", 1, *options)
    two = pack(path, tmp_path / "two", data, "--batch-size", 2, *options)
    assert two["batch_size"] == 2
    a, b = _initializers(one["qdq_model"]), _initializers(two["qdq_model"])
    assert sorted(a) == sorted(b)
    for key in a:
        assert a[key].dtype == b[key].dtype and np.array_equal(a[key], b[key]), key
    assert open(one["checkpoint"], "rb").read() == open(two["checkpoint"], "rb").read()
    for key in ("input_scale", "input_zero_point"):
        assert one[key] == two[key]


def test_ad_autoencoder_batch_one_sparse_trains_on_micropython(micropython, tmp_path):
    # the sparse update at batch 1 on MicroPython (viper kernels, each step under
    # heap_lock): the trained checkpoint's loss on the sample below the packed one's
    module = ad_autoencoder().module
    onnx.save(export(module, torch.zeros((2, 640))), str(tmp_path / "ad.onnx"))
    x = np.random.default_rng(8).standard_normal((SAMPLES, 640)).astype(np.float32)
    np.savez(tmp_path / "data.npz", x_train=x)
    info = pack(tmp_path / "ad.onnx", tmp_path / "int8", tmp_path / "data.npz",
                "--batch-size", 1, *MSE, *CONFIGS["sparse"])
    xq = quantize_input(x[:1], info)
    (tmp_path / "data.bin").write_bytes(xq.tobytes())
    out = run_micropython(micropython, ROOT / "tests" / "device_scripts" /
                          "inttrain_steps.py", info["blob"], info["checkpoint"],
                          tmp_path / "data.bin", 3, "fast", tmp_path / "out.ckpt",
                          heap="64M")
    assert out.startswith("locked True viper True"), out[:200]

    def loss(checkpoint):
        m = Module(info["blob"], CheckpointState.load_checkpoint(str(checkpoint)))
        m.eval()
        return m(xq.reshape(-1).tolist())[0]

    start, end = loss(info["checkpoint"]), loss(tmp_path / "out.ckpt")
    print(f"AD autoencoder, sparse update at batch 1: 3 integer steps on MicroPython, loss "
          f"{start:.4f} -> {end:.4f}")
    assert np.isfinite(end) and end < start
