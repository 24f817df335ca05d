# Module.export_model_for_inferencing: write an inference-only blob (of a quantization-aware
# training blob: the int8 inference blob, its values computed by the blob's "export" program).
#
# The host packed that blob into the training blob already (schema: InferenceTemplate in
# host/microtrain_host/contract/microtrain.fbs), its own arena plan included, minus what only
# the device knows at export time: the current parameter values and the outputs asked for.
# Here the template is streamed from the training blob file with those inserted at its
# cuts and the CRC-32 computed on the way, so no copy of the model is ever held in RAM.
import os
import struct
from microtrain.blob import FLOAT, INT32, ITEM_BYTES, NO_TENSOR, describe, is_buffer
from microtrain.files import BufferFile, seek, write_atomically
from microtrain.crc32 import crc32
from microtrain.errors import BlobError, InputError, ParameterError

_CHUNK = 256  # bytes copied (or floats converted) at a time
_COPY = 0x80000000  # template cut kind: bytes copied from elsewhere in the training blob


def export_inference_blob(module, path, output_names):
    """Write the inference blob of `module` (current parameter values) to path, atomically."""
    b = module.blob
    if b.inference is None:
        raise BlobError("'%s' has no inference template: repack the model with this "
                        "version of microtrain" % describe(module.uri))
    if module.state.is_nominal:
        raise ParameterError("the checkpoint state is nominal (no parameter values): load them "
                             "with copy_buffer_to_parameters before exporting")
    pos, length, cuts, outputs, copied = b.inference
    ids = _output_ids(outputs, output_names)
    program = b.programs.get("export")
    if program is not None:
        # a quantization-aware blob: compute the int8 blob's weights, biases, scales, zero
        # points and requantization heads into the arenas (kernels/quant.py), from which the
        # template's cuts take them
        F, I = module.F, module.I
        for kernel, args in program.steps:
            kernel(F, I, args)
    size = length + 4 + 4 * len(outputs)
    for i in range(1, len(cuts), 2):
        kind = cuts[i]
        if kind == NO_TENSOR:
            continue
        if kind & _COPY:
            size += copied[i // 2]
        else:
            size += ITEM_BYTES[b.dtypes[kind]] * b.sizes[kind]

    src, end = _open_unchanged(module.uri, b.crc)
    with src:
        seek(src, pos)     # (not src.seek: littlefs, see files.seek)

        def write(out):
            out.write(struct.pack("<I", size))
            chunk = bytearray(_CHUNK)
            crc = 0
            at = 0
            for i in range(0, len(cuts), 2):
                crc = _copy(src, out, cuts[i] - at, chunk, crc)
                at = cuts[i]
                kind = cuts[i + 1]
                if kind != NO_TENSOR and kind & _COPY:
                    # bytes the training blob holds elsewhere: read them there, come back
                    seek(src, end - (kind & 0x0FFFFFFF))
                    crc = _copy(src, out, copied[i // 2], chunk, crc)
                    seek(src, pos + at)
                elif kind == NO_TENSOR:
                    # The output-id vector: the k chosen ids where the template had room for
                    # all of them; the unused words are never referenced.
                    piece = (struct.pack("<%dI" % (1 + len(ids)), len(ids), *ids)
                             + bytes(4 * (len(outputs) - len(ids))))
                    out.write(piece)
                    crc = crc32(piece, crc)
                else:
                    tid = cuts[i + 1]
                    arena = {FLOAT: module.F, INT32: module.I}.get(
                        b.dtypes[tid], b.weights if tid in b.in_place else b.Q)
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
    # Returns the open file and where its FlatBuffer ends (before the CRC).
    if is_buffer(uri):
        # a bytearray can change after the load as a file can: its CRC again (the
        # template's bytes are read from it; a stale one would be sealed by a fresh CRC)
        view = memoryview(uri)
        if (len(view) < 8 or crc32(view[4:len(view) - 4]) & 0xFFFFFFFF != crc
                or struct.unpack_from("<I", view, len(view) - 4)[0] != crc):
            raise BlobError("the blob buffer the Module was loaded from changed since; load "
                            "it again")
        return BufferFile(uri), len(view) - 4
    try:
        src = open(uri, "rb")
        end = os.stat(uri)[6] - 4
        src.seek(end)
        stored = struct.unpack("<I", src.read(4))[0]
    except OSError as e:
        raise BlobError("cannot read '%s', the blob the Module was loaded from: %s" % (uri, e))
    if stored != crc:
        src.close()
        raise BlobError("'%s' changed since the Module loaded it; load it again" % uri)
    return src, end


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

