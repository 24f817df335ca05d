# Feeding a program's inputs: one flat sequence per input copied into the arenas, checked
# on the way (lengths, class labels; int8 inputs: feedq.py). Module and InferenceSession
# call it before each run.
from microtrain.errors import InputError

# contract: private
# (generated from host/microtrain_host/contract/ by `python -m microtrain_host.contract.generate`; do not edit)
from microtrain.errors import const
_FLOAT = const(0)
_INT32 = const(1)
_ROLE_LABEL = const(1)
# end of contract


def copy_inputs(b, F, I, program, inputs, classes):
    """Copy one flat sequence per input of `program` into the arenas. With classes > 0,
    labels must be class indices in [0, classes); other int inputs (Gather's indices) are
    checked by the kernels that read them. A value of the wrong kind (None, a str, 1.5 as a
    label, 1e39 as a float32) is an InputError naming the input and the position."""
    tids = program.inputs
    if len(inputs) != len(tids):
        raise InputError("the %s program takes %d inputs (%s), got %d"
                         % (program.name, len(tids), ", ".join(b.names[t] for t in tids),
                            len(inputs)))
    for k in range(len(tids)):  # an index loop: zip() would allocate a tuple per input
        tid = tids[k]
        values = inputs[k]
        off, n = b.offsets[tid], b.sizes[tid]
        try:
            count = -1 if isinstance(values, str) else len(values)
        except TypeError:
            count = -1
        if count < 0:
            raise InputError("input '%s' must be a sequence of numbers (a list, an array), "
                             "not %s" % (b.names[tid], type(values).__name__))
        if count != n:
            raise InputError("input '%s' needs %d values (shape %r), got %d"
                             % (b.names[tid], n, b.shapes[tid], len(values)))
        # The loops stay plain (one store per value); a value the arena cannot take raises
        # in the store, and _refuse then finds it to say which and why.
        try:
            if b.dtypes[tid] == _INT32:
                label = classes if b.roles[tid] == _ROLE_LABEL else 0
                low, high = (0, label - 1) if label else (-_INT32_SPAN, _INT32_SPAN - 1)
                for i in range(n):
                    v = values[i]
                    # (MicroPython's array('i') would keep 10**40 as 0)
                    if not low <= v <= high:
                        raise InputError(
                            "label %s at position %d of '%s' is not a class index in [0, %d)"
                            % (_shown(v), i, b.names[tid], classes) if label else
                            "value %s at position %d of '%s' is outside the int32 range"
                            % (_shown(v), i, b.names[tid]))
                    I[off + i] = v      # an int only: array('i') refuses 1.5
            elif b.dtypes[tid] != _FLOAT:
                # an int8 / uint8 input (integer training): ints as they are, floats
                # quantized with its scale (feedq.py; a float blob never imports it). The
                # function is kept: an import statement per call allocates on MicroPython.
                if not _QUANTIZED:
                    from microtrain.feedq import copy_quantized
                    _QUANTIZED.append(copy_quantized)
                _QUANTIZED[0](b, tid, values, off, n)
            elif _LOAD is None or not _LOAD(F, off, values, n):
                top = _FLOAT_MAX
                for i in range(n):
                    v = values[i]
                    # A finite value float32 cannot hold would be kept as inf without a
                    # word. NaN and inf themselves pass, as in onnxruntime: inference
                    # computes with them and a train call refuses the non-finite loss.
                    if not -top <= v <= top and v - v == 0:
                        raise InputError("value %s at position %d of '%s' is beyond the "
                                         "float32 range" % (_shown(v), i, b.names[tid]))
                    F[off + i] = v
        except (TypeError, ValueError, OverflowError):
            _refuse(b, tid, values)


def _refuse(b, tid, values):
    # the first value of input tid the arena cannot take, named
    integer = b.dtypes[tid] != _FLOAT
    for i in range(len(values)):
        v = values[i]
        if integer:
            ok = isinstance(v, int) or hasattr(v, "__index__")    # numpy's ints too
        else:
            ok = isinstance(v, (int, float)) or hasattr(v, "__float__")
        if not ok:
            raise InputError("%s %s at position %d of '%s' is not %s"
                             % ("label" if b.roles[tid] == _ROLE_LABEL else "value",
                                _shown(v), i, b.names[tid],
                                "an integer" if integer else "a float32 number"))
    raise InputError("input '%s' holds values its arena cannot take" % b.names[tid])


def _shown(v):
    # a value as a message shows it: 10**400 is not printed in full
    text = repr(v)
    return text if len(text) <= 24 else text[:20] + "..."


_FLOAT_MAX = 3.4028234663852886e38
# kernels/float_native.mpy (machine code), where the board's runtime carries it: here its
# load_floats copies an array('f') of inputs in one go (what the loop above stores, as its
# values are all float32 and pass the check; ~1,500 instructions per value in bytecode), and
# module.py takes its largest_abs. None: the loops (CPython; a runtime without the module;
# a test setting _LOAD or module.largest_abs). (__import__: the runtime builder follows
# import statements, and the module has no source; in a runtime shipped without it,
# tools/runtime_native.py sets FLOAT_NATIVE, _LOAD and largest_abs to None.)
try:
    FLOAT_NATIVE = __import__("microtrain.kernels.float_native", None, None, ("load_floats",))
except (ImportError, ValueError):   # ValueError: an .mpy of another architecture or version
    FLOAT_NATIVE = None
_LOAD = FLOAT_NATIVE and FLOAT_NATIVE.load_floats
_QUANTIZED = []     # feedq.copy_quantized, once an int8 / uint8 input needed it
_INT32_SPAN = 0x80000000
