# Device-side driver of tests/test_optimizers.py, run under CPython and MicroPython:
#   optim_steps.py ARTIFACT_DIR CHECKPOINT OUT_CHECKPOINT DATA_FILE STEPS ACCUMULATE \
#                  SCHEDULE ARGS...
# SCHEDULE: none LR | constant LR | linear WARMUP TOTAL LR | invscaling LR POWER_T.
# DATA_FILE as for train_steps.py. Every ACCUMULATE train calls: one optimizer step, then the
# scheduler's step, then lazy_reset_grad. Prints "loss V" per train call, "lr V" with the rate
# each optimizer step ran at, then "params" and the contiguous parameters, then "state" and
# the optimizer state of every trainable parameter in blob order; saves OUT_CHECKPOINT with
# the optimizer state (so a later run can resume from it).
import sys
from array import array
from microtrain import (CheckpointState, Module, Optimizer, LinearLRScheduler,
                        ConstantLRScheduler, InverseScalingLRScheduler)


def scheduler(optimizer, kind, args):
    if kind == "none":
        optimizer.set_learning_rate(float(args[0]))
        return None
    if kind == "constant":
        return ConstantLRScheduler(optimizer, float(args[0]))
    if kind == "linear":
        return LinearLRScheduler(optimizer, int(args[0]), int(args[1]), float(args[2]))
    return InverseScalingLRScheduler(optimizer, float(args[0]), float(args[1]))


def main(argv):
    directory, checkpoint, out, data_file = argv[1:5]
    steps, accumulate = int(argv[5]), int(argv[6])
    state = CheckpointState.load_checkpoint(checkpoint)
    blob = directory + "/model.mtb"
    model = Module(blob, state)
    opt = Optimizer(blob, model)
    schedule = scheduler(opt, argv[7], argv[8:])
    b = model.blob
    x_id, y_id = b.programs["train"].inputs
    x = array("f", bytes(4 * b.sizes[x_id]))
    y = array("i" if b.dtypes[y_id] == 1 else "f", bytes(4 * b.sizes[y_id]))
    with open(data_file, "rb") as f:
        model.train()
        for call in range(steps):
            f.readinto(x)
            f.readinto(y)
            print("loss %r" % model(x, y))
            if (call + 1) % accumulate == 0:
                print("lr %r" % opt.get_learning_rate())
                opt.step()
                if schedule is not None:
                    schedule.step()
                model.lazy_reset_grad()
    print("params")
    for v in model.get_contiguous_parameters():
        print(repr(v))
    print("state")
    for tensor, grad, moments in b.parameters:
        for tid in moments:
            off = b.offsets[tid]
            for i in range(b.sizes[tid]):
                print(repr(model.F[off + i]))
    CheckpointState.save_checkpoint(state, out, include_optimizer_state=True)


main(sys.argv)
