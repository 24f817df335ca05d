"""Issue 22's accuracy acceptance: integer training (pack --int8, trained by the device
runtime) against float32 training of the same parameters, same start, same data, epochs,
batches, sample order and SGD learning rate; accuracy on held-out synthetic data, and the
autoencoder's anomaly AUC.

    python3 bench/int8_accuracy.py [--models mlp,imu_1d] [--configs classifier,sparse]
        [--train 256] [--test 8192] [--epochs 3] [--lr 0.01] [--batch 8]
        [--runtime cpython|micropython] [--micropython BIN] [--pretrain-steps 300]

The models and their data are tests/int8_acceptance_models.py's. For each model:
* Start: the float model as built (random init, BatchNorm statistics settled; the
  keyword-spotting DS-CNN: examples/kws's pretrained file, BatchNorm folded), first
  pretrained in torch (Adam, BatchNorm in train mode, every parameter) so that its
  features are informative: a classifier on a *different* synthetic task (the same
  model's generator under another name: other class templates; another seed;
  MobileNetV1-0.25, 2 classes: 16 templates through a temporary 16-output classifier, see
  PRETRAIN_CLASSES), the autoencoder on normal samples of its own task drawn with another
  seed (an anomaly detector is pretrained on normal data, then fine-tuned on the device
  on new normal data). Both runs start from this one float model.
* Float32 baseline: torch float32, torch.optim.SGD at the same lr (default: pack --int8's
  default, 0.01; at 0.05 float SGD grows weights far past the +-127 quanta of the scales
  the pack calibrated, where the int8 weights stop) on the same parameter
  set, with every BatchNorm folded into the convolution / Gemm before it by torch's own
  fuse_conv_bn_eval / fuse_linear_bn_eval. That is BatchNorm in eval mode (no batch
  statistics updated) and exactly the parameters the integer path trains: pack --int8
  folds BN with its running statistics too, and trains the folded weights and biases
  (BN's own gamma / beta, or a conv weight before an unfolded BN, would be another
  parameterization with other SGD steps). Torch, not microtrain's float pack: an oracle
  nobody here wrote, and seconds instead of hours for the MLPerf Tiny models.
* Integer: pack_int8 calibrated on the training samples, the parameter set
  (classifier: the last Gemm; sparse: --train-biases --train-last sparse_last) read from
  its int8.json and given to the float run by name; trained and evaluated by the device
  runtime (int8_accuracy_device.py: Module, the latent cache for blobs with a frozen prefix, the
  eval program's logits), under CPython by default; `--runtime micropython` runs the same
  script on the MicroPython Unix port (viper kernels, which the test suite checks
  bit-identical to the pure-Python ones CPython runs) because CPython takes 3-10 s per
  sample for ResNet-8 and MobileNetV1.
* Accuracy: argmax of the logits on the held-out samples. Autoencoder: trained (last Gemm,
  MSE on its own input) on normal samples; score = reconstruction MSE against the float
  input on held-out normal + anomalous samples; AUC by the rank formula (auc() below),
  cross-checked against sklearn's roc_auc_score if installed, else scipy's Mann-Whitney U.
Bounds (issue 22): |int - float| <= 2 points for a classifier, <= 0.02 AUC."""
import argparse
import copy
import dataclasses
import os
import pathlib
import subprocess
import sys
import tempfile
import time

import numpy as np
import onnx
import torch
from torch import nn

ROOT = pathlib.Path(__file__).resolve().parents[1]
for _p in (ROOT / "host", ROOT / "device", ROOT / "tests"):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))

from int8_acceptance_models import ACCEPTANCE_MODELS, KWS_ONNX, synthetic  # noqa: E402
from microtrain_host.int8pack import DEFAULT_LEARNING_RATE, pack_int8  # noqa: E402
from microtrain_host.ops.inttrain import LOGIT_BITS  # noqa: E402
from microtrain_host.quant.inttrain import quantize_input  # noqa: E402
from torch_reference import export  # noqa: E402

DEVICE_SCRIPT = pathlib.Path(__file__).with_name("int8_accuracy_device.py")
CONFIGS = ("classifier", "sparse")
ACCURACY_BOUND, AUC_BOUND = 2.0, 0.02
TRAIN_SEED, TEST_SEED, PRETRAIN_SEED = 1, 2, 3
# synthetic()'s noise per model, so that float32 training lands neither at chance nor at
# 100 % (a wide input averages the noise out: the IMU's 384 values, the image nets')
NOISE = {"imu_1d": 3.0, "conv_flatten_gemm": 2.0}
# pretraining tasks with more templates than the model has classes: MobileNetV1-0.25's 2
# classes. Pretrained on 2 other templates, its 256 pooled features fit those two and no
# longer separate the target's (measured at 300 steps: a logistic regression on them 59.6 %
# held-out, float32 SGD of the classifier at lr 0.01 52.3 %, chance 50 %); pretrained on 16
# templates they stay general (float32 SGD 71.7 %).
PRETRAIN_CLASSES = {"mobilenet_v1_025": 16}
# the paired bootstrap of int - float (paired_interval): resamples and its generator's seed
BOOTSTRAP_RESAMPLES, BOOTSTRAP_SEED = 2000, 5


