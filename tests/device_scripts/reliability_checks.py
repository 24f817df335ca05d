# The device side of tests/test_reliability.py: one case per numbered item of the
# reliability issue, the same under CPython and MicroPython.
#   reliability_checks.py DIR
# DIR holds mlp/ (the digits MLP, AdamW, batch 4) and cnn/ (a BatchNorm CNN, AdamW), each
# with model.mtb and checkpoint, plus the crafted files the host made (see the test).
# Prints one line per case: "<case>: <outcome>", where the outcome is "ok ..." or the error
# type and message; the test compares the lines with its table.
import os
import sys
from array import array
from microtrain import (CheckpointState, InferenceSession, Module, Optimizer, MicrotrainError)
from microtrain.files import exists

D = sys.argv[1]


def say(case, outcome):
    print("%s: %s" % (case, outcome))


def attempt(case, fn):
    # the outcome of fn(): "ok <what it returned>" or "<ErrorType>: <message>"
    try:
        result = fn()
    except MicrotrainError as e:
        say(case, "%s: %s" % (type(e).__name__, e))
        return
    except Exception as e:      # a crash: the test fails on the line
        say(case, "CRASH %s: %s" % (type(e).__name__, e))
        return
    say(case, "ok" if result is None else "ok %s" % (result,))


def setup(name):
    state = CheckpointState.load_checkpoint(D + "/%s/checkpoint" % name)
    model = Module(D + "/%s/model.mtb" % name, state)
    opt = Optimizer(D + "/%s/model.mtb" % name, model)
    b = model.blob
    x_id, y_id = b.programs["train"].inputs
    x = array("f", [((i * 37) % 17) / 17.0 - 0.5 for i in range(b.sizes[x_id])])
    y = array("i", [i % b.num_classes for i in range(b.sizes[y_id])])
    return state, model, opt, x, y


def snapshot(state):
    # every parameter, frozen one (running statistics) and optimizer moment, as bits
    out = []
    for name in sorted(state.parameters):
        out.append(bytes(array("f", state.parameters[name].data)))
    moments = state.momentums
    for name in sorted(moments):
        for m in moments[name]:
            out.append(bytes(array("f", m)))
    return out


def finite(state):
    for values in snapshot(state):
        for v in array("f", values):
            if not -3.5e38 < v < 3.5e38:
                return False
    return True


def good_step(model, opt, x, y):
    model.lazy_reset_grad()
    loss = model(x, y)
    opt.step()
    return loss


def bad_input_changes_nothing(name, bad):
    # items 1-3: a refused train call leaves the state bit for bit, the optimizer step after
    # it is refused too, and the next good step equals a run that never saw the bad batch
    state, model, opt, x, y = setup(name)
    good_step(model, opt, x, y)
    before = snapshot(state)
    attempt(name + " bad batch", lambda: model(bad(x), y))
    attempt(name + " step after it", opt.step)
    say(name + " state kept", "ok" if snapshot(state) == before else "CHANGED")
    loss = good_step(model, opt, x, y)
    state2, model2, opt2, _, _ = setup(name)
    good_step(model2, opt2, x, y)
    loss2 = good_step(model2, opt2, x, y)
    same = loss == loss2 and snapshot(state) == snapshot(state2)
    say(name + " next good step", "ok" if same else "DIFFERS %r %r" % (loss, loss2))


def nan_input(x):
    x = array("f", x)
    x[0] = float("nan")
    return x


def huge_input(x):
    return array("f", [1e25] * len(x))


def checkpoint_loads_and_trains(path):
    # item 4: a crafted checkpoint is refused at load or trains into finite state
    state = CheckpointState.load_checkpoint(path)
    model = Module(D + "/cnn/model.mtb", state)
    opt = Optimizer(D + "/cnn/model.mtb", model)
    _, _, _, x, y = setup("cnn")
    good_step(model, opt, x, y)
    model.eval()
    outputs = model(x, y)
    return "finite" if finite(state) and outputs == outputs else "NON-FINITE"


def saves_refused():
    # item 5: counters and properties beyond int64 are refused before anything is written
    state, model, opt, x, y = setup("mlp")
    path = D + "/saved_ck"
    CheckpointState.save_checkpoint(state, path, True)
    with open(path, "rb") as f:
        saved = f.read()
    state.optimizer_step = 2 ** 63 - 1
    opt.step_count = 2 ** 63 - 1
    good_step(model, opt, x, y)
    attempt("step 2**63 save", lambda: CheckpointState.save_checkpoint(state, path, True))
    state.optimizer_step = 7
    state.properties["big"] = 2 ** 63
    attempt("property 2**63 save", lambda: CheckpointState.save_checkpoint(state, path, True))
    del state.properties["big"]
    state.properties[5] = 1
    attempt("property named 5 save", lambda: CheckpointState.save_checkpoint(state, path))
    del state.properties[5]
    with open(path, "rb") as f:
        kept = f.read() == saved
    say("previous checkpoint kept", "ok" if kept else "CHANGED")
    say("no temporary file left", "ok" if not exists(path + ".tmp") else "LEFT")
    # item 6: a directory is never moved
    attempt("save over a directory",
            lambda: CheckpointState.save_checkpoint(state, D + "/a_directory"))
    say("directory kept", "ok" if exists(D + "/a_directory/inside") else "MOVED")
    # item 8: a link planted at PATH.tmp is not written through
    CheckpointState.save_checkpoint(state, D + "/linked")
    with open(D + "/victim", "rb") as f:
        victim = f.read()
    say("planted link not followed", "ok" if victim == b"precious" else "OVERWRITTEN")
    attempt("saved beside the link", lambda: len(CheckpointState.load_checkpoint(
        D + "/linked").parameters))
    attempt("export beside the link",
            lambda: model.export_model_for_inferencing(D + "/linked_inference.mtb", ["output"]))
    with open(D + "/victim2", "rb") as f:
        victim = f.read()
    say("planted link not followed by the export", "ok" if victim == b"precious" else
        "OVERWRITTEN")


