# The board's side of tests/test_power_cut.py (the same code runs under CPython): the
# class-incremental run of microtrain.continual.Learner over the digits int8 classifier,
# resumed from the run's directory "run" (in the current directory) on every boot.
#
# run() prints lines for the host: "files ..." (what the run's directory holds at power-on)
# and "resumed S P" once the run is loaded (stages done, steps of the open stage in its
# checkpoint); "train S" when stage S's training begins (from then on the run's data is
# fixed: the host may cut the power at any moment); "saved S P" after each save returned
# (the progress it holds); "stage S" when stage S is complete; "done K N" at the end (records
# kept, samples seen). With handshake, the board waits for a byte from the host after
# "stage S", before the next stage's captures, so that a random cut never lands in a
# capture: a cut there loses the sample in flight (samples.py, by design), and the run would
# then train on other data than the uninterrupted one.
# cut: None, or where the board stops by itself (stop_here: "cut", then it spins until the
# host cuts the power; under CPython the process ends at once, its unflushed buffers lost):
#   ("save", S, P, event): in a save of this boot whose progress is (S, P), after
#     its write call number `event` (1-based) or, with `event` one past the writes, after
#     the temporary file is closed (whole, not yet renamed; "closed W" tells the writes),
#     two past, after the rename;
#   ("capture", i): half-way through writing the values of sample i of the first stage
#     this boot captures.
import os
import sys
from array import array
from microtrain import files
from microtrain.continual import Learner

PLAN = ((0, 3), (3, 3), (6, 2), (8, 2))   # (first class, classes added) per stage
SHOTS = 6           # samples per class, in samples.bin stage after stage, RECORD bytes each:
RECORD = 68         # 64 uint8 inputs, int32 label


def stop_here():
    print("cut")
    if hasattr(os, "_exit"):    # CPython
        sys.stdout.flush()
        os._exit(0)
    while True:
        pass


class CutSave:
    # The temporary file of the save being cut, counting its write calls.
    def __init__(self, f, event):
        self.f, self.event, self.writes = f, event, 0

    def write(self, data):
        n = self.f.write(data)
        self.writes += 1
        if self.writes == self.event:
            stop_here()
        return n

    def flush(self):                    # CPython's write_atomically syncs the file
        self.f.flush()

    def fileno(self):
        return self.f.fileno()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.f.close()
        print("closed", self.writes)
        if self.writes + 1 == self.event:
            stop_here()


class CutRecord:
    # The store's file while a sample is appended: its state (written first, counting the
    # sample), the record's head, then half of its values and the power goes.
    def __init__(self, f):
        self.f, self.writes = f, 0

    def write(self, data):
        self.writes += 1
        if self.writes == 3:
            self.f.write(bytes(data)[:len(data) // 2])
            self.f.flush()
            stop_here()
        return self.f.write(data)

    def seek(self, at, whence=0):
        return self.f.seek(at, whence)

    def flush(self):
        return self.f.flush()


def run(source, every, epochs, lr, handshake=False, cut=None):
    """source: the directory holding int8_train.mtb, int8_train.ckpt and samples.bin."""
    save, create, replace = Learner.save, files._create, files._replace

    def save_and_tell(learner):
        progress = (learner.stages_done, learner._steps)
        if cut is not None and cut[0] == "save" and progress == cut[1:3]:
            made = []

            def create_to_cut(tmp):
                made.append(CutSave(create(tmp), cut[3]))
                return made[0]

            def replace_then_stop(tmp, path):
                replace(tmp, path)
                if made[0].writes + 2 == cut[3]:
                    stop_here()
            files._create, files._replace = create_to_cut, replace_then_stop
        save(learner)
        files._create, files._replace = create, replace
        print("saved", progress[0], progress[1])

    if files.is_directory("run"):
        print("files", " ".join(sorted(os.listdir("run"))))
    Learner.save = save_and_tell
    try:
        learner = Learner(source + "int8_train.mtb", source + "int8_train.ckpt", "run",
                          every=every)
        print("resumed", learner.stages_done, learner._steps)
        x = bytearray(64)
        label = array("i", [0])
        with open(source + "samples.bin", "rb") as samples:
            first_record = 0
            for stage in range(len(PLAN)):
                count = PLAN[stage][1] * SHOTS
                if stage >= learner.stages_done:
                    learner.begin_stage(PLAN[stage][1])
                    samples.seek(first_record * RECORD)
                    for i in range(count):
                        samples.readinto(x)
                        samples.readinto(label)
                        if i >= learner.captured:
                            if cut is not None and cut[0] == "capture" and i == cut[1]:
                                learner.store.f = CutRecord(learner.store.f)
                            learner.capture(x, label[0])
                    print("train", stage)
                    learner.train(epochs, lr)
                    print("stage", stage)
                    if handshake:
                        sys.stdin.read(1)
                first_record += count
        print("done", len(learner.store), learner.store.seen)
        learner.close()
    finally:
        Learner.save, files._create, files._replace = save, create, replace