# ---------------------------------------------------------------- the starting float model

def kws_float_model():
    """examples/kws/ds_cnn_kws.onnx (BatchNorm already folded) as a torch module, its
    weights read from the ONNX initializers by name."""
    sys.path.insert(0, str(ROOT / "examples" / "kws"))
    from pretrain import DSCNN, FoldedDSCNN
    module = FoldedDSCNN(DSCNN())
    weights = {i.name: torch.from_numpy(onnx.numpy_helper.to_array(i).copy())
               for i in onnx.load(str(KWS_ONNX)).graph.initializer}
    module.load_state_dict(weights)
    return module.eval()


def pretrain(spec, module, steps, batch=32, lr=1e-3):
    """Every parameter, Adam, BatchNorm in train mode, on another task of the same shape
    (the autoencoder: its normal samples, another seed). With PRETRAIN_CLASSES, on that many
    templates through a temporary classifier of as many outputs; the model's own
    classifier, untouched, is put back afterwards."""
    classes = PRETRAIN_CLASSES.get(spec.name, spec.classes)
    other = spec if spec.loss == "MSELoss" else dataclasses.replace(
        spec, name=spec.name + "-pretraining", classes=classes)
    x, y = synthetic(other, steps * batch, PRETRAIN_SEED, noise=NOISE.get(spec.name, 1.0))
    x, y = torch.from_numpy(x), torch.from_numpy(y)
    torch.manual_seed(PRETRAIN_SEED)
    head = module.classifier if classes != spec.classes else None
    if head is not None:
        module.classifier = nn.Linear(head.in_features, classes)
    optimizer = torch.optim.Adam(module.parameters(), lr=lr)
    module.train()
    for s in range(steps):
        xb, yb = x[s * batch:(s + 1) * batch], y[s * batch:(s + 1) * batch]
        optimizer.zero_grad()
        out = module(xb)
        loss = (nn.functional.mse_loss(out, xb) if spec.loss == "MSELoss" else
                nn.functional.cross_entropy(out, yb))
        loss.backward()
        optimizer.step()
    if head is not None:
        module.classifier = head
    return module.eval()


def start_model(name, batch, pretrain_steps):
    """(the starting float module, eval mode, BatchNorm unfolded; its ONNX file's model)."""
    spec = ACCEPTANCE_MODELS[name]
    module = kws_float_model() if spec.onnx is not None else spec.build(batch=batch).module
    if pretrain_steps:
        module = pretrain(spec, module, pretrain_steps)
    return module, export(module, torch.zeros((batch,) + spec.inputs))


