# Run one kernel on arenas read from files, under CPython or MicroPython, and write the
# arenas back: the kernel tests compare both interpreters byte for byte.
#   run_kernel.py FAMILY FUNCTION F_FILE I_FILE ARGS
# F_FILE: float32 arena, I_FILE: int32 arena (may be empty), ARGS: comma-separated
# numbers (ints, or floats with a '.'). Prints nothing; rewrites F_FILE and I_FILE.
import sys
from array import array
from microtrain.opcodes import kernel_module


def read(path, typecode):
    with open(path, "rb") as f:
        data = f.read()
    return array(typecode, data)


def main(argv):
    family, function, f_file, i_file, text = argv[1:6]
    F = read(f_file, "f")
    I = read(i_file, "i")
    args = tuple(float(v) if "." in v or "e" in v else int(v) for v in text.split(","))
    getattr(kernel_module(family), function)(F, I, args)
    with open(f_file, "wb") as f:
        f.write(F)
    with open(i_file, "wb") as f:
        f.write(I)


main(sys.argv)
