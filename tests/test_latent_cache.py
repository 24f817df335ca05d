"""Issue 22 scope 5, the latent cache (device latent.py): a classifier-only integer training
run keeps the frozen backbone's int8 features of each batch the first time it trains it,
and later epochs run only the classifier's steps on them. The parameters end bit for bit as
without the cache (CPython and the MicroPython Unix port; the cache in RAM and in a file),
and the work of 6 epochs of the KWS DS-CNN's personalisation, counted in MACs off the
packed steps, is within 1.3x of one epoch of forward passes."""
import subprocess
import sys

import numpy as np
import pytest

from conftest import DEVICE, ROOT, run_micropython
from int8_acceptance_run import LEARNING_RATES, loss_options, prepare, records
from microtrain import CheckpointState, Module
from microtrain import parser as device_blob_parser
from microtrain.errors import BlobError, InputError
from microtrain.latent import LatentCache
from microtrain_host.contract.ops import BY_CODE
from microtrain_host.int8pack import pack_int8
from microtrain_host.quant.inttrain import quantize_input
from microtrain_host.tools.step_cost import MACS

DIGITS = ROOT / "examples" / "digits"
KWS = ROOT / "examples" / "kws" / "ds_cnn_kws.onnx"
SCRIPT = ROOT / "tests" / "device_scripts" / "latent_cache.py"


def _records(info, x, y, batches):
    m = info["batch_size"]
    return b"".join(quantize_input(x[i * m:(i + 1) * m], info).tobytes()
                    + np.asarray(y[i * m:(i + 1) * m], "<i4").tobytes()
                    for i in range(batches))


