# Dropout's random generator, run by the CPython and MicroPython sides of test_ops_norm.py.
#   dropout_stream.py SEED STREAM N
# Prints the mask words one dropout kernel call draws for N elements (ratio 0.5), then runs
# a second call that drops every element, so that only integers are touched, under
# micropython.heap_lock() (a MemoryError there means the generator allocated), and prints
# the generator state after it.
import sys
from array import array
from microtrain.kernels import norm

try:
    import micropython
except ImportError:
    micropython = None

HALF = 536870894         # round(0.5 * (2**30 - 36)): drop about half
EVERYTHING = 1073741788  # 2**30 - 36: every draw is at most this


def main(argv):
    seed, stream, n = int(argv[1]), int(argv[2]), int(argv[3])
    words = (n + 29) // 30
    F = array("f", [1.0] * (2 * n))
    I = array("i", [0] * (words + 2))   # generator state in I[0:2], mask from I[2]
    norm.dropout(F, I, (n, 0, 2, 0, n, HALF, seed, stream, 2.0))
    print(" ".join(str(I[2 + w]) for w in range(words)))
    args = (n, 0, 2, 0, n, EVERYTHING, seed, stream, 2.0)
    if micropython is not None:
        micropython.heap_lock()
    norm.dropout(F, I, args)
    if micropython is not None:
        micropython.heap_unlock()
    print("state %d %d" % (I[0], I[1]))


main(sys.argv)