def changed_buffer_export():
    # item 7: a buffer blob changed after load is not exported
    with open(D + "/mlp/model.mtb", "rb") as f:
        data = bytearray(f.read())
    state = CheckpointState.load_checkpoint(D + "/mlp/checkpoint")
    model = Module(data, state)
    data[len(data) // 2] ^= 0x40
    attempt("export of a changed buffer",
            lambda: model.export_model_for_inferencing(D + "/exported.mtb", ["output"]))
    say("nothing exported", "ok" if not exists(D + "/exported.mtb") else "WRITTEN")


def budgets():
    # item 9: what is refused before it is read or allocated
    attempt("blob is a FIFO", lambda: Module(D + "/fifo", CheckpointState.load_checkpoint(
        D + "/mlp/checkpoint")))
    attempt("checkpoint is a FIFO", lambda: CheckpointState.load_checkpoint(D + "/fifo"))
    attempt("512 MiB of zeros as the blob", lambda: InferenceSession(D + "/zeros"))
    attempt("512 MiB of zeros as the checkpoint",
            lambda: CheckpointState.load_checkpoint(D + "/zeros"))
    attempt("tensors moved apart", lambda: Module(D + "/apart.mtb",
                                                  CheckpointState.load_checkpoint(
                                                      D + "/mlp/checkpoint")))
    state = CheckpointState.load_checkpoint(D + "/mlp/checkpoint")
    attempt("over the byte budget",
            lambda: Module(D + "/mlp/model.mtb", state, max_arena_bytes=10000))
    attempt("within the byte budget",
            lambda: Module(D + "/mlp/model.mtb", state, max_arena_bytes=100000) and None)
    attempt("inference over the byte budget",
            lambda: InferenceSession(D + "/mlp/model.mtb", max_arena_bytes=1000))


def bad_arguments():
    # item 12 (and 11, 16): every bad argument a clear error
    state, model, opt, x, y = setup("mlp")
    ck = D + "/mlp/checkpoint"
    blob = D + "/mlp/model.mtb"
    for what, value in (("None", None), ("a float", 1.5), ("an int", 3)):
        attempt("blob is %s" % what, lambda: Module(value, state))
        attempt("inference blob is %s" % what, lambda: InferenceSession(value))
        attempt("input is %s" % what, lambda: model(value, y))
        attempt("load_checkpoint(%s)" % what, lambda: CheckpointState.load_checkpoint(value))
        attempt("save_checkpoint(state, %s)" % what,
                lambda: CheckpointState.save_checkpoint(state, value))
    attempt("blob path as bytes", lambda: Module(blob.encode(), state))
    attempt("input is a str", lambda: model("abc", y))
    attempt("set_learning_rate('0.01')", lambda: opt.set_learning_rate("0.01"))
    attempt("10**400 in an input", lambda: model([10 ** 400] + [0.0] * (len(x) - 1), y))
    attempt("1e39 in an input", lambda: model([1e39] + [0.0] * (len(x) - 1), y))
    attempt("label 1.5", lambda: model(x, [1.5] + list(y)[1:]))
    attempt("label 2.5", lambda: model(x, [2.5] + list(y)[1:]))
    attempt("label 10", lambda: model(x, [10] + list(y)[1:]))
    attempt("label None", lambda: model(x, [None] + list(y)[1:]))
    attempt("input value 'a'", lambda: model(["a"] + list(x)[1:], y))
    # item 11: a file descriptor is refused, not read and closed
    fd = os.open(blob, os.O_RDONLY) if hasattr(os, "open") else None
    if fd is not None:
        attempt("inference blob is a file descriptor", lambda: InferenceSession(fd))
        os.close(fd)     # raises when the session closed it
        say("descriptor still open", "ok")
    # item 16: the same blob as a buffer and as a path
    with open(blob, "rb") as f:
        data = f.read()
    state2 = CheckpointState.load_checkpoint(ck)
    attempt("Module(buffer) + Optimizer(path)",
            lambda: Optimizer(blob, Module(data, state2)) and None)


bad_input_changes_nothing("cnn", nan_input)
bad_input_changes_nothing("mlp", huge_input)
for name in sorted(os.listdir(D + "/crafted")):
    attempt("checkpoint " + name, lambda: checkpoint_loads_and_trains(D + "/crafted/" + name))
saves_refused()
changed_buffer_export()
budgets()
bad_arguments()
print("done")
