"""Federated averaging (FedAvg) on the 8x8 digits with emulated devices.

Each device holds its own shard of examples/digits/digits.npz, and not a random one: a
sample goes to device (label % DEVICES), 30 % of them to a random device instead, so each
device sees mostly two or three digits and few of the others (non-IID data, as on real
devices). Every round, the devices - separate processes, running at the same time - load
the global checkpoint, train on their shards with the microtrain device runtime (device 0
under the MicroPython Unix port when it is available, the others under CPython) and save
their checkpoints; the server averages them weighted by shard size (microtrain_host.tools.fedavg,
as `microtrain aggregate` does) into the next global checkpoint and measures its validation
accuracy on all ten digits.

Usage: python examples/federated/federated.py [--devices 4] [--rounds 6] [--epochs 1]
                                              [--lr 0.01] [--cpython-only] [--work DIR]
"""
import argparse
import os
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path[:0] = [os.path.join(ROOT, "host"), os.path.join(ROOT, "device")]  # uninstalled too

from microtrain import CheckpointState, Module  # noqa: E402
from microtrain.fit import Batches, evaluate  # noqa: E402
from microtrain_host import fedavg, generate_artifacts  # noqa: E402
from microtrain_host.tools.train import TrainError, device_package_dir, find_micropython  # noqa: E402

DATA = os.path.join(ROOT, "examples", "digits", "digits.npz")
MODEL = os.path.join(ROOT, "examples", "digits", "mlp.onnx")
CLIENT = os.path.join(HERE, "client.py")


def write_shards(work, x, y, devices):
    """Disjoint non-IID shards (see above); returns [(directory, size)]."""
    rng = np.random.default_rng(0)
    owner = np.where(rng.random(len(y)) < 0.3, rng.integers(0, devices, len(y)), y % devices)
    shards = []
    for i in range(devices):
        keep = owner == i
        directory = os.path.join(work, "device%d" % i)
        os.makedirs(directory, exist_ok=True)
        x[keep].astype("<f4").tofile(os.path.join(directory, "x.f32"))
        y[keep].astype("<i4").tofile(os.path.join(directory, "y.i32"))
        shards.append((directory, int(keep.sum())))
    return shards


def start_device(interpreter, blob, checkpoint, shard, epochs, lr, out, seed):
    """A device's round as a process of its own (MicroPython, or CPython when None)."""
    args = [blob, checkpoint, shard, str(epochs), repr(lr), out, str(seed)]
    if interpreter is None:
        cmd = [sys.executable, CLIENT] + args
        env = dict(os.environ, PYTHONPATH=str(device_package_dir()))
    else:
        cmd = [interpreter, "-X", "heapsize=4M", CLIENT] + args
        env = dict(os.environ, MICROPYPATH=str(device_package_dir()))
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env)


def finish_device(proc):
    """The device's mean train loss of its last epoch."""
    out, err = proc.communicate()
    if proc.returncode != 0:
        sys.exit("device failed:\n" + out + err)
    return float(out.split()[-1])


def global_accuracy(blob, checkpoint, x_val, y_val):
    model = Module(blob, CheckpointState.load_checkpoint(checkpoint))
    return evaluate(model, Batches(model, x_val.reshape(-1).tolist(), y_val.tolist()))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--devices", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--epochs", type=int, default=1, help="local epochs per round")
    parser.add_argument("--lr", type=float, default=0.01, help="devices' AdamW learning rate")
    parser.add_argument("--cpython-only", action="store_true",
                        help="run every device under CPython, even with MicroPython around")
    parser.add_argument("--work", help="keep checkpoints here (default: a temporary directory)")
    args = parser.parse_args(argv)
    if args.work:
        os.makedirs(args.work, exist_ok=True)
        return federate(args, args.work)
    with tempfile.TemporaryDirectory(prefix="federated-") as work:
        return federate(args, work)


def federate(args, work):
    data = np.load(DATA)
    art = generate_artifacts(MODEL, loss="CrossEntropyLoss", optimizer="AdamW", batch_size=8,
                             artifact_directory=os.path.join(work, "artifacts"))
    shards = write_shards(work, data["x_train"], data["y_train"], args.devices)
    micropython = None
    if not args.cpython_only:
        try:
            micropython = find_micropython()
        except TrainError:
            print("(MicroPython Unix port not found: every device runs CPython)")
    for i, (_, size) in enumerate(shards):
        labels = [c for c in range(10) if c % args.devices == i]
        runtime = "MicroPython" if i == 0 and micropython else "CPython"
        print("device %d: %4d samples, mostly digits %s, %s" % (i, size, labels, runtime))

    current = art.checkpoint
    _, accuracy = global_accuracy(art.blob, current, data["x_val"], data["y_val"])
    print("round 0: global validation accuracy %5.1f %%  (the initial model)" % (100 * accuracy))
    for round_ in range(1, args.rounds + 1):
        outs, running = [], []
        for i, (shard, _) in enumerate(shards):
            outs.append(os.path.join(work, "device%d" % i, "checkpoint_round%d" % round_))
            running.append(start_device(micropython if i == 0 else None, art.blob, current,
                                        shard, args.epochs, args.lr, outs[-1], seed=round_))
        losses = [finish_device(proc) for proc in running]
        current = os.path.join(work, "global_round%d" % round_)
        fedavg(outs, weights=[size for _, size in shards], output=current)
        loss, accuracy = global_accuracy(art.blob, current, data["x_val"], data["y_val"])
        print("round %d: global validation accuracy %5.1f %%  (loss %.3f; devices' own train "
              "loss %s)" % (round_, 100 * accuracy, loss,
                            " ".join("%.2f" % v for v in losses)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
