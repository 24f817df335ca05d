"""Saving on the device never destroys the previous checkpoint.

* SIGKILL in the middle of a save of a large checkpoint (CPython and MicroPython): the
  temporary file is a FIFO the test reads from (the saving script opens it in place of the
  fresh file files.write_atomically creates), so the saving process is provably half-way
  (blocked writing, with most of the checkpoint still to come) when it is killed. The
  previous checkpoint still loads, the half-written bytes are refused, and the next save
  goes through over the leftover temporary file.
* Filesystems that refuse to rename over an existing file (some board ports): the save
  moves the old checkpoint to PATH.bak first; a crash after any single filesystem step
  leaves a loadable checkpoint, the old or the new one (load_checkpoint falls back to
  PATH.bak when PATH is missing).
"""
import errno
import os
import select
import signal
import subprocess
import sys
from array import array

import numpy as np
import pytest

import microtrain.files as device_files
from conftest import DEVICE, ROOT
from microtrain import CheckpointState, Parameter
from microtrain.errors import CheckpointError as DeviceCheckpointError
from microtrain_host.formats.checkpoint import parse_checkpoint, read_checkpoint
from microtrain_host.errors import CheckpointError

SCRIPT = ROOT / "tests" / "device_scripts" / "save_large.py"
LARGE = 512 * 1024  # float32 values: a 2 MiB checkpoint


def command(interpreter, *args):
    args = [str(a) for a in args]
    if interpreter == "cpython":
        return [sys.executable, str(SCRIPT), *args], {"PYTHONPATH": str(DEVICE)}
    return [interpreter, "-X", "heapsize=16M", str(SCRIPT), *args], {"MICROPYPATH": str(DEVICE)}


def save_large(interpreter, path, value):
    cmd, env = command(interpreter, path, LARGE, value, "file")
    proc = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ, **env))
    assert proc.returncode == 0 and "saved" in proc.stdout, proc.stderr


def kill_mid_save(interpreter, path, value):
    """Start a save of `path` whose temporary file is a FIFO; read part of it, SIGKILL the
    saving process while it is blocked writing the rest. Returns the bytes it got out."""
    tmp = str(path) + ".tmp"
    os.mkfifo(tmp)
    # O_RDWR: the open does not wait for a writer, and reads never see a premature EOF.
    fd = os.open(tmp, os.O_RDWR | os.O_NONBLOCK)
    cmd, env = command(interpreter, path, LARGE, value, "fifo")
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=dict(os.environ, **env))
    received = bytearray()
    try:
        while len(received) < 256 * 1024:
            assert proc.poll() is None, proc.communicate()
            if select.select([fd], [], [], 0.5)[0]:
                received += os.read(fd, 1 << 16)
        proc.send_signal(signal.SIGKILL)
        assert proc.wait() == -signal.SIGKILL
    finally:
        os.close(fd)
        if proc.poll() is None:
            proc.kill()
        proc.communicate()
    os.unlink(tmp)
    return bytes(received)


def values(path):
    """(big, small, property) as the device reader sees `path`."""
    state = CheckpointState.load_checkpoint(str(path))
    big = state.parameters["big"].data
    return big[0], big[len(big) - 1], list(state.parameters["small"].data), \
        state.properties["value"]


@pytest.mark.parametrize("runtime", ["cpython", "micropython"])
def test_sigkill_during_save_keeps_previous_checkpoint(runtime, tmp_path, request):
    interpreter = request.getfixturevalue("micropython") if runtime == "micropython" \
        else "cpython"
    path = tmp_path / "checkpoint"
    save_large(interpreter, path, 1.5)
    before = path.read_bytes()
    assert len(before) > 4 * LARGE

    partial = kill_mid_save(interpreter, path, 2.5)
    assert 256 * 1024 <= len(partial) < len(before)  # killed half-way through the save
    assert partial[4:8] == b"ODTC"
    assert path.read_bytes() == before
    assert values(path) == (1.5, 1.5, [1.5, -1.5], 1.5)
    assert read_checkpoint(path).trainable["big"].shape == (LARGE,)
    # What the killed save had written is refused by both readers.
    with pytest.raises(CheckpointError, match="truncated"):
        parse_checkpoint(partial)
    (tmp_path / "partial").write_bytes(partial)
    with pytest.raises(DeviceCheckpointError, match="truncated"):
        CheckpointState.load_checkpoint(str(tmp_path / "partial"))

    # A leftover half-written temporary file does not stop the next save.
    (tmp_path / "checkpoint.tmp").write_bytes(partial)
    save_large(interpreter, path, 2.5)
    assert values(path) == (2.5, 2.5, [2.5, -2.5], 2.5)
    assert sorted(os.listdir(tmp_path)) == ["checkpoint", "partial"]


