"""Emulated devices for federated learning, and what a federation needs around them: the
non-IID shards they hold, the global model's evaluation, the memory a run takes.

A device is the microtrain device runtime running `microtrain.federated.train_round` (the
code a board runs): in this process under CPython (`CPythonDevice`) or as a MicroPython
Unix-port process (`MicroPythonDevice`). Both take the global parameters as one flat float32
buffer and hand back the new buffer, bit for bit the same under either interpreter.
"""
import math
import numbers
import os
import re
import subprocess
import tempfile
from array import array

import numpy as np

from ..errors import MicrotrainHostError
from ..ir import INT32
from .train import device_error, device_package_dir, find_micropython



class FederateError(MicrotrainHostError):
    """A federated run cannot start or a device failed."""


def check_settings(clients, rounds, epochs, lr, alpha, fraction, seed, workers, updates_dir):
    """FederateError naming the first bad argument of a federated run, before it starts
    (Flower's simulation takes a while to start, and a device would fail only in round 1).
    Creates updates_dir when given, so that a path that cannot be a directory is refused
    now rather than after the first round's training."""
    def count(name, value, low=1):
        if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < low:
            raise FederateError(f"{name} must be an integer >= {low}, got {value!r}")

    def real(name, value):
        if isinstance(value, bool) or not isinstance(value, numbers.Real) \
                or not math.isfinite(value):
            raise FederateError(f"{name} must be a finite number, got {value!r}")

    count("clients", clients)
    count("rounds", rounds)
    count("epochs", epochs)
    count("seed", seed, 0)   # numpy's generators take no negative seed
    if workers is not None:
        count("workers", workers)
    real("lr", lr)
    if lr < 0:
        raise FederateError(f"the learning rate must be >= 0, got {lr!r}")
    real("alpha", alpha)
    if alpha <= 0:
        raise FederateError(f"the Dirichlet concentration alpha must be > 0, got {alpha!r}")
    real("fraction", fraction)
    if not 0 < fraction <= 1:
        raise FederateError(f"fraction of devices sampled per round must be in (0, 1], "
                            f"got {fraction!r}")
    if updates_dir:
        if os.path.exists(updates_dir) and not os.path.isdir(updates_dir):
            raise FederateError(f"cannot keep the updates in '{updates_dir}': it is a file, "
                                f"not a directory")
        try:
            os.makedirs(updates_dir, exist_ok=True)
        except OSError as e:
            raise FederateError(f"cannot keep the updates in '{updates_dir}': "
                                f"{e.strerror or e}") from e


def label_typecode(artifacts):
    """'i' when the blob's training labels are class indices, else 'f'."""
    from microtrain import parser as device_blob_parser
    b = device_blob_parser.load(os.path.join(str(artifacts), "model.mtb"))
    if "train" not in b.programs or len(b.programs["train"].inputs) != 2:
        raise FederateError("federated training feeds one input and one label tensor to the "
                            "train program; this model's blob has none such (packed with "
                            "loss none, or several inputs)")
    return "i" if b.dtypes[b.programs["train"].inputs[1]] == INT32 else "f"


class CPythonDevice:
    """The device runtime in this process."""

    def __init__(self, artifacts):
        self.artifacts = str(artifacts)
        self.y_type = label_typecode(artifacts)

    def train(self, buffer, x, y, epochs, lr, seed):
        """(new float32 buffer, samples trained on, mean train loss of the last epoch)."""
        from microtrain.federated import train_round
        out, samples, loss = train_round(
            self.artifacts, array("f", np.asarray(buffer, np.float32).tobytes()),
            array("f", np.asarray(x, np.float32).tobytes()),
            array(self.y_type, np.asarray(y, _numpy_type(self.y_type)).tobytes()),
            int(epochs), float(lr), int(seed))
        return np.frombuffer(out, np.float32).copy(), samples, loss


class MicroPythonDevice:
    """The device runtime in a MicroPython Unix-port process per round: the global buffer
    and the shard go in as raw files, the new buffer comes back as one."""

    def __init__(self, artifacts, binary=None, heap="4M"):
        self.artifacts = os.path.abspath(str(artifacts))
        self.y_type = label_typecode(artifacts)
        self.binary = find_micropython(binary)
        self.heap = heap

    def train(self, buffer, x, y, epochs, lr, seed):
        with tempfile.TemporaryDirectory(prefix="microtrain-device-") as tmp:
            np.asarray(buffer, "<f4").tofile(os.path.join(tmp, "global.f32"))
            np.asarray(x, "<f4").tofile(os.path.join(tmp, "x.f32"))
            ext = ".i32" if self.y_type == "i" else ".f32"
            np.asarray(y, "<i4" if self.y_type == "i" else "<f4").tofile(
                os.path.join(tmp, "y" + ext))
            out = os.path.join(tmp, "out.f32")
            proc = subprocess.run(
                [self.binary, "-X", f"heapsize={self.heap}", "-m", "microtrain.federated",
                 self.artifacts, os.path.join(tmp, "global.f32"), tmp, str(int(epochs)),
                 repr(float(lr)), out, str(int(seed))],
                capture_output=True, text=True,
                env=dict(os.environ, MICROPYPATH=str(device_package_dir())))
            match = re.search(r"^@round (\d+) (\S+)$", proc.stdout, re.M)
            if proc.returncode != 0 or match is None:
                raise FederateError(f"MicroPython device failed (exit {proc.returncode}): "
                                    f"{device_error(proc.stdout + proc.stderr, proc.returncode)}")
            return (np.fromfile(out, "<f4").astype(np.float32), int(match.group(1)),
                    float(match.group(2)))


