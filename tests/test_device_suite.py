"""The device checks (tests/device_scripts/device_checks.py) under CPython and MicroPython."""
import shutil
import subprocess
import sys

import pytest
import torch

import microtrain_host as mh
from conftest import DEVICE, ROOT, run_micropython
from torch_reference import export, mlp

SCRIPT = ROOT / "tests" / "device_scripts" / "device_checks.py"


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("device_checks")
    mh.generate_artifacts(export(mlp(12, 5), torch.zeros(1, 12)), loss="CrossEntropyLoss",
                          optimizer="AdamW", artifact_directory=tmp, batch_size=8)
    # A checkpoint onnxruntime-training 1.19.2 wrote (no CRC-32 trailer), for the corruption
    # checks; it is only parsed, never bound to this model.
    shutil.copyfile(ROOT / "tests" / "data" / "ort-1.19.2" / "adamw_step5_checkpoint",
                    tmp / "ort_checkpoint")
    return tmp


def _assert_all_passed(output):
    assert output.strip().splitlines()[-1].endswith(" 0 failed"), output
    assert "FAIL" not in output, output


def test_device_checks_cpython(artifacts):
    proc = subprocess.run([sys.executable, str(SCRIPT), str(artifacts)], capture_output=True,
                          text=True, env={"PYTHONPATH": str(DEVICE), "PATH": "/usr/bin:/bin"})
    _assert_all_passed(proc.stdout + proc.stderr)
    assert proc.returncode == 0


def test_device_checks_micropython(artifacts, micropython):
    _assert_all_passed(run_micropython(micropython, SCRIPT, artifacts, heap="2M"))
