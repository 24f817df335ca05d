# The fields of the quantized tensors of an int8 blob (Tensor.scale, .zero_point, .axis,
# .derived, .in_place), read at load by the parser; a float blob never imports this module.
import struct
from array import array
from microtrain.blob import INT8, INT32, ITEM_BYTES, ROLE_CONSTANT, ROLE_INPUT, UINT8
from microtrain.errors import BlobError

# contract: blob Tensor
# (generated from host/microtrain_host/contract/ by `python -m microtrain_host.contract.generate`; do not edit)
from microtrain.errors import const
_TENSOR_DATA = const(6)
_TENSOR_SCALE = const(9)
_TENSOR_ZERO_POINT = const(10)
_TENSOR_AXIS = const(11)
_TENSOR_DERIVED = const(12)
_TENSOR_IN_PLACE = const(13)
# end of contract


def read_quantized(r, t, b, name, dtype, role, offset, size, in_file):
    """Check and note the quantization fields of tensor t (the next tensor id of blob b);
    returns its offset: in its arena, or in the weights' buffer for an int8 weight read in
    place (where the blob is, given as a buffer; else one after another in the buffer of
    such weights a blob file gets)."""
    tid = len(b.names)
    in_place = r.scalar(t, _TENSOR_IN_PLACE, "B", 0)
    derived = r.scalar(t, _TENSOR_DERIVED, "B", 0)
    arena = (b.float_arena, b.int_arena, b.byte_arena, b.byte_arena)[dtype]
    if in_place:
        if role != ROLE_CONSTANT or dtype not in (INT8, UINT8) or offset or derived:
            raise BlobError("tensor '%s' is read in place but is not a given int8 "
                            "constant at offset 0" % name)
    elif offset + size > arena:
        raise BlobError("tensor '%s' [%d, %d) lies outside its %d-element arena"
                        % (name, offset, offset + size, arena))
    if role == ROLE_CONSTANT:
        pos, nbytes = r.vector(t, _TENSOR_DATA, 1, "constant data")
        if derived:
            # derived: the given head; the step reading it computes the rest
            if dtype > INT32 or nbytes > 4 * size or nbytes % 4:
                raise BlobError("derived constant '%s' has %d data bytes for %d elements"
                                % (name, nbytes, size))
            b.derived[tid] = struct.unpack_from(
                "<%d%s" % (nbytes // 4, "fi"[dtype]), r.buf, pos) if nbytes else ()
        elif nbytes != ITEM_BYTES[dtype] * size:
            raise BlobError("constant '%s' has %d data bytes, expected %d"
                            % (name, nbytes, ITEM_BYTES[dtype] * size))
        elif in_place and b.weights is not None:
            b.in_place.add(tid)
            offset = pos    # read where it is in the blob's buffer
        else:
            if in_place:    # one after another in the weights' buffer
                b.in_place.add(tid)
                offset = b.weights_size
                b.weights_size += size
            b.constants.append((tid, pos if in_file else bytes(r.buf[pos:pos + nbytes])))
    pos, n = r.vector(t, _TENSOR_SCALE, 4, "tensor scales")
    if n:
        # an array: no float object per scale (per-channel scales are many)
        scales = array("f", bytes(r.buf[pos:pos + 4 * n]))
        zero_points = r.scalars(t, _TENSOR_ZERO_POINT, "i", "tensor zero points")
        if dtype not in (INT8, UINT8) or len(zero_points) not in (1, len(scales)):
            raise BlobError("tensor '%s': %d scales and %d zero points for a tensor of "
                            "dtype %d" % (name, len(scales), len(zero_points), dtype))
        b.quant[tid] = (scales, zero_points, r.scalar(t, _TENSOR_AXIS, "i", 0))
        if role == ROLE_INPUT:
            # kept past load (the loaders drop b.quant): an int8 / uint8 input then takes
            # float values too, quantized on the way in (feedq.py)
            kept = getattr(b, "input_quant", None) or {}
            kept[tid] = (scales, zero_points)
            b.input_quant = kept
    return offset
