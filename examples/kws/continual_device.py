# Keep learning on the device (MicroPython or CPython): the int8 DS-CNN's classifier learns
# new keywords stage after stage with microtrain.continual.Learner, as a board would.
#   continual_device.py DIR MODE EPOCHS LR [flash] [fresh]
# (each stage's learning rate falls linearly from LR to LR / 10 over its epochs)
# DIR holds model.mtb and checkpoint (the integer training blob packed with room for 12
# classes, all unused) and the data, quantized on the host as the blob's input wants it:
# x_train.q8 / y_train.i32 (the recordings, 10 per keyword) and x_test.q8 / y_test.i32
# (held out). MODE: "replay" (4 stages of 3 new keywords, each trained on the whole sample
# store: the latent codes of every keyword so far), "noreplay" (the same stages, each
# trained on its own keywords' samples only) or "joint" (the upper bound at each stage:
# the keywords so far learned in one stage from the start, with as many training steps as
# the staged run with replay took to get there; four runs). A run's checkpoint and sample
# store go to DIR/run_MODE (run_joint1..4); a run cut off resumes there. The held-out
# samples' latent codes are computed once into DIR/test_latents.bin.
# flash: the blob is the bytes constant BLOB of the frozen module kws_blob (read in place);
# fresh: start the runs over (their directories removed first) rather than resume them.
# Prints per stage "stage S classes C store BYTES groups R/T ...", then "peak heap BYTES":
# the largest live heap after a collection at each phase (MicroPython; CPython: -1).
import gc
import os
import sys
from array import array

gc.collect()
try:
    BASE = gc.mem_alloc()
except AttributeError:      # CPython
    BASE = None
peak = 0
PLANS = {"replay": (3, 3, 3, 3), "noreplay": (3, 3, 3, 3)}
GROUP = 3                   # keywords per group (the stages of the incremental plan)


def probe():
    global peak
    if BASE is not None:
        gc.collect()
        used = gc.mem_alloc() - BASE
        if used > peak:
            peak = used


def samples(directory, part, x):
    # (label) per sample of a part, its bytes read into x; one sample in RAM
    y = array("i", [0])
    with open(directory + "/x_%s.q8" % part, "rb") as fx, \
            open(directory + "/y_%s.i32" % part, "rb") as fy:
        while fx.readinto(x) == len(x) and fy.readinto(y) == 4:
            yield y[0]


def test_latents(learner, directory, x):
    # the held-out samples' latent codes (features bytes each), computed once into a file:
    # the backbone is frozen, so a code never changes
    path = directory + "/test_latents.bin"
    try:
        os.stat(path)
        return path
    except OSError:
        pass
    with open(path + ".tmp", "wb") as out:
        for _ in samples(directory, "test", x):
            out.write(learner.latent(x))
    os.rename(path + ".tmp", path)
    return path


def accuracy(learner, directory, path):
    # [right, total] per group of keywords learned so far, on the held-out samples
    groups = [[0, 0] for _ in range((learner.classes + GROUP - 1) // GROUP)]
    code = bytearray(learner.features)
    y = array("i", [0])
    with open(path, "rb") as fc, open(directory + "/y_test.i32", "rb") as fy:
        while fc.readinto(code) == len(code) and fy.readinto(y) == 4:
            if y[0] < learner.classes:
                g = groups[y[0] // GROUP]
                g[0] += learner.predict(code) == y[0]
                g[1] += 1
    probe()
    return groups


def learn(learner, directory, x, codes, plan, epochs, lr, first_stage=0):
    # the stages of plan (new keywords per stage) on learner, each printed with its accuracy
    for stage, added in enumerate(plan):
        if stage < learner.stages_done:
            continue                   # done before a power cut
        first = learner.begin_stage(added)
        offered = 0
        for label in samples(directory, "train", x):
            if first <= label < first + added:
                if offered >= learner.captured:
                    learner.capture(x, label)
                offered += 1
                if offered == 1:
                    probe()
        learner.train(epochs, lr, final_learning_rate=lr / 10)
        probe()
        groups = accuracy(learner, directory, codes)
        print("stage %d classes %d store %d groups %s" % (
            first_stage + stage, learner.classes,
            len(learner.store) * learner.store.record_size,
            " ".join("%d/%d" % (r, t) for r, t in groups)))
    learner.close()


def remove(path):
    # a run's directory and its files (a fresh start)
    try:
        names = os.listdir(path)
    except OSError:
        return
    for name in names:
        os.remove(path + "/" + name)
    os.rmdir(path)


def main(directory, mode, epochs, lr, flash, fresh):
    from microtrain.continual import Learner
    probe()
    if flash:
        from kws_blob import BLOB
        blob = memoryview(BLOB)
    else:
        blob = directory + "/model.mtb"
    # (run directory, plan, epochs per stage) of each Learner the mode runs
    if mode == "joint":
        # the upper bound at each stage: the keywords so far in one stage, from the start,
        # with as many steps as the staged run with replay took to get there
        runs = [("run_joint%d" % (s + 1), (GROUP * (s + 1),), (epochs * (s + 2) + 1) // 2)
                for s in range(4)]
    else:
        runs = [("run_" + mode, PLANS[mode], epochs)]
    x = codes = None
    for stage, (name, plan, stage_epochs) in enumerate(runs):
        if fresh:
            remove(directory + "/" + name)
        learner = Learner(blob, directory + "/checkpoint", directory + "/" + name,
                          every=16, budget_bytes=16384, policy="balanced",
                          replay=mode != "noreplay", seed=1)
        if x is None:
            b = learner.module.blob
            x_id = b.programs["train"].inputs[0]
            x = (array("b", bytes(b.sizes[x_id])) if b.dtypes[x_id] == 2
                 else bytearray(b.sizes[x_id]))
            probe()
            codes = test_latents(learner, directory, x)
        learn(learner, directory, x, codes, plan, stage_epochs, lr, stage)
        learner = None
    print("peak heap %d" % (peak if BASE is not None else -1))


main(sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4]), "flash" in sys.argv[5:],
     "fresh" in sys.argv[5:])