def fold_batch_norms(module):
    """A copy with every BatchNorm that follows a Conv / Linear in a Sequential folded into
    it (torch's fusion helpers) and replaced by Identity: parameter names stay the
    convolution's, as in the integer pack."""
    module = copy.deepcopy(module).eval()
    for seq in [m for m in module.modules() if isinstance(m, nn.Sequential)]:
        for i in range(len(seq) - 1):
            layer, norm = seq[i], seq[i + 1]
            if isinstance(norm, nn.modules.batchnorm._BatchNorm):
                if isinstance(layer, nn.modules.conv._ConvNd):
                    seq[i] = torch.nn.utils.fusion.fuse_conv_bn_eval(layer, norm)
                elif isinstance(layer, nn.Linear):
                    seq[i] = torch.nn.utils.fusion.fuse_linear_bn_eval(layer, norm)
                else:
                    raise ValueError(f"a BatchNorm after {type(layer).__name__}")
                seq[i + 1] = nn.Identity()
    left = [n for n, m in module.named_modules()
            if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    if left:
        raise ValueError(f"BatchNorm not folded: {left}")
    return module


# ---------------------------------------------------------------- data, order, metrics

def data(name, train, test):
    """(x_train, y_train, x_test, y_test): the autoencoder trains on normal samples and is
    tested on normal + anomalous ones (y 1)."""
    spec = ACCEPTANCE_MODELS[name]
    noise = NOISE.get(name, 1.0)
    x, y = synthetic(spec, train, TRAIN_SEED, noise)
    xt, yt = synthetic(spec, test, TEST_SEED, noise, anomalies=spec.loss == "MSELoss")
    return x, y, xt, yt


def batch_order(batches, epochs, seed=4):
    """The batch index of every step: each epoch a permutation of the fixed batches."""
    rng = np.random.default_rng(seed)
    return np.concatenate([rng.permutation(batches) for _ in range(epochs)])


def auc(scores, labels):
    """Area under the ROC curve of scores for labels 1 against 0: the Mann-Whitney
    statistic from the ranks (ties get their average rank) over n1 * n0."""
    scores, labels = np.asarray(scores, np.float64), np.asarray(labels)
    order = np.argsort(scores, kind="stable")
    ranks = np.empty(len(scores))
    sorted_scores = scores[order]
    start = 0
    while start < len(scores):
        end = start
        while end + 1 < len(scores) and sorted_scores[end + 1] == sorted_scores[start]:
            end += 1
        ranks[order[start:end + 1]] = (start + end) / 2 + 1     # 1-based average rank
        start = end + 1
    positive = labels == 1
    n1, n0 = int(positive.sum()), int((~positive).sum())
    return float((ranks[positive].sum() - n1 * (n1 + 1) / 2) / (n1 * n0))


def reference_auc(scores, labels):
    """sklearn's roc_auc_score, else scipy's Mann-Whitney U / (n1 n0); None without both."""
    try:
        from sklearn.metrics import roc_auc_score
        return float(roc_auc_score(labels, scores))
    except ImportError:
        pass
    try:
        from scipy.stats import mannwhitneyu
    except ImportError:
        return None
    scores, labels = np.asarray(scores), np.asarray(labels)
    u = mannwhitneyu(scores[labels == 1], scores[labels == 0]).statistic
    return float(u / ((labels == 1).sum() * (labels == 0).sum()))


def score(spec, outputs, x, y):
    """Accuracy in percent, or (autoencoder) the anomaly AUC of the reconstruction MSE."""
    if spec.loss == "MSELoss":
        return auc(reconstruction_error(outputs, x), y)
    return 100.0 * float((outputs.argmax(1) == y).mean())


def reconstruction_error(outputs, x):
    return ((outputs.reshape(len(x), -1) - x.reshape(len(x), -1)) ** 2).mean(1)


def paired_interval(spec, float_out, int_out, x, y, resamples=BOOTSTRAP_RESAMPLES,
                    seed=BOOTSTRAP_SEED):
    """The paired bootstrap's 95 % percentile interval of score(int) - score(float): the
    held-out samples drawn with replacement, the same draw scoring both runs, so that what
    the two get right or wrong together cancels (the difference's noise is that of the
    samples they disagree on). It measures the held-out sampling's noise only, not the
    training's (another seed of the stochastic rounding)."""
    draws = np.random.default_rng(seed).integers(0, len(y), (resamples, len(y)))
    if spec.loss == "MSELoss":
        float_err = reconstruction_error(float_out, x)
        int_err = reconstruction_error(int_out, x)
        differences = np.array([auc(int_err[d], y[d]) - auc(float_err[d], y[d])
                                for d in draws])
    else:
        hits = ((int_out.argmax(1) == y).astype(np.float64)
                - (float_out.argmax(1) == y).astype(np.float64))
        differences = 100.0 * hits[draws].mean(1)
    low, high = np.percentile(differences, [2.5, 97.5])
    return float(low), float(high)


# ---------------------------------------------------------------- the two trainings

def float_training(spec, module, parameters, x, y, order, batch, lr, clamp=None):
    """torch float32 SGD of `parameters` (names) of the BN-folded module over the batches in
    `order`; returns the held-out outputs function. clamp: (weight name, per-row scales):
    after every step that weight is clamped to +-127 of its row's scale, as the integer
    classifier's int8 weight is (a diagnosis: the float run with the integer's range)."""
    folded = fold_batch_norms(module)
    named = dict(folded.named_parameters())
    missing = sorted(set(parameters) - set(named))
    if missing:
        raise ValueError(f"{spec.name}: the integer pack trains {missing}, which the folded "
                         f"float model does not have")
    for n, p in named.items():
        p.requires_grad_(n in parameters)
    optimizer = torch.optim.SGD([named[n] for n in parameters], lr=lr)
    xt, yt = torch.from_numpy(x), torch.from_numpy(y)
    for s in order:
        xb, yb = xt[s * batch:(s + 1) * batch], yt[s * batch:(s + 1) * batch]
        optimizer.zero_grad()
        out = folded(xb)
        loss = (nn.functional.mse_loss(out, xb) if spec.loss == "MSELoss" else
                nn.functional.cross_entropy(out, yb))
        loss.backward()
        optimizer.step()
        if clamp is not None:
            with torch.no_grad():
                limit = 127 * torch.tensor(clamp[1], dtype=torch.float32)[:, None]
                weight = named[clamp[0]]
                weight.copy_(torch.maximum(torch.minimum(weight, limit), -limit))

    def outputs(samples):
        with torch.no_grad():
            return folded(torch.from_numpy(samples)).numpy()
    return outputs


def records(info, x, y, with_labels):
    m = info["batch_size"]
    return b"".join(quantize_input(x[i:i + m], info).tobytes()
                    + (np.asarray(y[i:i + m], "<i4").tobytes() if with_labels else b"")
                    for i in range(0, len(x) - len(x) % m, m))


def saturated_weights(info, checkpoint):
    """The share of the trained int8 weights at the clamp (+-127) after training."""
    from microtrain import CheckpointState
    params = CheckpointState.load_checkpoint(str(checkpoint)).parameters
    at_clamp = total = 0
    for name in info["parameters"]:
        if params[name].data_type == 3:      # ONNX INT8: a weight (biases are int32)
            w = np.frombuffer(bytes(params[name].data), np.int8)
            at_clamp += int((np.abs(w.astype(np.int32)) == 127).sum())
            total += len(w)
    return at_clamp / total


def run_device(runtime, micropython, *args):
    env = dict(os.environ)
    if runtime == "micropython":
        env["MICROPYPATH"] = str(ROOT / "device")
        command = [micropython, "-X", "heapsize=256M"]
    else:
        env["PYTHONPATH"] = str(ROOT / "device")
        command = [sys.executable]
    proc = subprocess.run(command + [str(DEVICE_SCRIPT)] + [str(a) for a in args],
                          capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"{runtime} failed:\n{proc.stdout}\n{proc.stderr}")
    return proc.stdout


def integer_training(spec, onnx_path, work, config, x, y, xt, yt, order, batch, lr,
                     runtime="cpython", micropython=None):
    """pack_int8 calibrated on x, trained and evaluated by the device runtime: (info, the
    held-out outputs as floats [samples, outputs], the device's epoch lines)."""
    np.savez(work / "calibration.npz", x_train=x)
    options = dict(train_biases=True, train_last=spec.sparse_last) if config == "sparse" else {}
    mse = spec.loss == "MSELoss"
    if mse:
        options.update(loss="mse", target="input")
    info = pack_int8(onnx_path, work / config, calibration=work / "calibration.npz",
                     batch_size=batch, learning_rate=lr, **options)
    (work / "train.bin").write_bytes(records(info, x, y, not mse))
    (work / "eval.bin").write_bytes(records(info, xt, yt, not mse))
    (work / "order.bin").write_bytes(np.asarray(order, "<u2").tobytes())
    # the latent cache wherever the pack found a frozen prefix (the classifier config, the
    # autoencoder's last Gemm too: its input is kept as its target); the same run bit for bit
    from microtrain import parser as device_blob_parser
    cut = device_blob_parser.load(info["blob"]).programs["train"].latent_from
    mode = "cache" if cut else "plain"
    out = run_device(runtime, micropython, info["blob"], info["checkpoint"],
                     work / "train.bin", work / "order.bin", work / "eval.bin",
                     work / "out.bin", mode, work / "trained.ckpt")
    info["saturated"] = saturated_weights(info, work / "trained.ckpt")
    outputs = np.frombuffer((work / "out.bin").read_bytes(), "<i4") / 2.0 ** LOGIT_BITS
    return info, outputs.reshape(len(xt) - len(xt) % batch, -1), out.splitlines()


def compare(name, config, train=256, test=8192, epochs=3, lr=DEFAULT_LEARNING_RATE,
            batch=8, pretrain_steps=300, runtime="cpython", micropython=None, work=None):
    """One row of the table: a dict with the float and integer figures."""
    if train % batch or test % batch:
        raise ValueError("--train and --test must be multiples of --batch")
    # (torch's thread pool on a loaded 2-core machine makes a tiny model's step 100x slower)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _compare(name, config, train, test, epochs, lr, batch, pretrain_steps, runtime,
                        micropython, work)
    finally:
        torch.set_num_threads(threads)


