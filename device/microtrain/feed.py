# Feeding a program's inputs: one flat sequence per input copied into the arenas, checked
# on the way (lengths, class labels, the range of int8 inputs). Module and InferenceSession
# call it before each run.
from microtrain.blob import FLOAT, INT8, INT32, ROLE_LABEL
from microtrain.errors import InputError


def copy_inputs(b, F, I, program, inputs, classes):
    """Copy one flat sequence per input of `program` into the arenas. With classes > 0,
    labels must be class indices in [0, classes); other int inputs (Gather's indices) are
    checked by the kernels that read them."""
    tids = program.inputs
    if len(inputs) != len(tids):
        raise InputError("the %s program takes %d inputs (%s), got %d"
                         % (program.name, len(tids), ", ".join(b.names[t] for t in tids),
                            len(inputs)))
    for k in range(len(tids)):  # an index loop: zip() would allocate a tuple per input
        tid = tids[k]
        values = inputs[k]
        off, n = b.offsets[tid], b.sizes[tid]
        if len(values) != n:
            raise InputError("input '%s' needs %d values (shape %r), got %d"
                             % (b.names[tid], n, b.shapes[tid], len(values)))
        if b.dtypes[tid] == INT32:
            label = classes if b.roles[tid] == ROLE_LABEL else 0
            for i in range(n):
                v = values[i]
                if label and not 0 <= v < label:
                    raise InputError("label %r at position %d of '%s' is not a class index "
                                     "in [0, %d)" % (v, i, b.names[tid], classes))
                I[off + i] = int(v)
        elif b.dtypes[tid] != FLOAT:
            # an int8 / uint8 input (already quantized: integer training) into the byte arena
            Q = b.Q
            low = -128 if b.dtypes[tid] == INT8 else 0
            for i in range(n):
                v = values[i]
                if not low <= v <= low + 255:
                    raise InputError("value %r at position %d of '%s' is outside the %s range"
                                     % (v, i, b.names[tid], "int8" if low else "uint8"))
                Q[off + i] = v & 255
        else:
            for i in range(n):
                F[off + i] = values[i]
