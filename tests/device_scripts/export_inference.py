# Device-side driver of test_export.py, run by CPython and by MicroPython.
#   export_inference.py ARTIFACT_DIR DATA_FILE OUT_DIR
# DATA_FILE holds one batch: the input then the target (float32, little-endian). Trains two
# SGD steps on it, saves OUT_DIR/checkpoint, exports OUT_DIR/inference.mtb, runs that with
# an InferenceSession and prints its outputs.
import sys
from array import array
from microtrain import CheckpointState, InferenceSession, Module, Optimizer


def main(argv):
    directory, data_file, out_dir = argv[1], argv[2], argv[3]
    state = CheckpointState.load_checkpoint(directory + "/checkpoint")
    model = Module(directory + "/model.mtb", state)
    opt = Optimizer(directory + "/model.mtb", model)
    opt.set_learning_rate(0.1)
    b = model.blob
    x_id, y_id = b.programs["train"].inputs
    x = array("f", bytes(4 * b.sizes[x_id]))
    y = array("f", bytes(4 * b.sizes[y_id]))
    with open(data_file, "rb") as f:
        f.readinto(x)
        f.readinto(y)
    for _ in range(2):
        model(x, y)
        opt.step()
        model.lazy_reset_grad()
    CheckpointState.save_checkpoint(state, out_dir + "/checkpoint")
    model.export_model_for_inferencing(out_dir + "/inference.mtb", ["output"])
    del model, opt
    for v in InferenceSession(out_dir + "/inference.mtb").run(x):
        print(repr(v))


main(sys.argv)