def _compare(name, config, train, test, epochs, lr, batch, pretrain_steps, runtime,
             micropython, work):
    spec = ACCEPTANCE_MODELS[name]
    clock = time.time()
    module, onnx_model = start_model(name, batch, pretrain_steps)
    x, y, xt, yt = data(name, train, test)
    order = batch_order(train // batch, epochs)
    with tempfile.TemporaryDirectory() as scratch:
        work = pathlib.Path(work or scratch)
        work.mkdir(parents=True, exist_ok=True)
        onnx.save(onnx_model, work / "model.onnx")
        info, int_out, lines = integer_training(spec, work / "model.onnx", work, config, x, y,
                                                xt, yt, order, batch, lr, runtime,
                                                micropython)
    before = score(spec, fold_batch_norms(module)(torch.from_numpy(xt)).detach().numpy(),
                   xt, yt)
    float_out = float_training(spec, module, info["parameters"], x, y, order, batch, lr)(xt)
    row = dict(model=name, config=config, parameters=len(info["parameters"]),
               saturated=info["saturated"],
               float=score(spec, float_out, xt, yt), int=score(spec, int_out, xt, yt),
               before=before, epochs_loss=lines, seconds=time.time() - clock,
               metric="AUC" if spec.loss == "MSELoss" else "accuracy %")
    if spec.loss == "MSELoss":
        row["reference_auc"] = (reference_auc(reconstruction_error(float_out, xt), yt),
                                reference_auc(reconstruction_error(int_out, xt), yt))
    clamped = float_training(spec, module, info["parameters"], x, y, order, batch, lr,
                             clamp=(info["weight"], info["weight_scales"]))(xt)
    row["float_clamped"] = score(spec, clamped, xt, yt)
    row["difference"] = row["int"] - row["float"]
    row["interval"] = paired_interval(spec, float_out, int_out, xt, yt)
    row["bound"] = AUC_BOUND if spec.loss == "MSELoss" else ACCURACY_BOUND
    row["passes"] = abs(row["difference"]) <= row["bound"]
    return row


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--models", default=",".join(ACCEPTANCE_MODELS))
    p.add_argument("--configs", default=",".join(CONFIGS))
    p.add_argument("--train", type=int, default=256)
    p.add_argument("--test", type=int, default=8192)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--lr", type=float, default=DEFAULT_LEARNING_RATE,
                   help="SGD learning rate of both runs; default pack --int8's own, "
                        f"{DEFAULT_LEARNING_RATE} (at 0.05 float SGD grows weights past the "
                        "+-127 quanta the pack calibrated, where the int8 weights stop)")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--pretrain-steps", type=int, default=300)
    p.add_argument("--runtime", choices=("cpython", "micropython"), default="cpython")
    p.add_argument("--micropython", default=os.environ.get(
        "MICROTRAIN_MICROPYTHON", str(ROOT / ".cache" / "micropython" / "micropython")))
    a = p.parse_args(argv)
    print(f"train {a.train}, held-out {a.test}, {a.epochs} epochs, SGD lr {a.lr}, batch "
          f"{a.batch}, pretraining {a.pretrain_steps} steps, integer runtime {a.runtime}",
          flush=True)
    print("| model | config | trained tensors | metric | before | float32 | integer | "
          "int - float | paired 95 % interval | within bound | int8 weights at +-127 | "
          "float32, last Gemm clamped to +-127 quanta | seconds |")
    print("|---|---|---:|---|---:|---:|---:|---:|---|---|---:|---:|---:|")
    for name in a.models.split(","):
        for config in a.configs.split(","):
            try:
                r = compare(name, config, a.train, a.test, a.epochs, a.lr, a.batch,
                            a.pretrain_steps, a.runtime, a.micropython)
            except Exception as e:      # a refused configuration is a row, not the end
                print(f"| {name} | {config} | - | - | - | - | - | - | - | refused: "
                      f"{str(e).splitlines()[0][:160]} | - | - | - |", flush=True)
                continue
            digits = 4 if r["metric"] == "AUC" else 2
            print(f"| {name} | {config} | {r['parameters']} | {r['metric']} | "
                  f"{r['before']:.{digits}f} | {r['float']:.{digits}f} | {r['int']:.{digits}f} | "
                  f"{r['difference']:+.{digits}f} | [{r['interval'][0]:+.{digits}f}, "
                  f"{r['interval'][1]:+.{digits}f}] | {'yes' if r['passes'] else 'NO'} "
                  f"(±{r['bound']}) | "
                  f"{100 * r['saturated']:.1f} % | {r['float_clamped']:.{digits}f} | "
                  f"{r['seconds']:.0f} |", flush=True)
            extra = f"  reference AUC (float, int): {r['reference_auc']}" \
                if "reference_auc" in r else ""
            print(f"    device: {'; '.join(r['epochs_loss'])}{extra}", flush=True)


if __name__ == "__main__":
    main()
