# Device-side driver shared by the CPython and MicroPython runs of the parity tests.
#   train_steps.py ARTIFACT_DIR DATA_FILE STEPS LEARNING_RATE [ACCUMULATE]
# DATA_FILE holds, for each step, the input (float32; int32 token ids for an embedding
# model) then the labels (int32 for cross-entropy, float32 otherwise), little-endian.
# Prints one loss per line (repr), then "params" and the contiguous parameters, then
# "eval" and the eval loss on the first batch.
# ACCUMULATE=k calls lazy_reset_grad and step only every k train calls.
import sys
from array import array
from microtrain import CheckpointState, Module, Optimizer


def main(argv):
    directory, data_file, steps, lr = argv[1], argv[2], int(argv[3]), float(argv[4])
    accumulate = int(argv[5]) if len(argv) > 5 else 1
    state = CheckpointState.load_checkpoint(directory + "/checkpoint")
    blob = directory + "/model.mtb"
    model = Module(blob, state)
    opt = Optimizer(blob, model)
    opt.set_learning_rate(lr)
    b = model.blob
    x_id, y_id = b.programs["train"].inputs
    x_type = "i" if b.dtypes[x_id] == 1 else "f"   # int: token ids
    y_type = "i" if b.dtypes[y_id] == 1 else "f"
    x = array(x_type, bytes(4 * b.sizes[x_id]))
    y = array(y_type, bytes(4 * b.sizes[y_id]))
    first = None
    with open(data_file, "rb") as f:
        model.train()
        for step in range(steps):
            f.readinto(x)
            f.readinto(y)
            if first is None:
                first = (array(x_type, x), array(y_type, y))
            print(repr(model(x, y)))
            if (step + 1) % accumulate == 0:
                opt.step()
                model.lazy_reset_grad()
    print("params")
    for v in model.get_contiguous_parameters():
        print(repr(v))
    model.eval()
    out = model(first[0], first[1])
    print("eval")
    print(repr(out[0] if isinstance(out, list) else out))


main(sys.argv)
