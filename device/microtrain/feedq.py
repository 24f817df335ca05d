# Feeding an int8 / uint8 input (integer training blobs): integers go into the byte arena as
# they are; float values are quantized on the way in with the input's own scale and zero
# point (kept from the blob by quantized.py), as onnxruntime's QuantizeLinear and the
# host's `microtrain train` do: x / scale in float32, rounded half to even, plus the zero
# point, saturated. feed.py imports this module only for such an input: a float blob
# never does.
from array import array
from microtrain.blob import INT8
from microtrain.errors import InputError

_F32 = array("f", [0.0])    # rounds a value to float32 (a board's floats already are)
_DOUBLE = 1.0 + 2.0 ** -30 != 1.0   # floats are doubles (CPython, the Unix port)


def copy_quantized(b, tid, values, off, n):
    """The n values of int8 / uint8 input tid into the byte arena at off: integers checked
    to lie in the type's range, floats quantized (the first value decides which)."""
    low = -128 if b.dtypes[tid] == INT8 else 0
    first = values[0]
    if not isinstance(first, int) and not hasattr(first, "__index__"):
        _quantize_floats(b, tid, values, off, n, low)
        return
    Q = b.Q
    for i in range(n):
        v = values[i]
        if not low <= v <= low + 255:
            raise InputError("value %r at position %d of '%s' is outside the %s range"
                             % (v, i, b.names[tid], "int8" if low else "uint8"))
        Q[off + i] = v & 255


def _quantize_floats(b, tid, values, off, n, low):
    kept = getattr(b, "input_quant", None) or {}
    scales, zero_points = kept.get(tid, ((), ()))
    if len(scales) != 1:
        raise InputError("input '%s' takes %s values and has %s: give integers"
                         % (b.names[tid], "int8" if low else "uint8",
                            "no quantization scale" if not scales else "one scale per "
                            "channel"))
    scale = scales[0]
    zero_point = zero_points[0]
    high = low + 255
    Q = b.Q
    f32 = _F32
    for i in range(n):
        v = values[i]
        try:
            if _DOUBLE:
                # the value as float32, as the host's numpy has it, then float32 / float32
                # correctly rounded to float32 (a double quotient of two float32s rounded to
                # float32 is that number): CPython and the Unix port give a board's bytes
                f32[0] = v
                f32[0] = f32[0] / scale
                q = f32[0]
            else:
                q = v / scale   # floats are float32 here: no rounding dance, fewer boxes
        except (TypeError, ValueError, OverflowError):
            raise InputError("value %r at position %d of '%s' is not a number"
                             % (v, i, b.names[tid]))
        if q != q:
            raise InputError("value %r at position %d of '%s' is not a number"
                             % (v, i, b.names[tid]))
        # saturated before rounding (inf, 1e30: no big int), then after the zero point
        if q > 512.0:
            q = 512.0
        elif q < -512.0:
            q = -512.0
        q = round(q) + zero_point   # round(): half to even, on CPython and MicroPython
        if q > high:
            q = high
        elif q < low:
            q = low
        Q[off + i] = q & 255
