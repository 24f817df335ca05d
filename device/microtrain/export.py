# Module.export_model_for_inferencing: write an inference-only blob.
#
# The host packed that blob into the training blob already (schema: InferenceTemplate in
# host/microtrain_host/schema/microtrain.fbs), its own arena plan included, minus what only
# the device knows at export time: the current parameter values and the outputs asked for.
# Here the template is streamed from the training blob file with those inserted at its
# cuts and the CRC-32 computed on the way, so no copy of the model is ever held in RAM.
import os
import struct
from microtrain.blob import FLOAT, INT32, ITEM_BYTES, NO_TENSOR
from microtrain.checkpoint import write_atomically
from microtrain.crc32 import crc32
from microtrain.errors import BlobError, InputError, ParameterError

_CHUNK = 256  # bytes copied (or floats converted) at a time


def export_inference_blob(module, path, output_names):
    """Write the inference blob of `module` (current parameter values) to path, atomically."""
    b = module.blob
    if b.inference is None:
        raise BlobError("'%s' has no inference template: repack the model with this "
                        "version of microtrain" % module.uri)
    if module.state.is_nominal:
        raise ParameterError("the checkpoint state is nominal (no parameter values): load them "
                             "with copy_buffer_to_parameters before exporting")
    pos, length, cuts, outputs = b.inference
    ids = _output_ids(outputs, output_names)
    size = length + 4 + 4 * len(outputs)
    for i in range(1, len(cuts), 2):
        if cuts[i] != NO_TENSOR:
            size += ITEM_BYTES[b.dtypes[cuts[i]]] * b.sizes[cuts[i]]

    with _open_unchanged(module.uri, b.crc) as src:
        src.seek(pos)

        def write(out):
            out.write(struct.pack("<I", size))
            chunk = bytearray(_CHUNK)
            crc = 0
            at = 0
            for i in range(0, len(cuts), 2):
                crc = _copy(src, out, cuts[i] - at, chunk, crc)
                at = cuts[i]
                if cuts[i + 1] == NO_TENSOR:
                    # The output-id vector: the k chosen ids where the template had room for
                    # all of them; the unused words are never referenced.
                    piece = (struct.pack("<%dI" % (1 + len(ids)), len(ids), *ids)
                             + bytes(4 * (len(outputs) - len(ids))))
                    out.write(piece)
                    crc = crc32(piece, crc)
                else:
                    tid = cuts[i + 1]
                    arena = {FLOAT: module.F, INT32: module.I}.get(b.dtypes[tid], b.Q)
                    crc = _write_raw(out, arena, b.offsets[tid], b.sizes[tid], crc)
            crc = _copy(src, out, length - at, chunk, crc)
            out.write(struct.pack("<I", crc & 0xFFFFFFFF))

        write_atomically(path, write, BlobError, "inference blob")


def _output_ids(outputs, output_names):
    if isinstance(output_names, str):
        output_names = [output_names]
    known = [name for name, _ in outputs]
    if not output_names:
        raise InputError("name at least one output to export; the model's outputs are: %s"
                         % ", ".join(known))
    ids = []
    for name in output_names:
        if name not in known:
            raise InputError("'%s' is not an output of the model; its outputs are: %s"
                             % (name, ", ".join(known)))
        tid = outputs[known.index(name)][1]
        if tid in ids:
            raise InputError("output '%s' is named twice" % name)
        ids.append(tid)
    return ids


def _open_unchanged(uri, crc):
    # The template is read from the file the Module was loaded from: it must still be
    # that file, not one repacked since.
    try:
        src = open(uri, "rb")
        src.seek(os.stat(uri)[6] - 4)
        stored = struct.unpack("<I", src.read(4))[0]
    except OSError as e:
        raise BlobError("cannot read '%s', the blob the Module was loaded from: %s" % (uri, e))
    if stored != crc:
        src.close()
        raise BlobError("'%s' changed since the Module loaded it; load it again" % uri)
    return src


def _copy(src, out, n, chunk, crc):
    view = memoryview(chunk)
    while n > 0:
        k = min(n, len(chunk))
        if src.readinto(view[:k]) != k:
            raise BlobError("the training blob ended inside its inference template")
        out.write(view[:k])
        crc = crc32(view[:k], crc)
        n -= k
    return crc


def _write_raw(out, arena, offset, count, crc):
    # bytes() of a slice of an arena (float32, int32 or the byte arena): its raw
    # little-endian bytes, which every crc32 (binascii's or the pure-Python fallback) reads
    # as bytes.
    view = memoryview(arena)
    step = _CHUNK // 4
    for start in range(offset, offset + count, step):
        piece = bytes(view[start:min(start + step, offset + count)])
        out.write(piece)
        crc = crc32(piece, crc)
    return crc

