"""Nominal checkpoints: names, types and shapes without values.

A Module on a nominal state refuses to train or evaluate (ParameterError naming the way
out) until every parameter arrives through copy_buffer_to_parameters(buf,
trainable_only=False) - trainable ones alone are not enough when some are frozen - and then
trains exactly like a Module built from the full checkpoint: same losses and parameters,
bit for bit, on CPython and on MicroPython.
"""
import numpy as np
import pytest

import microtrain_host as mh
from microtrain_host.formats.checkpoint import read_checkpoint
from test_resume import MODEL, losses, lr_bits, params, run_device, write_batches

STEPS = 3
FROZEN = ["1.weight"]


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("nominal")
    art = mh.generate_artifacts(str(MODEL), loss="CrossEntropyLoss", optimizer="AdamW",
                                frozen_params=FROZEN, batch_size=8, artifact_directory=tmp,
                                nominal_checkpoint=True)
    return art, write_batches(tmp / "data", STEPS)


def test_nominal_checkpoint_has_names_and_shapes_only(artifacts):
    art, _ = artifacts
    full, nominal = read_checkpoint(art.checkpoint), read_checkpoint(art.nominal_checkpoint)
    assert nominal.is_nominal and not full.is_nominal
    assert list(nominal.trainable) == list(full.trainable)
    assert list(nominal.frozen) == list(full.frozen) == FROZEN
    assert all(a.size == 0 for a in {**nominal.trainable, **nominal.frozen}.values())
    data_bytes = sum(a.nbytes for a in {**full.trainable, **full.frozen}.values())
    assert art.nominal_checkpoint and \
        len(open(art.nominal_checkpoint, "rb").read()) < 400 < data_bytes


@pytest.mark.parametrize("runtime", ["cpython", "micropython"])
def test_nominal_state_refuses_then_trains_like_the_full_one(artifacts, runtime, request):
    interpreter = request.getfixturevalue("micropython") if runtime == "micropython" \
        else "cpython"
    art, data = artifacts
    lr = lr_bits(0.01)
    full = run_device(interpreter, art.blob, art.checkpoint, data, 0, STEPS, lr, "-", 1)
    nominal = run_device(interpreter, art.blob, art.nominal_checkpoint, data, 0, STEPS, lr,
                         "-", 1, art.checkpoint)
    refusals = [line for line in nominal if line.startswith("refused ")]
    assert len(refusals) == 3
    for line in refusals:
        assert line.split(":")[0].endswith(" yes"), line
        assert "nominal" in line and "copy_buffer_to_parameters" in line
        assert "trainable_only=False" in line
    assert losses(nominal) == losses(full) and len(losses(full)) == STEPS
    assert params(nominal) == params(full)
    assert len(set(losses(full))) > 1


def test_frozen_parameters_stay_as_copied(artifacts, tmp_path):
    """After copy_buffer_to_parameters(trainable_only=False) and training, a save holds the
    copied frozen values exactly and trained trainable ones."""
    art, data = artifacts
    out = tmp_path / "after"
    run_device("cpython", art.blob, art.nominal_checkpoint, data, 0, STEPS, lr_bits(0.01), out,
               0, art.checkpoint)
    before, after = read_checkpoint(art.checkpoint), read_checkpoint(out)
    assert not after.is_nominal
    for name in FROZEN:
        assert np.array_equal(after.frozen[name], before.frozen[name])
    assert all(not np.array_equal(after.trainable[n], before.trainable[n])
               for n in before.trainable)