@pytest.fixture(scope="module")
def digits(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("latent_digits")
    info = pack_int8(DIGITS / "mlp.onnx", tmp / "int8", calibration=DIGITS / "digits.npz",
                     batch_size=8, learning_rate=0.05)
    data = np.load(DIGITS / "digits.npz")
    return tmp, info, data["x_train"], data["y_train"]


def _run(info, x, y, batches, epochs, mode, tmp):
    state = CheckpointState.load_checkpoint(info["checkpoint"])
    model = Module(info["blob"], state)
    m = info["batch_size"]
    cache = None if mode == "plain" else LatentCache(
        model, batches, str(tmp / "cache.bin") if mode == "file" else None)
    losses = []
    for epoch in range(epochs):
        for s in range(batches):
            xs = quantize_input(x[s * m:(s + 1) * m], info).reshape(-1).tolist()
            ys = [int(v) for v in y[s * m:(s + 1) * m]]
            losses.append(model(xs, ys) if cache is None else
                          cache.step(s, xs if epoch == 0 else None, ys))
    CheckpointState.save_checkpoint(state, str(tmp / mode))
    return losses, (tmp / mode).read_bytes()


def test_cached_training_equals_uncached_on_cpython(digits, tmp_path):
    tmp, info, x, y = digits
    plain = _run(info, x, y, 6, 4, "plain", tmp_path)
    assert plain == _run(info, x, y, 6, 4, "ram", tmp_path)
    assert plain == _run(info, x, y, 6, 4, "file", tmp_path)
    assert plain[0][-6:] != plain[0][:6]          # it trained


def test_cached_training_equals_uncached_on_micropython(digits, micropython, tmp_path):
    tmp, info, x, y = digits
    (tmp_path / "data.bin").write_bytes(_records(info, x, y, 5))
    outs = {mode: run_micropython(micropython, SCRIPT, info["blob"], info["checkpoint"],
                                  tmp_path / "data.bin", 5, 4, mode, tmp_path / mode)
            for mode in ("plain", "ram", "file")}
    epochs = lambda out: [line for line in out.splitlines() if line.startswith("epoch")]  # noqa: E731
    assert epochs(outs["plain"]) == epochs(outs["ram"]) == epochs(outs["file"])
    assert "cache bytes %d" % (5 * (8 * info["features"] + 4 * 8)) in outs["ram"]
    assert ((tmp_path / "plain").read_bytes() == (tmp_path / "ram").read_bytes()
            == (tmp_path / "file").read_bytes())


def test_a_blob_that_trains_more_than_its_classifier_is_refused(digits, tmp_path):
    tmp, info, x, y = digits
    deeper = pack_int8(DIGITS / "mlp.onnx", tmp_path / "int8", calibration=DIGITS /
                       "digits.npz", batch_size=8, learning_rate=0.05, train_last=2)
    model = Module(deeper["blob"], CheckpointState.load_checkpoint(deeper["checkpoint"]))
    with pytest.raises(InputError, match="trained layers all come after frozen ones"):
        LatentCache(model, 4)
    model = Module(info["blob"], CheckpointState.load_checkpoint(info["checkpoint"]))
    record = 8 * (info["features"] + 4)                 # a batch of 8: codes, int32 labels
    with pytest.raises(InputError, match=f"takes {3 * record} bytes in RAM, more than the "
                                         f"{3 * record - 1} allowed: keep it in a file"):
        LatentCache(model, 3, max_bytes=3 * record - 1)
    assert LatentCache(model, 3, max_bytes=3 * record).bytes == 3 * record
    assert LatentCache(model, 3, str(tmp_path / "f"), max_bytes=1).bytes == 3 * record
    cache = LatentCache(model, 2)
    with pytest.raises(InputError, match="never trained with its input"):
        cache.step(1, None, [0] * 8)
    with pytest.raises(InputError, match="outside the cache's 2 batches"):
        cache.step(2, None, [0] * 8)
    # a crafted blob's cut or kept tensors are checked before the cache uses them
    train = model.blob.programs["train"]
    good = train.latent_from, train.latent
    b = model.blob
    weights = [t for t in range(len(b.names)) if t in b.in_place]
    for cut, kept, reason in ((len(train.steps), good[1], "starts at step 4 of 4"),
                              (good[0], (len(b.names),), "int8 or int32 tensor"),
                              (good[0], weights[:1], "int8 or int32 tensor")):
        train.latent_from, train.latent = cut, kept
        with pytest.raises(BlobError, match=reason):
            LatentCache(model, 1)
    train.latent_from, train.latent = good


def _macs(records):
    total = 0
    for op, _, ints, _ in records:
        spec = BY_CODE.get(op)
        if spec is not None and spec.name in MACS:
            total += MACS[spec.name](dict(zip(spec.ints, ints)))[1]
    return total


def test_kws_personalisation_work_with_the_cache(micropython, tmp_path):
    """The KWS DS-CNN (MLPerf Tiny size, batch 1) personalised in integers, classifier only:
    6 epochs with the cache against one epoch of forward passes, in MACs; and the cached run
    on MicroPython equals the uncached one."""
    x = np.random.default_rng(2).standard_normal((6, 1, 49, 10)).astype(np.float32)
    np.savez(tmp_path / "data.npz", x_train=x)
    info = pack_int8(KWS, tmp_path / "int8", calibration=tmp_path / "data.npz", batch_size=1,
                     learning_rate=0.05)
    b = device_blob_parser.load(info["blob"], keep_steps=True)
    train = b.step_records["train"]
    start = b.programs["train"].latent_from          # the classifier's first step
    assert BY_CODE[train[start][0]].name == "INT_GEMM_LOGITS"
    prefix, suffix = _macs(train[:start]), _macs(train[start:])
    forward = _macs(b.step_records["eval"])
    samples, epochs = 4, 6
    ratio = (samples * (prefix + suffix) + (epochs - 1) * samples * suffix) / (samples * forward)
    uncached = epochs * samples * (prefix + suffix) / (samples * forward)
    print(f"KWS int8 last, {epochs} epochs: {ratio:.3f}x the MACs of one epoch of forward "
          f"passes with the latent cache ({uncached:.2f}x without); per sample: backbone "
          f"{prefix:,} MACs, classifier step {suffix:,}")
    assert ratio <= 1.3 and prefix > 100 * suffix
    from microtrain_host.tools.inspect import describe
    assert f"latent cache     {64 + 4:8d}  bytes per training batch" in describe(
        info["blob"], steps=False)
    (tmp_path / "data.bin").write_bytes(_records(info, x, np.arange(6) % info["classes"],
                                                 samples))
    outs = {mode: run_micropython(micropython, SCRIPT, info["blob"], info["checkpoint"],
                                  tmp_path / "data.bin", samples, epochs, mode,
                                  tmp_path / mode)
            for mode in ("plain", "file")}
    assert outs["plain"].splitlines()[:epochs] == outs["file"].splitlines()[:epochs]
    assert (tmp_path / "plain").read_bytes() == (tmp_path / "file").read_bytes()


# (model, --train-last N): a frozen prefix before a trained block, without --train-biases.
# The cache keeps what the pack found alive across the cut: one int8 tensor and the labels
# for most; ResNet-8's last two layers also the output of the frozen first conv of its last
# block (the block's input goes on to its skip Add); the autoencoder its input (its own
# target).
# The third value: the cached run on CPython too (the two large models take half a minute
# there; their CPython kernels equal MicroPython's in test_int8_acceptance).
LAST_BLOCKS = [("mlp", 2, True), ("imu_1d", 2, True), ("conv_flatten_gemm", 2, True),
               ("ad_autoencoder", 2, True), ("resnet8", 2, False), ("ds_cnn_kws", 3, False)]


@pytest.mark.parametrize("name,last,cpython", LAST_BLOCKS, ids=[n for n, *_ in LAST_BLOCKS])
def test_last_block_training_with_the_cache_equals_without(name, last, cpython, micropython,
                                                            tmp_path):
    """Batch 2, 3 batches, 3 epochs on the MicroPython Unix port: the losses of every epoch
    and the saved checkpoint byte for byte the same with the cache in RAM, in a file and
    without it; the cache keeps the tensors the packed blob names, and the later epochs
    run only the steps from its cut."""
    batch, batches, epochs = 2, 3, 3
    path, calibration, x, y = prepare(name, tmp_path / "data", batch * batches)
    info = pack_int8(path, tmp_path / "int8", calibration=calibration, batch_size=batch,
                     learning_rate=LEARNING_RATES[name], train_last=last, **loss_options(name))
    b = device_blob_parser.load(info["blob"])
    train = b.programs["train"]
    assert 0 < train.latent_from < len(train.steps)
    record = sum(b.sizes[t] * (4 if b.dtypes[t] == 1 else 1) for t in train.latent)
    (tmp_path / "data.bin").write_bytes(records(info, x, y, batch))
    outs = {mode: run_micropython(micropython, SCRIPT, info["blob"], info["checkpoint"],
                                  tmp_path / "data.bin", batches, epochs, mode,
                                  tmp_path / mode)
            for mode in ("plain", "ram", "file")}
    losses = {mode: [line for line in out.splitlines() if line.startswith("epoch")]
              for mode, out in outs.items()}
    assert len(losses["plain"]) == epochs and losses["plain"][0] != losses["plain"][-1]
    assert losses["plain"] == losses["ram"] == losses["file"]
    assert "cache bytes %d" % (batches * record) in outs["ram"]
    assert ((tmp_path / "plain").read_bytes() == (tmp_path / "ram").read_bytes()
            == (tmp_path / "file").read_bytes())
    if not cpython:
        return
    # and CPython's cached run ends where the board's did
    subprocess.run([sys.executable, str(SCRIPT), info["blob"], info["checkpoint"],
                    str(tmp_path / "data.bin"), str(batches), str(epochs), "file",
                    str(tmp_path / "cpython")], env={"PYTHONPATH": str(DEVICE)}, check=True,
                   capture_output=True, timeout=600)
    assert (tmp_path / "cpython").read_bytes() == (tmp_path / "plain").read_bytes()


@pytest.mark.parametrize("name,last,batch", [("conv_flatten_gemm", 2, 4), ("mlp", 1, 3)])
def test_microtrain_fit_trains_from_the_cache_as_without_it(name, last, batch, tmp_path):
    """microtrain.fit (`microtrain train`, a board's loop) caches per sample: the batches
    are drawn in a new shuffled order every epoch, and a sample the first epoch left out
    (the count is no multiple of the batch) runs whole when it first comes. The losses of
    every step, the evaluations and the checkpoint equal those of the run without it."""
    from microtrain import fit
    from microtrain_host.tools.train import write_device_data
    path, calibration, x, y = prepare(name, tmp_path / "data", 23)
    info = pack_int8(path, tmp_path / "int8", calibration=calibration, batch_size=batch,
                     learning_rate=LEARNING_RATES[name], train_last=last)
    b = device_blob_parser.load(info["blob"])
    write_device_data(str(tmp_path), b, x, y, x[:8], y[:8])
    runs = {}
    for latent in (False, True):
        reports = []
        out = tmp_path / f"trained_{latent}"
        fit.run(str(tmp_path / "int8"), str(tmp_path), 4, LEARNING_RATES[name], str(out),
                lambda kind, values: reports.append((kind, values)), 3, None, latent)
        runs[latent] = reports, out.read_bytes()
    assert runs[True] == runs[False]
    steps = [v[3] for kind, v in runs[True][0] if kind == "step"]
    assert len(steps) == 4 * (23 // batch) and steps[-1] != steps[0]
    state, module, _, train, _ = fit.load(str(tmp_path / "int8"), str(tmp_path), 0.01)
    cache = fit.latent_cache(module, train, 4)
    assert cache is not None and cache.samples >= 23
    assert fit.latent_cache(module, train, 1) is None       # one epoch: nothing to save
