"""The fit check against the emulated Cortex-M3 (qemu-mps2-an385, MicroPython 1.25) for
integer blobs in the ROMFS image, whose int8 weights stay in flash: the sparse DS-CNN update
(reference_models.ds_cnn, batch 4, the last three layers and the biases trained in
integers) either trains, as predicted, or is predicted not to fit and runs out of memory on
the board; the pretrained KWS DS-CNN's classifier (examples/kws) is predicted to fit, and
trains there. Needs the firmware of scripts/build_qemu_board.sh (skipped without it, failed
when MICROTRAIN_REQUIRE_QEMU=1)."""
import re

import numpy as np
import onnx

from reference_models import ds_cnn
from test_models import example
from torch_reference import export

from microtrain_host.cli import main
from microtrain_host.int8pack import pack_int8
from microtrain_host.tools import boards, deploy
from microtrain_host.tools.runtime import minimal_sources

WIDE = ("microtrain/kernels/intwide.py", "microtrain/kernels/intwide_viper.py")


def test_usable_heap_is_the_gc_pool_of_the_profile_heap():
    # py/gc.c's tables out of the qemu port's MICROPY_HEAP_SIZE (143,360 B): 2,188 bytes
    # of allocation table, 1,094 of finaliser table, 8,752 blocks of 16 bytes (the total
    # micropython.mem_info() prints on the board: see the test below)
    assert boards.usable_heap(boards.load_board("qemu-mps2-an385")) == 140_032
    assert boards.usable_heap({"heap": 196_608, "word_bytes": 4}) == 192_064


def sparse_ds_cnn(tmp_path):
    ref = ds_cnn()
    onnx.save(export(ref.module, example(ref, ref.batch)), tmp_path / "model.onnx")
    rng = np.random.default_rng(1)
    x = rng.standard_normal((64,) + ref.inputs).astype(np.float32)
    np.savez(tmp_path / "data.npz", x_train=x, y_train=rng.integers(0, 10, 64))
    out = tmp_path / "sparse"
    pack_int8(tmp_path / "model.onnx", out, calibration=tmp_path / "data.npz",
              batch_size=ref.batch, learning_rate=0.05, train_biases=True, train_last=3)
    return out


def test_sparse_ds_cnn_integer_blob_trains_on_the_emulated_board_or_is_predicted_not_to(
        firmware, tmp_path, capsys):
    out = sparse_ds_cnn(tmp_path)
    data = tmp_path / "data.npz"
    plan = deploy.plan(out, "qemu-mps2-an385", steps=2)
    assert plan.blob_in_rom     # its int8 weights read in place from flash
    fit = plan.fit
    with capsys.disabled():
        print("\nsparse DS-CNN integer blob, predicted:",
              {k: v for k, v in vars(fit).items() if isinstance(v, int)})
    lines = []
    if not fit.fits:
        # deploy refuses it without --force; run anyway, the board runs out of memory
        args = ["deploy", str(out), "--board", "qemu-mps2-an385", "--steps", "2", "--data",
                str(data), "--firmware", str(firmware)]
        assert main(args) == 1
        assert "predicted not to fit" in capsys.readouterr().err
        try:
            deploy.run(plan, data, lr=0.05, firmware=firmware,
                       report=lambda kind, value: lines.append(value))
        except deploy.DeployError as e:
            assert re.search("OutOfMemoryError|MemoryError", str(e)), e
        else:
            raise AssertionError("predicted not to fit, yet it trained on the board")
        # the GC's total on the board is the usable heap the prediction compares against
        totals = [int(m.group(1)) for line in lines if isinstance(line, str)
                  for m in [re.search(r"GC: total: (\d+)", line)] if m]
        assert totals == [fit.heap], lines
        return
    result = deploy.run(plan, data, lr=0.05, firmware=firmware)
    assert len(result.losses) == 2 and all(np.isfinite(result.losses))
    assert abs(fit.train - result.peak) <= 0.10 * result.peak, (fit.train, result.peak)


def test_kws_classifier_integer_blob_is_predicted_to_fit_and_trains_on_the_emulated_board(
        firmware, tmp_path):
    # The blob as parsed in place (constants noted by their place, not copied; the arenas it
    # refers to counted once) and only the machine code the run imports: predicted 109 KB of
    # the 140,032 usable, where the board needed 104-107 KB (a filler scan,
    # bench/deploy_heap.py); the model before counted 145 KB, "no fit"
    import int8_acceptance_run as run
    model, calibration, x, y = run.prepare("ds_cnn_kws", tmp_path, 4)
    info = run.pack("ds_cnn_kws", "classifier", model, calibration, tmp_path / "int8")
    np.savez(tmp_path / "data.npz", x_train=x.reshape(len(x), -1), y_train=y)
    # no layer sums 128 or more terms into an input gradient: the wide sums' module and its
    # viper forms, which the checkers would import, stay off the board
    assert not set(WIDE) & set(minimal_sources(info["blob"]))
    plan = deploy.plan(tmp_path / "int8", "qemu-mps2-an385", steps=2)
    assert plan.blob_in_rom and plan.fit.fits, vars(plan.fit)
    result = deploy.run(plan, tmp_path / "data.npz", lr=0.01, firmware=firmware)
    assert len(result.losses) == 2 and all(np.isfinite(result.losses))
    print(f"\nKWS classifier integer blob: peak between phases predicted {plan.fit.train} "
          f"measured {result.peak}; needed {plan.fit.needed} (load {plan.fit.load})")
    assert abs(plan.fit.train - result.peak) <= 0.10 * result.peak, (plan.fit.train,
                                                                      result.peak)


def test_minimal_runtime_carries_the_wide_sums_viper_forms_only_for_a_wide_layer(tmp_path):
    # A 1x1 convolution of 160 output channels after another: its input gradient, which
    # the first one's bias needs, sums 160 terms per element (kernels/intwide.py); the
    # classifier-only pack computes no input gradient
    from mlperf_tiny import _settle
    from reference_models import ReferenceModel
    import torch.nn as nn
    module = nn.Sequential(nn.Conv2d(4, 8, 1), nn.ReLU(), nn.Conv2d(8, 160, 1), nn.ReLU(),
                           nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(160, 3))
    ref = ReferenceModel("wide", _settle(module, (4, 4, 4)), (4, 4, 4), "CrossEntropyLoss", 1,
                         {"SGD": 0.05})
    onnx.save(export(ref.module, example(ref, 1)), tmp_path / "model.onnx")
    np.savez(tmp_path / "data.npz",
             x_train=np.random.default_rng(0).standard_normal((8, 4, 4, 4)).astype("f4"))
    carried = {}
    for name, options in (("classifier", {}), ("sparse", dict(train_biases=True,
                                                               train_last=2))):
        info = pack_int8(tmp_path / "model.onnx", tmp_path / name,
                         calibration=tmp_path / "data.npz", batch_size=1, **options)
        carried[name] = set(WIDE) <= set(minimal_sources(info["blob"]))
    assert carried == {"classifier": False, "sparse": True}
