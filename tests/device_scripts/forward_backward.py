# Device-side driver of test_forward_backward.py, run by CPython and by MicroPython.
#   forward_backward.py ARTIFACT_DIR DATA_FILE STEPS
# DATA_FILE holds, for each step, the input then the target (float32, little-endian). Each
# step: outputs = forward(x); the loss 0.5 * sum((outputs - target)^2) is computed here,
# outside the graph, so backward gets outputs - target; then an SGD step. Prints every
# step's outputs, then the final parameters.
import sys
from array import array
from microtrain import CheckpointState, Module, Optimizer


def main(argv):
    directory, data_file, steps = argv[1], argv[2], int(argv[3])
    state = CheckpointState.load_checkpoint(directory + "/checkpoint")
    model = Module(directory + "/model.mtb", state)
    opt = Optimizer(directory + "/model.mtb", model)
    opt.set_learning_rate(0.05)
    b = model.blob
    x = array("f", bytes(4 * b.sizes[b.programs["forward"].inputs[0]]))
    target = array("f", bytes(4 * b.sizes[b.programs["backward"].inputs[0]]))
    grad = array("f", target)
    with open(data_file, "rb") as f:
        for _ in range(steps):
            f.readinto(x)
            f.readinto(target)
            outputs = model.forward(x)
            for i in range(len(grad)):
                grad[i] = outputs[i] - target[i]
                print(repr(outputs[i]))
            model.backward(grad)
            opt.step()
            model.lazy_reset_grad()
    for v in model.get_contiguous_parameters():
        print(repr(v))


main(sys.argv)
