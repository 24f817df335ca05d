# Saves a large checkpoint (one trainable parameter of N float32 values, all equal to
# VALUE, plus a small frozen one), for the interrupted-save tests.
#   save_large.py PATH N VALUE file|fifo
# fifo: PATH.tmp is a FIFO the test reads from; it is opened as it is, in place of the fresh
# file write_atomically creates (which would remove it first), so that the test can kill
# this process while it is blocked half-way through writing.
import sys
from array import array
from microtrain import CheckpointState, Parameter
from microtrain import files


def main(argv):
    path, n, value = argv[1], int(argv[2]), float(argv[3])
    if argv[4] == "fifo":
        files._create = lambda tmp: open(tmp, "wb")
    state = CheckpointState()
    big = array("f", bytes(4 * n))
    for i in range(n):
        big[i] = value
    state.parameters["big"] = Parameter("big", (n,), big, True)
    state.parameters["small"] = Parameter("small", (2,), array("f", [value, -value]), False)
    state.properties["value"] = value
    CheckpointState.save_checkpoint(state, path)
    print("saved")


main(sys.argv)
