# The loader: a blob file's tensors, constants and programs into arenas allocated once.
# The file and the arenas are never in the heap together (on a board they would not fit:
# the int8 DS-CNN is a 32 KB file for 47 KB of arenas). Pass 1 reads the file into a buffer
# (as large as the arenas, at the bottom of the heap, when there is such a hole), checks and
# parses it (parser.py), noting each constant by its place in the file; the buffer is
# dropped and the arenas take its place. Pass 2 reads the file again in small chunks, each
# constant straight into its arena, the CRC-32 recomputed: a file replaced in between is
# refused. A blob given as a buffer (in flash) is loaded by inplace.py instead.
import gc
import struct
from microtrain.arenas import CHUNK, arenas, compact, mem_free, put, within
from microtrain.blob import ITEM_BYTES, describe, is_buffer
from microtrain.crc32 import crc32
from microtrain.errors import BlobError, OutOfMemoryError
from microtrain.files import open_existing, open_regular, path_of, read_whole, reason
from microtrain.flatbuf import Reader
from microtrain.parser import (LATER_BYTES, LATER_WEIGHTS, arena_sizes, check_head, load,
                               parse_root, root_of)

# contract: blob Model; private
# (generated from host/microtrain_host/contract/ by `python -m microtrain_host.contract.generate`; do not edit)
from microtrain.errors import const
_MODEL_FLOAT_ARENA = const(5)
_MODEL_INT_ARENA = const(6)
_MODEL_BYTE_ARENA = const(16)
_MODEL_WEIGHTS_IN_PLACE = const(17)
_INT8 = const(2)
_UINT8 = const(3)
# end of contract


def load_into_arenas(source, budget=None):
    """(blob, float arena, int arena) of the blob at source, its constants copied in.
    source is the blob file's path, or the blob itself as a buffer - bytes, or a memoryview
    of a file in a board's ROM filesystem or of a frozen bytes object: the blob in flash,
    whose int8 weights the kernels then read in place, taking no heap (inplace.py)."""
    if is_buffer(source):
        from microtrain.inplace import load_buffer
        return load_buffer(source, budget)
    path = path_of(source, BlobError, "the blob", True)
    b, size, floats, ints, nbytes = _parse_file(path, budget)
    within(budget, 4 * (floats + ints) + nbytes + b.weights_size, "'%s' needs" % path,
           "arenas")
    b.quant = {}        # the scales served the checks (derived multipliers); not needed now
    F, I, Q, b.weights = arenas(path, floats, ints, nbytes, b.weights_size)
    _read_constants(path, b, size, F, I, Q)
    _arenas_into_steps(b, Q)
    return b, F, I


def _parse_file(path, budget):
    # (blob, file size, arena sizes) of the file at path, its constants noted by their place
    # in the file. A function of its own: once it returns, no stale slot of a running
    # frame can keep the file's bytes from the garbage collector (MicroPython scans frames
    # conservatively).
    try:
        # the file is read into a buffer as large as the arenas (when the heap has the
        # room), at the bottom of the heap: the parsed blob's objects then pack above it,
        # and the arenas take its place once it is dropped, instead of looking for holes
        # between those objects.
        compact()
        try:
            f, _ = open_existing(path)
            with f:
                length = f.seek(0, 2)
                f.seek(0)
                check_head(f.read(12), length)      # before reading it all
                within(budget, length, "'%s' is" % path, "file")
                data = read_whole(f, _stated_arenas(f))
        except OSError as e:
            raise BlobError("cannot read blob '%s': %s" % (path, reason(e)))
        r, root = root_of(data)
        floats, ints, nbytes = arena_sizes(r, root)
        return (parse_root(r, root, data, False, LATER_BYTES, True), len(data), floats, ints,
                nbytes)
    except MemoryError:
        data = r = root = None
        try:    # the file's size for the message (here, not in a function of its own:
            # each function costs a board's heap)
            with open(path, "rb") as f:
                size = f.seek(0, 2)
        except (OSError, MemoryError):
            size = "?"
        raise OutOfMemoryError("'%s' does not fit in the heap: its %s-byte file and the blob "
                               "parsed from it need more than %s bytes free"
                               % (path, size, mem_free()))


def _stated_arenas(f):
    # The bytes of arenas the blob's root table states, read from the file's first bytes
    # (a FlatBuffer's root table is written last: it is near the front), capped by the free
    # heap; 0 when unknown, and on CPython. Only where to put the file: the stated sizes are
    # checked once the blob is parsed.
    if not hasattr(gc, "mem_free"):
        return 0
    try:
        size = f.seek(0, 2)
        f.seek(0)
        r = Reader(memoryview(f.read(min(size, 512))), BlobError, start=4)
        root = r.root()
        room = 4 * (r.scalar(root, _MODEL_FLOAT_ARENA, "I", 0)
                    + r.scalar(root, _MODEL_INT_ARENA, "I", 0)) \
            + r.scalar(root, _MODEL_BYTE_ARENA, "I", 0) \
            + r.scalar(root, _MODEL_WEIGHTS_IN_PLACE, "I", 0)
    except Exception:   # a hint only: a broken file is reported by the parse
        return 0
    gc.collect()
    return min(room, gc.mem_free())


