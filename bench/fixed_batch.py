# The model the device-side benchmark scripts train (model_step.py, float_workload.py):
# MicroPython and CPython alike (array and the device package only).
from array import array

from microtrain import CheckpointState, Module, Optimizer


def trainer(directory):
    """(model, train_step) of the artifacts in directory: train_step() runs one train step
    (model(x, y), opt.step(), lazy_reset_grad) on one fixed batch, the same every run."""
    state = CheckpointState.load_checkpoint(directory + "/checkpoint")
    model = Module(directory + "/model.mtb", state)
    opt = Optimizer(directory + "/model.mtb", model)
    b = model.blob
    x_id, y_id = b.programs["train"].inputs
    if b.dtypes[x_id] == 1:   # token ids
        x = array("i", [(i * 7) % 11 for i in range(b.sizes[x_id])])
    else:
        x = array("f", [((i * 7919) % 1009) / 1009.0 - 0.5 for i in range(b.sizes[x_id])])
    if b.num_classes:
        y = array("i", [i % b.num_classes for i in range(b.sizes[y_id])])
    else:
        y = array("f", [((i * 104729) % 1013) / 1013.0 - 0.5 for i in range(b.sizes[y_id])])

    def train_step():
        model(x, y)
        opt.step()
        model.lazy_reset_grad()
    return model, train_step