class Crash(BaseException):
    """A power cut: the save stops right there."""


class NoRenameOverFS:
    """os for microtrain.files on a filesystem that refuses to rename over an existing
    file, crashing before filesystem step number `crash_at` (rename, remove); everything
    else is the real os."""

    def __init__(self, crash_at=None):
        self.crash_at = crash_at
        self.steps = 0

    def _step(self):
        if self.steps == self.crash_at:
            raise Crash()
        self.steps += 1

    def rename(self, src, dst):
        if os.path.exists(dst):
            raise OSError(errno.EEXIST, "File exists")
        self._step()
        os.rename(src, dst)

    def remove(self, path):
        self._step()
        os.remove(path)

    def stat(self, path):
        return os.stat(path)

    def __getattr__(self, name):
        return getattr(os, name)


def small_state(value):
    state = CheckpointState()
    state.parameters["w"] = Parameter("w", (3,), array("f", [value] * 3), True)
    state.properties["value"] = value
    return state


def test_save_without_rename_over_keeps_a_loadable_checkpoint(tmp_path, monkeypatch):
    path = str(tmp_path / "ckpt")
    CheckpointState.save_checkpoint(small_state(1.0), path)
    fs = NoRenameOverFS()
    monkeypatch.setattr(device_files, "os", fs)
    CheckpointState.save_checkpoint(small_state(2.0), path)  # no crash: count the steps
    assert CheckpointState.load_checkpoint(path).properties["value"] == 2.0
    assert sorted(os.listdir(tmp_path)) == ["ckpt"]
    steps = fs.steps
    # remove what may lie at ckpt.tmp (a link is never written through), remove a stale
    # .bak, move the old aside, move the new in, remove .bak
    assert steps == 5

    seen = set()
    for crash_at in range(steps):
        value = 3.0 + crash_at
        monkeypatch.setattr(device_files, "os", NoRenameOverFS(crash_at))
        with pytest.raises(Crash):
            CheckpointState.save_checkpoint(small_state(value), path)
        monkeypatch.setattr(device_files, "os", NoRenameOverFS())
        loaded = CheckpointState.load_checkpoint(path).properties["value"]
        assert loaded in (value - 1.0 if crash_at else 2.0, value), (crash_at, loaded)
        seen.add(os.path.exists(path))
        # The next save, uninterrupted, cleans up whatever the crash left.
        CheckpointState.save_checkpoint(small_state(value), path)
        assert CheckpointState.load_checkpoint(path).properties["value"] == value
        assert sorted(os.listdir(tmp_path)) == ["ckpt"]
    assert seen == {True, False}  # some crashes left only ckpt.bak, and it was loaded


def test_load_falls_back_to_bak_only_when_the_file_is_missing(tmp_path):
    path = str(tmp_path / "ckpt")
    CheckpointState.save_checkpoint(small_state(1.0), path + ".bak")
    assert CheckpointState.load_checkpoint(path).properties["value"] == 1.0
    CheckpointState.save_checkpoint(small_state(2.0), path)
    assert CheckpointState.load_checkpoint(path).properties["value"] == 2.0
    assert sorted(os.listdir(tmp_path)) == ["ckpt"]  # a completed save drops the stale .bak
    CheckpointState.save_checkpoint(small_state(1.0), path + ".bak")
    (tmp_path / "ckpt").write_bytes(b"garbage!" * 4)  # present but corrupt: no fallback
    with pytest.raises(DeviceCheckpointError, match="not a training checkpoint"):
        CheckpointState.load_checkpoint(path)
    os.remove(path + ".bak")
    os.remove(path)
    with pytest.raises(DeviceCheckpointError, match="cannot read checkpoint"):
        CheckpointState.load_checkpoint(path)


def test_every_single_byte_flip_is_refused(tmp_path):
    """With the CRC-32 trailer, a flipped byte anywhere - raw float data included - is
    refused by both readers (ORT's format alone cannot notice flips inside raw data)."""
    state = small_state(0.25)
    state.momentums = {"w": [array("f", [0.5] * 3)]}
    state.optimizer_step = 7
    path = str(tmp_path / "ckpt")
    CheckpointState.save_checkpoint(state, path, include_optimizer_state=True)
    good = open(path, "rb").read()
    assert parse_checkpoint(good).checked
    raw = np.array([0.25] * 3, "<f4").tobytes()
    assert raw in good  # the flips below do hit raw tensor data
    for pos in range(len(good)):
        for flip in (0x01, 0x80, 0xFF):
            data = bytearray(good)
            data[pos] ^= flip
            with pytest.raises(CheckpointError):
                parse_checkpoint(bytes(data))
            with pytest.raises(DeviceCheckpointError):
                CheckpointState.load_checkpoint(bytes(data))
