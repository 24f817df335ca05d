# Device-side driver of the resume, nominal and FedAvg tests, under CPython and MicroPython.
#   resume_steps.py BLOB CHECKPOINT DATA_DIR START STEPS LR_BITS OUT WITH_STATE [FULL]
# DATA_DIR/x.f32 and DATA_DIR/y.i32 hold the batches back to back (raw little-endian).
# Loads CHECKPOINT, trains STEPS steps from batch START, then (OUT not "-") sets the
# properties epoch, lr and note and saves OUT, with optimizer state when WITH_STATE is 1.
# LR_BITS is the learning rate's float32 bit pattern in hex, so both interpreters use the
# very same number. With FULL (a second checkpoint), CHECKPOINT is nominal: training and
# eval must be refused until copy_buffer_to_parameters brings FULL's parameters in.
# CHECKPOINT "buffer:PATH" loads PATH's bytes and passes them as a buffer (a checkpoint in
# flash).
# Prints "props ..." (what CHECKPOINT held; floats as float32 bits), "refused ..." lines,
# one "loss XXXXXXXX" (float32 bits) per step, then "params XXXXXXXX" (CRC-32 of the
# contiguous parameters) and "saved" or nothing.
import struct
import sys
from array import array
from microtrain import CheckpointState, Module, Optimizer
from microtrain.crc32 import crc32
from microtrain.errors import ParameterError


def bits(value):
    return "%08x" % struct.unpack("<I", struct.pack("<f", value))[0]


def read(path, typecode):
    with open(path, "rb") as f:
        return array(typecode, f.read())


def show_properties(state):
    items = []
    for name in sorted(state.properties):
        value = state.properties[name]
        items.append("%s=%s" % (name, bits(value) if isinstance(value, float) else value))
    print("props " + " ".join(items))


def refused(model, x, y, what):
    try:
        model(x, y)
        print("refused %s no" % what)
    except ParameterError as e:
        print("refused %s yes: %s" % (what, e))


def main(argv):
    blob, checkpoint, data = argv[1], argv[2], argv[3]
    start, steps = int(argv[4]), int(argv[5])
    lr = struct.unpack("<f", struct.pack("<I", int(argv[6], 16)))[0]
    out, with_state = argv[7], argv[8] == "1"
    if checkpoint.startswith("buffer:"):
        with open(checkpoint[7:], "rb") as f:
            checkpoint = f.read()
    state = CheckpointState.load_checkpoint(checkpoint)
    show_properties(state)
    model = Module(blob, state)
    opt = Optimizer(blob, model)
    opt.set_learning_rate(lr)
    b = model.blob
    x_id, y_id = b.programs["train"].inputs
    nx, ny = b.sizes[x_id], b.sizes[y_id]
    xs, ys = read(data + "/x.f32", "f"), read(data + "/y.i32", "i")
    x, y = array("f", xs[:nx]), array("i", ys[:ny])
    if len(argv) > 9:
        refused(model, x, y, "train")
        model.eval()
        refused(model, x, y, "eval")
        model.train()
        full = Module(blob, CheckpointState.load_checkpoint(argv[9]))
        model.copy_buffer_to_parameters(full.get_contiguous_parameters(True), True)
        refused(model, x, y, "train after trainable_only=True")
        model.copy_buffer_to_parameters(full.get_contiguous_parameters(False), False)
        del full
    model.train()
    for step in range(start, start + steps):
        x[:] = xs[step * nx:(step + 1) * nx]
        y[:] = ys[step * ny:(step + 1) * ny]
        print("loss " + bits(model(x, y)))
        opt.step()
        model.lazy_reset_grad()
    print("params %08x" % (crc32(model.get_contiguous_parameters(False)) & 0xFFFFFFFF))
    if out != "-":
        state.properties["epoch"] = start + steps
        state.properties["lr"] = lr
        state.properties["note"] = "trained to step %d" % (start + steps)
        CheckpointState.save_checkpoint(state, out, with_state)
        print("saved")


main(sys.argv)
