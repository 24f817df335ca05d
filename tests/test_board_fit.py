"""The fit check against the emulated Cortex-M3 (qemu-mps2-an385, MicroPython 1.25) for an
integer blob in the ROMFS image: the sparse DS-CNN update (reference_models.ds_cnn, batch
4, the last three layers and the biases trained in integers), whose int8 weights stay in
flash. Its run either trains, as predicted, or is predicted not to fit and runs out of
memory on the board. Needs the firmware of scripts/build_qemu_board.sh (skipped without it,
failed when MICROTRAIN_REQUIRE_QEMU=1)."""
import re

import numpy as np
import onnx

from reference_models import ds_cnn
from test_models import example
from torch_reference import export

from microtrain_host.cli import main
from microtrain_host.int8pack import pack_int8
from microtrain_host.tools import boards, deploy


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
