# One device's part of a federated-averaging round, on a board or on the host: take the
# global parameters as one flat buffer (Module.copy_buffer_to_parameters), train on this
# device's own samples with a fresh optimizer, hand back the new flat buffer
# (Module.get_contiguous_parameters) with the number of samples it trained on, the weight
# FedAvg gives it. microtrain_host.flower runs this for every emulated device of a Flower
# simulation, in-process under CPython or as a MicroPython process:
#
#   micropython -m microtrain.federated ARTIFACT_DIR GLOBAL.f32 SHARD_DIR EPOCHS LR OUT.f32 [SEED]
#
# GLOBAL.f32 and OUT.f32 hold every parameter (trainable and frozen) as float32
# little-endian, in the blob's order (the order of get_contiguous_parameters(False), which
# is onnxruntime-training's). SHARD_DIR holds x.f32 and y.i32 (class indices) or y.f32.
# Prints "@round SAMPLES MEAN_TRAIN_LOSS_OF_THE_LAST_EPOCH".
import sys
from microtrain.checkpoint import CheckpointState
from microtrain.module import Module
from microtrain.optimizer import Optimizer
from microtrain.fit import Batches, fit, _read
# (Module's flat-buffer methods import it when called; imported here, it goes into a
# minimal runtime built for this program: tools/runtime.py follows module-level imports)
from microtrain.flatparams import contiguous_parameters, copy_buffer


def train_round(artifacts, buffer, x, y, epochs, lr, seed=1):
    """Returns (new flat parameter buffer, samples, mean train loss of the last epoch)."""
    state = CheckpointState.load_checkpoint(artifacts + "/checkpoint")
    module = Module(artifacts + "/model.mtb", state)
    copy_buffer(module, buffer, False)      # Module.copy_buffer_to_parameters
    # A fresh optimizer every round: the averaged model has no meaningful moments (FedAvg
    # averages parameters only, as `microtrain aggregate` does).
    optimizer = Optimizer(artifacts + "/model.mtb", module)
    optimizer.set_learning_rate(lr)
    batches = Batches(module, x, y)
    if batches.full_batches == 0:
        raise ValueError("this device has %d samples, fewer than one batch (%d)"
                         % (batches.count, batches.batch))
    losses = []

    def report(kind, values):
        if kind == "epoch":
            losses.append(values[1])

    fit(module, optimizer, batches, None, epochs, report, seed)
    return contiguous_parameters(module, False), batches.count, losses[-1]


def main(argv):
    artifacts, global_path, shard, epochs, lr, out = argv[1:7]
    seed = int(argv[7]) if len(argv) > 7 else 1
    import os
    y_type = "i"
    y_path = shard + "/y.i32"
    try:
        os.stat(y_path)
    except OSError:
        y_type, y_path = "f", shard + "/y.f32"
    buffer, samples, loss = train_round(artifacts, _read(global_path, "f"),
                                        _read(shard + "/x.f32", "f"), _read(y_path, y_type),
                                        int(epochs), float(lr), seed)
    with open(out + ".tmp", "wb") as f:
        f.write(buffer)
    os.rename(out + ".tmp", out)
    print("@round %d %r" % (samples, loss))


if __name__ == "__main__":
    main(sys.argv)