def _arenas_into_steps(b, Q):
    # The byte kernels' args were parsed with stand-ins for the byte arena (first, and last
    # for a weight in the arena) and the weights' buffer of a blob file (last).
    for steps in b.programs.values():
        steps = steps.steps
        for k in range(len(steps)):
            kernel, args = steps[k]
            if args and args[0] is LATER_BYTES:
                args = list(args)
                args[0] = Q
                if args[-1] is LATER_BYTES:
                    args[-1] = Q
                elif args[-1] is LATER_WEIGHTS:
                    args[-1] = b.weights
                steps[k] = (kernel, tuple(args))
    b.Q = Q
    b.constants = None  # in the arenas now


def _read_constants(path, b, size, F, I, Q):
    # Second pass over the file: CRC-32 of the FlatBuffer as it streams by through a small
    # chunk, each constant - noted by its place in the file - copied into its arena on the
    # way (int8 ones read straight into the byte arena), in file order.
    places = []
    for tid, raw in b.constants:
        if isinstance(raw, int):
            places.append((raw, tid))
        else:           # computed at load (derived requantization multipliers)
            put(b, tid, 0, raw, len(raw), F, I, Q)
    places.sort()
    end = 0
    for pos, tid in places:     # one pass over the file: no constant can read another's data
        if pos < end:
            raise BlobError("'%s': constant '%s' shares its data with another constant (the "
                            "loader reads a blob file's constants in one pass)"
                            % (path, b.names[tid]))
        end = pos + ITEM_BYTES[b.dtypes[tid]] * b.sizes[tid]
    chunk = bytearray(CHUNK)
    view = memoryview(chunk)
    try:
        with open(path, "rb") as f:
            if f.seek(0, 2) != size:
                raise BlobError("'%s' changed while it was being loaded" % path)
            f.seek(4)
            crc, at = 0, 4
            for pos, tid in places:
                crc = _stream(f, view, crc, at, pos, None)
                at = pos + ITEM_BYTES[b.dtypes[tid]] * b.sizes[tid]
                if b.dtypes[tid] in (_INT8, _UINT8):
                    into = memoryview(b.weights if tid in b.in_place else Q)[
                        b.offsets[tid]:b.offsets[tid] + b.sizes[tid]]
                    if f.readinto(into) != len(into):
                        raise BlobError("'%s' changed while it was being loaded" % path)
                    crc = crc32(into, crc)
                else:
                    crc = _stream(f, view, crc, pos, at, (b, tid, F, I, Q))
            crc = _stream(f, view, crc, at, size - 4, None)
            if f.readinto(view[:4]) != 4:
                raise BlobError("'%s' changed while it was being loaded" % path)
    except OSError as e:
        raise BlobError("cannot read blob '%s': %s" % (path, reason(e)))
    if crc & 0xFFFFFFFF != b.crc or struct.unpack_from("<I", chunk, 0)[0] != b.crc:
        raise BlobError("'%s' changed while it was being loaded" % path)


def _stream(f, view, crc, at, end, into):
    # CRC-32 of the file's bytes [at, end), read through view; with into = (blob, tensor
    # id, arenas): those bytes are the tensor's constant, copied into its arena (chunks are
    # multiples of 4 bytes from its start: whole elements).
    start = at
    while at < end:
        got = f.readinto(view[:min(len(view), end - at)])
        if not got or (into and got % 4):
            raise BlobError("the blob file changed while it was being loaded")
        crc = crc32(view[:got], crc)
        if into:
            put(into[0], into[1], at - start, view[:got], got, into[2], into[3], into[4])
        at += got
    return crc


def program(b, uri, name, default_uri):
    """Program `name` of blob b, or of the blob at uri when it is another file; that file
    must have been packed from the same model (same tensor table)."""
    if uri is not None and uri is not default_uri and not (
            type(uri) is type(default_uri) and uri == default_uri) and _crc_of(uri) != b.crc:
        # another file (or a file beside the buffer the Module was given): the same bytes
        # by their CRC, or a blob packed from the same model
        other = load(uri)
        if other.names != b.names or other.offsets != b.offsets:
            raise BlobError("'%s' and '%s' were not packed from the same model"
                            % (describe(uri), describe(default_uri)))
        b = other
    if name not in b.programs:
        raise BlobError("'%s' has no %s program" % (describe(uri or default_uri), name))
    return b.programs[name]


def _crc_of(uri):
    # the CRC-32 a blob file or buffer ends with (0 when it cannot be read: load says why)
    try:
        if is_buffer(uri):
            tail = bytes(memoryview(uri)[-4:])
        else:
            with open_regular(path_of(uri, BlobError, "the blob", True)) as f:
                f.seek(-4, 2)
                tail = f.read(4)
    except (OSError, ValueError):
        return 0
    return struct.unpack("<I", tail)[0] if len(tail) == 4 else 0
