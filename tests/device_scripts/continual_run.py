# A class-incremental run of microtrain.continual.Learner (MicroPython or CPython): the
# stages of PLAN (classes added per stage), SHOTS samples per new class captured from the
# training data, EPOCHS epochs per stage; after each stage the accuracy on the held-out data
# of the classes so far. The run's checkpoint is in RUN_DIR/checkpoint at the end.
#   continual_run.py BLOB CKPT RUN_DIR DATA_DIR PLAN SHOTS EPOCHS LR replay|noreplay [pure]
# DATA_DIR: x_train.q8, y_train.i32, x_val.q8, y_val.i32 (inputs quantized on the host).
# PLAN: classes per stage, comma-separated ("3,3,2,2"). pure: the pure-Python kernels.
import sys
from array import array
from microtrain.continual import Learner
from microtrain.kernels import inttrain

blob, ckpt, run, data, plan, shots, epochs, lr, mode = sys.argv[1:10]
if sys.argv[10:] == ["pure"]:
    inttrain.use_fast(False)
learner = Learner(blob, ckpt, run, every=7, replay=mode == "replay")
b = learner.module.blob
size = b.sizes[b.programs["train"].inputs[0]]
x = array("b", bytes(size)) if b.dtypes[b.programs["train"].inputs[0]] == 2 else bytearray(size)


def samples(part):
    y = array("i", [0])
    with open(data + "/x_%s.q8" % part, "rb") as fx, open(data + "/y_%s.i32" % part, "rb") as fy:
        while fx.readinto(x) == size and fy.readinto(y) == 4:
            yield y[0]


for stage, added in enumerate(int(v) for v in plan.split(",")):
    if stage < learner.stages_done:
        continue
    first = learner.begin_stage(added)
    taken = [0] * added
    offered = 0
    for label in samples("train"):
        if first <= label < first + added and taken[label - first] < int(shots):
            taken[label - first] += 1
            if offered >= learner.captured:
                learner.capture(x, label)
            offered += 1
    learner.train(int(epochs), float(lr))
    right = total = 0
    for label in samples("val"):
        if label < learner.classes:
            right += learner.predict(learner.latent(x)) == label
            total += 1
    print("stage %d classes %d accuracy %d/%d store %r" % (stage, learner.classes, right,
                                                          total, learner.store.counts()))
learner.close()
