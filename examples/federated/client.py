# One emulated device's part of a federated round, under MicroPython or CPython: load the
# global checkpoint, train on this device's own shard, save this device's checkpoint.
#   client.py BLOB GLOBAL_CHECKPOINT SHARD_DIR EPOCHS LR OUT [SEED]
# SHARD_DIR holds x.f32 and y.i32 (raw little-endian) with this device's samples only.
# Prints "@trained SAMPLES MEAN_LOSS".
import sys
from array import array
from microtrain import CheckpointState, Module, Optimizer
from microtrain.fit import Batches, fit


def read(path, typecode):
    with open(path, "rb") as f:
        return array(typecode, f.read())


def main(argv):
    blob, checkpoint, shard, epochs, lr, out = argv[1:7]
    seed = int(argv[7]) if len(argv) > 7 else 1
    state = CheckpointState.load_checkpoint(checkpoint)
    model = Module(blob, state)
    optimizer = Optimizer(blob, model)
    optimizer.set_learning_rate(float(lr))
    train = Batches(model, read(shard + "/x.f32", "f"), read(shard + "/y.i32", "i"))
    losses = []

    def report(kind, values):
        if kind == "epoch":
            losses.append(values[1])

    fit(model, optimizer, train, None, int(epochs), report, seed)
    state.properties["samples"] = train.count
    CheckpointState.save_checkpoint(state, out)
    print("@trained %d %r" % (train.count, losses[-1]))


main(sys.argv)