def make_device(artifacts, runtime="cpython", micropython=None, heap="4M"):
    if runtime == "cpython":
        return CPythonDevice(artifacts)
    if runtime == "micropython":
        return MicroPythonDevice(artifacts, micropython, heap)
    raise FederateError(f"unknown runtime '{runtime}': cpython or micropython")


def _numpy_type(typecode):
    return np.int32 if typecode == "i" else np.float32


def noniid_shards(labels, clients, alpha=0.5, seed=0):
    """Non-IID shards of equal size: each device draws its label mix from a Dirichlet
    distribution of concentration alpha over the classes (Hsu et al. 2019; alpha 0.5 gives
    most devices two or three dominant labels, smaller alpha fewer) and gets len/clients
    samples (±1) drawn by that mix. The devices take turns drawing one sample at a time,
    without replacement, so a class that runs out is missed by all alike (a device's mix
    is renormalised over the classes left). Every sample lands on exactly one device.
    Returns one sorted array of sample indices per device."""
    labels = np.asarray(labels).reshape(len(labels), -1)[:, 0]
    if clients < 1:
        raise FederateError(f"--clients must be at least 1, got {clients}")
    if clients > len(labels):
        raise FederateError(f"{len(labels)} samples cannot make {clients} shards")
    if not alpha > 0:
        raise FederateError(f"the Dirichlet concentration must be positive, got {alpha}")
    rng = np.random.default_rng(seed)
    classes, label_index = np.unique(labels, return_inverse=True)
    pools = [list(rng.permutation(np.flatnonzero(label_index == c)))
             for c in range(len(classes))]
    left = np.array([len(p) for p in pools], np.float64)
    mixes = rng.dirichlet(np.full(len(classes), float(alpha)), clients)
    sizes = [len(part) for part in np.array_split(np.arange(len(labels)), clients)]
    shards = [[] for _ in range(clients)]
    for turn in range(max(sizes)):
        for i in range(clients):
            if turn >= sizes[i]:
                continue
            weights = mixes[i] * (left > 0)
            if weights.sum() <= 0:
                weights = left  # this device's classes are gone: any class left
            c = rng.choice(len(classes), p=weights / weights.sum())
            shards[i].append(pools[c].pop())
            left[c] -= 1
    return [np.sort(np.array(s, np.int64)) for s in shards]


def describe_shards(labels, shards):
    """(sizes, distinct labels per shard, share of each shard's most common label)."""
    labels = np.asarray(labels).reshape(len(labels), -1)[:, 0]
    sizes = [len(s) for s in shards]
    distinct = [len(np.unique(labels[s])) for s in shards]
    top = [np.unique(labels[s], return_counts=True)[1].max() / len(s) for s in shards]
    return sizes, distinct, top


def evaluate(artifacts, buffer, x, y):
    """(mean loss, accuracy or None) of the parameters in `buffer` on (x, y), with the
    device runtime's eval program (full batches, as `microtrain train` reports)."""
    from microtrain import CheckpointState, Module
    from microtrain.fit import Batches, evaluate as device_evaluate
    artifacts = str(artifacts)
    y_type = label_typecode(artifacts)
    module = Module(os.path.join(artifacts, "model.mtb"),
                    CheckpointState.load_checkpoint(os.path.join(artifacts, "checkpoint")))
    module.copy_buffer_to_parameters(array("f", np.asarray(buffer, np.float32).tobytes()),
                                     False)
    batches = Batches(module, array("f", np.asarray(x, np.float32).tobytes()),
                      array(y_type, np.asarray(y, _numpy_type(y_type)).tobytes()))
    return device_evaluate(module, batches)


def initial_buffer(artifacts):
    """The packed checkpoint's parameters as one flat float32 buffer (blob order)."""
    from microtrain import CheckpointState, Module
    artifacts = str(artifacts)
    module = Module(os.path.join(artifacts, "model.mtb"),
                    CheckpointState.load_checkpoint(os.path.join(artifacts, "checkpoint")))
    return np.frombuffer(module.get_contiguous_parameters(False), np.float32).copy()


def buffer_to_checkpoint(artifacts, buffer, path):
    """Write a flat buffer as a checkpoint (ORT's format, no optimizer state), laid out
    exactly as `microtrain aggregate` writes its result."""
    from microtrain import parser as device_blob_parser
    from ..formats.checkpoint import write_checkpoint
    b = device_blob_parser.load(os.path.join(str(artifacts), "model.mtb"))
    buffer = np.asarray(buffer, np.float32)
    trainable, frozen, at = {}, {}, 0
    for tensor, grad, _ in b.parameters:
        n = b.sizes[tensor]
        value = buffer[at:at + n].reshape(b.shapes[tensor])
        (trainable if grad >= 0 else frozen)[b.names[tensor]] = value
        at += n
    if at != buffer.size:
        raise FederateError(f"buffer has {buffer.size} values, the model's parameters {at}")
    write_checkpoint(path, trainable, frozen)


def tree_rss(pid=None):
    """Resident memory in bytes of a process and all its descendants (Linux /proc), or
    None where /proc is not there."""
    if not os.path.exists("/proc/self/status"):
        return None
    total, todo = 0, [os.getpid() if pid is None else pid]
    while todo:
        p = todo.pop()
        try:
            with open(f"/proc/{p}/status") as f:
                total += next(int(line.split()[1]) * 1024 for line in f
                              if line.startswith("VmRSS:"))
            for task in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{task}/children") as f:
                    todo.extend(int(c) for c in f.read().split())
        except (OSError, StopIteration):
            continue  # gone meanwhile, or a zombie (no VmRSS line)
    return total


def own_rss():
    """Resident memory in bytes of this process alone (None without /proc)."""
    try:
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:"))
    except (OSError, StopIteration):
        return None
